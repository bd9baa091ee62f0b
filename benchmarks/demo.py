"""`make demo`: what D-ARL is for, in minutes on CPU.

1. **The claim**, in the controlled-staleness harness (`benchmarks/staleness/harness.py`: the tiny Qwen3 and the same
   `ReplayStep` verl's trainers call, rollouts exactly s versions stale): the scarce task (256 hard sums revisited),
   lr 2e-4, 50 steps of 32 prompts x 8 in two mini-batches, greedy accuracy on 500 held-out problems every 10 steps.
   Decoupled PPO and the preset (`darl_tokens_e2`) at staleness s = 8, and on-policy training (`sync`, s = 0) as the
   reference, two runs side by side. Chosen on development seeds: at s = 8 decoupled PPO loses most of what on-policy
   training gains and the preset keeps it (docs/evidence.md).
2. **The product's pipeline**: the one-step-off CPU launch script with the preset for a few steps (Ray, verl's FSDP2
   trainer, verl's vLLM rollout), on the arithmetic task: the same configuration runs end to end. Too few steps to
   learn; it shows the path, not the claim.

It draws the three validation curves in one figure (OUT/demo.png) and prints each final accuracy and the difference.

    python -m benchmarks.demo [--seed 4] [--staleness 8] [--e2e-steps 8] [--out outputs/demo]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
# the validated regime of docs/evidence/protocol.md (section 1), as its development and held-out stages ran it
COMMON = {"task": "scarce", "lr": 2e-4, "steps": 50, "eval_every": 10, "val_size": 500, "minibatches": 2}
NAMES = {"decoupled": "decoupled PPO", "darl_tokens_e2": "D-ARL (the preset)", "sync": "on-policy (s = 0)"}


def _run(method: str, staleness: int, seed: int) -> dict:
    from benchmarks.staleness.run_study import cell_staleness, run_one

    return run_one({"method_name": method, "staleness": cell_staleness(method, staleness), "seed": seed,
                    "common": COMMON})


def claim(staleness: int, seed: int, jobs: int) -> dict[str, dict]:
    """The three harness runs, `jobs` at a time: {method: run_study's result}."""
    from recipe.darl.example.build import build_example

    build_example()  # once, before the workers need it
    methods = ["decoupled", "darl_tokens_e2", "sync"]
    with ProcessPoolExecutor(jobs) as pool:
        runs = list(pool.map(_run, methods, [staleness] * 3, [seed] * 3))
    return dict(zip(methods, runs))


def pipeline(out: Path, steps: int) -> tuple[int, list[tuple[int, float]]]:
    """The preset through the one-step-off CPU script for `steps` steps: (exit code, validation accuracy by step)."""
    from recipe.darl.example.arithmetic import VAL_KEY
    from recipe.darl.plot import read_log

    env = dict(os.environ, OUT_DIR=str(out), STEPS=str(steps), TEST_FREQ=str(steps), SAVE_FREQ=str(steps),
               RESUME_MODE="disable", EXPERIMENT_NAME="demo_pipeline", PYTHON=sys.executable)
    code = subprocess.call(["bash", str(SCRIPT)], env=env)
    return code, (read_log(out / "metrics.jsonl").get(VAL_KEY, []) if code == 0 else [])


def draw(runs: dict[str, dict], staleness: int, seed: int, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, run in runs.items():
        steps = [e["step"] for e in run["evals"]]
        label = NAMES[method] if method == "sync" else f"{NAMES[method]}, s = {staleness}"
        ax.plot(steps, [e["accuracy"] for e in run["evals"]], marker="o", label=label, ls=":" if method == "sync" else "-")
    ax.set_xlabel("training step (32 prompts x 8 responses each)")
    ax.set_ylabel("greedy accuracy, 500 held-out sums")
    ax.set_title(f"Training on rollouts {staleness} versions stale (tiny Qwen3, seed {seed})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = out / "demo.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--staleness", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2, help="harness runs side by side, one thread each")
    parser.add_argument("--e2e-steps", type=int, default=8, help="steps through the launch script; 0 skips it")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "demo")
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)  # a demo starts fresh
    args.out.mkdir(parents=True)

    start = time.perf_counter()
    print(f"[demo] 1/2 the claim: decoupled PPO and the preset at s = {args.staleness}, on-policy at s = 0 "
          f"(the harness, seed {args.seed}, 50 steps each)", flush=True)
    runs = claim(args.staleness, args.seed, args.jobs)
    (args.out / "claim.json").write_text(json.dumps(runs))
    png = draw(runs, args.staleness, args.seed, args.out)
    claim_min = (time.perf_counter() - start) / 60

    code, val = 0, []
    if args.e2e_steps > 0:
        print(f"[demo] 2/2 the pipeline: {SCRIPT.name}, {args.e2e_steps} steps", flush=True)
        code, val = pipeline(args.out / "pipeline", args.e2e_steps)

    final = {m: r["final_accuracy"] for m, r in runs.items()}
    print()
    print(f"[demo] the claim ({claim_min:.1f} min): final accuracy at step 50, s = {args.staleness}: decoupled PPO "
          f"{final['decoupled']:.3f}, D-ARL {final['darl_tokens_e2']:.3f}: "
          f"{100 * (final['darl_tokens_e2'] - final['decoupled']):+.1f} points (on-policy: {final['sync']:.3f}, "
          f"start {runs['decoupled']['initial_accuracy']:.3f})")
    print(f"[demo] plot: {png}")
    if args.e2e_steps > 0:
        if code != 0:
            print(f"[demo] the pipeline failed (exit {code}): {args.out / 'pipeline'}", file=sys.stderr)
            return code
        shown = ", ".join(f"step {s}: {a:.3f}" for s, a in val)
        print(f"[demo] the pipeline ran the preset through verl's one-step-off trainer on vLLM for {args.e2e_steps} "
              f"steps (validation {shown}; logs, tensorboard and checkpoint in {args.out / 'pipeline'})")
    print(f"[demo] {(time.perf_counter() - start) / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
