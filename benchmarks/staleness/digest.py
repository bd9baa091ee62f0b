"""Digests of short harness runs, to show a change to the step leaves its outputs bit-identical: run it at two
commits on one machine and compare the files.

    python -m benchmarks.staleness.digest OUT.json [--methods naive decoupled darl] [--seeds 0 1 2] [--steps 10]

Each run (scarce task, lr 2e-4, s = 4, two mini-batches) gives its final accuracy and a sha256 of every step's metrics
(wall-clock fields left out).
"""

from __future__ import annotations

import argparse
import hashlib
import json

from benchmarks.staleness.run_study import run_one


def digest(method: str, seed: int, steps: int) -> list:
    common = {"task": "scarce", "lr": 2e-4, "steps": steps, "eval_every": steps, "val_size": 100, "minibatches": 2}
    result = run_one({"method_name": method, "staleness": 4, "seed": seed, "common": common})
    metrics = [{k: v for k, v in m.items() if "time" not in k and k != "wall"} for m in result["steps"]]
    return [result["final_accuracy"], hashlib.sha256(json.dumps(metrics, sort_keys=True, default=str).encode()).hexdigest()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--methods", nargs="+", default=["naive", "decoupled", "darl"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    runs = {f"{m}/{s}": digest(m, s, args.steps) for m in args.methods for s in args.seeds}
    with open(args.out, "w") as f:
        json.dump(runs, f, indent=1)
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
