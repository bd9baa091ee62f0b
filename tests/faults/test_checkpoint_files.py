"""Torn checkpoint files are never loaded (recipe/darl/robustness/checkpoint_files.py, docs/faults.md).

Each file-level case is checked by hand: the header is recomputed here with hashlib, files are cut or bit-flipped
at chosen offsets, and a real SIGKILL lands inside an atomic write in a forked child.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from recipe.darl.robustness import checkpoint_files as ff
from recipe.darl import probes

probes._loaded()
fi = sys.modules[probes.HOOK_MODULE]  # tests/faults/inject.py, as the product's probes loaded it


def _payload(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


OBJ = {"replay": {"steps_done": 7, "groups": [{"version": 3, "t": torch.arange(6, dtype=torch.int32)}]}, "config": {"k": 4}}


def test_checked_file_is_header_plus_torch_payload(tmp_path):
    path = str(tmp_path / "darl_replay.pt")
    digest = ff.write_checked(path, OBJ)
    data = open(path, "rb").read()
    header, payload = data.split(b"\n", 1)
    assert header == b"DARL-CHECKED-1 sha256=" + hashlib.sha256(payload).hexdigest().encode() + b" bytes=%d" % len(payload)
    assert digest == hashlib.sha256(payload).hexdigest()
    assert len(payload) == len(_payload(OBJ))  # the payload is torch.save's own serialization
    loaded = ff.read_checked(path)
    assert loaded["replay"]["steps_done"] == 7 and torch.equal(loaded["replay"]["groups"][0]["t"], torch.arange(6, dtype=torch.int32))
    assert os.listdir(tmp_path) == ["darl_replay.pt"]  # no temporary file left


@pytest.mark.parametrize("cut", ["header", "half", "one_byte_short", "one_byte_long"])
def test_a_torn_file_is_refused_naming_it(tmp_path, cut):
    path = str(tmp_path / "darl_replay.pt")
    ff.write_checked(path, OBJ)
    data = open(path, "rb").read()
    body = data.index(b"\n") + 1
    torn = {"header": data[:20], "half": data[:body + (len(data) - body) // 2], "one_byte_short": data[:-1],
            "one_byte_long": data + b"\0"}[cut]
    open(path, "wb").write(torn)
    with pytest.raises(ff.CorruptCheckpointError) as e:
        ff.read_checked(path)
    assert path in str(e.value) and ("torn" in str(e.value))


def test_a_flipped_byte_is_refused(tmp_path):
    path = str(tmp_path / "darl_queue.pt")
    ff.write_checked(path, {"samples": [b"x" * 100]})
    data = bytearray(open(path, "rb").read())
    data[-10] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(ff.CorruptCheckpointError, match="sha256"):
        ff.read_checked(path)


def test_a_file_from_before_checksums_still_loads_and_a_torn_one_is_refused(tmp_path):
    path = str(tmp_path / "darl_replay.pt")
    torch.save(OBJ, path)
    assert ff.read_checked(path)["config"] == {"k": 4}
    open(path, "wb").write(open(path, "rb").read()[:100])
    with pytest.raises(ff.CorruptCheckpointError, match="no D-ARL checksum header"):
        ff.read_checked(path)


def test_an_interrupted_write_leaves_the_previous_file(tmp_path):
    path = str(tmp_path / "darl_replay.pt")
    ff.write_checked(path, {"v": 1})

    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ff.write_checked(path, {"v": 2}, before_replace=boom)
    assert ff.read_checked(path) == {"v": 1} and os.listdir(tmp_path) == ["darl_replay.pt"]


def test_sigkill_inside_the_write_leaves_the_previous_file_and_a_temp_file_nobody_reads(tmp_path):
    path = str(tmp_path / "darl_replay.pt")
    ff.write_checked(path, {"v": 1})
    pid = os.fork()
    if pid == 0:  # the child dies with the new file complete in its temporary name, before the rename
        try:
            ff.write_checked(path, {"v": 2, "big": torch.zeros(1000)}, before_replace=lambda: os.kill(os.getpid(), signal.SIGKILL))
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    names = sorted(os.listdir(tmp_path))
    assert names == ["darl_replay.pt", f"darl_replay.pt.tmp.{pid}"]
    assert ff.read_checked(path) == {"v": 1}
    ff.write_checked(path, {"v": 3})  # the next write removes the dead one's temporary file
    assert os.listdir(tmp_path) == ["darl_replay.pt"] and ff.read_checked(path) == {"v": 3}


# ---- verl's tracker and the step folders ------------------------------------------------------------------------

def _step(root, t, files=("data.pt", "darl_replay.pt")):
    folder = root / f"global_step_{t}"
    (folder / "actor").mkdir(parents=True)
    for name in files:
        (folder / name).write_bytes(b"x")
    return folder


def test_no_tracker_means_no_checkpoint(tmp_path):
    assert ff.check_resume(str(tmp_path)) is None and ff.check_resume(str(tmp_path / "missing")) is None


def test_a_tracker_torn_by_a_kill_is_rewritten_with_the_newest_finished_step(tmp_path):
    _step(tmp_path, 2)
    _step(tmp_path, 4)
    _step(tmp_path, 6, files=("darl_replay.pt",))  # a later save killed before verl's data.pt: not finished
    (tmp_path / ff.TRACKER_FILE).write_bytes(b"")  # verl's open("w") truncated it, the kill came before write
    lines = []
    assert ff.check_resume(str(tmp_path), log=lines.append) == 4
    assert (tmp_path / ff.TRACKER_FILE).read_text() == "4" and "torn" in lines[0] and "global_step_4" in lines[0]
    assert ff.check_resume(str(tmp_path), log=lines.append) == 4 and len(lines) == 1  # repaired: nothing more to say


def test_a_torn_tracker_without_a_finished_folder_is_an_error(tmp_path):
    _step(tmp_path, 2, files=("darl_replay.pt",))
    (tmp_path / ff.TRACKER_FILE).write_bytes(b"")
    with pytest.raises(ff.CorruptCheckpointError, match=ff.TRACKER_FILE):
        ff.check_resume(str(tmp_path))


def test_a_tracker_naming_a_missing_folder_is_an_error_not_a_fresh_start(tmp_path):
    _step(tmp_path, 2)
    (tmp_path / ff.TRACKER_FILE).write_text("4")
    with pytest.raises(ff.CorruptCheckpointError, match="global_step_4 does not exist"):
        ff.check_resume(str(tmp_path))


def test_rotation_keeps_the_newest_folders_at_or_below_the_tracker(tmp_path):
    for t in (1, 2, 3, 4):
        _step(tmp_path, t)
    _step(tmp_path, 5, files=())  # partial, above the tracker
    (tmp_path / ff.TRACKER_FILE).write_text("4")
    assert ff.rotate(str(tmp_path), 2, log=lambda s: None) == [1, 2]
    assert sorted(ff.step_folders(str(tmp_path))) == [3, 4, 5]
    assert ff.rotate(str(tmp_path), None) == [] and ff.rotate(str(tmp_path), 0) == []
    # only among the steps this process saved: an earlier job's checkpoints stay, as with verl's own rotation
    assert ff.rotate(str(tmp_path), 1, log=lambda s: None, only=[4]) == []
    assert ff.rotate(str(tmp_path), 1, log=lambda s: None, only=[3, 4]) == [3]


def test_verify_cli_names_the_torn_file(tmp_path):
    folder = tmp_path / "global_step_3"
    folder.mkdir()
    ff.write_checked(str(folder / "darl_replay.pt"), OBJ)
    ff.write_checked(str(folder / "darl_queue.pt"), {"samples": []})
    assert ff.verify_folder(str(folder)) == {"darl_replay.pt": "ok", "darl_queue.pt": "ok"}
    data = (folder / "darl_queue.pt").read_bytes()
    (folder / "darl_queue.pt").write_bytes(data[:-3])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "recipe.darl.robustness.checkpoint_files", str(folder)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 1
    assert f"{folder}/darl_replay.pt: ok" in done.stdout and f"{folder}/darl_queue.pt: checkpoint file" in done.stdout


# ---- the kill hook ----------------------------------------------------------------------------------------------

def test_fault_spec_parsing():
    assert fi.parse("generate:3, after_buffer:4:0.5") == [("generate", 3, 0.0), ("after_buffer", 4, 0.5)]
    with pytest.raises(ValueError, match="fault"):
        fi.parse("nowhere:3")
    with pytest.raises(ValueError):
        fi.parse("update")


def test_the_hook_does_nothing_unless_armed(monkeypatch):
    kills = []
    monkeypatch.setattr(fi, "_kill", lambda fault, step: kills.append((fault, step)))
    monkeypatch.delenv(fi.ENV, raising=False)
    probes.probe("update", 3)
    monkeypatch.setenv(fi.ENV, "update:4,rollout_stop:2")
    probes.probe("update", 3)
    probes.probe("after_save", 4)
    assert kills == []
    probes.probe("update", 4)
    probes.probe("decode", 2)  # a scenario of the test's maps onto the product's point
    assert kills == [("update", 4), ("rollout_stop", 2)]
    with pytest.raises(ValueError, match="unknown probe point"):
        probes.probe("generate", 1)  # the product knows no test scenario


def test_the_armed_hook_writes_the_marker_and_kills_its_process(tmp_path):
    marker = tmp_path / "marker"
    code = textwrap.dedent("""
        from recipe.darl.probes import probe
        probe("update", 2)  # not armed: goes on
        print("passed step 2", flush=True)
        probe("update", 3)
        print("survived")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OMP_NUM_THREADS="1", DARL_FAULT_INJECT="update:3", DARL_FAULT_MARKER=str(marker)))
    assert done.returncode == -signal.SIGKILL
    assert "passed step 2" in done.stdout and "survived" not in done.stdout
    assert marker.read_text().startswith("update:3 pid ")


def test_the_hook_kills_the_group_named_by_darl_fault_pgid(tmp_path):
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        from recipe.darl.probes import probe
        sleeper = subprocess.Popen(["sleep", "60"])
        open(sys.argv[1], "w").write(str(sleeper.pid))
        os.environ["DARL_FAULT_PGID"] = str(os.getpgrp())
        probe("after_save", 5)
    """)
    pidfile = tmp_path / "sleeper"
    proc = subprocess.Popen([sys.executable, "-c", code, str(pidfile)], start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", DARL_FAULT_INJECT="after_save:5"))
    proc.wait(timeout=60)
    sleeper = int(pidfile.read_text())
    assert proc.returncode == -signal.SIGKILL
    # the sleeper was killed with the group (a zombie until init reaps it: check its state, not its pid)
    try:
        state = open(f"/proc/{sleeper}/stat").read().split()[2]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), state
