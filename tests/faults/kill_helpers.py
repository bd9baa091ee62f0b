"""Launching a CPU pipeline script in its own session with a fault armed (DARL_FAULT_INJECT), reading what it
left behind, and cleaning up the session as a scheduler would (every process of the job SIGKILLed)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ONE_STEP_OFF = REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
FULLY_ASYNC = REPO / "shells" / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
V1 = REPO / "shells" / "cpu" / "v1_colocate_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"


def _e2e_helpers():
    spec = importlib.util.spec_from_file_location("_e2e_helpers", REPO / "tests" / "e2e_helpers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


e2e = _e2e_helpers()
build_inputs = e2e.build_inputs
read_log = e2e.read_log


@dataclass
class Launch:
    name: str
    rc: int
    seconds: float
    text: str
    marker: list[str]
    log: dict[int, dict]
    leftovers: int  # processes of the job's session still alive 3 s after the launch ended (then SIGKILLed)
    tracker: int | None = None
    folders: list[int] = field(default_factory=list)

    def restored(self) -> dict | None:
        """The buffer summary the resumed trainer printed (groups, steps_done, next_seq, file)."""
        m = re.search(r"restored the replay buffer: (\d+) groups, versions (\[[^\]]*\]), steps_done (\d+), next_seq (\d+), "
                      r"from (\S+)", self.text)
        if not m:
            return None
        return {"groups": int(m.group(1)), "versions": json.loads(m.group(2)), "steps_done": int(m.group(3)),
                "next_seq": int(m.group(4)), "path": m.group(5)}

    def resumed_from(self) -> int | None:
        m = re.search(r"Resuming from \S*global_step_(\d+)", self.text)
        return int(m.group(1)) if m else None

    def trained(self) -> list[int]:
        return sorted(s for s, m in self.log.items() if "actor/pg_loss" in m)


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid and int(entry) != os.getpid():
                    pids.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_session(sid: int, grace_s: float = 3.0) -> int:
    """After the launch ended: SIGKILLs whatever of its session is still alive after `grace_s` (the scheduler's
    kill of the whole job); returns how many processes that was (zombies not counted)."""
    deadline = time.time() + grace_s
    while True:  # a session that empties sooner ends the wait
        alive = [pid for pid in _session_pids(sid) if _running(pid)]
        if not alive or time.time() >= deadline:
            break
        time.sleep(0.2)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + 15
    while time.time() < deadline and any(_running(p) for p in alive):
        time.sleep(0.2)
    return len(alive)


def session_process(sid: int, matches) -> int | None:
    """The first process of session `sid` whose command line (its arguments, a list of bytes) `matches`."""
    for pid in _session_pids(sid):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if matches(cmdline):
            return pid
    return None


def driver_pid(sid: int) -> int | None:
    """The job's driver: the process of session `sid` running a D-ARL entry point (what run.sh sends USR1 to)."""
    entry_points = (b"recipe.darl.main_one_step_off", b"recipe.darl.main_fully_async", b"recipe.darl.main_v1")
    return session_process(sid, lambda argv: any(e in argv for e in entry_points))


def kill_vllm_server(sid: int, killed: list[float]) -> bool:
    """SIGKILL to the Ray worker process of session `sid` hosting verl's vLLMHttpServer actor (Ray titles it
    `ray::vLLMHttpServer`); appends the time to `killed`; False while there is none."""
    pid = session_process(sid, lambda argv: argv[0].startswith(b"ray::vLLMHttpServer")
                          or any(b"ray::CPUvLLMHttpServer" in a for a in argv))
    if pid is not None:
        killed.append(time.time())
        os.kill(pid, signal.SIGKILL)
    return pid is not None


def usr1_to_driver(sid: int) -> bool:
    """SIGUSR1 to the job's driver, as run.sh forwards Slurm's; False while the driver has not started."""
    pid = driver_pid(sid)
    if pid is not None:
        os.kill(pid, signal.SIGUSR1)
    return pid is not None


def _act_after_update(proc: subprocess.Popen, log: Path, step: int, action, timeout: int) -> int | None:
    """Waits until the run logged an actor update at trainer step >= `step`, calls `action(session id)` until it
    returns True, then waits for the end; returns the exit code (None: no end within `timeout`)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if any("actor/pg_loss" in r["data"] and r["data"].get("training/global_step", r["step"]) >= step for r in records):
            if action(proc.pid):
                break
        time.sleep(0.5)
    try:
        return proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        return None


def launch(script: Path, root: Path, inputs: dict, name: str, fault: str = "", env: dict | None = None,
           overrides: tuple[str, ...] = (), timeout: int = 600, after_step: int | None = None, action=None,
           grace_s: float = 3.0) -> Launch:
    """Runs `script` on `inputs` in a new session with `DARL_FAULT_INJECT=fault`; outputs in root/out (shared by
    every launch: each resumes the last), verl's file logger in root/<name>.jsonl, the output in root/<name>.txt.
    `action(session id) -> bool`: called once an update at trainer step `after_step` (or later) is logged, until it
    returns True (`usr1_to_driver`: a stop request). `leftovers`: the session's processes still alive `grace_s`
    after the script ended."""
    marker = root / f"{name}.marker"
    log = root / f"{name}.jsonl"
    run_env = dict(os.environ, MODEL_PATH=inputs["MODEL_PATH"], TRAIN_FILES=inputs["TRAIN_FILES"],
                   VAL_FILES=inputs["VAL_FILES"], OUT_DIR=str(root / "out"), VERL_FILE_LOGGER_PATH=str(log),
                   N_RESPONSES="4", MINI_BATCH_SIZE="2", TRAIN_BATCH_SIZE="4", TEST_FREQ="-1", SAVE_FREQ="1",
                   RESUME_MODE="auto", PYTHON=sys.executable, DARL_FAULT_INJECT=fault, DARL_FAULT_MARKER=str(marker))
    run_env.update(env or {})
    log = Path(run_env["VERL_FILE_LOGGER_PATH"])  # the caller may have put verl's file logger elsewhere
    args = [inputs["reward"], "replay.k=3", "replay.warmup=0", "data.max_response_length=12",
            "trainer.val_before_train=false", *overrides]
    out_path = root / f"{name}.txt"
    t0 = time.time()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(["bash", "-c", 'export DARL_FAULT_PGID=$$; exec bash "$0" "$@"', str(script), *args],
                                env=run_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if action is not None:
            rc = _act_after_update(proc, log, after_step or 1, action, timeout)
        else:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
    seconds = time.time() - t0
    leftovers = kill_session(proc.pid, grace_s)
    if rc is None:
        proc.wait()
        raise AssertionError(f"{name}: no end within {timeout} s (a hang): {out_path}")
    ckpt = root / "out" / "checkpoints"
    tracker_file = ckpt / "latest_checkpointed_iteration.txt"
    tracker = int(tracker_file.read_text()) if tracker_file.exists() and tracker_file.read_text().strip() else None
    folders = sorted(int(p.name.split("_")[-1]) for p in ckpt.glob("global_step_*")) if ckpt.exists() else []
    return Launch(name=name, rc=rc, seconds=seconds, text=out_path.read_text(errors="replace"),
                  marker=marker.read_text().splitlines() if marker.exists() else [],
                  log=read_log(log) if log.exists() else {}, leftovers=leftovers, tracker=tracker, folders=folders)
