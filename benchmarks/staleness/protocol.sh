#!/usr/bin/env bash
# docs/evidence/protocol.md, run: the testbed validation, the development stage, then (STAGE=heldout) the held-out
# stage. Finished runs are skipped, so an interrupted study goes on where it stopped.
#   bash benchmarks/staleness/protocol.sh [OUT]                 # validation + development stage (seeds 0-7)
#   STAGE=heldout bash benchmarks/staleness/protocol.sh [OUT]   # the held-out seeds, once the development stage chose
#   STAGE=pipeline bash benchmarks/staleness/protocol.sh [OUT]  # the same choice through the CPU launch scripts
#   STAGE=replay_dev / replay_heldout bash benchmarks/staleness/protocol.sh [OUT]  # section 5: replay on and off
#   STAGE=threshold_dev / threshold_heldout bash benchmarks/staleness/protocol.sh [OUT]  # section 6: where it pays
#   STAGE=replay_pipeline bash benchmarks/staleness/protocol.sh [OUT]  # section 5 through fully-async, after section 6
# TASK (scarce) picks the regime; JOBS (2) runs side by side, one thread each. Runs archived under ARCHIVE
# (docs/evidence/protocol, written by `python -m benchmarks.staleness.protocol archive OUT ARCHIVE`) are restored first.
set -euo pipefail
OUT="${1:-runs/protocol}"
TASK="${TASK:-scarce}"
STAGE="${STAGE:-dev}"
JOBS="${JOBS:-2}"
export OMP_NUM_THREADS=1
PY="${PYTHON:-python}"
here="$(dirname "${BASH_SOURCE[0]}")"
consts() { "$PY" -c "from benchmarks.staleness import protocol as p; print(' '.join(map(str, p.$1)))"; }

# a held-out run counts only from a clean commit (provenance.same_origin): run the study from a checkout with no
# uncommitted edits, e.g. `git worktree add ../study HEAD`
if [[ "$STAGE" == *heldout || "$STAGE" == replay_pipeline ]] && [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    echo "STAGE=$STAGE runs from a tree with uncommitted edits: its runs would not count (docs/evidence/protocol.md);" \
        "commit them, or run from a clean checkout (git worktree add ../study HEAD)" >&2
    exit 1
fi
# runs archived in the repository count as done: a study on a new machine resumes where the last one stopped
"$PY" -m benchmarks.staleness.protocol restore "${ARCHIVE:-docs/evidence/protocol}" "$OUT"
PYTHON="$PY" JOBS="$JOBS" TASK="$TASK" bash "$here/validate.sh" "$OUT/validation"
# protocol.md, section 1: no method is compared where stale training is not worse than on-policy training
if ! "$PY" -m benchmarks.staleness.validation "$OUT/validation/$TASK" --check; then
    if [[ "$TASK" == scarce ]]; then
        TASK=arithmetic
        PYTHON="$PY" JOBS="$JOBS" TASK="$TASK" bash "$here/validate.sh" "$OUT/validation"
    fi
    if ! "$PY" -m benchmarks.staleness.validation "$OUT/validation/$TASK" --check; then
        echo "no regime validated: no method comparison runs (docs/evidence/protocol.md, section 1)" >&2
        exit 1
    fi
fi
LR=$("$PY" -c "
from pathlib import Path; from benchmarks.staleness.validation import by_lr, best_lr
print(format(best_lr(by_lr(Path('$OUT/validation/$TASK'))), 'g'))")
common=(--task "$TASK" --lr "$LR" --steps 50 --eval-every 10 --val-size 500 --minibatches 2 --jobs "$JOBS")
echo "regime: $TASK at lr $LR"

# the development stage's choice, recomputed from its runs (restored above on a new machine)
chosen() {
    "$PY" -m benchmarks.staleness.protocol choose "$OUT/$TASK/dev" --out "$OUT/$TASK/dev/choice.md" > /dev/null
    PRESET=$(sed -n 's/^preset: \([a-z0-9_]*\)$/\1/p' "$OUT/$TASK/dev/choice.md")
    ALT=$(sed -n 's/^alternative: \([a-z0-9_]*\)$/\1/p' "$OUT/$TASK/dev/choice.md")
    [[ -n "$PRESET" && -n "$ALT" ]] || { echo "the development stage has not chosen yet: $OUT/$TASK/dev" >&2; exit 1; }
    echo "preset: $PRESET, strongest simple alternative: $ALT"
}

if [[ "$STAGE" == dev ]]; then
    for s in 4 8; do  # s = 4 for every configuration and seed first, then s = 8
        "$PY" -m benchmarks.staleness.run_study --out "$OUT/$TASK/dev" "${common[@]}" --staleness "$s" \
            --seeds $(consts DEV_SEEDS) --methods $(consts DEV_CONFIGS)
    done
    "$PY" -m benchmarks.staleness.protocol choose "$OUT/$TASK/dev" --out "$OUT/$TASK/dev/choice.md"
elif [[ "$STAGE" == heldout ]]; then
    chosen
    # seed by seed (run_study's order): every run of a seed, at s = 4 and 8, one after another on one machine
    "$PY" -m benchmarks.staleness.run_study --out "$OUT/$TASK/heldout" "${common[@]}" --staleness 4 8 \
        --seeds $(consts HELDOUT_SEEDS) --methods $(consts HELDOUT_BASELINES) "$PRESET" "$ALT"
    "$PY" -m benchmarks.staleness.protocol headline "$OUT/$TASK/heldout" --preset "$PRESET" --alternative "$ALT" \
        --out "$OUT/$TASK/heldout/headline.md"
elif [[ "$STAGE" == pipeline ]]; then
    # the same choice through the CPU launch scripts at the validated rate and the harness's batch (protocol.md,
    # section 4: 32 prompts x 8 a step in 2 mini-batches, 50 steps; at the scripts' own 16 prompts in mini-batches of
    # 8, on-policy training collapses at this rate): one-step-off, and fully-async at staleness_threshold 4 with its
    # on-policy run (sync) as the ceiling, every held-out seed. Archived runs (`python -m
    # benchmarks.staleness.pipeline_report OUT/TASK/pipeline --archive ARCHIVE/TASK/pipeline`) are restored first and
    # count as done.
    chosen
    packed="${ARCHIVE:-docs/evidence/protocol}/$TASK/pipeline/results.jsonl.gz"
    if [[ -f "$packed" ]]; then "$PY" -m benchmarks.staleness.pipeline_report "$packed" --restore "$OUT/$TASK/pipeline"; fi
    PYTHON="$PY" TASK="$TASK" LR="$LR" TRAIN_BATCH_SIZE=32 MINI_BATCH_SIZE=16 STALENESS_THRESHOLD=4 STEPS=50 \
        SEEDS="$(consts HELDOUT_SEEDS)" \
        TRAINERS="one_step_off fully_async" CONFIGS="sync decoupled $PRESET $ALT" VERSUS="decoupled $ALT sync" \
        bash "$here/pipeline_check.sh" "$OUT/$TASK/pipeline"
elif [[ "$STAGE" == replay_dev ]]; then
    # protocol.md, section 5: replay on and off on development seeds of their own, s = 4 then s = 8
    for s in 4 8; do
        "$PY" -m benchmarks.staleness.run_study --out "$OUT/$TASK/replay_dev" "${common[@]}" --staleness "$s" \
            --seeds $(consts REPLAY_DEV_SEEDS) --methods $(consts REPLAY_CONFIGS)
    done
elif [[ "$STAGE" == replay_heldout ]]; then
    # protocol.md, section 5: the held-out seeds the power calculation asked for, seed by seed (every run of a seed
    # at s = 4 and 8 one after another on one machine)
    "$PY" -m benchmarks.staleness.run_study --out "$OUT/$TASK/replay_heldout" "${common[@]}" --staleness 4 8 \
        --seeds $(consts REPLAY_HELDOUT_SEEDS) --methods $(consts REPLAY_CONFIGS)
elif [[ "$STAGE" == threshold_dev || "$STAGE" == threshold_heldout ]]; then
    # protocol.md, section 6: the preset, decoupled PPO and the alternative through the fully-async CPU script at each
    # staleness_threshold, seed by seed (every launch of a seed one after another on one machine), the pipeline
    # stage's batch and steps
    sweep() { "$PY" -c "from benchmarks.staleness import threshold_sweep as t; print(' '.join(map(format, t.$1)))"; }
    stage="$OUT/$TASK/$STAGE"
    "$PY" -m benchmarks.staleness.threshold_sweep restore "${ARCHIVE:-docs/evidence/protocol}/$TASK/$STAGE" "$stage"
    if [[ "$STAGE" == threshold_dev ]]; then seeds=$(sweep DEV_SEEDS) thresholds=$(sweep DEV_THRESHOLDS)
    else seeds=$(sweep HELDOUT_SEEDS) thresholds=$(sweep THRESHOLDS); fi
    [[ -n "$seeds" ]] || { echo "no held-out seeds yet: protocol.md, section 6 draws them after the development block" >&2; exit 1; }
    for seed in $seeds; do
        for t in $thresholds; do
            PYTHON="$PY" TASK="$TASK" LR="$LR" TRAIN_BATCH_SIZE=32 MINI_BATCH_SIZE=16 STALENESS_THRESHOLD="$t" STEPS=50 \
                SEEDS="$seed" TRAINERS=fully_async CONFIGS="$(sweep CONFIGS)" VERSUS="decoupled" \
                bash "$here/pipeline_check.sh" "$stage/t$t"
        done
    done
    if [[ "$STAGE" == threshold_dev ]]; then "$PY" -m benchmarks.staleness.threshold_sweep power "$stage"
    else "$PY" -m benchmarks.staleness.threshold_sweep report "$stage"; fi
elif [[ "$STAGE" == replay_pipeline ]]; then
    # protocol.md, section 5: its three configurations through the fully-async CPU script on its held-out seeds, at
    # the threshold section 6 supports (read from section 6's finished held-out stage), seed by seed
    archive="${ARCHIVE:-docs/evidence/protocol}/$TASK"
    "$PY" -m benchmarks.staleness.threshold_sweep restore "$archive/threshold_heldout" "$OUT/$TASK/threshold_heldout"
    t=$("$PY" -m benchmarks.staleness.replay_pipeline threshold "$OUT/$TASK/threshold_heldout")
    stage="$OUT/$TASK/replay_pipeline"
    "$PY" -m benchmarks.staleness.threshold_sweep restore "$archive/replay_pipeline" "$stage"
    for seed in $(consts REPLAY_HELDOUT_SEEDS); do
        PYTHON="$PY" TASK="$TASK" LR="$LR" TRAIN_BATCH_SIZE=32 MINI_BATCH_SIZE=16 STALENESS_THRESHOLD="$t" STEPS=50 \
            SEEDS="$seed" TRAINERS=fully_async CONFIGS="$(consts REPLAY_CONFIGS)" VERSUS="replay_off_e2" \
            bash "$here/pipeline_check.sh" "$stage/t$t"
    done
    "$PY" -m benchmarks.staleness.replay_pipeline report "$stage"
else
    echo "STAGE must be dev, heldout, pipeline, replay_dev, replay_heldout, replay_pipeline, threshold_dev or" \
        "threshold_heldout, got '$STAGE'" >&2; exit 1
fi
