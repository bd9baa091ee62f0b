"""Ending a run at a step boundary with a checkpoint, before a wall-clock limit (docs/trainer.md, "Stopping early").

A stop request is the file `darl_stop_request` in `trainer.default_local_dir`, written by the driver on SIGUSR1
(shells/run.sh forwards Slurm's USR1) or by hand. A file, not a signal: the trainer runs in a Ray actor, possibly on
another node, and the checkpoint folder is on storage every node sees.
"""

from __future__ import annotations

import os
import signal
import time

STOP_FILE = "darl_stop_request"


def request_path(ckpt_dir: str) -> str:
    return os.path.join(os.path.abspath(ckpt_dir), STOP_FILE)


def install_stop_signal(ckpt_dir: str) -> None:
    """SIGUSR1 -> a stop request in `ckpt_dir`. Installed in the driver before verl's run_ppo (Python runs the
    handler while the driver waits in ray.get); USR1's default action would kill the driver."""
    path = request_path(ckpt_dir)

    def on_usr1(signum, frame):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f"SIGUSR1 to pid {os.getpid()} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        print(f"[D-ARL] SIGUSR1: stop requested ({path}); the trainer saves a checkpoint at its next step boundary "
              "and ends", flush=True)

    signal.signal(signal.SIGUSR1, on_usr1)
