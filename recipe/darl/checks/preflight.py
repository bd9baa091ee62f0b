"""Start-up checks for a GPU run, made before Ray starts; they only read the config (its fix-ups: fixups.py).

- `prompt_store_line`: the bound of `replay.prompt_replay`'s per-prompt store, kept on the driver and in checkpoints.
- `logger_problems`: an unknown logger name, or wandb without credentials, fails only when `fit()` starts, after
  every model has loaded.
- `offline_problems`: with HF_HUB_OFFLINE=1, a hub model id missing from the Hugging Face cache; the command that
  prepares a missing data file.
- `gpu_environment_problem` (`python -m recipe.darl.checks.preflight --gpus N`, run by shells/run.sh and
  shells/common.sh): a launch that asks for GPUs from a torch without CUDA, naming the interpreter and environment.
"""

from __future__ import annotations

import netrc
import os
import sys
from collections.abc import Callable, Mapping
from urllib.parse import urlparse

import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from recipe.darl.checks.config_check import resolved_replay_key
from recipe.darl.trainer_mode import TrainerMode
from recipe.darl.checks.data_check import data_problems, local_parquet
from recipe.darl.core.config import as_list

WANDB_DEFAULT_HOST = "https://api.wandb.ai"
WANDB_KEYLESS_MODES = {"offline", "disabled", "dryrun"}


def wandb_credentials_found(env: Mapping[str, str] | None = None, home: str | None = None) -> bool:
    """True when wandb.init can log in: WANDB_API_KEY, a keyless WANDB_MODE, or a netrc entry for its host."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY", "").strip() or env.get("WANDB_MODE", "").strip().lower() in WANDB_KEYLESS_MODES:
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or WANDB_DEFAULT_HOST).hostname or "api.wandb.ai"
    # where `wandb login` writes the key
    path = env.get("NETRC") or os.path.join(os.path.expanduser("~") if home is None else home, ".netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError):  # OSError: no such file, among others
        return False
    return bool(entry and entry[2])


def logger_problems(cfg: DictConfig, env: Mapping[str, str] | None = None, home: str | None = None) -> list[str]:
    """The problems of `trainer.logger`: names verl's `Tracking` does not know, wandb without wandb credentials."""
    from verl.utils.tracking import Tracking

    names = as_list(cfg.trainer.get("logger"))
    unknown = [n for n in names if n != "tracking" and n not in Tracking.supported_backend]
    problems = [f"trainer.logger: unknown backend(s) {unknown}; verl's Tracking knows {', '.join(Tracking.supported_backend)}"
                ] if unknown else []
    if "wandb" not in names or wandb_credentials_found(env, home):
        return problems
    return problems + [f"trainer.logger={names} includes wandb, but no wandb credentials were found: set WANDB_API_KEY "
            "(or run `wandb login`, which writes ~/.netrc for api.wandb.ai; or WANDB_MODE=offline), or drop wandb "
            "from trainer.logger (the launch scripts: LOGGER='[\"console\",\"tensorboard\"]')"]


def parquet_rows(paths: list[str]) -> int | None:
    """Rows of local parquet files from their metadata (None when one is not a readable local parquet file)."""
    local = [local_parquet(path) for path in paths]
    try:
        return None if None in local else sum(pq.ParquetFile(path).metadata.num_rows for path in local)
    except Exception:  # noqa: BLE001 - the data check names an unreadable file
        return None


def prompt_store_line(cfg: DictConfig, mode: TrainerMode,
                      rows_of: Callable[[list[str]], int | None] = parquet_rows) -> str | None:
    """The per-prompt store's upper bound (responses, GiB at 9 bytes a token) when `replay.prompt_replay` is on,
    with a warning when `replay.prompt_replay_max_age` is shorter than one pass over the training data."""
    replay = OmegaConf.to_container(cfg.get("replay") or {}, resolve=True)
    per_prompt = resolved_replay_key(replay, "prompt_replay")  # null: the preset's 16
    max_age = replay.get("prompt_replay_max_age")
    if not replay.get("enable", False) or per_prompt is None:
        return None
    try:
        per_prompt, max_age = int(per_prompt), None if max_age is None else int(max_age)
        budget, n = mode.step_budget(cfg), int(cfg.actor_rollout_ref.rollout.n)
        max_tokens = int(cfg.data.get("max_response_length") or 0)
    except (TypeError, ValueError):  # the config check names the bad value
        return None
    rows = rows_of(as_list(cfg.data.get("train_files")))
    bounds = ([rows * per_prompt] if rows is not None else []) + ([max_age * budget * n] if max_age else [])
    if not bounds:
        return (f"[D-ARL] replay.prompt_replay={per_prompt}: the per-prompt store keeps {per_prompt} responses of "
                "every prompt seen, on the driver and in every checkpoint; set replay.prompt_replay_max_age to bound it")
    held = min(bounds)
    line = (f"[D-ARL] replay.prompt_replay={per_prompt}: the per-prompt store holds at most {held} responses "
            f"(<= {held * max_tokens * 9 / 2**30:.2f} GiB at {max_tokens} tokens, on the driver and in every checkpoint)")
    if max_age is None:
        return line + "; replay.prompt_replay_max_age bounds it to age x B x n responses"
    if rows is not None and budget > 0 and max_age * budget < rows:
        line += (f"; warning: replay.prompt_replay_max_age={max_age} steps is shorter than one pass over the "
                 f"{rows} training prompts ({-(-rows // budget)} steps at {budget} a step): most prompts' responses "
                 "are dropped before the prompt comes back")
    return line


def preflight(cfg: DictConfig, mode: TrainerMode, env: Mapping[str, str] | None = None,
              home: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, lines to print): the logger check, the data check (checks/data_check.py: rows without ground
    truth, empty or overlong prompts) and the per-prompt store's bound (the attention fallback is a fix-up)."""
    store, (data, data_lines) = prompt_store_line(cfg, mode), data_problems(cfg)
    offline, offline_lines = offline_problems(cfg, env)  # a node without internet: the model cache, missing data
    return logger_problems(cfg, env, home) + data + offline, ([store] if store else []) + data_lines + offline_lines


def hf_offline(env: Mapping[str, str] | None = None) -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to a true value: nothing is fetched from the hub."""
    env = os.environ if env is None else env
    return any(env.get(k, "").strip().lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached_model(repo: str, cache_dir: str | None = None) -> str | None:
    """The local snapshot of hub model `repo` when its config.json and weights are in the Hugging Face cache, else None."""
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo, local_files_only=True, cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError) or not a repo id (HFValidationError)
        return None
    names = os.listdir(path)
    weights = any(n.endswith((".safetensors", ".bin")) for n in names)
    return path if "config.json" in names and weights else None


def offline_problems(cfg: DictConfig, env: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(problems, lines to print) for a node without internet: with HF_HUB_OFFLINE=1, a hub model id that is not in
    the Hugging Face cache; a missing data file (config_check refuses it) gets the command that prepares it."""
    from recipe.darl.data.prepare import DATASETS

    problems, lines = [], []
    model = str(cfg.actor_rollout_ref.model.get("path") or "")
    if hf_offline(env) and model and not model.startswith(("/", "~", ".")) and not os.path.isdir(model) \
            and cached_model(model) is None:
        from huggingface_hub import constants

        problems.append(f"actor_rollout_ref.model.path={model}: HF_HUB_OFFLINE=1 and the model is not in the Hugging "
                        f"Face cache ({constants.HF_HUB_CACHE}); fetch it on a node with internet and the same HF_HOME: "
                        f"python -m recipe.darl.data.prepare --model {model} (or set MODEL_PATH to a local folder)")
    for key in ("train_files", "val_files"):
        for f in as_list(cfg.data.get(key)):
            path = os.path.expanduser(str(f))
            if "://" in path or os.path.exists(path):
                continue
            name = os.path.basename(os.path.dirname(path))
            dataset = name if name in DATASETS else "<gsm8k|math|math500|aime24|humaneval|livecodebench>"
            lines.append(f"[D-ARL] data.{key}: {path} is missing; prepare it (on a node with internet): "
                         f"python -m recipe.darl.data.prepare --dataset {dataset} --out {os.path.dirname(path)}")
    return problems, lines


def gpu_environment_problem(gpus: int) -> str | None:
    """None when this interpreter's torch sees a CUDA GPU (or `gpus` is 0); else what was found: the interpreter,
    its environment, torch's version and CUDA build."""
    if gpus <= 0:
        return None
    found = f"python {sys.executable} (environment {os.environ.get('CONDA_PREFIX') or sys.prefix})"
    fix = ("build the GPU environment with `make install-gpu` (.venv-gpu, which shells/run.sh activates for GPU jobs) "
           "or point VENV or CONDA_ENV at one (docs/install.md); GPU_CHECK=0 skips this check")
    try:
        import torch
    except ImportError as e:
        return f"the launch asks for {gpus} GPU(s), but {found} cannot import torch ({e}): {fix}"
    if torch.version.cuda is None:
        return f"the launch asks for {gpus} GPU(s), but {found} has torch {torch.__version__}, a build without CUDA: {fix}"
    if not torch.cuda.is_available():
        return (f"the launch asks for {gpus} GPU(s), but {found} has torch {torch.__version__} (CUDA {torch.version.cuda}) "
                "and sees no GPU: check nvidia-smi on this node (torch 2.11's CUDA 13 build needs an R580+ driver) "
                "and CUDA_VISIBLE_DEVICES")
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m recipe.darl.checks.preflight --gpus N`: exit 1, saying what was found, when torch here cannot use
    CUDA GPUs (shells/run.sh and shells/common.sh call it before Ray starts)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m recipe.darl.checks.preflight", description=main.__doc__.split(":")[0])
    parser.add_argument("--gpus", type=int, required=True, help="GPUs the launch asks for")
    args = parser.parse_args(argv)
    problem = gpu_environment_problem(args.gpus)
    if problem:
        print(f"[D-ARL] error: {problem}", file=sys.stderr)
        return 1
    import torch

    if args.gpus:
        print(f"[D-ARL] {sys.executable}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{torch.cuda.device_count()} GPU(s) visible", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
