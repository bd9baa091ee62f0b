"""The study's configurations as verl's trainers run them: each name of `run_study.METHODS` as a CPU launch script
(shells/cpu/<trainer>_grpo_tiny_arith_cpu_replay_4_<script>.sh) and the Hydra overrides that make it the same
configuration, so the held-out stage through the pipeline runs whatever the development stage chose.

    python -m benchmarks.staleness.pipeline_configs darl_tokens_e2     # prints: the script suffix, then the overrides

The harness's replay settings are `replay.*` keys of the same names (`HarnessConfig.replay_config`), every one of
them pinned (the CPU scripts' own `replay.warmup=2` for short runs included), `epochs` is verl's `actor.ppo_epochs`
(always pinned); `icepop` is the decoupled script with verl's `decoupled_token_icepop` bounds; `sync` is
decoupled PPO with the fully-async rollouter held to staleness 0 (environment, not overrides).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from benchmarks.staleness.harness import HarnessConfig
from benchmarks.staleness.run_study import METHODS
from recipe.darl.core.config import ReplayConfig

SCRIPTS = {"naive": "async", "decoupled": "decoupled", "icepop": "decoupled", "darl": "pmis_sg"}
# the replay settings the harness has: every one is pinned
REPLAY_KEYS = tuple(f.name for f in dataclasses.fields(ReplayConfig)
                    if f.name != "enable" and f.name in {g.name for g in dataclasses.fields(HarnessConfig)})
ICEPOP_BOUNDS = "0.5_5.0"  # verl's RolloutCorrectionConfig.decoupled_token_icepop(): lower_upper


def _hydra(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def launch(name: str) -> tuple[str, list[str], dict[str, str]]:
    """(script suffix, Hydra overrides, environment) of the study's configuration `name`."""
    if name not in METHODS:
        raise KeyError(f"{name!r} is not a configuration of benchmarks/staleness/run_study.py (METHODS)")
    spec = dict(METHODS[name])
    method = spec.pop("method")
    overrides, env = [], {}
    if spec.pop("staleness", None) == 0:  # on-policy: the rollouter never runs ahead
        env = {"STALENESS_THRESHOLD": "0", "PARTIAL_ROLLOUT": "false"}
    # pinned even at 1: the `_pmis_sg` scripts run the preset's two passes
    overrides.append(f"actor_rollout_ref.actor.ppo_epochs={spec.pop('epochs', 1)}")
    if method == "icepop":  # the script's alias threshold (C = 2) goes; verl's IcePop bounds take its place
        overrides += ["~algorithm.rollout_is_threshold", f"algorithm.rollout_correction.rollout_is_threshold={ICEPOP_BOUNDS}"]
    unknown = sorted(set(spec) - set(REPLAY_KEYS))
    if unknown or (spec and method != "darl"):
        raise ValueError(f"{name}: no launch-script override for {unknown or sorted(spec)}")
    if method == "darl":
        harness = HarnessConfig(method="darl", **spec)
        overrides += [f"replay.{key}={_hydra(getattr(harness, key))}" for key in REPLAY_KEYS]
    return SCRIPTS[method], overrides, env


if __name__ == "__main__":
    script, overrides, env = launch(sys.argv[1])
    print(" ".join([script, *(f"{k}={v}" for k, v in env.items()), "--", *overrides]))
