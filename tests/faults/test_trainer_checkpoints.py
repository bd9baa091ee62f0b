"""A kill at each point of DarlOneStepOffTrainer's checkpoint save, then a resume (no Ray; verl's own `_save_checkpoint` and
`_load_checkpoint` with the trainer tests' stand-in actor). The kill is the fault hook itself, made to raise
instead of SIGKILL, so the save stops exactly where a kill would stop it; the end-to-end kills are in
test_kill_resume.py."""

from __future__ import annotations

import copy
import os
import sys

import pytest

from recipe.darl.robustness import checkpoint_files as ff
from recipe.darl import probes

probes._loaded()
fi = sys.modules[probes.HOOK_MODULE]  # tests/faults/inject.py, as the product's probes loaded it
from recipe.darl.trainers.one_step_off import BUFFER_FILE


class Killed(BaseException):
    pass


class RecordingActor:
    """The trainer tests' stand-in actor, also recording the rotation count verl's save passed to the worker."""

    world_size = 1

    def __init__(self):
        self.saved, self.loaded, self.kept = [], [], []

    def save_checkpoint(self, local_path, remote_path, step, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saved.append((local_path, step))
        self.kept.append(max_ckpt_to_keep)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


@pytest.fixture
def run(trainer_hooks, batch_maker):
    def _run(cfg, steps=3, kill=None, kill_at=None):
        """Trains `steps` steps, saving after each; returns the trainer and the buffer state saved at each step.
        With `kill`, the last step's save is killed at that point."""
        deltas: dict[str, float] = {}
        trainer = trainer_hooks.make_trainer(cfg, deltas)
        trainer.actor_rollout_wg = trainer.actor_wg = RecordingActor()
        saved = {}
        for step in range(1, steps + 1):
            batch = batch_maker(versions=[step - 1, step - 1], rewards=[[1, 0], [0, 1]], seed=step)
            deltas.update({u: 0.1 * step for u in trainer_hooks.uids(batch)})
            if step == steps and kill:
                kill_at(kill)
                with pytest.raises(Killed):
                    trainer_hooks.run_step(trainer, batch, save=True)
                break
            trainer_hooks.run_step(trainer, batch, save=True)
            saved[step] = copy.deepcopy(trainer.darl.buffer.state_dict())
        return trainer, saved
    return _run


@pytest.fixture
def resume(trainer_hooks):
    def _resume(cfg):
        resumed = trainer_hooks.make_trainer(cfg, {})
        resumed.global_steps = 0
        resumed._load_checkpoint()
        return resumed
    return _resume


@pytest.fixture
def kill_at(monkeypatch):
    def _kill(point, step):
        raise Killed(f"{point}:{step}")

    monkeypatch.setattr(fi, "_kill", _kill)
    return lambda spec: monkeypatch.setenv(fi.ENV, spec)


@pytest.mark.parametrize("point,files", [
    ("buffer_write", set()),  # the buffer complete under its temporary name only (a real SIGKILL leaves that file:
                              # test_checkpoint_files.py), no finished file
    ("after_buffer", {BUFFER_FILE}),
    ("verl_save", {BUFFER_FILE, "actor"}),  # actor shards written, data.pt and tracker not
])
def test_a_save_killed_before_the_tracker_resumes_from_the_previous_step(replay_cfg, run, resume, state_equal, kill_at,
                                                                         point, files):
    cfg = replay_cfg("trainer.resume_mode=auto")
    root = cfg.trainer.default_local_dir
    _, saved = run(cfg, kill=f"{point}:3", kill_at=kill_at)
    folder3 = os.path.join(root, "global_step_3")
    finished = {n for n in os.listdir(folder3) if ".tmp." not in n}
    assert finished == files
    assert open(os.path.join(root, ff.TRACKER_FILE)).read() == "2"

    resumed = resume(cfg)
    assert resumed.global_steps == 2
    assert resumed.actor_rollout_wg.loaded == [os.path.join(root, "global_step_2", "actor")]
    assert state_equal(resumed.darl.buffer.state_dict(), saved[2])


def test_a_kill_right_after_a_save_resumes_from_it(replay_cfg, run, resume, state_equal, kill_at):
    cfg = replay_cfg("trainer.resume_mode=auto")
    trainer, saved = run(cfg, kill="after_save:3", kill_at=kill_at)
    resumed = resume(cfg)
    assert resumed.global_steps == 3
    assert state_equal(resumed.darl.buffer.state_dict(), trainer.darl.buffer.state_dict())  # the step-3 buffer, as saved


def test_a_kill_inside_verls_tracker_write_is_repaired(replay_cfg, run, resume, state_equal):
    cfg = replay_cfg("trainer.resume_mode=auto")
    root = cfg.trainer.default_local_dir
    trainer, saved = run(cfg)
    open(os.path.join(root, ff.TRACKER_FILE), "w").close()  # truncated by verl's open("w"), killed before write
    resumed = resume(cfg)
    assert resumed.global_steps == 3 and state_equal(resumed.darl.buffer.state_dict(), saved[3])
    assert open(os.path.join(root, ff.TRACKER_FILE)).read() == "3"


def test_a_torn_buffer_in_the_resumed_checkpoint_is_refused_naming_it(replay_cfg, run, resume):
    cfg = replay_cfg("trainer.resume_mode=auto")
    run(cfg, steps=2)
    path = os.path.join(cfg.trainer.default_local_dir, "global_step_2", BUFFER_FILE)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(ff.CorruptCheckpointError, match=path):
        resume(cfg)


def test_rotation_happens_after_the_tracker_and_removes_whole_folders(replay_cfg, run, resume):
    cfg = replay_cfg("trainer.resume_mode=auto", "trainer.max_actor_ckpt_to_keep=1")
    trainer, _ = run(cfg)
    root = cfg.trainer.default_local_dir
    assert sorted(os.listdir(root)) == ["global_step_3", ff.TRACKER_FILE]
    # verl's worker was told to keep everything (it would remove the previous shards before the tracker moves)
    assert trainer.actor_rollout_wg.kept == [None, None, None]
    assert cfg.trainer.max_actor_ckpt_to_keep == 1  # restored after each save
    # a resumed trainer rotates only what it saved itself: step 3 of the earlier job stays beside its new step 4
    resumed = resume(cfg)
    resumed.actor_rollout_wg = resumed.actor_wg = RecordingActor()
    resumed.global_steps = 4
    resumed._save_checkpoint()
    assert sorted(os.listdir(root)) == ["global_step_3", "global_step_4", ff.TRACKER_FILE]
    resumed.global_steps = 5
    resumed._save_checkpoint()
    assert sorted(os.listdir(root)) == ["global_step_3", "global_step_5", ff.TRACKER_FILE]


def test_a_torn_fully_async_queue_file_is_refused_naming_it(tmp_path):
    """The fully-async trainer's saved queue (`darl_queue.pt`) goes through the same checked read."""
    import asyncio

    from recipe.darl.trainers import fully_async as fa

    put = []
    trainer = fa.DarlFullyAsyncTrainerImpl.__new__(fa.DarlFullyAsyncTrainerImpl)

    async def put_sample(sample):
        put.append(sample)

    trainer.message_queue_client = type("Client", (), {"put_sample": staticmethod(put_sample)})()
    ff.write_checked(str(tmp_path / fa.QUEUE_FILE), {"samples": [b"s1", b"s2"]})
    assert asyncio.run(trainer.requeue(str(tmp_path))) == 2 and put == [b"s1", b"s2"]
    data = (tmp_path / fa.QUEUE_FILE).read_bytes()
    (tmp_path / fa.QUEUE_FILE).write_bytes(data[:-5])
    with pytest.raises(ff.CorruptCheckpointError, match=str(tmp_path / fa.QUEUE_FILE)):
        asyncio.run(trainer.requeue(str(tmp_path)))
