"""One definition per configuration: each named configuration (recipe/darl/config/preset/) resolves to the same
defining fields through every trainer's config (one-step-off, fully-async, V1), through any launch script
(`PRESET=<name>`), and through the controlled-staleness harness; docs/config.md's table is generated from the files."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from cluster_helpers import SHELLS, base_env, compose

from benchmarks.staleness.harness import HarnessConfig, preset_overrides
from recipe.darl.config import presets
from recipe.darl.core.config import PRESET as NULL_FOLLOWS

REPO = Path(__file__).resolve().parents[2]
TRAINERS = ("one_step_off", "fully_async", "v1_colocate_async")
NAMES = presets.names()


def _harness_fields(name: str) -> dict:
    """The defining fields as the harness trains them (its own config class, not the preset loader)."""
    spec = {k: v for k, v in preset_overrides(name).items() if k != "staleness"}
    h = HarnessConfig(**spec)
    out = {"replay.enable": h.method == "darl", "ppo_epochs": h.epochs, "bypass_mode": h.method == "naive",
           "rollout_is": None if h.method == "naive" else "token",
           "rollout_is_threshold": None if h.method == "naive" else
           (f"{h.icepop_low}_{h.icepop_high}" if h.method == "icepop" else h.threshold),
           "on_policy": preset_overrides(name).get("staleness") == 0}
    if h.method == "darl":
        rc = h.replay_config()
        for f in dataclasses.fields(rc):
            if f.name not in ("enable", "max_groups"):
                out[f"replay.{f.name}"] = rc.resolved(f.name) if f.name in NULL_FOLLOWS else getattr(rc, f.name)
        out["replay.behavior_weight"], out["replay.source_weight"] = rc.resolved_behavior_weight, rc.resolved_source_weight
    return out


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """{(trainer, name): resolved config} of every configuration through each trainer's `_pmis_sg` CPU script."""
    tmp = tmp_path_factory.mktemp("presets")
    env = base_env(tmp)
    env.update(MODEL_PATH=str(tmp / "model"), TRAIN_FILES=str(tmp / "data/math/train.parquet"),
               VAL_FILES=str(tmp / "data/math500/test.parquet"))
    cells = [(t, n) for t in TRAINERS for n in NAMES if n != "sync" or t == "fully_async"]
    jobs = [(SHELLS / "cpu" / f"{t}_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh", [], {**env, "PRESET": n}) for t, n in cells]
    return dict(zip(cells, compose(jobs)))


@pytest.mark.parametrize("name", NAMES)
def test_a_configuration_is_the_same_through_every_trainer_and_the_harness(composed, name):
    want = presets.defining(presets.load(name))
    assert _harness_fields(name) == want, name
    for trainer in TRAINERS:
        if (trainer, name) in composed:
            cfg = composed[(trainer, name)]
            assert cfg["preset"] == name
            assert presets.defining(cfg) == want, (trainer, name)


def test_the_study_configurations_keep_their_meaning():
    """The names the evidence reports, as the study ran them: the preset's two passes and token weights; the
    alternative's per-prompt replay on decoupled PPO; gates_only's one pass and ESS weights."""
    f = {n: presets.defining(presets.load(n)) for n in ("darl_tokens_e2", "decoupled_prompt_e2", "gates_only",
                                                        "replay_off_e2")}
    assert f["darl_tokens_e2"]["ppo_epochs"] == 2 and f["darl_tokens_e2"]["replay.source_weight"] == "tokens"
    assert f["darl_tokens_e2"]["replay.prompt_replay"] == 16 and f["darl_tokens_e2"]["replay.k"] == 4
    assert f["decoupled_prompt_e2"]["replay.prompt_replay"] == 16 and f["decoupled_prompt_e2"]["replay.k"] == 1
    assert f["decoupled_prompt_e2"]["replay.m2_budget"] is None and f["decoupled_prompt_e2"]["ppo_epochs"] == 2
    assert f["gates_only"]["ppo_epochs"] == 1 and f["gates_only"]["replay.source_weight"] == "ess"
    off = {k: v for k, v in f["replay_off_e2"].items() if k not in ("replay.k", "replay.prompt_replay")}
    assert off == {k: v for k, v in f["darl_tokens_e2"].items() if k not in ("replay.k", "replay.prompt_replay")}
    assert f["replay_off_e2"]["replay.k"] == 1 and f["replay_off_e2"]["replay.prompt_replay"] is None


def test_the_scripts_default_configurations(tmp_path):
    """`_async`, `_decoupled`, `_pmis_sg` run naive, decoupled and the preset; a PRESET other than the script's own
    names the experiment after it (its checkpoints are its own); a preset= flag wins over PRESET."""
    env = base_env(tmp_path)
    env.update(MODEL_PATH=str(tmp_path / "model"), TRAIN_FILES=str(tmp_path / "data/math/train.parquet"),
               VAL_FILES=str(tmp_path / "data/math500/test.parquet"))
    script = SHELLS / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_{}.sh"
    cfgs = compose([(Path(str(script).format(s)), [], env) for s in ("async", "decoupled", "pmis_sg")]
                   + [(Path(str(script).format("decoupled")), [], {**env, "PRESET": "sync"}),
                      (Path(str(script).format("decoupled")), ["preset=icepop"], {**env, "PRESET": "sync"})])
    assert [c["preset"] for c in cfgs] == ["naive", "decoupled", presets.DEFAULT, "sync", "icepop"]
    assert cfgs[1]["trainer"]["experiment_name"] == "fully_async_grpo_tiny_arith_cpu_replay_4_decoupled"
    assert cfgs[3]["trainer"]["experiment_name"] == "fully_async_grpo_tiny_arith_cpu_replay_4_decoupled_sync"
    assert cfgs[3]["async_training"]["staleness_threshold"] == 0 and cfgs[3]["async_training"]["partial_rollout"] is False
    assert cfgs[1]["async_training"]["staleness_threshold"] == 2  # the CPU scripts' own default


def test_sync_is_refused_where_it_cannot_hold(tmp_path):
    """Before Ray starts: sync through one-step-off (always one step stale), and sync with a staleness bound."""
    from recipe.darl.checks.config_check import ConfigError

    env = base_env(tmp_path)
    env.update(MODEL_PATH=str(tmp_path / "model"), TRAIN_FILES=str(tmp_path / "data/math/train.parquet"),
               VAL_FILES=str(tmp_path / "data/math500/test.parquet"), PRESET="sync")
    with pytest.raises(ConfigError, match="preset=sync .*one_step_off trainer"):
        compose([(SHELLS / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_decoupled.sh", [], env)])
    with pytest.raises(ConfigError, match=r"preset=sync needs async_training.staleness_threshold=0, got 4"):
        compose([(SHELLS / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_decoupled.sh", [],
                  {**env, "STALENESS_THRESHOLD": "4"})])


def test_config_md_holds_the_generated_table():
    text = (REPO / "docs" / "config.md").read_text()
    assert presets.table() in text, "regenerate: python -m recipe.darl.config.presets --table"


def test_every_configuration_named_in_the_docs_exists():
    """Every `preset=<name>` / `PRESET=<name>` in README and docs names a file of recipe/darl/config/preset/."""
    named = set()
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        named |= {a or b for a, b in re.findall(r"\bPRESET=([a-z0-9_]+)|\bpreset=([a-z0-9_]+)", path.read_text())}
    assert named and named <= set(NAMES), sorted(named - set(NAMES))


def _ablation_rows() -> list[tuple[str, str]]:
    """(flags, configuration) of every row of config.md's ablation table that names the configuration it gives."""
    text = (REPO / "docs" / "config.md").read_text().split("## Ablation flags", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| [^|]+ \| `([^`]+)` \| `([a-z0-9_]+)` \|$", text, re.MULTILINE)


def test_every_ablation_line_that_names_a_configuration_gives_it(tmp_path):
    """The preset (a `_pmis_sg` script) plus a row's flags resolves, through the trainer, to the configuration the
    row names: the docs' flag lines are the study's configurations."""
    rows = _ablation_rows()
    assert len(rows) >= 5 and {name for _, name in rows} <= set(NAMES)
    env = base_env(tmp_path)
    env.update(MODEL_PATH=str(tmp_path / "model"), TRAIN_FILES=str(tmp_path / "data/math/train.parquet"),
               VAL_FILES=str(tmp_path / "data/math500/test.parquet"))
    script = SHELLS / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
    cfgs = compose([(script, flags.split(), env) for flags, _ in rows])
    for (flags, name), cfg in zip(rows, cfgs):
        assert presets.defining(cfg) == presets.defining(presets.load(name)), (flags, name)
