"""Start-up checks for a GPU run, made before Ray starts; they only read the config (its fix-ups: fixups.py).

- `prompt_store_line`: the bound of `replay.prompt_replay`'s per-prompt store, kept on the driver and in checkpoints.
- `logger_problems`: an unknown logger name, or wandb without credentials, fails only when `fit()` starts, after
  every model has loaded.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Callable, Mapping
from urllib.parse import urlparse

import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from recipe.darl.checks.config_check import resolved_replay_key
from recipe.darl.trainer_mode import step_budget
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


def prompt_store_line(cfg: DictConfig, rows_of: Callable[[list[str]], int | None] = parquet_rows) -> str | None:
    """The per-prompt store's upper bound (responses, GiB at 9 bytes a token) when `replay.prompt_replay` is on,
    with a warning when `replay.prompt_replay_max_age` is shorter than one pass over the training data."""
    replay = OmegaConf.to_container(cfg.get("replay") or {}, resolve=True)
    per_prompt = resolved_replay_key(replay, "prompt_replay")  # null: the preset's 16
    max_age = replay.get("prompt_replay_max_age")
    if not replay.get("enable", False) or per_prompt is None:
        return None
    try:
        per_prompt, max_age = int(per_prompt), None if max_age is None else int(max_age)
        budget, n = step_budget(cfg), int(cfg.actor_rollout_ref.rollout.n)
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


def preflight(cfg: DictConfig, env: Mapping[str, str] | None = None,
              home: str | None = None) -> tuple[list[str], list[str]]:
    """(problems, lines to print): the logger check, the data check (checks/data_check.py: rows without ground
    truth, empty or overlong prompts) and the per-prompt store's bound (the attention fallback is a fix-up)."""
    store, (data, data_lines) = prompt_store_line(cfg), data_problems(cfg)
    return logger_problems(cfg, env, home) + data, ([store] if store else []) + data_lines
