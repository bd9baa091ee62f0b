"""A dead vLLM rollout server (docs/faults.md): verl's `vLLMHttpServer` actor SIGKILLed by the test while the
one-step-off CPU pipeline runs on `ROLLOUT=vllm`, after the first update (the next batch is being generated).
The run must stop by itself with a `RolloutServerError` naming the server (DEAD) and the step (found by the next
generation or, if the next batch was already generated, by the weight sync before the update), within seconds, and
leave the checkpoint before it intact. (The hf server's version, killed from inside its decode loop, and the
frozen server: tests/faults/test_kill_resume.py.)"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from kill_helpers import ONE_STEP_OFF, _session_pids, build_inputs, launch  # noqa: E402

KILLED: list[float] = []


def _kill_vllm_server(sid: int) -> bool:
    """SIGKILL to the Ray worker process hosting verl's vLLMHttpServer actor (Ray titles it `ray::vLLMHttpServer`)."""
    for pid in _session_pids(sid):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
        except OSError:
            continue
        if cmdline.startswith(b"ray::vLLMHttpServer") or b"ray::CPUvLLMHttpServer" in cmdline:
            KILLED.append(time.time())
            os.kill(pid, signal.SIGKILL)
            return True
    return False


def test_a_dead_vllm_server_stops_the_run_naming_it_and_the_step(tmp_path, vllm_installed):
    inputs = build_inputs(tmp_path, hidden_size=128)
    run = launch(ONE_STEP_OFF, tmp_path, inputs, "vllm_server", env=dict(ROLLOUT="vllm", STEPS="20"), after_step=1,
                 action=_kill_vllm_server, timeout=600)
    assert KILLED, "no vLLMHttpServer process found to kill: " + run.text[-2000:]
    assert run.rc not in (0, None, -9), run.rc  # ended by itself, with an error
    # the kill lands in a generation or, when the next batch was already done, in the weight sync before the update
    m = re.search(r"RolloutServerError: (?:generating the batch of|syncing weights to the rollout at) trainer step (\d+)",
                  run.text)
    assert m, run.text[-3000:]
    assert re.search(r"\(actor [0-9a-f]+\): DEAD", run.text), run.text[-3000:]
    step = int(m.group(1))
    assert run.trained() and max(run.trained()) == step - 1  # the steps before it were trained ...
    assert run.tracker == step - 1 and step - 1 in run.folders  # ... and saved (SAVE_FREQ 1): resume takes that one
    detected = re.search(r"rollout failure detected at ([0-9.]+)", run.text)
    assert detected and float(detected.group(1)) - KILLED[0] < 10.0
