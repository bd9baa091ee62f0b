"""The study's configurations as verl's trainers run them: a named configuration (recipe/darl/config/preset/) through
the CPU launch script of its kind (shells/cpu/<trainer>_grpo_tiny_arith_cpu_replay_4_<script>.sh) with
`preset=<name>`, the file the harness reads too (`harness.preset_overrides`).

    python -m benchmarks.staleness.pipeline_configs darl_tokens_e2     # prints: the script suffix, then the overrides

`sync` holds the fully-async rollouter at staleness 0 (its preset, and STALENESS_THRESHOLD / PARTIAL_ROLLOUT in the
environment, which the pipeline stage sets for every other configuration).
"""

from __future__ import annotations

import sys

from benchmarks.staleness.harness import preset_overrides
from recipe.darl.config import presets

SCRIPTS = {"naive": "async", "decoupled": "decoupled", "icepop": "decoupled", "darl": "pmis_sg"}


def launch(name: str) -> tuple[str, list[str], dict[str, str]]:
    """(script suffix, Hydra overrides, environment) of the named configuration `name`."""
    if name not in presets.names():
        raise KeyError(f"{name!r} is not a configuration of recipe/darl/config/preset/ ({', '.join(presets.names())})")
    spec = preset_overrides(name)
    env = {"STALENESS_THRESHOLD": "0", "PARTIAL_ROLLOUT": "false"} if spec.get("staleness") == 0 else {}
    return SCRIPTS[spec["method"]], [f"preset={name}"], env


if __name__ == "__main__":
    script, overrides, env = launch(sys.argv[1])
    print(" ".join([script, *(f"{k}={v}" for k, v in env.items()), "--", *overrides]))
