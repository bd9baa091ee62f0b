"""Before Ray starts (recipe/darl/checks/fixups.py, preflight.py): the sdpa fallback when flash_attn cannot be
imported, and the refusal of a wandb logger without wandb credentials; both through the launch scripts too."""

import shlex
import subprocess
import sys

import pytest
from cluster_helpers import SHELLS, base_env, compose as compose_scripts, flash_attn_importable
from hydra import compose, initialize_config_module

from recipe.darl.checks import fixups, preflight
from recipe.darl.checks.config_check import ConfigError
from recipe.darl.checks.fixups import select_attention
from recipe.darl.checks.preflight import logger_problems, wandb_credentials_found
from recipe.darl.main_one_step_off import MODE

PMIS_17B = SHELLS / "one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"
FA_PMIS = SHELLS / "fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"


def _compose(*overrides, config_name="one_step_off_trainer"):
    with initialize_config_module(config_module="recipe.darl.config", version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def _attn(cfg):
    return (cfg.actor_rollout_ref.model.get("override_config") or {}).get("attn_implementation")


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("config_name", ["one_step_off_trainer", "fully_async_trainer"])
def test_flash_attn_importable_keeps_verls_default(config_name):
    cfg = _compose(config_name=config_name)
    assert _attn(cfg) is None  # verl then uses flash_attention_2 (verl/workers/config/model.py)
    assert select_attention(cfg, importable=lambda: True) is None
    assert _attn(cfg) is None


@pytest.mark.parametrize("config_name", ["one_step_off_trainer", "fully_async_trainer"])
def test_missing_flash_attn_selects_sdpa_and_says_so(config_name):
    cfg = _compose(config_name=config_name)
    line = select_attention(cfg, importable=lambda: False)
    assert _attn(cfg) == "sdpa"
    assert line.count("\n") == 0 and "flash_attn cannot be imported" in line and "attn_implementation=sdpa" in line


@pytest.mark.parametrize("chosen", ["eager", "sdpa", "flash_attention_2"])
def test_an_explicit_choice_is_kept(chosen):
    cfg = _compose(f"++actor_rollout_ref.model.override_config.attn_implementation={chosen}")
    line = select_attention(cfg, importable=lambda: False)
    assert _attn(cfg) == chosen
    if chosen == "flash_attention_2":  # kept, with a warning that the workers will fail
        assert "warning" in line and "flash_attn cannot be imported" in line
    else:
        assert line is None
    assert select_attention(cfg, importable=lambda: True) is None and _attn(cfg) == chosen


def test_verl_builds_the_model_config_with_sdpa(tiny_model):
    """The key set is the one verl 0.9.1 reads: its HFModelConfig loads the hf_config with sdpa."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose(f"actor_rollout_ref.model.path={tiny_model}")
    select_attention(cfg, importable=lambda: False)
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    assert model_config.hf_config._attn_implementation == "sdpa"


def test_flash_attn_importable_detects_the_package(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)  # put back after the test
    assert fixups.flash_attn_importable() is flash_attn_importable()
    good, broken = tmp_path / "good", tmp_path / "broken"
    (good / "flash_attn").mkdir(parents=True)
    (good / "flash_attn" / "__init__.py").write_text("")
    (broken / "flash_attn").mkdir(parents=True)  # a build against another torch fails at import
    (broken / "flash_attn" / "__init__.py").write_text("raise OSError('undefined symbol: _ZN3c10')\n")
    try:
        monkeypatch.syspath_prepend(str(broken))
        assert fixups.flash_attn_importable() is False
        sys.modules.pop("flash_attn", None)
        monkeypatch.syspath_prepend(str(good))
        assert fixups.flash_attn_importable() is True
    finally:
        sys.modules.pop("flash_attn", None)  # never leave the stand-in behind


@pytest.mark.skipif(flash_attn_importable(), reason="flash_attn is installed here: nothing to fall back from")
@pytest.mark.parametrize("script", [PMIS_17B, FA_PMIS], ids=["one_step_off", "fully_async"])
def test_launch_scripts_fall_back_to_sdpa_with_one_line(script, tmp_path, capsys):
    env = base_env(tmp_path)
    (cfg,) = compose_scripts([(script, [], env)])
    assert capsys.readouterr().err.count("flash_attn cannot be imported: using attn_implementation=sdpa") == 1
    assert cfg["actor_rollout_ref"]["model"]["override_config"]["attn_implementation"] == "sdpa"

    # the user's own choice wins, silently
    (cfg,) = compose_scripts([(script, ["++actor_rollout_ref.model.override_config.attn_implementation=eager"], env)])
    assert "attn_implementation" not in capsys.readouterr().err
    assert cfg["actor_rollout_ref"]["model"]["override_config"]["attn_implementation"] == "eager"


# --------------------------------------------------------------------------- logger


def _netrc(tmp_path, text):
    path = tmp_path / "netrc"
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_wandb_credentials(tmp_path):
    home = str(tmp_path / "home")  # no .netrc there
    assert not wandb_credentials_found({}, home=home)
    assert not wandb_credentials_found({"WANDB_API_KEY": " "}, home=home)
    assert wandb_credentials_found({"WANDB_API_KEY": "k"}, home=home)
    assert wandb_credentials_found({"WANDB_MODE": "offline"}, home=home)
    assert not wandb_credentials_found({"WANDB_MODE": "online"}, home=home)
    ok = _netrc(tmp_path, "machine api.wandb.ai\n  login user\n  password secret\n")
    assert wandb_credentials_found({"NETRC": ok}, home=home)
    other = _netrc(tmp_path, "machine example.com login user password secret\n")
    assert not wandb_credentials_found({"NETRC": other}, home=home)
    own = _netrc(tmp_path, "machine wandb.corp.example login user password secret\n")
    assert wandb_credentials_found({"NETRC": own, "WANDB_BASE_URL": "https://wandb.corp.example:8443"}, home=home)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".netrc").write_text("machine api.wandb.ai login user password secret\n")
    (tmp_path / "home" / ".netrc").chmod(0o600)
    assert wandb_credentials_found({}, home=home)  # ~/.netrc, where `wandb login` writes


def test_wandb_logger_without_credentials_is_a_problem(tmp_path):
    home = str(tmp_path)
    cfg = _compose()  # verl's default logger: console + wandb
    (problem,) = logger_problems(cfg, env={}, home=home)
    assert "trainer.logger" in problem and "WANDB_API_KEY" in problem and "wandb" in problem
    assert logger_problems(cfg, env={"WANDB_API_KEY": "k"}, home=home) == []
    assert logger_problems(_compose('trainer.logger=["console","tensorboard"]'), env={}, home=home) == []
    assert logger_problems(_compose("trainer.logger=wandb"), env={}, home=home) != []
    (typo,) = logger_problems(_compose('trainer.logger=["console","tensorbaord"]'), env={}, home=home)
    assert "unknown backend(s) ['tensorbaord']" in typo and "tensorboard" in typo


def test_launch_script_refuses_wandb_without_credentials_before_ray(tmp_path):
    """D-ARL's checks refuse it, raising before the config is used (a dry run exits non-zero naming the key, before
    Ray in a real run: tests/cluster/test_shells_env.py)."""
    env = base_env(tmp_path)
    env["LOGGER"] = '["console","wandb"]'
    with pytest.raises(ConfigError, match=r"trainer.logger=\['console', 'wandb'\] includes wandb(.|\n)*WANDB_API_KEY"):
        compose_scripts([(PMIS_17B, [], env)])
    env["WANDB_API_KEY"] = "not-a-real-key"
    (cfg,) = compose_scripts([(PMIS_17B, [], env)])
    assert cfg["trainer"]["logger"] == ["console", "wandb"]


@pytest.mark.parametrize("setting, expected", [
    ({}, '["console","tensorboard"]'),
    ({"WANDB_API_KEY": "k"}, '["console","tensorboard","wandb"]'),
    ({"NETRC": "wandb"}, '["console","tensorboard","wandb"]'),
    ({"NETRC": "other"}, '["console","tensorboard"]'),
    ({"LOGGER": '["console"]', "WANDB_API_KEY": "k"}, '["console"]'),
    ({"LOGGER": '["console","wandb"]'}, '["console","wandb"]'),
])
def test_common_sh_logger_default(setting, expected, tmp_path):
    """console + tensorboard by default; wandb added when WANDB_API_KEY or a netrc key for api.wandb.ai is there."""
    env = base_env(tmp_path)
    env.update(DARL_PRINT_CMD="1", **setting)
    if setting.get("NETRC") == "wandb":
        env["NETRC"] = _netrc(tmp_path, "machine api.wandb.ai\n  login user\n  password secret\n")
    elif setting.get("NETRC") == "other":
        env["NETRC"] = _netrc(tmp_path, "machine api.wandb.aix login user password secret\n")
    out = subprocess.run(["bash", str(PMIS_17B)], env=env, capture_output=True, text=True, check=True).stdout
    (logger,) = [w for w in shlex.split(out) if w.startswith("trainer.logger=")]  # undo printf %q
    assert logger == "trainer.logger=" + expected


# --------------------------------------------------------------------------- the per-prompt store's bound

_STORE = ("replay.enable=true", "replay.prompt_replay=16", "data.max_response_length=1024", "data.train_batch_size=32",
          "actor_rollout_ref.rollout.n=8")


@pytest.mark.parametrize("age, held, warned", [("null", 16000, False), (40, 10240, False), (8, 2048, True)])
def test_the_prompt_store_line_gives_its_bound_from_the_rows_and_the_age(age, held, warned):
    cfg = _compose(*_STORE, f"replay.prompt_replay_max_age={age}")
    line = preflight.prompt_store_line(cfg, MODE, rows_of=lambda paths: 1000)
    # no age: 1000 prompts x 16; age A: at most A x 32 prompts x 8 responses (40 steps pass over the 1000 prompts)
    assert f"holds at most {held} responses" in line
    assert f"<= {held * 1024 * 9 / 2**30:.2f} GiB at 1024 tokens" in line
    assert ("shorter than one pass over the 1000 training prompts (32 steps at 32 a step)" in line) == warned
    assert ("bounds it to age x B x n" in line) == (age == "null")


def test_the_prompt_store_line_without_rows_and_when_off(tmp_path):
    assert preflight.prompt_store_line(_compose(*_STORE[1:]), MODE) is None  # replay off
    assert preflight.prompt_store_line(_compose(_STORE[0], "replay.prompt_replay=false"), MODE) is None  # per-prompt replay off
    assert preflight.prompt_store_line(_compose(_STORE[0], "replay.pmis=false"), MODE) is None  # null follows pmis false: off
    # null follows the preset (16): the line is printed for the preset as shipped
    assert preflight.prompt_store_line(_compose(*_STORE[:1]), MODE, rows_of=lambda paths: None).startswith(
        "[D-ARL] replay.prompt_replay=16: the per-prompt store keeps 16 responses")
    line = preflight.prompt_store_line(_compose(*_STORE), MODE, rows_of=lambda paths: None)
    assert "keeps 16 responses of every prompt seen" in line and "prompt_replay_max_age" in line
    # the rows come from the parquet files' metadata; a file that is not local parquet gives no count
    import pandas as pd

    for name, rows in (("a.parquet", 3), ("b.parquet", 5)):
        pd.DataFrame({"prompt": ["x"] * rows}).to_parquet(tmp_path / name)
    assert preflight.parquet_rows([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]) == 8
    assert preflight.parquet_rows([str(tmp_path / "a.parquet"), "hdfs://x/c.parquet"]) is None
    cfg = _compose(*_STORE, f"data.train_files={tmp_path / 'b.parquet'}", "++faults.check_data=false")
    lines = preflight.preflight(cfg, MODE, env={"WANDB_MODE": "offline"})[1]
    assert any("holds at most 80 responses" in line for line in lines)  # 5 prompts x 16
