"""`make demo`: D-ARL one-step-off training end to end on CPU, on the built-in example.

Runs shells/cpu/one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh, plots its metrics to a PNG (recipe/darl/plot.py)
and prints the validation accuracy before and after training.

    python -m recipe.darl.demo [--steps 40] [--out outputs/demo] [extra Hydra overrides ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .plot import plot, read_log

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
VAL_KEY = "val-core/darl/arithmetic/acc/mean@1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "demo")
    args, overrides = parser.parse_known_args()

    if args.out.exists():
        shutil.rmtree(args.out)  # a demo starts fresh; use the shell scripts to resume
    env = dict(os.environ, OUT_DIR=str(args.out), STEPS=str(args.steps), TEST_FREQ=str(args.test_freq),
               SAVE_FREQ=str(args.steps), RESUME_MODE="disable", EXPERIMENT_NAME="demo", PYTHON=sys.executable)
    start = time.perf_counter()
    code = subprocess.call(["bash", str(SCRIPT), *overrides], env=env)
    minutes = (time.perf_counter() - start) / 60
    if code != 0:
        print(f"[demo] training failed (exit {code}) after {minutes:.1f} min", file=sys.stderr)
        return code

    log = args.out / "metrics.jsonl"
    series = read_log(log)
    png = plot(series, args.out / "demo.png", title=f"D-ARL on CPU: tiny Qwen3, arithmetic, the preset ({args.steps} steps)")
    val = series.get(VAL_KEY, [])
    if len(val) < 2:
        print(f"[demo] expected validation before and after training in {log}", file=sys.stderr)
        return 1
    (step0, before), (step1, after) = val[0], val[-1]
    replay_keys = sorted(k for k in series if k.startswith("replay/"))
    print()
    print(f"[demo] finished {args.steps} steps in {minutes:.1f} min (training script, example build included)")
    print(f"[demo] validation accuracy (greedy, {VAL_KEY}): step {step0}: {before:.3f} -> step {step1}: {after:.3f} "
          f"({'improved' if after > before else 'did NOT improve'})")
    print(f"[demo] {len(replay_keys)} replay/ metrics logged every step; metrics: {log}")
    print(f"[demo] tensorboard: {args.out / 'tensorboard'}   checkpoint: {args.out / 'checkpoints'}")
    print(f"[demo] plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
