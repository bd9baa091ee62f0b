"""`guard_generation` (recipe/darl/robustness/rollout_watch.py) with stand-in server handles: a dead server and a hung
generation become a `RolloutServerError` naming the step and each server's state; other errors pass through.
The real thing (a killed, a frozen hf server through Ray) is in test_kill_resume.py."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import ray.exceptions
from omegaconf import OmegaConf

from recipe.darl.robustness import rollout_watch as fr


class Handle:
    """A server actor handle: `__ray_call__.remote(fn)` answers, hangs or raises ActorDiedError."""

    def __init__(self, hexid: str, state: str):
        self._actor_id = SimpleNamespace(hex=lambda: hexid)
        self.state = state

    @property
    def __ray_call__(self):
        async def remote(fn):
            if self.state == "dead":
                raise ray.exceptions.ActorDiedError()
            if self.state == "hung":
                await asyncio.sleep(3600)
            return fn(None)

        return SimpleNamespace(remote=remote)


def _run(coro):
    return asyncio.run(coro)


async def _never(*_):
    """A wait that outlives every test: a generation, a sample wait or a weight sync on a hung or dead server."""
    await asyncio.sleep(3600)


def test_server_states_names_each_server(monkeypatch):
    handles = [Handle("a" * 32, "alive"), Handle("b" * 32, "dead"), Handle("c" * 32, "hung")]
    states = _run(fr.server_states(handles, ["hf://x/hf_server_0_0", "hf://y/hf_server_1_0", "10.0.0.3:8000"],
                                   timeout_s=0.2))
    assert states == ["hf://x/hf_server_0_0 (actor aaaaaaaaaaaa): alive",
                      "hf://y/hf_server_1_0 (actor bbbbbbbbbbbb): DEAD (ActorDiedError)",
                      "10.0.0.3:8000 (actor cccccccccccc): NOT ANSWERING within 0.2 s"]


def test_a_dead_server_becomes_an_error_naming_it_and_the_step(monkeypatch, capsys):
    async def work():
        raise ray.exceptions.ActorDiedError()

    handles = [Handle("a" * 32, "alive"), Handle("b" * 32, "dead")]
    with pytest.raises(fr.RolloutServerError) as e:
        _run(fr.guard_generation(work(), what="generating the batch of trainer step 7", timeout_s=None,
                                 handles=handles, addresses=["s0", "s1"]))
    text = str(e.value)
    assert text.startswith("generating the batch of trainer step 7: a rollout server died during generation (ActorDiedError)")
    assert "s1 (actor bbbbbbbbbbbb): DEAD" in text and "s0 (actor aaaaaaaaaaaa): alive" in text
    assert isinstance(e.value.__cause__, ray.exceptions.ActorDiedError)
    assert "[D-ARL] rollout failure detected at" in capsys.readouterr().out


def test_a_generation_past_the_timeout_is_an_error_naming_the_hung_server(monkeypatch):
    monkeypatch.setattr(fr, "PING_TIMEOUT_S", 0.2)

    async def work():
        await asyncio.sleep(3600)

    with pytest.raises(fr.RolloutServerError, match=r"step 3: no batch after 0.5 s \(faults.generation_timeout_s\)") as e:
        _run(fr.guard_generation(work(), what="step 3", timeout_s=0.5, handles=[Handle("c" * 32, "hung")], addresses=["s0"]))
    assert "s0 (actor cccccccccccc): NOT ANSWERING within 0.2 s" in str(e.value)


def test_other_errors_pass_through_and_results_are_returned():
    async def broken():
        raise ray.exceptions.RayTaskError("f", "traceback", ValueError("a bug in a reward"))

    with pytest.raises(ray.exceptions.RayTaskError):
        _run(fr.guard_generation(broken(), what="x", timeout_s=5, handles=[Handle("a" * 32, "alive")], addresses=["s0"]))

    async def fine():
        return 42

    assert _run(fr.guard_generation(fine(), what="x", timeout_s=5, handles=[], addresses=[])) == 42


def test_the_timeout_key():
    assert fr.generation_timeout(OmegaConf.create({"faults": {"generation_timeout_s": 90}})) == 90.0
    assert fr.generation_timeout(OmegaConf.create({"faults": {"generation_timeout_s": None}})) is None
    assert fr.generation_timeout(OmegaConf.create({})) is None


def test_the_config_check_refuses_a_bad_timeout(compose_config):
    from recipe.darl.checks.config_check import check_config
    from recipe.darl.main_one_step_off import MODE

    assert not [p for p in check_config(compose_config(), MODE) if "faults" in p]
    assert any("faults.generation_timeout_s must be null" in p
               for p in check_config(compose_config("faults.generation_timeout_s=-5"), MODE))


def test_fully_async_a_failed_rollouter_generation_is_an_error_not_a_finished_run():
    """verl's rollouter prints and swallows the exception that ends its generation, then sends its finish signal;
    `_watch_generation` records it and the D-ARL trainer raises it once verl's fit has returned."""
    from recipe.darl.trainers import fully_async as fa

    class Rollouter:
        def __init__(self, fail):
            self.global_steps, self.total_rollout_steps = 8, 8
            self.fail = fail

            async def call(fn, *args):
                return fn(self, *args)

            self.__ray_call__ = SimpleNamespace(remote=call)

        async def _streaming_generation_main(self):
            if self.fail:
                raise ray.exceptions.ActorDiedError()

        async def fit(self):  # verl's fit: gathers the generation with return_exceptions=True
            await asyncio.gather(self._streaming_generation_main(), return_exceptions=True)

    for fail in (False, True):
        trainer = fa.DarlFullyAsyncTrainerImpl.__new__(fa.DarlFullyAsyncTrainerImpl)
        trainer.global_steps, trainer.current_param_version = 4, 3
        trainer.rollouter = Rollouter(fail)
        trainer.checkpoint_manager = SimpleNamespace(replicas=[SimpleNamespace(_server_handle=Handle("d" * 32, "dead"),
                                                                               _server_address="hf://r/hf_server_0_0")])
        asyncio.run(trainer.rollouter.__ray_call__.remote(fa._watch_generation))
        asyncio.run(trainer.rollouter.fit())
        if not fail:
            asyncio.run(trainer._check_rollouter_finished())  # a finished run
            continue
        with pytest.raises(fr.RolloutServerError) as e:
            asyncio.run(trainer._check_rollouter_finished())
        assert str(e.value).startswith("the rollouter's generation failed (ActorDiedError: The actor died unexpectedly")
        assert "the trainer stopped at step 4, parameter version 3" in str(e.value)
        assert "hf://r/hf_server_0_0 (actor dddddddddddd): DEAD (ActorDiedError)" in str(e.value)


def _fully_async_trainer(step: int, version: int, timeout_s: float, server: "Handle", address: str):
    """A fully-async D-ARL trainer with only what its weight sync and sample wait read."""
    from recipe.darl.trainers import fully_async as fa

    trainer = fa.DarlFullyAsyncTrainerImpl.__new__(fa.DarlFullyAsyncTrainerImpl)
    trainer.global_steps, trainer.current_param_version, trainer._requeued, trainer._watching = step, version, 0, True
    trainer.config = OmegaConf.create({"faults": {"generation_timeout_s": timeout_s}})
    trainer.checkpoint_manager = SimpleNamespace(replicas=[SimpleNamespace(_server_handle=server,
                                                                           _server_address=address)])
    return trainer


def test_fully_async_a_dead_server_at_the_weight_sync_is_an_error_naming_it(monkeypatch):
    from recipe.darl.trainers import fully_async as fa

    async def sync(self):
        raise ray.exceptions.ActorDiedError()

    monkeypatch.setattr(fa.FullyAsyncTrainerBase, "_fit_update_weights", sync)
    trainer = _fully_async_trainer(5, 4, 60, Handle("e" * 32, "dead"), "hf://r/hf_server_0_0")
    with pytest.raises(fr.RolloutServerError) as e:
        asyncio.run(trainer._fit_update_weights())
    assert str(e.value).startswith("syncing weights to the rollout at trainer step 5 (parameter version 4): a rollout "
                                   "server died (ActorDiedError)")
    assert "hf://r/hf_server_0_0 (actor eeeeeeeeeeee): DEAD" in str(e.value)


def test_fully_async_no_sample_within_the_timeout_is_an_error_naming_the_hung_server(monkeypatch):
    from recipe.darl.trainers import fully_async as fa

    monkeypatch.setattr(fa.FullyAsyncTrainerBase, "_get_samples_from_queue", _never)
    monkeypatch.setattr(fr, "PING_TIMEOUT_S", 0.2)
    trainer = _fully_async_trainer(6, 5, 0.3, Handle("f" * 32, "hung"), "hf://r/hf_server_0_0")
    with pytest.raises(fr.RolloutServerError) as e:
        asyncio.run(trainer._get_samples_from_queue())
    assert str(e.value).startswith("collecting the samples of trainer step 6 (parameter version 5): no batch after 0.3 s")
    assert "hf://r/hf_server_0_0 (actor ffffffffffff): NOT ANSWERING within 0.2 s" in str(e.value)


def test_one_step_off_weight_sync_to_a_dead_server_names_it_and_the_step(monkeypatch):
    """The kill can land after the next batch was generated: the weight sync before the update finds the dead server."""
    from recipe.darl.trainers import one_step_off as osp

    trainer = osp.DarlOneStepOffTrainer.__new__(osp.DarlOneStepOffTrainer)
    trainer.global_steps = 4
    trainer.config = OmegaConf.create({"faults": {"generation_timeout_s": 60}})
    trainer.llm_server_manager = SimpleNamespace(server_handles=[Handle("ab" * 8, "dead")],
                                                 server_addresses=["http://10.0.0.1:8000"])

    def sync_to_dead_server(self):
        raise ray.exceptions.ActorDiedError()

    monkeypatch.setattr(osp.OneStepOffRayTrainer, "_fit_update_weights", sync_to_dead_server)
    with pytest.raises(fr.RolloutServerError) as caught:
        trainer._fit_update_weights()
    text = str(caught.value)
    assert text.startswith("syncing weights to the rollout at trainer step 4: a rollout server died (ActorDiedError)")
    assert "http://10.0.0.1:8000 (actor abababababab): DEAD (ActorDiedError)" in text

    def other_error(self):
        raise ray.exceptions.RayTaskError("f", "traceback", ValueError("not a server"))

    trainer.llm_server_manager.server_handles = [Handle("cd" * 8, "alive")]
    monkeypatch.setattr(osp.OneStepOffRayTrainer, "_fit_update_weights", other_error)
    with pytest.raises(ray.exceptions.RayTaskError):  # servers alive: not ours to rename
        trainer._fit_update_weights()


def test_guard_weight_sync_returns_results_and_passes_errors_through():
    assert fr.guard_weight_sync(lambda: {"sync": 1}, what="x", timeout_s=5, handles=[Handle("a" * 32, "dead")],
                                addresses=["s0"]) == {"sync": 1}  # done before any check: no ping

    def broken():
        raise ValueError("a bug in the sync")

    with pytest.raises(ValueError, match="a bug in the sync"):
        fr.guard_weight_sync(broken, what="x", timeout_s=5, handles=[], addresses=[])
    slow = fr.guard_weight_sync(lambda: (time.sleep(0.3), "late")[1], what="x", timeout_s=5,
                                handles=[Handle("a" * 32, "alive")], addresses=["s0"], poll_s=0.05)
    assert slow == "late"  # alive servers, within the timeout: waited for


def test_guard_weight_sync_a_server_dying_inside_the_sync_ends_the_wait(capsys):
    """What a fresh machine showed: the vLLM server SIGKILLed inside a weight sync; verl's sender waits forever."""
    never = threading.Event()
    handles = [Handle("a" * 32, "alive"), Handle("b" * 32, "dead")]
    t0 = time.time()
    with pytest.raises(fr.RolloutServerError) as e:
        fr.guard_weight_sync(never.wait, what="syncing weights to the rollout at trainer step 3", timeout_s=3600,
                             handles=handles, addresses=["s0", "s1"], poll_s=0.1)
    assert time.time() - t0 < 5
    text = str(e.value)
    assert text.startswith("syncing weights to the rollout at trainer step 3: a rollout server died during the weight sync")
    assert "s1 (actor bbbbbbbbbbbb): DEAD" in text and "s0 (actor aaaaaaaaaaaa): alive" in text
    assert "[D-ARL] rollout failure detected at" in capsys.readouterr().out


def test_guard_weight_sync_past_the_timeout_names_the_hung_server(monkeypatch):
    monkeypatch.setattr(fr, "PING_TIMEOUT_S", 0.1)
    never = threading.Event()
    with pytest.raises(fr.RolloutServerError, match=r"^step 2: no end after 0.3 s \(faults.generation_timeout_s\)") as e:
        fr.guard_weight_sync(never.wait, what="step 2", timeout_s=0.3, handles=[Handle("c" * 32, "hung")],
                             addresses=["s0"], poll_s=0.1)
    assert "s0 (actor cccccccccccc): NOT ANSWERING within 0.1 s" in str(e.value)


def test_one_step_off_weight_sync_hanging_on_a_dead_server_names_it_and_the_step(monkeypatch):
    from recipe.darl.trainers import one_step_off as osp

    never = threading.Event()
    monkeypatch.setattr(osp.OneStepOffRayTrainer, "_fit_update_weights", lambda self: never.wait())
    monkeypatch.setattr(fr, "SYNC_POLL_S", 0.1)
    trainer = osp.DarlOneStepOffTrainer.__new__(osp.DarlOneStepOffTrainer)
    trainer.global_steps = 2
    trainer.config = OmegaConf.create({"faults": {"generation_timeout_s": 3600}})
    trainer.llm_server_manager = SimpleNamespace(server_handles=[Handle("ef" * 8, "dead")],
                                                 server_addresses=["192.0.2.2:36175"])
    with pytest.raises(fr.RolloutServerError) as e:
        trainer._fit_update_weights()
    assert str(e.value).startswith("syncing weights to the rollout at trainer step 2: a rollout server died during "
                                   "the weight sync; rollout servers:\n  192.0.2.2:36175 (actor efefefefefef): DEAD")


def test_fully_async_weight_sync_hanging_on_a_dead_server_names_it_and_the_step(monkeypatch):
    from recipe.darl.trainers import fully_async as fa

    monkeypatch.setattr(fa.FullyAsyncTrainerBase, "_fit_update_weights", _never)
    monkeypatch.setattr(fr, "SYNC_POLL_S", 0.1)
    trainer = _fully_async_trainer(3, 2, 3600, Handle("9" * 32, "dead"), "192.0.2.2:36175")
    t0 = time.time()
    with pytest.raises(fr.RolloutServerError) as e:
        asyncio.run(trainer._fit_update_weights())
    assert time.time() - t0 < 5
    assert str(e.value).startswith("syncing weights to the rollout at trainer step 3 (parameter version 2): a rollout "
                                   "server died during the weight sync; rollout servers:\n  192.0.2.2:36175 (actor "
                                   "999999999999): DEAD")


def test_guard_weight_sync_async_past_the_timeout_and_a_finished_sync(monkeypatch):
    monkeypatch.setattr(fr, "PING_TIMEOUT_S", 0.1)

    with pytest.raises(fr.RolloutServerError, match=r"^step 8: no end after 0.3 s \(faults.generation_timeout_s\)") as e:
        _run(fr.guard_weight_sync_async(_never(), what="step 8", timeout_s=0.3, handles=[Handle("c" * 32, "hung")],
                                        addresses=["s0"], poll_s=0.1))
    assert "s0 (actor cccccccccccc): NOT ANSWERING within 0.1 s" in str(e.value)

    async def slow():
        await asyncio.sleep(0.3)
        return "synced"

    assert _run(fr.guard_weight_sync_async(slow(), what="x", timeout_s=5, handles=[Handle("a" * 32, "alive")],
                                           addresses=["s0"], poll_s=0.05)) == "synced"
