"""Checkpoint files a kill cannot tear, and a resume that never loads a half-written checkpoint (docs/faults.md).

The project's files (`darl_replay.pt`, the fully-async `darl_queue.pt`) carry a length and sha256 header and replace
the old file atomically: a kill leaves the old file or the new one. verl writes its tracker
`latest_checkpointed_iteration.txt` last, with a plain `open("w")`: `check_resume` repairs one a kill emptied and
refuses one naming a missing folder (verl would silently train from scratch and overwrite the run).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
from typing import Any, Callable, Optional

import torch

from recipe.darl.core.config import is_int

MAGIC = b"DARL-CHECKED-1"
TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that is torn, truncated or corrupted; the message names the file."""


def atomic_write_bytes(path: str, data: bytes, before_replace: Optional[Callable[[], None]] = None) -> None:
    """`data` to `path` through a fsynced temporary file in the same folder and `os.replace`.
    `before_replace` runs once the temporary file is complete, before the rename (the fault hook's point)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename made durable: fsync the folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    # a temporary file of an earlier, killed write of the same target
    prefix = os.path.basename(path) + ".tmp."
    for name in os.listdir(folder):
        if name.startswith(prefix):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))


def write_checked(path: str, obj: Any, before_replace: Optional[Callable[[], None]] = None) -> str:
    """`torch.save(obj)` to `path` atomically, with a checksum header; returns the payload's sha256."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    header = b"%s sha256=%s bytes=%d\n" % (MAGIC, digest.encode(), len(payload))
    atomic_write_bytes(path, header + payload, before_replace)
    return digest


def read_checked(path: str) -> Any:
    """The object `write_checked` wrote to `path`, after checking length and sha256. A file without the header
    (written before checksums existed) is loaded with plain `torch.load`; any failure names the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CorruptCheckpointError(f"cannot read checkpoint file {path}: {e}") from e
    if not data.startswith(MAGIC):
        try:
            return torch.load(io.BytesIO(data), weights_only=False)
        except Exception as e:
            raise CorruptCheckpointError(
                f"checkpoint file {path} cannot be loaded ({len(data)} bytes, no D-ARL checksum header: {e}); it is "
                "torn or corrupted. Resume from another checkpoint (trainer.resume_mode=resume_path) or start fresh"
            ) from e
    header, newline, payload = data.partition(b"\n")
    match = re.fullmatch(rb"DARL-CHECKED-1 sha256=([0-9a-f]{64}) bytes=(\d+)", header) if newline else None
    if match is None:
        raise CorruptCheckpointError(f"checkpoint file {path} has a damaged header: the file is torn or corrupted")
    digest, size = match.group(1).decode(), int(match.group(2))
    found = hashlib.sha256(payload).hexdigest()
    if len(payload) != size or found != digest:
        raise CorruptCheckpointError(
            f"checkpoint file {path} is torn or corrupted: its header promises {size} bytes with sha256 {digest[:16]}..., "
            f"the file holds {len(payload)} bytes with sha256 {found[:16]}...; it was not written completely (or was "
            "damaged since). Resume from another checkpoint (trainer.resume_mode=resume_path) or start fresh"
        )
    return torch.load(io.BytesIO(payload), weights_only=False)


def step_folders(root: str) -> dict[int, str]:
    """{t: path} of the `global_step_<t>` folders under `root`."""
    names = os.listdir(root) if os.path.isdir(root) else []
    return {int(m.group(1)): os.path.join(root, m.group(0)) for m in map(STEP_DIR.match, names)
            if m and os.path.isdir(os.path.join(root, m.group(0)))}


def read_tracker(root: str) -> Optional[int]:
    """The step verl's tracker names; None when there is no tracker. Raises ValueError when it is unreadable."""
    path = os.path.join(root, TRACKER_FILE)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return int(f.read().decode(errors="replace").strip())  # ValueError on a torn (empty) tracker


def check_resume(root: str, log: Callable[[str], None] = print) -> Optional[int]:
    """Before verl's `auto` resume from `root` (`trainer.default_local_dir`): repairs a torn tracker, refuses a
    tracker naming a missing folder; returns the step resume will take (None: no checkpoint)."""
    root = os.path.abspath(root)
    path = os.path.join(root, TRACKER_FILE)
    try:
        step = read_tracker(root)
    except ValueError:
        complete = [t for t, folder in step_folders(root).items() if os.path.exists(os.path.join(folder, "data.pt"))]
        if not complete:
            raise CorruptCheckpointError(
                f"the checkpoint tracker {path} is torn (not a step number) and no global_step_<t> folder under "
                f"{root} holds a complete checkpoint (data.pt): remove the tracker to start fresh") from None
        step = max(complete)
        atomic_write_bytes(path, str(step).encode())
        log(f"[D-ARL] the checkpoint tracker {path} was torn (a kill while verl wrote it); rewrote it with step {step}, "
            f"the newest folder verl had finished writing (global_step_{step} has data.pt)")
        return step
    if step is None:
        return None
    folder = os.path.join(root, f"global_step_{step}")
    if not os.path.isdir(folder):
        raise CorruptCheckpointError(
            f"the checkpoint tracker {path} names step {step}, but {folder} does not exist; verl would train from "
            "scratch and overwrite this run. Restore the folder, point the tracker at an existing global_step_<t>, "
            "or remove the tracker to start fresh")
    return step


def rotate(root: str, keep: Optional[int], log: Callable[[str], None] = print,
           only: Optional[list[int]] = None) -> list[int]:
    """After verl's tracker names the newest checkpoint: removes whole `global_step_<t>` folders older than the `keep`
    newest at or below it (with `only`, among those steps alone); returns the steps removed."""
    try:
        latest = read_tracker(root) if keep and keep > 0 else None
    except ValueError:  # a torn tracker: check_resume repairs it at the next launch
        latest = None
    if latest is None:
        return []
    steps = sorted(t for t in step_folders(root) if t <= latest and (only is None or t in only))
    removed = steps[:max(len(steps) - keep, 0)]
    for t in removed:
        shutil.rmtree(os.path.join(root, f"global_step_{t}"), ignore_errors=True)
    if removed:
        log(f"[D-ARL] removed checkpoint folder(s) {', '.join(f'global_step_{t}' for t in removed)} (keeping {keep})")
    return removed


def guarded_verl_save(trainer, save: Callable[[], Any], step: int) -> Any:
    """Runs verl's `_save_checkpoint` (`save`) for step `step` with the checkpoint rotation moved after the tracker.

    verl's own rotation removes the previous step's actor shards before `data.pt` and the tracker are written, so a
    kill in between leaves the tracker naming a step without weights; here `rotate` runs once the tracker is
    written. Probe points: `verl_save` (after the actor shards), `after_save` (tracker written)."""
    from recipe.darl.probes import probe, probe_after

    cfg = trainer.config.trainer
    keep = 1 if cfg.get("remove_previous_ckpt_in_save", False) else cfg.get("max_actor_ckpt_to_keep", None)
    saved = {k: cfg.get(k) for k in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep", "remove_previous_ckpt_in_save")
             if k in cfg}
    for k in saved:  # keys the config has: no open_dict needed
        cfg[k] = False if k == "remove_previous_ckpt_in_save" else None
    try:
        with probe_after(trainer.actor_rollout_wg, "save_checkpoint", "verl_save", step):
            result = save()
    finally:
        cfg.update(saved)
    probe("after_save", step)
    saved_steps = trainer.__dict__.setdefault("_darl_saved_steps", [])
    if step not in saved_steps:
        saved_steps.append(step)
    rotate(os.path.abspath(cfg.default_local_dir), keep if is_int(keep) else None, only=saved_steps)
    return result


def verify_folder(folder: str, files: tuple[str, ...] = ("darl_replay.pt", "darl_queue.pt")) -> dict[str, str]:
    """{file: "ok" | error message} for the checked files present in a checkpoint folder (the CLI below)."""
    out = {}
    for name in files:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            try:
                read_checked(path)
                out[name] = "ok"
            except CorruptCheckpointError as e:
                out[name] = str(e)
    return out


if __name__ == "__main__":  # python -m recipe.darl.robustness.checkpoint_files <checkpoint folder>...
    import sys

    bad = 0
    for arg in sys.argv[1:]:
        for name, status in verify_folder(arg).items():
            print(f"{os.path.join(arg, name)}: {status}")
            bad += status != "ok"
    sys.exit(1 if bad else 0)
