#!/usr/bin/env bash
# docs/evidence/protocol.md, section 7: the protocol on the second testbed (chains worked line by line, the chains
# example's 2.3M-parameter model), into OUT/chains. Finished runs are skipped, so an interrupted stage goes on where it
# stopped; runs archived under ARCHIVE (docs/evidence/protocol) are restored first.
#   STAGE=validation bash benchmarks/staleness/chains.sh [OUT]   # does staleness hurt there? (first)
#   STAGE=dev bash benchmarks/staleness/chains.sh [OUT]          # the choice, on development seeds
#   STAGE=heldout bash benchmarks/staleness/chains.sh [OUT]      # the held-out seeds (from a clean checkout only)
# JOBS (2) runs side by side, one thread each.
set -euo pipefail
OUT="${1:-runs/protocol}"
STAGE="${STAGE:-validation}"
JOBS="${JOBS:-2}"
export OMP_NUM_THREADS=1
PY="${PYTHON:-python}"
here="$(dirname "${BASH_SOURCE[0]}")"
consts() { "$PY" -c "from benchmarks.staleness import chains_study as c; print(' '.join(map(format, c.$1)))"; }

if [[ "$STAGE" == heldout ]] && [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    echo "STAGE=heldout runs from a tree with uncommitted edits: its runs would not count (docs/evidence/protocol.md);" \
        "commit them, or run from a clean checkout (git worktree add ../study HEAD)" >&2
    exit 1
fi
"$PY" -m benchmarks.staleness.protocol restore "${ARCHIVE:-docs/evidence/protocol}" "$OUT"
PYTHON="$PY" JOBS="$JOBS" TASK=chains LRS="$(consts LRS)" SYNC_SEEDS="$(consts SYNC_SEEDS)" \
    STALE_SEEDS="$(consts STALE_SEEDS)" bash "$here/validate.sh" "$OUT/validation"
[[ "$STAGE" == validation ]] && exit 0
if ! "$PY" -m benchmarks.staleness.validation "$OUT/validation/chains" --check; then
    echo "staleness does not hurt on the chains testbed: no method comparison runs there (protocol.md, section 7)" >&2
    exit 1
fi
LR=$("$PY" -c "
from pathlib import Path; from benchmarks.staleness.validation import by_lr, best_lr
print(format(best_lr(by_lr(Path('$OUT/validation/chains'))), 'g'))")
common=(--task chains --lr "$LR" --steps 50 --eval-every 10 --val-size 500 --minibatches 2 --jobs "$JOBS")
echo "chains testbed at lr $LR"
if [[ "$STAGE" == dev ]]; then
    for s in 4 8; do
        "$PY" -m benchmarks.staleness.run_study --out "$OUT/chains/dev" "${common[@]}" --staleness "$s" \
            --seeds $(consts DEV_SEEDS) --methods $(consts DEV_CONFIGS)
    done
    "$PY" -m benchmarks.staleness.chains_study dev "$OUT/chains/dev" --out "$OUT/chains/dev/choice.md"
elif [[ "$STAGE" == heldout ]]; then
    "$PY" -m benchmarks.staleness.chains_study dev "$OUT/chains/dev" --out "$OUT/chains/dev/choice.md" > /dev/null
    PRESET=$(sed -n 's/^preset: \([a-z0-9_]*\)$/\1/p' "$OUT/chains/dev/choice.md")
    ALT=$(sed -n 's/^alternative: \([a-z0-9_]*\)$/\1/p' "$OUT/chains/dev/choice.md")
    [[ -n "$PRESET" && -n "$ALT" ]] || { echo "the development stage has not chosen yet: $OUT/chains/dev" >&2; exit 1; }
    # seed by seed: every run of a seed, at s = 4 and 8, one after another on one machine
    "$PY" -m benchmarks.staleness.run_study --out "$OUT/chains/heldout" "${common[@]}" --staleness 4 8 \
        --seeds $(consts HELDOUT_SEEDS) --methods $(consts HELDOUT_BASELINES) "$PRESET" "$ALT"
    "$PY" -m benchmarks.staleness.chains_study heldout "$OUT/chains/heldout" --preset "$PRESET" --alternative "$ALT" \
        --out "$OUT/chains/heldout/headline.md"
else
    echo "STAGE must be validation, dev or heldout, got '$STAGE'" >&2; exit 1
fi
