"""Reruns archived study runs from their recorded configurations and compares the accuracy curves.

    python -m benchmarks.staleness.reproduce docs/evidence/scarce darl:4:6 decoupled:4:6

Each run is `method_name:staleness:seed` of the archive; it is rerun with today's code (keys a configuration
no longer has must hold their old defaults, or the run is refused) and every evaluation point is compared
exactly. Exit status 0 when all are bit-identical.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from benchmarks.staleness.harness import HarnessConfig, run
from benchmarks.staleness.run_study import study_results

# keys of retired designs, and the value under which a run did not use them
RETIRED = {"success": False, "success_max_age": None, "max_score": None, "prompt_replay_budget": "extra",
           "prompt_replay_norm": "split", "prompt_replay_when": None, "rescore": "all"}


def config_of(record: dict) -> HarnessConfig:
    """Today's configuration of an archived run; raises if the run used a design that is no longer in the code."""
    fields = {f.name for f in dataclasses.fields(HarnessConfig)}
    values = dict(record["config"])
    for key, off in RETIRED.items():
        value = values.pop(key, off)
        # per-prompt replay ran as zero_adv (the only behaviour left) or was off
        if key == "prompt_replay_when" and (value == "zero_adv" or not values.get("prompt_replay")):
            continue
        if value != off:
            raise ValueError(f"{record['method_name']} seed {record['seed']}: {key}={value!r} is a retired design")
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"keys this harness does not know: {unknown}")
    values.pop("model_dir", None)
    return HarnessConfig(**values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archive", type=Path, help="a study folder holding results.jsonl(.gz)")
    p.add_argument("runs", nargs="+", help="method_name:staleness:seed")
    args = p.parse_args(argv)
    records = study_results(args.archive)
    same = True
    for spec in args.runs:
        name, staleness, seed = spec.split(":")
        matches = [r for r in records if r["method_name"] == name and r["staleness"] == int(staleness)
                   and r["seed"] == int(seed)]
        if len(matches) != 1:
            raise SystemExit(f"{spec}: {len(matches)} archived runs match")
        record = matches[0]
        result = run(config_of(record))
        old = [e["accuracy"] for e in record["evals"]]
        new = [e["accuracy"] for e in result["evals"]]
        ok = old == new
        same &= ok
        print(f"{spec}: archived final {record['final_accuracy']}, rerun {result['final_accuracy']}; "
              f"{len(old)} evaluation points {'bit-identical' if ok else 'DIFFER'}", flush=True)
        if not ok:
            print(f"  archived {old}\n  rerun    {new}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
