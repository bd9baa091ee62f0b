#!/usr/bin/env bash
# What the preset costs through the one-step-off trainer (docs/performance.md): the CPU launch script's `_pmis_sg`
# (the preset) and `_decoupled` (decoupled PPO), one after the other for each seed on one machine, then each run's
# median step time over steps 3.. and the ratio per seed.
#   bash benchmarks/preset_cost.sh [OUT]        (default runs/preset_cost; SEEDS ["1 2"], STEPS [12]; about 5 min a run)
set -euo pipefail
OUT="$(realpath -m "${1:-runs/preset_cost}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/benchmarks/rollout_env.sh"  # the tests' transformers rollout, unless ROLLOUT=vllm
mkdir -p "$OUT"
for seed in ${SEEDS:-1 2}; do
    for config in decoupled pmis_sg; do
        run="$OUT/${config}_seed$seed"
        [[ -s "$run/metrics.jsonl" ]] && continue  # done: an interrupted comparison goes on where it stopped
        echo "$(date -u +%H:%M:%S) $config seed $seed"
        SEED="$seed" OUT_DIR="$run" STEPS="${STEPS:-12}" TEST_FREQ=1000 SAVE_FREQ=1000 RESUME_MODE=disable \
            bash "$ROOT/shells/cpu/one_step_off_grpo_tiny_arith_cpu_replay_4_${config}.sh" > "$run.log" 2>&1 \
            || { echo "$config seed $seed failed: $run.log"; exit 1; }
    done
done
PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" - "$OUT" <<'PY'
import statistics
import sys
from pathlib import Path
from recipe.darl.plot import read_log
out = Path(sys.argv[1])
print("| seed | decoupled median step s | preset median step s | ratio | preset groups trained per step |")
print("|---|---|---|---|---|")
ratios = []
for run in sorted(out.glob("pmis_sg_seed*/metrics.jsonl")):
    seed = run.parent.name.removeprefix("pmis_sg_seed")
    logs = {c: read_log(out / f"{c}_seed{seed}" / "metrics.jsonl") for c in ("decoupled", "pmis_sg")}
    step = {c: statistics.median(v for s, v in log["perf/time_per_step"] if s > 2) for c, log in logs.items()}
    groups = statistics.mean(v for _, v in logs["pmis_sg"].get("replay/selected", [(0, float("nan"))]))
    ratios.append(step["pmis_sg"] / step["decoupled"])
    print(f"| {seed} | {step['decoupled']:.2f} | {step['pmis_sg']:.2f} | {ratios[-1]:.2f}x | {groups:.1f} |")
print(f"\nmedian ratio over {len(ratios)} seed(s): {statistics.median(ratios):.2f}x")
PY
