"""The named configurations (`preset=<name>`): one Hydra file each in config/preset/, read here without verl.

The trainers select one as a Hydra group (`python -m recipe.darl.main_one_step_off preset=darl_tokens_e2`, or
`PRESET=<name>` with any launch script); `replay.*` and `actor_rollout_ref.*` flags after it change it. The
controlled-staleness harness reads the same files (`benchmarks/staleness/harness.py`, `preset_overrides`), so a name
means one configuration everywhere.

    python -m recipe.darl.config.presets                   # the names
    python -m recipe.darl.config.presets darl_tokens_e2    # one configuration's defining keys
    python -m recipe.darl.config.presets --table           # docs/config.md's table of configurations
    python -m recipe.darl.config.presets --write docs/config.md   # the table written between its markers
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

PRESETS = Path(__file__).with_name("preset")
REPLAY_DEFAULTS = Path(__file__).with_name("replay") / "darl.yaml"
# the configuration the D-ARL launch scripts (`_pmis_sg`) run
DEFAULT = "darl_tokens_e2"
# on-policy training: the fully-async rollouter held to staleness 0 (async_training is verl's fully-async group, so a
# preset cannot set it without making any trainer's config look fully-async)
ON_POLICY = "sync"


def names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _compose(name: str) -> dict:
    """A preset file with its defaults list composed as Hydra composes it (entries of the same group, then
    `_self_`): the subset of Hydra's rules the preset files use."""
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise KeyError(f"preset={name!r} is not a configuration; known: {', '.join(names())}")
    body = yaml.safe_load(path.read_text()) or {}
    defaults = body.pop("defaults", ["_self_"])
    out: dict = {}
    for entry in defaults:
        out = _merge(out, body if entry == "_self_" else _compose(entry))
    return out


def load(name: str) -> dict[str, Any]:
    """The keys preset `name` sets, with `replay:` complete (replay/darl.yaml's defaults under the preset's)."""
    values = _compose(name)
    replay = yaml.safe_load(REPLAY_DEFAULTS.read_text())
    values["replay"] = _merge(replay, values.get("replay", {}))
    return values


def defining(config: dict[str, Any]) -> dict[str, Any]:
    """The fields that define a configuration, from a resolved trainer config or `load`'s dict: replay (resolved, so
    null and its pmis-given value compare equal), passes, rollout correction and the rollouter's staleness hold."""
    from recipe.darl.core.config import PRESET, ReplayConfig

    replay = {k: v for k, v in config["replay"].items() if k != "max_groups"}
    rc = ReplayConfig.from_dict(replay)
    corr = config["algorithm"]["rollout_correction"]
    out: dict[str, Any] = {"replay.enable": rc.enable,
                           "ppo_epochs": config["actor_rollout_ref"]["actor"]["ppo_epochs"],
                           "bypass_mode": corr["bypass_mode"], "rollout_is": corr["rollout_is"],
                           "rollout_is_threshold": corr["rollout_is_threshold"] if corr["rollout_is"] else None,
                           "on_policy": (config["async_training"]["staleness_threshold"] == 0 if config.get("async_training")
                                         else config.get("preset") == ON_POLICY)}
    if rc.enable:
        for key in replay:
            if key != "enable":
                out[f"replay.{key}"] = rc.resolved(key) if key in PRESET else getattr(rc, key)
        out["replay.behavior_weight"], out["replay.source_weight"] = rc.resolved_behavior_weight, rc.resolved_source_weight
    return out


def describe(name: str) -> str:
    """The comment under a preset file's package line: what it is."""
    lines = (PRESETS / f"{name}.yaml").read_text().splitlines()[1:]
    return " ".join(line[2:] for line in lines if line.startswith("# ")).strip()


_COLUMNS = (("passes", "ppo_epochs"), ("pi_old, IS", None), ("K", "replay.k"), ("order", "replay.order"),
            ("ratio", "replay.ratio"), ("reuse cap", "replay.max_reuse"), ("behavior w.", "replay.behavior_weight"),
            ("source w.", "replay.source_weight"), ("m2 gate", "replay.m2_budget"),
            ("trust region", "replay.behavior_clip"), ("per-prompt", "replay.prompt_replay"),
            ("warm-up", "replay.warmup"), ("zero-adv filter", "replay.filter_zero_adv"))


def _cell(fields: dict[str, Any], key: str | None) -> str:
    if key is None:  # how pi_old and the IS weights are made
        if fields["bypass_mode"]:
            return "rollout's, none"
        return f"recomputed, C = {fields['rollout_is_threshold']}" + (", s = 0" if fields["on_policy"] else "")
    if key.startswith("replay.") and not fields["replay.enable"]:
        return ""
    value = fields.get(key)
    return "off" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def table() -> str:
    """docs/config.md's table of configurations, generated from the preset files: the resolved defining fields
    (replay's columns blank where replay is off), then what each one is."""
    rows = ["| `preset=` | " + " | ".join(c for c, _ in _COLUMNS) + " |", "|---" * (len(_COLUMNS) + 1) + "|"]
    for name in names():
        fields = defining(load(name))
        rows.append(f"| `{name}` | " + " | ".join(_cell(fields, key) for _, key in _COLUMNS) + " |")
    rows.append("")
    rows += [f"- `{name}`: {describe(name)}" for name in names()]
    return "\n".join(rows) + "\n"


def write(path: Path) -> None:
    """Replaces what lies between `<!-- presets:begin -->` and `<!-- presets:end -->` in `path` with `table()`."""
    text = path.read_text()
    begin, end = "<!-- presets:begin -->\n", "<!-- presets:end -->"
    head, rest = text.split(begin, 1)
    path.write_text(head + begin + table() + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table(), end="")
    elif sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write(Path(sys.argv[2]))
    elif sys.argv[1:]:
        for key, value in defining(load(sys.argv[1])).items():
            print(f"{key}={value}")
    else:
        print("\n".join(names()))
