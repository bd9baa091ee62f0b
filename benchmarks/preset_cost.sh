#!/usr/bin/env bash
# What the preset costs through the one-step-off trainer (docs/performance.md): the CPU launch script's `_pmis_sg`
# (the preset, two passes), `_decoupled` (decoupled PPO, one pass) and `_decoupled` with the preset's two passes
# (`equal_update`), one after the other for each seed on one machine, then each run's median step time over
# steps 3.. and the ratios per seed: what the preset costs in all, and what it costs on top of its passes.
#   bash benchmarks/preset_cost.sh [OUT]        (default runs/preset_cost; SEEDS ["1 2"], STEPS [12]; about 3 min a run on 2 cores)
# A run folder with a metrics.jsonl is kept, not run again. DARL_PRINT_CMD=1 (or DARL_DRY_RUN=1) passes on to the
# launch scripts: each run's log holds its command (its resolved config), and nothing is reported.
set -euo pipefail
OUT="$(realpath -m "${1:-runs/preset_cost}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/benchmarks/rollout_env.sh"  # the tests' transformers rollout, unless ROLLOUT=vllm
mkdir -p "$OUT"
for seed in ${SEEDS:-1 2}; do
    for config in decoupled equal_update pmis_sg; do
        run="$OUT/${config}_seed$seed"
        [[ -s "$run/metrics.jsonl" ]] && continue  # done: an interrupted comparison goes on where it stopped
        script=$config extra=()
        [[ $config == equal_update ]] && script=decoupled extra=(actor_rollout_ref.actor.ppo_epochs=2)
        echo "$(date -u +%H:%M:%S) $config seed $seed"
        SEED="$seed" OUT_DIR="$run" STEPS="${STEPS:-12}" TEST_FREQ=1000 SAVE_FREQ=1000 RESUME_MODE=disable \
            bash "$ROOT/shells/cpu/one_step_off_grpo_tiny_arith_cpu_replay_4_${script}.sh" "${extra[@]}" > "$run.log" 2>&1 \
            || { echo "$config seed $seed failed: $run.log"; exit 1; }
    done
done
[[ "${DARL_PRINT_CMD:-0}" != 0 || "${DARL_DRY_RUN:-0}" != 0 ]] && { echo "launches printed, not run: $OUT/*.log"; exit 0; }
PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" - "$OUT" <<'PY'
import statistics
import sys
from pathlib import Path
from recipe.darl.plot import read_log
out = Path(sys.argv[1])
configs = ("decoupled", "equal_update", "pmis_sg")
print("| seed | decoupled median step s | two passes (equal_update) s | preset s | preset / decoupled "
      "| preset / equal_update | preset groups trained per step |")
print("|---|---|---|---|---|---|---|")
ratios, equal = [], []
for run in sorted(out.glob("pmis_sg_seed*/metrics.jsonl")):
    seed = run.parent.name.removeprefix("pmis_sg_seed")
    logs = {c: read_log(out / f"{c}_seed{seed}" / "metrics.jsonl") for c in configs}
    step = {c: statistics.median(v for s, v in log["perf/time_per_step"] if s > 2) for c, log in logs.items()}
    groups = statistics.mean(v for _, v in logs["pmis_sg"].get("replay/selected", [(0, float("nan"))]))
    ratios.append(step["pmis_sg"] / step["decoupled"])
    equal.append(step["pmis_sg"] / step["equal_update"])
    print(f"| {seed} | {step['decoupled']:.2f} | {step['equal_update']:.2f} | {step['pmis_sg']:.2f} "
          f"| {ratios[-1]:.2f}x | {equal[-1]:.2f}x | {groups:.1f} |")
print(f"\nmedian ratios over {len(ratios)} seed(s): preset / decoupled {statistics.median(ratios):.2f}x, "
      f"preset / equal_update {statistics.median(equal):.2f}x")
PY
