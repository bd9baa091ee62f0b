#!/usr/bin/env bash
# The two V0 trainers compared on CPU: the example's `_pmis_sg` configuration on CPU through
# one-step-off and through fully-async (verl's defaults for the CPU scripts: 16 prompts per step, weight
# sync every step, staleness_threshold 2), one seed each; then a table of step time, trained staleness,
# validation accuracy and verl's idle ratios.
#   bash benchmarks/cpu_trainers.sh [OUT]        (default runs/cpu_trainers; STEPS [20]; about 5 min on 2 cores)
# A trainer whose metrics.jsonl reached step STEPS is kept, not run again. DARL_PRINT_CMD=1 (or DARL_DRY_RUN=1) passes
# on to the launch scripts: each trainer's log holds its command (its resolved config), and nothing is reported.
set -euo pipefail
OUT="$(realpath -m "${1:-runs/cpu_trainers}")"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/benchmarks/rollout_env.sh"  # the rollout the archived runs used (hf), unless ROLLOUT is set
mkdir -p "$OUT"
for kind in one_step_off fully_async; do
    grep -qs '"step":'"${STEPS:-20}"',' "$OUT/$kind/metrics.jsonl" && continue  # finished: kept
    OUT_DIR="$OUT/$kind" STEPS="${STEPS:-20}" TEST_FREQ=10 SAVE_FREQ=1000 RESUME_MODE=disable \
        bash "$ROOT/shells/cpu/${kind}_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh" > "$OUT/$kind.log" 2>&1 \
        || { echo "$kind failed: $OUT/$kind.log"; exit 1; }
done
[[ "${DARL_PRINT_CMD:-0}" != 0 || "${DARL_DRY_RUN:-0}" != 0 ]] && { echo "launches printed, not run: $OUT/*.log"; exit 0; }
PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" - "$OUT" <<'PY'
import statistics
import sys
from pathlib import Path
from recipe.darl.example.arithmetic import VAL_KEY
from recipe.darl.plot import read_log
out = Path(sys.argv[1])
print("| trainer | median step s | trained staleness (share of groups) | mean | val accuracy at step | trainer idle | rollouter idle |")
print("|---|---|---|---|---|---|---|")
for kind in ("one_step_off", "fully_async"):
    log = read_log(out / kind / "metrics.jsonl")
    times = [v for s, v in log.get("perf/time_per_step", []) if s > 2]
    buckets = {k: series for k, series in log.items() if k.startswith("replay/staleness_hist/s")}
    steps = {s for series in buckets.values() for s, _ in series}  # steps that trained: shares sum to 1 there
    hist = {int(k.rsplit("/s", 1)[1]): sum(v for _, v in series) / len(steps) for k, series in buckets.items()}
    shares = ", ".join(f"{s}: {hist[s]:.2f}" for s in sorted(hist))
    mean = statistics.mean(v for _, v in log.get("replay/staleness_mean", [(0, float("nan"))]))
    accs = ", ".join(f"{s}: {a:.3f}" for s, a in log.get(VAL_KEY, []))
    idle = [statistics.mean(v for _, v in log[k]) if k in log else float("nan")
            for k in ("fully_async/trainer/idle_ratio", "fully_async/rollouter/idle_ratio")]
    idle_text = ["-" if x != x else f"{x:.2f}" for x in idle]  # one-step-off logs no idle ratios
    print(f"| {kind} | {statistics.median(times):.2f} | {shares} | {mean:.2f} | {accs} | {idle_text[0]} | {idle_text[1]} |")
PY
