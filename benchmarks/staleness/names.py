"""Method names in the archived studies (docs/evidence/<study>/results.jsonl.gz): one mapping, applied once.

A study's method name says what the run trained. When the preset changed, the name `darl` (harness) and
`pmis_sg` (through verl's trainers) moved to the new preset; the runs of earlier presets carry explicit names:

    darl_no_prompt      the group-replay preset: the preset with replay.prompt_replay=false (shipped until 2026-11-25)
    darl_v2             the preset with the two-sided behavior trust region (replay.behavior_clip_high=0.2)
    darl_chi2           the first design (chi2-ranked selection)
    darl_prompt_always  per-prompt replay for every returning prompt, on the group-replay preset

    python -m benchmarks.staleness.names docs/evidence      # renames every archive in place; idempotent

Each renamed run keeps the name it was recorded under in `name_at_run`. An archive with any such run was renamed
already and is left as it is, so runs added to it later under today's names keep them.

Source weights: until 2026-12-02 a null `source_weight` resolved to ESS weights under `pmis` (tokens without); since
then null means tokens and the harness records the value it ran. `ran_source_weight` reads an archived record.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

# the group-replay preset and its one-switch variants (the scarce regime and the reruns from the shipped weights)
_GROUP_PRESET = {"darl": "darl_no_prompt", "darl_prompt_zero": "darl", "darl_e2": "darl_no_prompt_e2",
                 "darl_high1": "darl_no_prompt_high1", "darl_no_bclip": "darl_no_prompt_no_bclip",
                 "darl_r1": "darl_no_prompt_r1", "darl_success": "darl_no_prompt_success",
                 "darl_success_no_bclip": "darl_no_prompt_success_no_bclip", "darl_variance": "darl_no_prompt_variance",
                 "darl_prompt": "darl_prompt_always", "darl_prompt_age8": "darl_prompt_always_age8",
                 "darl_prompt_age16": "darl_prompt_always_age16", "darl_prompt_mixed": "darl_prompt_always_mixed",
                 "darl_prompt_r025": "darl_prompt_always_r025", "darl_prompt_shared": "darl_prompt_always_shared"}
# the second design's first regimes ran when the preset bounded the trust region on both sides
_TWO_SIDED = {"darl": "darl_v2", "darl_no_bclip": "darl_v2_no_bclip", "darl_no_m2": "darl_v2_no_m2",
              "gates_only": "gates_v2", "bclip_only": "bclip_v2_only"}
# the first design's study: its `darl` ranked groups by chi2
_FIRST_DESIGN = {"darl": "darl_chi2", "darl_k1": "darl_chi2_k1", "darl_k2": "darl_chi2_k2", "darl_k8": "darl_chi2_k8",
                 "darl_keep_zero_adv": "darl_chi2_keep_zero_adv", "darl_max_reuse1": "darl_chi2_max_reuse1",
                 "pmis_no_selection": "darl_chi2_pmis_no_selection", "replay_uniform": "darl_chi2_replay_uniform",
                 "selection_no_pmis": "darl_chi2_selection_no_pmis"}

# archive folder -> {name at run: name now}; the pipeline archive renames its `config` field
RENAMES: dict[str, dict[str, str]] = {
    "scarce": _GROUP_PRESET,
    "stress_shipped": _GROUP_PRESET,
    "benign_shipped": _GROUP_PRESET,
    "stress": _TWO_SIDED,
    "benign": _TWO_SIDED,
    "chi2_selection": _FIRST_DESIGN,
    "pipeline_scarce": {"pmis_sg": "pmis_sg_no_prompt", "pmis_sg_prompt_zero": "pmis_sg",
                        "pmis_sg_e2": "pmis_sg_no_prompt_e2", "pmis_sg_prompt": "pmis_sg_prompt_always",
                        "pmis_sg_prompt_mixed": "pmis_sg_prompt_always_mixed"},
}


def ran_source_weight(config: dict[str, Any]) -> str:
    """The source weights an archived harness run trained with: its recorded value, or for a null one (recorded before
    2026-12-02) what null meant then, "ess" under pmis and "tokens" without."""
    if config.get("source_weight") is not None:
        return config["source_weight"]
    return "ess" if config.get("pmis", True) else "tokens"


def rename_run(run: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """The run under its name now (a copy); a run that already carries `name_at_run` is returned as it is."""
    if "name_at_run" in run:
        return run
    key = "method_name" if "method_name" in run else "config"
    old = run[key]
    if old not in mapping:
        return run
    return {**run, key: mapping[old], "name_at_run": old}


def rename_archive(path: Path, mapping: dict[str, str]) -> int:
    """Rewrites results.jsonl(.gz) at `path` with the mapping; returns how many runs were renamed."""
    runs = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()] \
        if path.suffix == ".gz" else [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if any("name_at_run" in r for r in runs):  # renamed already: later runs carry today's names
        return 0
    renamed = [rename_run(r, mapping) for r in runs]
    changed = sum(a is not b for a, b in zip(runs, renamed))
    if changed:
        text = "".join(json.dumps(r) + "\n" for r in renamed).encode()
        path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)
    return changed


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "docs/evidence")
    for study, mapping in RENAMES.items():
        for path in (root / study / "results.jsonl.gz", root / study / "results.jsonl"):
            if path.exists():
                print(f"{path}: {rename_archive(path, mapping)} run(s) renamed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
