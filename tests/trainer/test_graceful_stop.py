"""The stop request (recipe/darl/robustness/stop_request.py) without Ray: SIGUSR1 writes it; DarlOneStepOffTrainer saves at the step
boundary, sets verl's is_last_step and removes it; the fully-async trainer saves at the next weight sync, ends
verl's fit and then the rollouter's (verl's own rollouter code, run on one event loop with stand-ins); a request
left by an earlier job is removed once the resume has run. run.sh's part is in tests/cluster/test_run_sh.py."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from types import SimpleNamespace

import pytest
import ray
import torch
from verl.experimental.fully_async_policy import fully_async_rollouter
from verl.experimental.fully_async_policy.message_queue import MessageQueue
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

from recipe.darl.robustness.stop_request import STOP_FILE, install_stop_signal
from recipe.darl.trainers import fully_async as fa
from recipe.darl.trainers.one_step_off import BUFFER_FILE

from test_fully_async import _fa, make_fa_trainer
from test_trainer_hooks import make_trainer, replay_cfg, uids  # noqa: F401 (replay_cfg: the fixture)


def _request(cfg) -> str:
    path = os.path.join(cfg.trainer.default_local_dir, STOP_FILE)
    os.makedirs(cfg.trainer.default_local_dir, exist_ok=True)
    open(path, "w").close()
    return path


def test_sigusr1_writes_the_stop_request(tmp_path, capsys):
    ckpt = tmp_path / "ckpt" / "run"  # not there yet: the handler creates it
    before = signal.getsignal(signal.SIGUSR1)
    try:
        install_stop_signal(str(ckpt))
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.time() + 5
        while not (ckpt / STOP_FILE).exists():  # Python runs the handler between bytecodes of the main thread
            assert time.time() < deadline
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert f"SIGUSR1 to pid {os.getpid()}" in (ckpt / STOP_FILE).read_text()
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[D-ARL] SIGUSR1: stop requested ({ckpt / STOP_FILE}); the trainer saves a checkpoint at its next "
                   "step boundary and ends"]


def test_both_entry_points_install_it_right_before_run_ppo_not_on_a_dry_run(compose_config, monkeypatch, capsys):
    import verl.trainer.main_ppo

    from recipe.darl import main_one_step_off

    cfg = compose_config()
    seen = []
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo",
                        lambda config, task_runner_class: seen.append((signal.getsignal(signal.SIGUSR1), task_runner_class)))
    before = signal.getsignal(signal.SIGUSR1)
    try:
        monkeypatch.setenv("DARL_DRY_RUN", "1")
        main_one_step_off.run_or_print(cfg, main_one_step_off.MODE, "DarlTaskRunner")
        assert seen == [] and signal.getsignal(signal.SIGUSR1) is before
        monkeypatch.delenv("DARL_DRY_RUN")
        main_one_step_off.run_or_print(cfg, main_one_step_off.MODE, "DarlTaskRunner")  # main_fully_async goes through the same function
        from recipe.darl.trainers.task_runners import DarlTaskRunner

        assert len(seen) == 1 and seen[0][0].__name__ == "on_usr1" and seen[0][1] is DarlTaskRunner
    finally:
        signal.signal(signal.SIGUSR1, before)


# --------------------------------------------------------------------------- one-step-off


def boundary_step(trainer, batch) -> None:
    """verl's one-step-off fit_step from the reward to the checkpoint hook, then its step count."""
    trainer.metrics, trainer.timing_raw = {}, {}
    for hook in (trainer._fit_compute_reward, trainer._fit_compute_log_prob, trainer._fit_compute_advantage,
                 trainer._fit_update_actor):
        batch = hook(batch)
    trainer._fit_save_checkpoint()
    trainer.global_steps += 1


@pytest.mark.parametrize("save_freq", [-1, 5])
def test_one_step_off_saves_at_the_boundary_ends_and_removes_the_request(replay_cfg, batch_maker, capsys, save_freq):
    cfg = replay_cfg(f"trainer.save_freq={save_freq}")
    deltas: dict[str, float] = {}
    trainer = make_trainer(cfg, deltas)
    trainer.is_last_step, trainer.max_steps_duration = False, 0
    step1, step2 = (batch_maker(versions=[v, v], rewards=[[1, 0], [0, 1]], seed=v) for v in (0, 1))
    deltas.update({u: 0.1 for u in uids(step1) + uids(step2)})
    boundary_step(trainer, step1)
    assert trainer.actor_rollout_wg.saved == [] and not trainer.is_last_step  # step 1: nothing asked, nothing saved

    request = _request(cfg)
    boundary_step(trainer, step2)
    folder = os.path.join(cfg.trainer.default_local_dir, "global_step_2")
    assert trainer.actor_rollout_wg.saved == [(os.path.join(folder, "actor"), 2)]
    assert os.path.exists(os.path.join(folder, BUFFER_FILE)) and os.path.exists(os.path.join(folder, "data.pt"))
    with open(os.path.join(cfg.trainer.default_local_dir, "latest_checkpointed_iteration.txt")) as f:
        assert f.read() == "2"  # what a resume finds
    assert trainer.is_last_step  # verl's fit loop returns after this step
    assert not os.path.exists(request)
    out = capsys.readouterr().out
    assert f"[D-ARL] stop request: checkpoint saved at step 2 ({cfg.trainer.default_local_dir}); training ends" in out
    assert ("trainer.save_freq=-1 saves no checkpoints; saving one anyway" in out) == (save_freq <= 0)


def test_one_step_off_removes_a_request_left_by_an_earlier_job_after_the_resume(replay_cfg, batch_maker, monkeypatch,
                                                                               capsys):
    cfg = replay_cfg("trainer.resume_mode=auto")
    trainer = make_trainer(cfg, {})
    trainer.global_steps = 3
    trainer._save_checkpoint()  # a checkpoint to resume from, as the earlier job left it
    request = _request(cfg)
    seen = []
    resume = OneStepOffRayTrainer._load_checkpoint
    monkeypatch.setattr(OneStepOffRayTrainer, "_load_checkpoint",
                        lambda self: (seen.append(os.path.exists(request)), resume(self))[1])
    resumed = make_trainer(cfg, {})
    resumed.global_steps = 0
    resumed._load_checkpoint()
    assert resumed.global_steps == 3 and seen == [True]  # verl's resume ran with the request still there
    assert not os.path.exists(request)
    assert f"removed a stop request left by an earlier job: {request}" in capsys.readouterr().out


# --------------------------------------------------------------------------- fully-async


class StandInRollouter:
    """The trainer's handle on the rollouter: checkpoint calls, and `__ray_call__.remote(fn)` run here."""

    def __init__(self):
        self.saved, self.called = [], []
        self.save_checkpoint = SimpleNamespace(remote=lambda folder: self.saved.append(folder))

        async def call(fn, *args):
            self.called.append(fn)
            return fn(self, *args)

        self.__ray_call__ = SimpleNamespace(remote=call)


class StandInAggregator:
    """verl's MetricsAggregator: steps' metrics in, their aggregate out once per sync cycle."""

    def __init__(self):
        self.pending: list[dict] = []

    def add_step_metrics(self, metrics, **kw):
        self.pending.append(dict(metrics))

    def get_aggregated_metrics(self, **kw):
        return {k: v for m in self.pending for k, v in m.items()}

    def reset(self):
        self.pending = []


def fa_trainer(cfg, monkeypatch, deltas=None):
    trainer = make_fa_trainer(cfg, {} if deltas is None else deltas)
    monkeypatch.setattr(ray, "get", lambda x, **kw: x)  # the stand-ins answer directly, no Ray
    trainer.message_queue_client = SimpleNamespace(get_queue_size_sync=lambda: 0)  # empty: darl_queue.pt holds 0
    trainer.rollouter = StandInRollouter()
    trainer.local_trigger_step, trainer.last_ckpt_version, trainer.global_steps = 1, 0, 0
    trainer.max_steps_duration, trainer._stopping, trainer.required_samples = 0, False, 4
    trainer.metrics_aggregator = StandInAggregator()
    trainer.logger = SimpleNamespace(logged=[])
    trainer.logger.log = lambda data, step: trainer.logger.logged.append((step, data))
    trainer.progress_bar = SimpleNamespace(update=lambda n: None, close=lambda: None)
    return trainer


@pytest.mark.parametrize("save_freq", [-1, 1])
def test_fully_async_stops_at_the_next_sync_with_a_checkpoint_and_ends_the_rollouter(compose_config, batch_maker,
                                                                                     monkeypatch, capsys, save_freq):
    cfg = _fa(compose_config, "replay.warmup=0", "async_training.trigger_parameter_sync_step=2",
              f"trainer.save_freq={save_freq}")
    deltas: dict[str, float] = {}
    trainer = fa_trainer(cfg, monkeypatch, deltas)
    request = _request(cfg)  # before step 1: the stop waits for the sync after step 2
    steps = []

    async def fit_step(batch_dict=None):  # verl's fit_step, the hooks D-ARL and the stop touch, in its order
        trainer.metrics, trainer.timing_raw = {}, {}
        steps.append(trainer.global_steps)
        batch = batch_maker(versions=[0, 0], rewards=[[1, 0], [0, 1]], seed=len(steps))
        deltas.update({u: 0.0 for u in uids(batch)})
        for hook in (trainer._fit_compute_reward, trainer._fit_compute_log_prob, trainer._fit_compute_advantage,
                     trainer._fit_update_actor):
            batch = hook(batch)
        trainer._fit_update_local_step()
        trainer._fit_save_checkpoint()
        trainer._fit_postprocess_step()
        assert len(steps) < 5, "the stop request was not honoured"

    trainer.fit_step = fit_step
    assert asyncio.run(trainer.fit()) is None  # verl's fit, ended by StopRequested
    assert steps == [1, 2] and trainer.current_param_version == 1
    folder = os.path.join(cfg.trainer.default_local_dir, "global_step_1")
    assert trainer.actor_rollout_wg.saved == [(os.path.join(folder, "actor"), 1)]  # once, by verl or for the stop
    assert trainer.rollouter.saved == [folder]
    assert os.path.exists(os.path.join(folder, BUFFER_FILE)) and os.path.exists(os.path.join(folder, fa.QUEUE_FILE))
    with open(os.path.join(cfg.trainer.default_local_dir, "latest_checkpointed_iteration.txt")) as f:
        assert f.read() == "1"
    assert not os.path.exists(request)
    assert trainer.rollouter.called == [fa._end_generation]
    # the stop's own sync cycle is logged (verl logs a step's metrics at the next step, and the last after its loop)
    assert [step for step, data in trainer.logger.logged if "actor/pg_loss" in data] == [1]
    out = capsys.readouterr().out
    assert "[D-ARL] stop request: checkpoint saved at parameter version 1 (trainer step 2)" in out
    assert ("saving one anyway" in out) == (save_freq <= 0)


def test_fully_async_removes_a_stale_request_after_the_resume(compose_config, monkeypatch, capsys):
    cfg = _fa(compose_config, "trainer.resume_mode=auto")
    trainer = fa_trainer(cfg, monkeypatch)
    request = _request(cfg)
    seen = []
    resume = fa.FullyAsyncTrainerBase.load_checkpoint

    async def load(self):
        seen.append(os.path.exists(request))
        return await resume(self)

    monkeypatch.setattr(fa.FullyAsyncTrainerBase, "load_checkpoint", load)
    assert asyncio.run(trainer.load_checkpoint()) == 0 and seen == [True]
    assert not os.path.exists(request)
    assert "removed a stop request left by an earlier job" in capsys.readouterr().out


def plain(actor_class):
    """The class behind a @ray.remote class."""
    return actor_class.__ray_metadata__.modified_class.__ray_actor_class__


def test_end_generation_ends_verls_rollouter_paused_at_its_staleness_limit(compose_config, monkeypatch):
    """verl's FullyAsyncRollouter.fit on one event loop: 3 samples fed (its staleness limit), two generated, one
    still generating, the processor paused for a sync that will not come. `_end_generation` ends fit."""
    cfg = _fa(compose_config, "trainer.total_epochs=1")
    real_sleep = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda d, *a, **k: real_sleep(min(d, 0.01), *a, **k))  # its 10 s monitor

    class Generator:
        calls = 0

        async def generate_sequences_single(self, batch):
            Generator.calls += 1
            if Generator.calls == 3:
                await asyncio.Event().wait()  # a long generation, in flight when the run ends
            return batch

    async def run():
        r = plain(fully_async_rollouter.FullyAsyncRollouter).__new__(plain(fully_async_rollouter.FullyAsyncRollouter))
        queue = plain(MessageQueue)(cfg, max_queue_size=100)  # verl's queue, called directly
        r.__dict__.update(
            config=cfg, message_queue_client=queue, async_rollout_manager=Generator(), paused=False, running=True,
            train_dataloader=[{"input_ids": torch.tensor([[5, 6, 7]])} for _ in range(20)], global_steps=1,
            total_rollout_steps=20, pending_queue=asyncio.Queue(maxsize=128), active_tasks=set(), staleness_samples=0,
            max_required_samples=3, max_concurrent_samples=4, max_queue_size=100, required_samples=2,
            staleness_threshold=0.5, total_generated_samples=0, _step_generated_samples=0, dropped_stale_samples=0,
            processed_sample_count=0, idle_start_time=time.time(), _active_count_history=[])
        r._init_async_objects()
        fit = asyncio.create_task(r.fit())
        deadline = time.time() + 30
        while not (r.paused and len(queue.queue) == 2):
            assert time.time() < deadline and not fit.done()
            await real_sleep(0.01)
        await real_sleep(0.1)
        assert not fit.done()  # waiting for the trainer's sync
        fa._end_generation(r)
        await asyncio.wait_for(fit, timeout=10)
        return r, queue

    r, queue = asyncio.run(run())
    assert not r.running and list(queue.queue)[-1] is None  # verl's finish signal
    assert r.feed_task is None and r.processor_task is None
