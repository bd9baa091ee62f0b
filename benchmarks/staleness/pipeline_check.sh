#!/usr/bin/env bash
# The confirmation point of docs/evidence.md: the three seed configurations through the verl pipeline
# on CPU (one-step-off, s = 1, the same task and model as the harness), one seed each.
#   bash benchmarks/staleness/pipeline_check.sh [OUT]      (default runs/pipeline; about 25 min on 2 cores)
set -euo pipefail
OUT="$(realpath -m "${1:-runs/pipeline}")"
mkdir -p "$OUT"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
for cfg in async decoupled pmis_sg; do
    name="one_step_off_grpo_tiny_arith_cpu_replay_4_${cfg}"
    OUT_DIR="$OUT/$cfg" STEPS="${STEPS:-30}" TEST_FREQ=10 SAVE_FREQ=1000 RESUME_MODE=disable \
        bash "$ROOT/shells/cpu/$name.sh" > "$OUT/$cfg.log" 2>&1 || { echo "$cfg failed: $OUT/$cfg.log"; exit 1; }
    echo "$cfg done: $OUT/$cfg/metrics.jsonl"
done
PYTHONPATH="$ROOT" "${PYTHON:-$ROOT/.venv/bin/python}" - "$OUT" <<'PY'
import sys
from pathlib import Path
from recipe.darl.demo import VAL_KEY
from recipe.darl.plot import read_log
out = Path(sys.argv[1])
print("| config | greedy val accuracy at step |\n|---|---|")
for cfg in ("async", "decoupled", "pmis_sg"):
    accs = read_log(out / cfg / "metrics.jsonl").get(VAL_KEY, [])
    print(f"| {cfg} | " + ", ".join(f"{s}: {a:.3f}" for s, a in accs) + " |")
PY
