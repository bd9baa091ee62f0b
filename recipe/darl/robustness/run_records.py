"""What a relaunched job keeps of the launches before it (docs/faults.md, "What a relaunch keeps").

verl's `file` logger opens its jsonl file with mode "wb" and its wandb logger starts a new run on every launch.
`keep_run_records` (in the driver, before Ray) renames an earlier launch's metrics file to `<stem>.<NNN><suffix>`
beside it (`sorted()` gives launch order) and exports `WANDB_RUN_ID` (kept in `<default_local_dir>/wandb_run_id`, new
when the launch will not resume) with `WANDB_RESUME=allow`, also to Ray's workers, where verl creates its trackers;
`record_launch` appends each launch's provenance and resolved config to `<default_local_dir>/launches.jsonl`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import secrets
import socket
import string
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from recipe.darl.core.config import as_list
from recipe.darl.robustness.checkpoint_files import TRACKER_FILE, atomic_write_bytes

WANDB_ID_FILE = "wandb_run_id"
LAUNCHES_FILE = "launches.jsonl"
REPO_ROOT = Path(__file__).resolve().parents[3]  # the D-ARL checkout (recipe/darl/robustness/ is three below)
PACKAGES = ("verl", "torch", "vllm", "ray", "transformers")
_ID_CHARS = string.ascii_lowercase + string.digits
_ID = re.compile(r"^[a-z0-9]{8}$")


def file_logger_path(config: DictConfig, env: Optional[Mapping[str, str]] = None) -> str:
    """Where verl's `FileLogger` writes, as an absolute path; `env` defaults to this process's environment."""
    env = os.environ if env is None else env
    path = env.get("VERL_FILE_LOGGER_PATH")
    if path is None:
        root = os.path.expanduser(env.get("VERL_FILE_LOGGER_ROOT", "."))
        path = os.path.join(root, config.trainer.project_name, f"{config.trainer.experiment_name}.jsonl")
    return os.path.abspath(path)


def _kept_launches(path: str) -> list[tuple[int, str]]:
    """(NNN, absolute path) of the earlier launches' `<stem>.<NNN><suffix>` files beside `path`, oldest first."""
    folder, name = os.path.split(os.path.abspath(path))
    stem, suffix = os.path.splitext(name)
    pattern = re.compile(re.escape(stem) + r"\.(\d+)" + re.escape(suffix))
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted((int(m.group(1)), os.path.join(folder, f)) for f in names if (m := pattern.fullmatch(f)))


def launch_files(path: str) -> list[str]:
    """Every launch's metrics files, oldest first: `<stem>.001<suffix>`, ..., then `path` itself if it exists."""
    return [f for _, f in _kept_launches(path)] + ([os.path.abspath(path)] if os.path.exists(path) else [])


def keep_metrics_file(path: str) -> str | None:
    """Renames a non-empty metrics file `path` to the next `<stem>.<NNN><suffix>`; returns the new name or None."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    stem, suffix = os.path.splitext(path)
    kept = f"{stem}.{max((n for n, _ in _kept_launches(path)), default=0) + 1:03d}{suffix}"
    os.rename(path, kept)
    return kept


def wandb_run_id(config: DictConfig) -> tuple[str, str]:
    """(id, how): the id in `<default_local_dir>/wandb_run_id` when this launch resumes, else a new one saved there."""
    ckpt_dir = os.path.abspath(config.trainer.default_local_dir)
    id_file = os.path.join(ckpt_dir, WANDB_ID_FILE)
    mode = config.trainer.get("resume_mode", "auto")
    resumes = mode == "resume_path" or (mode == "auto" and os.path.exists(os.path.join(ckpt_dir, TRACKER_FILE)))
    if os.path.exists(id_file) and resumes:
        with open(id_file) as f:
            run_id = f.read().strip()
        if _ID.match(run_id):
            return run_id, f"resumed, id from {id_file}"
    run_id = "".join(secrets.choice(_ID_CHARS) for _ in range(8))
    os.makedirs(ckpt_dir, exist_ok=True)
    atomic_write_bytes(id_file, (run_id + "\n").encode())
    return run_id, f"new, id written to {id_file}"


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def boot_id() -> str | None:
    """Linux's id of this boot (/proc/sys/kernel/random/boot_id), None elsewhere: virtual machines often share one
    host name, while a boot id names one machine from its start to its shutdown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def provenance() -> dict[str, Any]:
    """The code and machine a run comes from; `dirty` counts tracked changes only (outputs and caches are ignored);
    commit and dirty are None outside a git checkout."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status),
            "host": socket.gethostname(), "boot": boot_id(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "python": platform.python_version(), "date": utc_now(), "argv": list(sys.argv)}


def record_launch(config: DictConfig) -> Optional[str]:
    """Appends {"provenance", "versions", "config" (fully resolved)} to `<default_local_dir>/launches.jsonl`, one line
    a launch, kept across relaunches; returns the file's path (None for a remote checkpoint folder, `scheme://`)."""
    if "://" in str(config.trainer.default_local_dir):
        return None
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        resolved = OmegaConf.to_container(config, resolve=True)
    except Exception as e:  # an interpolation only the workers can resolve: the config as written, and why
        resolved = {"unresolved": OmegaConf.to_container(config, resolve=False), "why": f"{type(e).__name__}: {e}"}
    folder = os.path.abspath(config.trainer.default_local_dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LAUNCHES_FILE)
    with open(path, "a") as f:
        f.write(json.dumps({"provenance": provenance(), "versions": versions, "config": resolved}, default=str) + "\n")
    return path


def keep_run_records(config: DictConfig) -> dict:
    """Called in the driver before verl's run_ppo. Keeps the earlier launch's metrics file and points wandb at the
    run being resumed; prints one line saying what it did. Returns {"kept": renamed metrics file or None,
    "metrics": the file this launch writes or None, "wandb_run_id": the exported id or None, "launches": the launch
    record's file}."""
    loggers = as_list(config.trainer.get("logger"))
    done = {"kept": None, "metrics": None, "wandb_run_id": None}
    said = []
    if "file" in loggers:
        done["metrics"] = file_logger_path(config)
        done["kept"] = keep_metrics_file(done["metrics"])
        if done["kept"]:
            earlier = [f for f in launch_files(done["metrics"]) if f != done["metrics"]]
            said.append(f"metrics of the earlier launch kept as {done['kept']}, this launch writes {done['metrics']} "
                        f"({len(earlier)} earlier launch file(s) beside it; sorted() gives launch order)")
    if "wandb" in loggers or "tracking" in loggers:
        if os.environ.get("WANDB_RUN_ID"):
            run_id, how = os.environ["WANDB_RUN_ID"], "WANDB_RUN_ID set by the user"
        else:
            run_id, how = wandb_run_id(config)
            os.environ["WANDB_RUN_ID"] = run_id
            os.environ.setdefault("WANDB_RESUME", "allow")
        for key in ("WANDB_RUN_ID", "WANDB_RESUME"):  # to Ray's workers, where verl creates its trackers
            if key in os.environ:
                OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{key}", os.environ[key],
                                 force_add=True)
        done["wandb_run_id"] = run_id
        said.append(f"wandb run {run_id} ({how}; WANDB_RESUME={os.environ.get('WANDB_RESUME', '')})")
    done["launches"] = record_launch(config)  # after the wandb id: the recorded config holds it
    if done["launches"]:
        said.append(f"provenance and resolved config of this launch appended to {done['launches']}")
    if said:
        print("[D-ARL] " + "; ".join(said), flush=True)
    return done
