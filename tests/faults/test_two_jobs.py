"""Two jobs on one host: each worker group's torch.distributed port comes from its job's own range
(recipe/darl/robustness/job_ports.py), so two launches started at once both train; a range with no free port is
refused with an error naming the setting."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from kill_helpers import ONE_STEP_OFF, build_inputs, launch
from recipe.darl.robustness.job_ports import ENV, HIGH, LOW, SLOT, is_port_clash, job_port_range

pytestmark = pytest.mark.full  # a long launch: make test-all


def test_the_port_range_comes_from_the_setting_or_a_slot_below_the_ephemeral_range():
    assert job_port_range({ENV: "24000-24064"}) == (24000, 24064)
    for bad in ("24000", "24000-24004", "80-200", "a-b", "30000-20000"):
        with pytest.raises(ValueError, match=ENV):
            job_port_range({ENV: bad})
    slots = {job_port_range({}, random.Random(seed)) for seed in range(200)}
    assert len(slots) > 100  # jobs draw different slots
    for lo, hi in slots:
        assert LOW <= lo < hi <= HIGH and hi - lo == SLOT and (lo - LOW) % SLOT == 0
        assert hi <= 32768  # below Linux's ephemeral range, where verl's port 0 and every connection draw


def test_a_port_clash_is_recognised_from_torch_and_from_verl():
    assert is_port_clash(RuntimeError("The server socket has failed to listen on any local network address. "
                                      "port: 44217, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"))
    assert is_port_clash(RuntimeError("Could not find a free port in range [24000, 24008]"))
    assert not is_port_clash(RuntimeError("CUDA out of memory"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_jobs")
    return root, build_inputs(root)


def test_two_launches_at_once_on_one_host_both_train(inputs):
    """Two one-step-off CPU jobs (Ray, FSDP2, the hf rollout), started together, each with its own Ray cluster."""
    root, data = inputs
    runs = {}

    def go(name: str) -> None:
        (root / name).mkdir()
        runs[name] = launch(ONE_STEP_OFF, root / name, data, name, env={"STEPS": "2", "SAVE_FREQ": "-1"},
                            timeout=600)

    threads = [threading.Thread(target=go, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, run in runs.items():
        assert run.rc == 0, f"{name}: {run.text[-3000:]}"
        assert run.trained() == [1, 2], name


def test_a_range_without_a_free_port_is_refused_naming_the_setting(inputs):
    root, data = inputs
    held = []
    lo = 31000 + random.Random().randrange(0, 700, 8)
    for port in range(lo, lo + 8):  # every port of the range taken by another program
        s = socket.socket()
        s.bind(("", port))
        held.append(s)
    try:
        (root / "full").mkdir()
        run = launch(ONE_STEP_OFF, root / "full", data, "full", env={"STEPS": "1", ENV: f"{lo}-{lo + 8}"}, timeout=300)
    finally:
        for s in held:
            s.close()
    assert run.rc != 0
    assert f"this job's range {lo}-{lo + 8}" in run.text and f"{ENV}=LO-HI" in run.text, run.text[-3000:]
