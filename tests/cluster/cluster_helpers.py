"""Helpers for tests/cluster: launch scripts composed (in this process, or with DARL_DRY_RUN=1), config checks, a
tiny-model fallback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHELLS = ROOT / "shells"
VARIANTS = ("async", "decoupled", "pmis_sg")
# the only keys the three launch configurations `_async`, `_decoupled`, `_pmis_sg` may change: the keys their presets
# (naive, decoupled, darl_tokens_e2) set (docs/config.md, 'Configurations')
def configuration_keys() -> set[str]:
    from recipe.darl.config import presets

    keys: set[str] = set()
    for name in ("naive", "decoupled", presets.DEFAULT):
        keys |= set(flatten(presets.load(name)))
    return keys | {"critic.ppo_epochs"}  # verl's critic key follows the actor's passes


# derived from the script's file name, so they differ too (verl interpolates the experiment name into the tracer's)
NAME_KEYS = {"trainer.experiment_name", "trainer.default_local_dir", "actor_rollout_ref.rollout.trace.experiment_name"}
# logging lines; "[darl] ..." banner, "[D-ARL] ..." notes, verl's validate_config report
_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d[ T]|darl\] |D-ARL\] |validate_config\] )")


WANDB_VARS = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC")


def flash_attn_importable() -> bool:
    from recipe.darl.checks.fixups import flash_attn_importable as importable

    return importable()


def base_env(tmp: Path) -> dict[str, str]:
    """Environment for a dry run: temp model folder and data files that exist, one thread, no Ray auth."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    for rel in ("gsm8k/train.parquet", "gsm8k/test.parquet", "math/train.parquet", "math500/test.parquet"):
        (tmp / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "data" / rel).touch()
    env = dict(os.environ)
    for key in ("TRAINER_GPUS", "ROLLOUT_GPUS", "NNODES", "ROLLOUT_NNODES", "EXPERIMENT_NAME", "SEED", "LOGGER", "CKPT_DIR",
                "TRAIN_FILES", "VAL_FILES", "DARL_PRINT_CMD", "SLURM_JOB_ID", "SBATCH_ARGS", "GPU_CHECK",
                "GPU_MEMORY_UTILIZATION", "WEIGHT_SYNC_BUCKET_MB", "MAX_TOKENS_PER_GPU", *WANDB_VARS):
        env.pop(key, None)
    env.update(OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", DARL_DRY_RUN="1", PYTHON=sys.executable,
               MODEL_PATH=str(model), DATA_DIR=str(tmp / "data"), CKPT_ROOT=str(tmp / "ckpt"),
               NETRC=str(tmp / "no_netrc"))  # no wandb key from the developer's ~/.netrc either
    return env


def parse_dry_run(stdout: str) -> dict:
    """The resolved config main_one_step_off prints (log lines before it dropped)."""
    return yaml.safe_load("\n".join(line for line in stdout.splitlines() if not _LOG_LINE.match(line)))


def compose(jobs: list[tuple[Path, list[str], dict]]) -> list[dict]:
    """Each [(script, args, env)]'s resolved config, composed in this process: the script prints its command
    (DARL_PRINT_CMD=1, bash alone), and the command's entry point composes and prepares it as its `main` does, under
    the job's environment. One verl import for all of them, where each `run_dry` subprocess imports verl anew (about
    10 CPU-s); test_dry_run.py checks that both give the same config."""
    from hydra import compose as hydra_compose, initialize_config_module
    from omegaconf import OmegaConf

    from recipe.darl import main_fully_async, main_one_step_off, main_v1

    prepare_config = main_one_step_off.prepare_config
    entry = {"recipe.darl.main_one_step_off": ("one_step_off_trainer",
                                               lambda cfg: prepare_config(cfg, main_one_step_off.MODE)),
             "recipe.darl.main_fully_async": ("fully_async_trainer", main_fully_async.prepare_fully_async_config),
             "recipe.darl.main_v1": ("v1_trainer", lambda cfg: prepare_config(cfg, main_v1.launch_mode(cfg)))}
    out = []
    for script, args, env in jobs:
        printed = subprocess.run(["bash", str(script), *args], env={**env, "DARL_PRINT_CMD": "1"}, capture_output=True,
                                 text=True, check=True).stdout
        _python, flag, module, *overrides = shlex.split(printed)
        assert flag == "-m" and module in entry, printed
        config_name, prepare = entry[module]
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            with initialize_config_module("recipe.darl.config", version_base=None):
                cfg = hydra_compose(config_name=config_name, overrides=main_one_step_off.rewrite_plus_overrides(overrides))
            out.append(OmegaConf.to_container(prepare(cfg), resolve=True))
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return out


def run_dry(jobs: list[tuple[Path, list[str], dict]], timeout: float = 120) -> list[dict]:
    """Runs [(script, args, env)] concurrently; returns each resolved config (fails the test on an error).

    The working directory is the temp folder above DATA_DIR (Hydra writes its outputs/ there), which also
    shows the scripts work from any directory.
    """
    procs = [subprocess.Popen(["bash", str(s), *args], env=env, cwd=str(Path(env["DATA_DIR"]).parent),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for s, args, env in jobs]
    out = []
    for (script, _, _), p in zip(jobs, procs):
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"{script.name} failed ({p.returncode}):\n{stderr[-3000:]}"
        out.append(parse_dry_run(stdout))
    return out


def flatten(d, prefix=""):
    flat = {}
    if isinstance(d, dict):
        for k, v in d.items():
            flat.update(flatten(v, f"{prefix}{k}."))
    else:
        flat[prefix[:-1]] = d
    return flat


def diff_keys(a: dict, b: dict) -> set[str]:
    fa, fb = flatten(a), flatten(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k, "<absent>") != fb.get(k, "<absent>")}


def script_path(family: str, variant: str) -> Path:
    return SHELLS / f"one_step_off_grpo_{family}_replay_4_{variant}.sh"


def check_key_values(fam, trainer_gpus: int, rollout_gpus: int, dataset: str) -> None:
    """The values every launch script must resolve to (docs/config.md)."""
    for variant, cfg in fam.configs.items():
        arr, algo, trainer = cfg["actor_rollout_ref"], cfg["algorithm"], cfg["trainer"]
        rollout, corr, replay = arr["rollout"], algo["rollout_correction"], cfg["replay"]
        assert rollout["name"] == "vllm" and rollout["mode"] == "async"
        assert arr["hybrid_engine"] is False
        assert rollout["calculate_log_probs"] is True and rollout["free_cache_engine"] is False
        assert rollout["tensor_model_parallel_size"] == 1 and rollout["n"] == 8
        # vLLM's share, with the weight sync's buffers (up to 3 x 1024 MB) outside it on the same GPU (docs/performance.md, 'GPU memory')
        assert rollout["gpu_memory_utilization"] == 0.8
        assert rollout["checkpoint_engine"]["update_weights_bucket_megabytes"] == 1024
        # sdpa when flash_attn cannot be imported (recipe/darl/checks/preflight.py), else verl's flash_attention_2
        attn = (arr["model"].get("override_config") or {}).get("attn_implementation")
        assert attn == (None if flash_attn_importable() else "sdpa")
        assert trainer["n_gpus_per_node"] == trainer_gpus and trainer["nnodes"] == 1
        assert cfg["rollout"]["n_gpus_per_node"] == rollout_gpus and cfg["rollout"]["nnodes"] == 1
        assert rollout["n_gpus_per_node"] == rollout_gpus and rollout["nnodes"] == 1  # main_one_step_off's one-step-off copy
        assert arr["actor"]["strategy"] == "fsdp2" and arr["actor"]["fsdp_config"]["strategy"] == "fsdp2"
        assert algo["adv_estimator"] == "grpo" and arr["actor"]["use_kl_loss"] is False
        assert arr["actor"]["optim"]["lr"] == pytest.approx(1e-6)
        assert arr["actor"]["shuffle"] is False
        assert cfg["reward"]["custom_reward_function"] == {"path": "pkg://recipe.darl.rewards", "name": "compute_score"}
        assert trainer["resume_mode"] == "auto" and trainer["logger"] == ["console", "tensorboard"]  # no wandb key
        assert trainer["experiment_name"] == script_path(fam.name, variant).stem
        assert trainer["default_local_dir"] == str(fam.tmp / "ckpt" / "darl" / trainer["experiment_name"])
        assert trainer["save_freq"] > 0 and trainer["test_freq"] > 0 and trainer["total_epochs"] >= 1
        assert arr["model"]["path"] == str(fam.tmp / "model")
        assert cfg["data"]["train_files"] == str(fam.tmp / "data" / dataset / "train.parquet")
        assert cfg["data"]["apply_chat_template_kwargs"] == {"enable_thinking": False}
        assert "rollout_is" not in algo and "rollout_is_threshold" not in algo  # the algorithm.rollout_is* aliases were mapped
        # the three launch configurations
        if variant == "async":
            assert corr["bypass_mode"] is True and corr["rollout_is"] is None and replay["enable"] is False
        elif variant == "decoupled":
            assert corr["bypass_mode"] is False and corr["rollout_is"] == "token" and replay["enable"] is False
            assert corr["rollout_is_threshold"] == 2.0
        else:
            assert corr["bypass_mode"] is False and corr["rollout_is"] == "token" and corr["rollout_is_threshold"] == 2.0
            assert replay["enable"] is True and replay["k"] == 4 and replay["pmis"] is True
            assert replay["stop_grad"] is True and replay["warmup"] == 5


def check_only_configuration_keys(fam) -> None:
    """The three resolved configs differ only in their configuration's keys (and the name-derived ones)."""
    c = fam.configs
    a_d = diff_keys(c["async"], c["decoupled"]) - NAME_KEYS
    d_p = diff_keys(c["decoupled"], c["pmis_sg"]) - NAME_KEYS
    keys = configuration_keys()
    assert a_d <= keys and d_p <= keys, (a_d - keys, d_p - keys)
    assert a_d == {"preset", "algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.rollout_is"}
    assert {"preset", "replay.enable", "actor_rollout_ref.actor.ppo_epochs", "critic.ppo_epochs"} <= d_p
    # and the scripts' text: the same lines apart from their header comment (the name says the configuration)
    bodies = {}
    for v in VARIANTS:
        lines = script_path(fam.name, v).read_text().splitlines()
        bodies[v] = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert bodies["async"] == bodies["decoupled"] == bodies["pmis_sg"]


def check_verl_validation(fam) -> None:
    """verl's validate_config and its dataclass configs accept the resolved configs, as its task runner will."""
    import warnings

    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    for cfg in fam.configs.values():
        cfg = OmegaConf.create(cfg)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Disabled critic")
            assert not need_critic(cfg) and not need_reference_policy(cfg)  # GRPO without KL: actor and rollout only
        validate_config(cfg, use_reference_policy=False, use_critic=False)
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        assert rollout.name == "vllm" and rollout.calculate_log_probs and rollout.n == 8


# --------------------------------------------------------------------------- tiny model and packaged data


def build_tiny_model_fallback(path: Path) -> str:
    """A tiny Qwen3 with a character-level tokenizer (only if recipe.darl.example.tiny_model is missing)."""
    import string

    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(string.printable) - {"\r", "\x0b", "\x0c"}))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                  unk_token="<unk>", additional_special_tokens=["<|im_start|>"], padding_side="left")
    tok.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
