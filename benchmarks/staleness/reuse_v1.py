"""Copies the first study's benign naive runs and decoupled seeds 1-2 into a new study's results file.

    python -m benchmarks.staleness.reuse_v1 docs/evidence/v1/results.jsonl.gz runs/study/benign/results.jsonl

Their code path is unchanged and bit-reproducible (decoupled seed 0 is rerun by study.sh to check it). Each
copied run carries `reused_from`, and the cost target ignores its step times (not measured side by side).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.staleness.run_study import load_results


def main(argv: list[str]) -> int:
    source, target = Path(argv[0]), Path(argv[1])
    runs = load_results(source.with_suffix("") if source.suffix == ".gz" else source)
    kept = [r for r in runs if r["staleness"] in (1, 4, 8) and
            (r["method_name"] == "naive" or (r["method_name"] == "decoupled" and r["seed"] != 0))]
    with target.open("a") as f:
        for r in kept:
            f.write(json.dumps(dict(r, reused_from=str(source))) + "\n")
    print(f"copied {len(kept)} runs from {source} into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
