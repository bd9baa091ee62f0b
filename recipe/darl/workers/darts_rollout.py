"""DARTS in verl's agent loop (math in core/darts.py, measurements in docs/darts.md).

`DartsPlanner` (the DARTS managers' `planner`) plans each group's r and L, then folds the kept lengths into its EMA,
counts and times and drops its columns: the trainer sees n responses per prompt in verl's order.
`DartsAgentLoopWorker` runs a group's r requests, records their finishing order, aborts the rest once n finished
(L = 0) and keeps the first n - L and last L (per part, for a group that verl's chunking splits over workers).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import numpy as np
import ray
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager
from verl.utils.ray_utils import auto_await

from ..trainer_mode import FULLY_ASYNC, ONE_STEP_OFF, TrainerMode
from ..core.darts import DartsConfig, LengthSpreadEma, allocate, dual_end_keep, split_counts

# planning columns, removed before the trainer sees the batch
GROUP, EXTRA, KEEP_LAST = "darts_group", "darts_extra", "darts_keep_last"
# per kept row: its part's totals / its rows (responses; tokens of dropped and aborted requests)
COUNTS = ("darts_generated", "darts_aborted", "darts_dropped", "darts_dropped_tokens", "darts_aborted_tokens",
          "darts_aborts_missed")
TIMES = ("darts_submitted_at", "darts_last_kept_at")  # per kept row: its part's times (seconds since the epoch)
POPULATION = 1024  # fully-async plans one prompt at a time: against the EMA's most recent prompts
_ROW: contextvars.ContextVar = contextvars.ContextVar("darts_row")  # (part, task) of the agent loop running


def darts_config(config) -> DartsConfig:
    values = OmegaConf.to_container(config.get("rollout_shaping") or {}, resolve=True)
    return DartsConfig.from_dict(values, int(config.actor_rollout_ref.rollout.n))


def prompt_key(non_tensor: dict[str, np.ndarray], row: int) -> str:
    """A stable key of a row's prompt (its chat messages, else its token ids, else verl's `index`)."""
    for name in ("raw_prompt", "raw_prompt_ids", "index"):
        if name in non_tensor:
            value = non_tensor[name][row]
            value = value.tolist() if hasattr(value, "tolist") else value
            return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
    raise KeyError("rollout_shaping: a prompt row has no raw_prompt, raw_prompt_ids or index to key its EMA by")


@dataclass
class _Part:
    """The rows of one group this worker generates: n kept of r, finishing order, tasks to abort."""

    n: int
    r: int
    keep_last: int
    submitted_at: float = 0.0
    running: set = field(default_factory=set)
    finished: list = field(default_factory=list)  # tasks, in the order their generation finished
    finished_at: dict = field(default_factory=dict)  # task -> time its generation finished
    tokens: dict = field(default_factory=dict)  # task -> response tokens it generated
    outputs: dict = field(default_factory=dict)  # task -> id() of its output
    aborted: set = field(default_factory=set)
    aborted_calls: dict = field(default_factory=dict)  # task -> the abort of its server call (-> partial tokens)
    decoded: dict = field(default_factory=dict)  # task -> tokens of its server calls that returned (earlier turns
    aborted_tokens: int = 0                      # and partial-rollout segments)
    aborts_missed: int = 0  # aborted requests the server ran to their end anyway (or did not return in time)


class DartsAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker generating r responses per group and keeping n (module docstring)."""

    def __init__(self, config, llm_client, *args, **kwargs):
        super().__init__(config, llm_client, *args, **kwargs)
        self._parts: dict[str, _Part] = {}
        acquire, release = llm_client._acquire_server, llm_client._release_server

        async def acquire_abortable(request_id: str, **extra):
            call = asyncio.ensure_future(acquire(request_id, **extra))
            try:
                server_id, handle = await asyncio.shield(call)
            except asyncio.CancelledError:  # the balancer counts the request in flight once it answers: release it
                call.add_done_callback(lambda done: done.cancelled() or done.exception() is not None
                                       or release(done.result()[0], request_id=request_id))
                raise
            return server_id, _AbortOnCancel(handle)

        llm_client._acquire_server = acquire_abortable

    async def generate_sequences(self, batch):
        if GROUP not in batch.non_tensor_batch or batch.meta_info.get("validate", False):
            return await super().generate_sequences(batch)
        groups, extra, tail = (batch.non_tensor_batch[k] for k in (GROUP, EXTRA, KEEP_LAST))
        rows = [i for i in range(len(batch)) for _ in range(1 + int(extra[i]))]
        now = time.time()
        for key in dict.fromkeys(groups):
            mine = [i for i in range(len(batch)) if groups[i] == key]
            self._parts[key] = _Part(n=len(mine), r=sum(1 + int(extra[i]) for i in mine),
                                     keep_last=sum(int(tail[i]) for i in mine), submitted_at=now)
        expanded = batch.select_idxs(np.array(rows))
        expanded.meta_info = dict(batch.meta_info)
        try:
            return await super().generate_sequences(expanded)
        finally:
            for key in dict.fromkeys(groups):
                self._parts.pop(key, None)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        part = self._parts.get(kwargs.pop(GROUP, None))
        for name in (EXTRA, KEEP_LAST):
            kwargs.pop(name, None)
        run = super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs)
        if part is None:
            return await run
        task = asyncio.current_task()
        part.running.add(task)
        _ROW.set((part, task))  # read by the coroutine `run` once awaited: it runs in this task's context
        try:
            output = await run
        except asyncio.CancelledError:
            if task in part.aborted:  # ours: the group has its n
                if hasattr(task, "uncancel"):  # Python 3.11+ counts cancellations; 3.10 needs nothing here
                    task.uncancel()
                abort = part.aborted_calls.pop(task, None)
                partial, missed = await abort if abort is not None else (0, False)  # awaited before the sum is read
                part.aborted_tokens += part.decoded.pop(task, 0) + partial
                part.aborts_missed += missed
                return None
            raise
        finally:
            part.running.discard(task)
        part.outputs[task] = id(output)
        return output

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        """Records a response's finish (verl calls this after generation, before padding and reward); once n have
        finished with L = 0 the rest are aborted."""
        row = _ROW.get(None)
        if row is not None:
            part, task = row
            part.running.discard(task)
            part.finished.append(task)
            part.finished_at[task] = time.time()
            part.tokens[task] = int(sum(output.response_mask))
            if part.keep_last == 0 and len(part.finished) == part.n:
                for other in list(part.running):
                    part.aborted.add(other)
                    other.cancel()
        return await super()._agent_loop_postprocess(output, validate, **kwargs)

    def _postprocess(self, inputs, input_non_tensor_batch=None, validate=False):
        if not input_non_tensor_batch or GROUP not in input_non_tensor_batch:
            return super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)
        rank = {id(output): i for i, output in enumerate(inputs) if output is not None}
        keep: list[int] = []
        for key in dict.fromkeys(input_non_tensor_batch[GROUP]):
            part = self._parts[key]
            chosen = dual_end_keep(part.finished, part.n, part.keep_last)
            dropped = set(part.finished) - set(chosen)
            totals = (part.r, len(part.aborted), len(dropped), sum(part.tokens[t] for t in dropped),
                      part.aborted_tokens, part.aborts_missed)
            fields = {name: total / part.n for name, total in zip(COUNTS, totals)}
            fields.update(zip(TIMES, (part.submitted_at, max(part.finished_at[t] for t in chosen))))
            kept = sorted(rank[part.outputs[t]] for t in chosen)
            for i in kept:
                inputs[i].extra_fields.update(fields)
            keep += kept
        return super()._postprocess([inputs[i] for i in keep],
                                    input_non_tensor_batch={k: v[keep] for k, v in input_non_tensor_batch.items()},
                                    validate=validate)


class _AbortOnCancel:
    """A rollout server's handle whose `generate` aborts its request on the server when the caller is cancelled."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self.generate = SimpleNamespace(remote=lambda **kwargs: _generate_or_abort(handle, kwargs))

    def __getattr__(self, name: str):
        return getattr(self._handle, name)


async def _generate_or_abort(handle, kwargs: dict):
    ref = handle.generate.remote(**kwargs)
    row = _ROW.get(None)
    try:
        output = await ref
    except asyncio.CancelledError:
        handle.abort_request.remote(kwargs["request_id"], reset_prefix_cache=False)  # the server's own, fire and forget
        abort = asyncio.ensure_future(_abort_until_returned(handle, kwargs["request_id"], ref))
        if row is not None:  # the row's worker counts the tokens of the partial response the server returns
            row[0].aborted_calls[row[1]] = abort
        raise
    if row is not None:
        row[0].decoded[row[1]] = row[0].decoded.get(row[1], 0) + len(output.token_ids)
    return output


async def _abort_until_returned(handle, request_id: str, ref, period_s: float = 0.25,
                                timeout_s: float = 30.0) -> tuple[int, bool]:
    """Aborts `request_id` in its server's engine, again every `period_s` (vLLM ignores the abort of an id it does not
    hold yet) until the server call returns: (the partial response's tokens, whether the abort missed: the server
    reports the request `completed`, or returned nothing in `timeout_s`)."""
    loop = asyncio.get_running_loop()
    # a Ray object ref can be awaited again after the awaiting task was cancelled
    result, deadline = asyncio.ensure_future(ref), loop.time() + timeout_s
    while not result.done() and loop.time() < deadline:
        abort = asyncio.ensure_future(handle.__ray_call__.remote(abort_in_engine, request_id))
        abort.add_done_callback(lambda done: done.cancelled() or done.exception())  # a failed try: the next one
        await asyncio.wait([result, abort], timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            await asyncio.wait([result], timeout=period_s)
    if not result.done():
        result.cancel()
        return 0, True
    try:
        output = result.result()
    except Exception:  # noqa: BLE001 - a server call that failed: its tokens are not counted
        return 0, False
    return len(output.token_ids), getattr(output, "stop_reason", None) == "completed"


def abort_in_engine(server, request_id: str, timeout_s: float = 10.0) -> bool:
    """Aborts `request_id` with vLLM's `AsyncLLM.abort` on the engine's loop, run in verl's vLLM server actor via
    `__ray_call__`; False without a vLLM engine. verl 0.9.1's `abort_request` misses vLLM's internal request ids
    (docs/darts.md). Under a prefill/decode split the prefill leg (`<id>_P`) runs here, the decode leg (`<id>_D`) on a
    decode peer."""
    engine = getattr(server, "engine", None)
    handler = getattr(engine, "output_handler", None)  # AsyncLLM's output task: it runs on the engine's loop
    if not callable(getattr(engine, "abort", None)) or handler is None:
        return False
    for peer in getattr(server, "_pd_decode_peers", None) or ():
        peer.__ray_call__.remote(abort_in_engine, f"{request_id}_D")
    ids = [request_id, f"{request_id}_P"]
    asyncio.run_coroutine_threadsafe(engine.abort(ids), handler.get_loop()).result(timeout_s)
    return True


class DartsPlanner:
    """Plans r per group and observes the kept responses: the DARTS state of a verl `AgentLoopManager`."""

    def __init__(self, config, mode: TrainerMode) -> None:
        self.darts = darts_config(config)
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.spread_ema = LengthSpreadEma(self.darts.ema_alpha)
        self.counts = dict.fromkeys(("prompts", "warmup_prompts", "kept", *COUNTS), 0.0)
        self.kept_lengths: list[float] = []
        self.span: list[float] = []  # submission and last kept finish times since the last pop_metrics
        self.planned_prompts = 0
        # the fully-async rollouter reads metrics and state from Ray's task thread (`__ray_call__`) while `observe`
        # runs on its event loop: every read and write of the counters, lengths, span and EMA holds this lock
        self._state_lock = threading.Lock()
        # the warm-up's steps in prompts: train_batch_size (one-step-off, V1), require_batches mini-batches (fully-async)
        self.warmup_prompts = self.darts.warmup_steps * mode.step_budget(config) if self.darts.adaptive else 0

    def plan(self, prompts, chunks: int, population: bool) -> tuple[list[str], bool]:
        """Adds GROUP, EXTRA and KEEP_LAST to `prompts` (groups of n consecutive rows, verl splits them into `chunks`
        equal parts); returns the groups' prompt keys and whether this is the warm-up's plan."""
        n = self.n
        if len(prompts) % n:
            raise ValueError(f"rollout_shaping: {len(prompts)} rows are not groups of rollout.n={n}")
        groups = len(prompts) // n
        keys = [prompt_key(prompts.non_tensor_batch, g * n) for g in range(groups)]
        with self._state_lock:  # the EMA and the plan count, also read from Ray's task thread
            responses, tails, warm = self._responses(keys, population)
            self.planned_prompts += groups
        size = len(prompts) // chunks if len(prompts) % chunks == 0 else len(prompts)
        extra, tail = np.zeros(len(prompts), dtype=np.int64), np.zeros(len(prompts), dtype=np.int64)
        for g, (r, keep_last) in enumerate(zip(responses, tails)):
            cuts = sorted({g * n, (g + 1) * n} | {c for c in range(0, len(prompts), size) if g * n < c < (g + 1) * n})
            sizes = [b - a for a, b in zip(cuts, cuts[1:])]
            for a, e, k in zip(cuts, split_counts(r - n, sizes), split_counts(keep_last, sizes)):
                extra[a], tail[a] = e, k  # on the part's first row: the worker sums over the part's rows
        tag = uuid4().hex[:8]
        prompts.non_tensor_batch[GROUP] = np.array([f"{tag}:{i // n}" for i in range(len(prompts))], dtype=object)
        prompts.non_tensor_batch[EXTRA], prompts.non_tensor_batch[KEEP_LAST] = extra, tail
        return keys, warm

    def _responses(self, keys: list[str], population: bool) -> tuple[list[int], list[int], bool]:
        """r and L of each group, and whether this is the warm-up's plan (the released warm-up: r = mean_ratio * n,
        every tail cut)."""
        n, groups = self.n, len(keys)
        if self.planned_prompts < self.warmup_prompts:
            return [self.darts.mean_responses(n)] * groups, [0] * groups, True
        if self.darts.adaptive:
            low, high = self.darts.bounds(n)
            others = [k for k in self.spread_ema.recent(POPULATION) if k not in keys] if population else []
            spreads = [self.spread_ema.get(k) for k in others + keys]
            responses = allocate(spreads, n, self.darts.mean_ratio, low, high)[len(others):]
        else:
            responses = [self.darts.fixed_responses(n)] * groups
        return responses, [self.darts.keep_last_for(r, n) for r in responses], False

    def observe(self, output, keys: list[str], warm: bool = False) -> None:
        """Folds the kept lengths into the EMA, counts, times, and drops the planning and count columns."""
        lengths = output.batch["response_mask"].sum(-1).tolist()
        counted = {name: float(np.sum(output.non_tensor_batch.pop(name).astype(np.float64))) for name in COUNTS}
        submitted, last = (output.non_tensor_batch.pop(name).astype(np.float64) for name in TIMES)
        for name in (GROUP, EXTRA, KEEP_LAST):
            output.non_tensor_batch.pop(name, None)
        with self._state_lock:
            self.kept_lengths += lengths
            for g, key in enumerate(keys):
                self.spread_ema.update(key, lengths[g * self.n:(g + 1) * self.n])
            self.counts["prompts"] += len(keys)
            self.counts["warmup_prompts"] += len(keys) if warm else 0
            self.counts["kept"] += len(output)
            for name, value in counted.items():
                self.counts[name] += value
            self.span = [min(self.span[:1] + [submitted.min()]), max(self.span[1:] + [last.max()])]

    def pop_metrics(self) -> dict[str, float]:
        """`rollout_shaping/` metrics since the last call; generation_s runs from the first submission to the last
        kept response's finish."""
        with self._state_lock:
            c, self.counts = self.counts, dict.fromkeys(self.counts, 0.0)
            lengths, self.kept_lengths = self.kept_lengths, []
            span, self.span = self.span, []
            ema_prompts = float(len(self.spread_ema.values))
        if not c["prompts"] or not lengths:
            return {}
        p50, p95 = np.percentile(lengths, [50, 95]).tolist()
        tokens = {"kept": float(sum(lengths)), "dropped": c["darts_dropped_tokens"], "aborted": c["darts_aborted_tokens"]}
        return {"rollout_shaping/generation_s": span[1] - span[0],
                **{f"rollout_shaping/tokens_{k}": v for k, v in tokens.items()},
                "rollout_shaping/tokens_decoded": sum(tokens.values()),
                "rollout_shaping/kept_length_p50": p50, "rollout_shaping/kept_length_p95": p95,
                "rollout_shaping/generated": c["darts_generated"], "rollout_shaping/aborted": c["darts_aborted"],
                "rollout_shaping/aborts_missed": c["darts_aborts_missed"],
                "rollout_shaping/dropped": c["darts_dropped"], "rollout_shaping/kept": c["kept"],
                "rollout_shaping/responses_per_prompt": c["darts_generated"] / c["prompts"],
                "rollout_shaping/warmup": c["warmup_prompts"] / c["prompts"],
                "rollout_shaping/ema_prompts": ema_prompts}

    def state(self) -> dict[str, Any]:
        with self._state_lock:
            return {"ema": copy.deepcopy(self.spread_ema.state_dict()), "planned_prompts": self.planned_prompts}

    def load_state(self, state: dict[str, Any]) -> None:
        with self._state_lock:
            self.spread_ema = LengthSpreadEma(self.darts.ema_alpha, state["ema"])
            self.planned_prompts = int(state.get("planned_prompts", 0))


WORKERS = ray.remote(DartsAgentLoopWorker)  # verl's AgentLoopManager creates its workers from `agent_loop_workers_class`


class DartsAgentLoopManager(AgentLoopManager):
    """The one-step-off and V1 trainers' manager (`actor_rollout_ref.rollout.agent.agent_loop_manager_class`): both
    take a step's prompts as `data.train_batch_size`, the one-step-off mode's budget."""

    agent_loop_workers_class = WORKERS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.planner = DartsPlanner(self.config, TrainerMode(ONE_STEP_OFF))

    @auto_await  # as verl's: its validation calls this without await
    async def generate_sequences(self, prompts):
        if prompts.meta_info.get("validate", False):
            return await super().generate_sequences(prompts)
        keys, warm = self.planner.plan(prompts, chunks=len(self.agent_loop_workers), population=False)
        output = await super().generate_sequences(prompts)
        self.planner.observe(output, keys, warm)
        return output


class DartsFullyAsyncAgentLoopManager(FullyAsyncAgentLoopManager):
    """The fully-async rollouter's manager: one prompt per call, planned against the EMA's recent prompts."""

    agent_loop_workers_class = WORKERS

    async def generate_sequences_single(self, prompts):
        keys, warm = self.planner.plan(prompts, chunks=1, population=True)
        output = await super().generate_sequences_single(prompts)
        self.planner.observe(output, keys, warm)
        return output


def install_in_rollouter(rollouter) -> bool:
    """Makes the fully-async rollouter's manager (verl has no hook for its class) a DARTS one; idempotent. Call before
    the rollouter generates."""
    manager = rollouter.async_rollout_manager
    if isinstance(manager, DartsFullyAsyncAgentLoopManager):
        return False
    old = list(manager.agent_loop_workers)
    manager.__class__ = DartsFullyAsyncAgentLoopManager
    manager.planner = DartsPlanner(manager.config, TrainerMode(FULLY_ASYNC))
    manager.agent_loop_workers_class = WORKERS  # verl's __init__ set the instance's own
    # verl's worker creation: a coroutine that never awaits, run to its end here since __ray_call__ does not await
    creation = manager._init_agent_loop_workers()
    try:
        creation.send(None)
    except StopIteration:
        pass
    else:
        creation.close()
        raise RuntimeError("rollout_shaping: verl's AgentLoopManager._init_agent_loop_workers now awaits; "
                           "install_in_rollouter must be made async")
    for worker in old:
        ray.kill(worker)
    return True
