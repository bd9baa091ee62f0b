"""Kill the job at chosen moments, resume with trainer.resume_mode=auto (docs/faults.md), stop it as Slurm does
before a time limit.

The one-step-off CPU pipeline (Ray, the FSDP2 trainer, the hf rollout server, replay K = 3, a checkpoint after
every step, 5 steps) runs in its own session; `DARL_FAULT_INJECT` picks the moment. All launches share one
output folder, each resuming what the previous left:

1. a rollout server dies mid-generation (only its process, SIGKILL): the run stops by itself with an error naming
   the server and the step, within seconds; the checkpoint before it stays the one resume takes;
2. the job (its whole process group) is SIGKILLed inside its second checkpoint save: buffer and actor shards
   written, verl's data.pt and tracker not: resume takes the previous checkpoint, with that checkpoint's buffer,
   whose actor shards verl's own rotation would have removed by then;
3. no fault, 30 configured steps and no periodic checkpoint: after its first update the test sends SIGUSR1 to the
   driver (what shells/run.sh forwards from Slurm ten minutes before the limit); the trainer saves at its next step
   boundary and exits 0; every step is trained once over the three launches. (The fully-async stop:
   test_stop_signal.py.)

These three log to one metrics file, the CPU scripts' `<out>/metrics.jsonl`, as a relaunch with the same command
does; each relaunch keeps the earlier launch's file beside it (recipe/darl/robustness/run_records.py).

`DARL_FAULT_FULL=1` adds the rest of the matrix (a job kill mid-generation, during the actor update, between the
buffer file and verl's files, inside the buffer's write, right after a save; a hung server) in another folder.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from kill_helpers import ONE_STEP_OFF, Launch, build_inputs, launch, read_log, usr1_to_driver
from recipe.darl.robustness.checkpoint_files import read_checked

pytestmark = pytest.mark.full  # a long launch: make test-all

STEPS = 5
FULL = os.environ.get("DARL_FAULT_FULL") == "1"


def _buffer_summary(root, step: int) -> dict:
    state = read_checked(str(root / "out" / "checkpoints" / f"global_step_{step}" / "darl_replay.pt"))["replay"]
    return {"groups": len(state["groups"]), "versions": sorted({g["version"] for g in state["groups"]}),
            "steps_done": state["steps_done"], "next_seq": state["next_seq"]}


def _assert_resumed(run: Launch, root, step: int, saved: dict) -> None:
    """`run` resumed at `step` (the last complete checkpoint) with exactly that checkpoint's buffer."""
    assert run.resumed_from() == step, run.text[-3000:]
    restored = run.restored()
    assert restored is not None and restored["path"].endswith(f"global_step_{step}/darl_replay.pt"), restored
    assert {k: restored[k] for k in saved} == saved
    assert saved["steps_done"] == step
    if run.trained():
        assert min(run.trained()) == step + 1, run.trained()


def _summary(root, runs: dict) -> None:
    """Per launch: exit code, seconds, processes left, tracker after it (printed with -s; docs/faults.md)."""
    for name, run in runs.items():
        detect = f", detected after {_detect_seconds(run):.1f} s" if "rollout failure detected" in run.text else ""
        print(f"[faults] {name}: rc {run.rc}, {run.seconds:.0f} s, {run.leftovers} process(es) left, "
              f"tracker {run.tracker}, folders {run.folders}, trained {run.trained()}{detect}")


def _detect_seconds(run: Launch) -> float:
    killed = float(run.marker[0].rsplit(" at ", 1)[1])
    detected = float(re.search(r"rollout failure detected at ([0-9.]+)", run.text).group(1))
    return detected - killed


def _relaunch(root, inputs, name: str, fault: str, env: dict, overrides: tuple, **kw) -> Launch:
    """`launch` with verl's file logger at the same path for every launch, `<out>/metrics.jsonl` (the CPU scripts'
    own); the launch's log is that file afterwards (each launch writes it anew, the one before kept beside it)."""
    metrics = root / "out" / "metrics.jsonl"
    run = launch(ONE_STEP_OFF, root, inputs, name, fault, {**env, "VERL_FILE_LOGGER_PATH": str(metrics)}, overrides, **kw)
    run.log = read_log(metrics) if metrics.exists() else {}
    return run


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    inputs = build_inputs(root)
    env = {"STEPS": str(STEPS)}
    timeout = ("faults.generation_timeout_s=120",)
    runs = {"server": _relaunch(root, inputs, "server", "rollout_server:2", env, timeout)}
    runs["saved_2"] = _buffer_summary(root, 2)
    runs["save"] = _relaunch(root, inputs, "save", "verl_save:4", env, timeout)
    runs["saved_3"] = _buffer_summary(root, 3)
    ckpt = root / "out" / "checkpoints"
    runs["step4_files"] = sorted(p.name for p in (ckpt / "global_step_4").iterdir() if ".tmp." not in p.name)
    runs["step3_shards"] = sorted(p.name for p in (ckpt / "global_step_3" / "actor").glob("*.pt"))
    runs["stop"] = _relaunch(root, inputs, "stop", "", {"STEPS": "30", "SAVE_FREQ": "1000"}, timeout,
                             after_step=STEPS - 1, action=usr1_to_driver)
    runs["root"] = root
    _summary(root, {k: runs[k] for k in ("server", "save", "stop")})
    return runs


def test_a_dead_rollout_server_stops_the_run_naming_it_and_the_step(fast):
    run = fast["server"]
    assert run.marker and run.marker[0].startswith("rollout_server:2 ")
    assert run.rc not in (0, -9), run.rc  # ended by itself, with an error
    assert "RolloutServerError: generating the batch of trainer step 3" in run.text
    assert re.search(r"hf://\S+/hf_server_0_0 \(actor [0-9a-f]+\): DEAD", run.text)
    assert _detect_seconds(run) < 10.0
    # steps 1 and 2 were trained and saved; nothing of step 3 was
    assert run.trained() == [1, 2] and run.tracker == 2


def test_a_kill_inside_a_save_resumes_from_the_previous_checkpoint(fast):
    """The second launch resumes from step 2, trains and saves step 3, and is killed inside step 4's save."""
    run, root = fast["save"], fast["root"]
    assert run.rc == -9 and run.marker[0].startswith("verl_save:4 ")
    _assert_resumed(run, root, 2, fast["saved_2"])
    assert run.trained() == [3]  # step 4 trained too, but verl logs a step's metrics after its save, where it died
    # step 4's folder holds the buffer and the actor shards, but verl never named it: the tracker still says 3
    assert run.tracker == 3 and run.folders == [2, 3, 4]
    assert fast["step4_files"] == ["actor", "darl_replay.pt"]  # no data.pt: verl stopped before it (and the tracker)
    # step 4 was this process's second save: verl's rotation (max_actor_ckpt_to_keep=1) would have removed step 3's
    # shards inside it, before the tracker; rotation now runs after the tracker, so they survived
    assert {"model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt"} <= set(fast["step3_shards"])


def test_usr1_after_the_resume_saves_at_the_next_step_boundary_and_no_step_is_lost(fast):
    """The third launch resumes from step 3, trains on, and stops at the step boundary after the USR1: one checkpoint,
    the stop's, complete, with the buffer of its last trained step; every step of the job trained and logged once."""
    run, root = fast["stop"], fast["root"]
    assert run.rc == 0, run.text[-3000:]
    assert "SIGUSR1: stop requested" in run.text
    _assert_resumed(run, root, 3, fast["saved_3"])
    last = run.trained()[-1]
    assert run.trained() == list(range(4, last + 1)) and last < 15, "the job did not end early"
    # the stop's save is this launch's only one (save_freq 1000); step 4's folder, torn by the second launch's kill,
    # stays beside it unless the stop came at step 4, whose save replaced it
    assert run.tracker == last and set(run.folders) == {2, 3, 4, last}
    folder = root / "out" / "checkpoints" / f"global_step_{last}"
    assert {"data.pt", "darl_replay.pt"} <= {p.name for p in folder.iterdir()}
    assert _buffer_summary(root, last)["steps_done"] == last
    # every step counted once: 1-2 (first launch), 3 (second; its step 4 was lost with the kill), 4-last (this one)
    assert fast["server"].trained() + fast["save"].trained() + run.trained() == list(range(1, last + 1))
    # and every step logged stays on disk: each relaunch kept the metrics file of the launch before it (the killed
    # one's too) beside the one it writes; sorted(), they are in launch order
    out = root / "out"
    files = sorted(out.glob("metrics*.jsonl"))
    assert [p.name for p in files] == ["metrics.001.jsonl", "metrics.002.jsonl", "metrics.jsonl"]
    records = [json.loads(line) for p in files for line in p.read_text().splitlines()]
    assert [r["step"] for r in records if "actor/pg_loss" in r["data"]] == list(range(1, last + 1))
    assert [sorted(s for s, m in read_log(p).items() if "actor/pg_loss" in m) for p in files] == \
        [[1, 2], [3], list(range(4, last + 1))]
    assert f"metrics of the earlier launch kept as {out / 'metrics.001.jsonl'}" in fast["save"].text
    assert f"metrics of the earlier launch kept as {out / 'metrics.002.jsonl'}" in run.text


def test_no_process_of_a_finished_launch_outlives_it_by_long(fast):
    # Ray's workers of a killed driver die with its raylet; what is left 3 s later is killed by the helper (as a
    # scheduler would); counted here so a change in that shows
    launches = ("server", "save", "stop")
    assert all(fast[k].leftovers <= 6 for k in launches), {k: fast[k].leftovers for k in launches}


def test_a_server_killed_inside_a_weight_sync_stops_the_run_naming_it_and_the_step(tmp_path_factory):
    """Deterministic: the server dies right after the first bucket of its second weight update (the sync after trainer
    step 1), with the trainer's sender inside the sync. Once seen to hang a run; now an error within seconds."""
    root = tmp_path_factory.mktemp("faults_sync")
    run = launch(ONE_STEP_OFF, root, build_inputs(root), "sync", "sync_server:2", {"STEPS": "3"},
                 ("faults.generation_timeout_s=120",))
    _summary(root, {"sync": run})
    assert run.marker and run.marker[0].startswith("sync_server:2 "), run.text[-3000:]
    assert run.rc not in (0, -9), run.rc
    assert re.search(r"RolloutServerError: syncing weights to the rollout at trainer step 1: a rollout server died",
                     run.text), run.text[-3000:]
    assert re.search(r"hf://\S+/hf_server_0_0 \(actor [0-9a-f]+\): DEAD", run.text)
    assert run.trained() == [] and run.tracker is None  # step 1's update ran, its metrics and save come after the sync
    assert _detect_seconds(run) < 10.0


# ---- the rest of the matrix (DARL_FAULT_FULL=1) ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def full(tmp_path_factory):
    if not FULL:
        pytest.skip("set DARL_FAULT_FULL=1 for the whole fault matrix (about 10 min)")
    root = tmp_path_factory.mktemp("faults_full")
    inputs = build_inputs(root)
    steps = 7
    env = {"STEPS": str(steps)}
    plan = [("generate", "generate:2"), ("update", "update:3:0.3"), ("after_buffer", "after_buffer:4"),
            ("buffer_write", "buffer_write:5"), ("after_save", "after_save:6")]
    runs, before = {}, {}
    for name, spec in plan:
        runs[name] = launch(ONE_STEP_OFF, root, inputs, name, spec, env, ("faults.generation_timeout_s=120",))
        if runs[name].tracker:
            before[name] = _buffer_summary(root, runs[name].tracker)
    runs["end"] = launch(ONE_STEP_OFF, root, inputs, "end", "", env, ("faults.generation_timeout_s=120",))
    runs["hang"] = launch(ONE_STEP_OFF, tmp_path_factory.mktemp("faults_hang"), inputs, "hang", "rollout_stop:1",
                          {"STEPS": "3"}, ("faults.generation_timeout_s=20",))
    _summary(root, runs)
    return {"root": root, "runs": runs, "before": before, "steps": steps, "plan": plan}


def test_full_matrix_each_kill_resumes_from_the_last_complete_checkpoint(full):
    runs, before, root = full["runs"], full["before"], full["root"]
    names = [n for n, _ in full["plan"]]
    expected_tracker = {"after_buffer": 3, "buffer_write": 4, "after_save": 6}  # kill inside a save at k: k - 1
    previous = None
    for name in names:
        run = runs[name]
        assert run.rc == -9 and run.marker and run.marker[0].startswith(name.split(":")[0]), (name, run.rc, run.text[-2000:])
        if name in expected_tracker:
            assert run.tracker == expected_tracker[name], (name, run.tracker)
        if previous is not None and runs[previous].tracker:
            _assert_resumed(run, root, runs[previous].tracker, before[previous])
        previous = name
    end = runs["end"]
    assert end.rc == 0
    _assert_resumed(end, root, runs[previous].tracker, before[previous])
    assert max(end.trained()) == full["steps"] and end.tracker == full["steps"]
    assert _buffer_summary(root, full["steps"])["steps_done"] == full["steps"]


def test_full_matrix_a_hung_server_stops_the_run_after_the_timeout(full):
    run = full["runs"]["hang"]
    assert run.rc not in (0, -9) and run.marker[0].startswith("rollout_stop:1 ")
    assert "no batch after 20 s (faults.generation_timeout_s)" in run.text
    assert re.search(r"hf_server_0_0 \(actor [0-9a-f]+\): NOT ANSWERING", run.text)
    assert 10.0 <= _detect_seconds(run) < 45.0  # the 20 s count from the wait's start; then 10 s of pings


def test_full_matrix_fully_async_a_dead_rollout_server_is_an_error(tmp_path_factory):
    """Fully-async: the server dies mid-generation; whichever notices first (the rollouter's generation, which verl
    swallows and the trainer raises after the finish signal, or the trainer's next weight sync) ends the run with
    a RolloutServerError naming the server."""
    if not FULL:
        pytest.skip("set DARL_FAULT_FULL=1 for the whole fault matrix")
    from kill_helpers import FULLY_ASYNC

    root = tmp_path_factory.mktemp("faults_fa")
    run = launch(FULLY_ASYNC, root, build_inputs(root), "fa_server", "rollout_server:1",
                 {"STEPS": "4", "REQUIRE_BATCHES": "1", "STALENESS_THRESHOLD": "2"}, timeout=900)
    _summary(root, {"fa_server": run})
    assert run.marker and run.rc not in (0, -9), run.rc
    assert "RolloutServerError: " in run.text
    assert re.search(r"hf://\S+/hf_server_0_0 \(actor [0-9a-f]+\): DEAD", run.text)


def test_full_matrix_fully_async_a_kill_inside_a_save_resumes_with_buffer_and_queue(tmp_path_factory):
    """Fully-async: the job is SIGKILLed inside the save of parameter version 2, between the buffer and queue files
    and verl's files; the resumed run takes version 1's checkpoint: its buffer, and its saved queue requeued."""
    if not FULL:
        pytest.skip("set DARL_FAULT_FULL=1 for the whole fault matrix")
    from kill_helpers import FULLY_ASYNC

    root = tmp_path_factory.mktemp("faults_fa_kill")
    inputs = build_inputs(root)
    env = {"STEPS": "4", "REQUIRE_BATCHES": "1", "STALENESS_THRESHOLD": "2"}
    killed = launch(FULLY_ASYNC, root, inputs, "fa_kill", "after_buffer:2", env, timeout=900)
    step1 = root / "out" / "checkpoints" / "global_step_1"
    saved = _buffer_summary(root, 1)
    queued = len(read_checked(str(step1 / "darl_queue.pt"))["samples"])
    end = launch(FULLY_ASYNC, root, inputs, "fa_end", "", env, timeout=900)
    _summary(root, {"fa_kill": killed, "fa_end": end})
    assert killed.rc == -9 and killed.marker[0].startswith("after_buffer:2 ")
    assert killed.tracker == 1 and 2 in killed.folders
    step2 = root / "out" / "checkpoints" / "global_step_2"
    assert not (step2 / "actor").exists() or not (step2 / "data.pt").exists()
    assert end.rc == 0, end.text[-3000:]
    assert "Load from checkpoint folder: " + str(step1) in end.text
    restored = end.restored()
    assert restored and restored["path"] == str(step1 / "darl_replay.pt") and {k: restored[k] for k in saved} == saved
    assert f"requeued {queued} generated but untrained sample(s) from {step1}/darl_queue.pt" in end.text
    assert end.tracker == 4 and _buffer_summary(root, 4)["steps_done"] > saved["steps_done"]


def test_full_matrix_fully_async_a_hung_rollout_server_is_an_error(tmp_path_factory):
    """Fully-async: the server is frozen (SIGSTOP) mid-generation; the trainer's wait for samples, or its next
    weight sync, gives up after faults.generation_timeout_s and names the server as not answering."""
    if not FULL:
        pytest.skip("set DARL_FAULT_FULL=1 for the whole fault matrix")
    from kill_helpers import FULLY_ASYNC

    root = tmp_path_factory.mktemp("faults_fa_hang")
    run = launch(FULLY_ASYNC, root, build_inputs(root), "fa_hang", "rollout_stop:1",
                 {"STEPS": "4", "REQUIRE_BATCHES": "1", "STALENESS_THRESHOLD": "2"}, ("faults.generation_timeout_s=20",),
                 timeout=900)
    _summary(root, {"fa_hang": run})
    assert run.marker and run.rc not in (0, -9), run.rc
    assert "(faults.generation_timeout_s); rollout servers:" in run.text
    assert re.search(r"hf_server_0_0 \(actor [0-9a-f]+\): NOT ANSWERING", run.text)
