"""DARTS in verl's agent loop (core/darts.py has the math; docs/darts.md the measurements).

- `DartsManagerMixin` (driver side: the one-step-off trainer's manager, the fully-async rollouter's) plans each
  group's responses r before generation (fixed, or adaptive from the length-spread EMA it owns and checkpoints),
  and after it folds the kept lengths into the EMA, counts generated / aborted / dropped responses, and removes
  its bookkeeping columns, so the trainer sees exactly n responses per prompt, in verl's order.
- `DartsAgentLoopWorker` (verl's `AgentLoopWorker`, one Ray actor per worker) runs the r requests of a group as
  verl runs any row, records the order they finish in, aborts the rest once n have finished (L = 0: the request is
  aborted in its server's engine, `abort_in_engine`), and keeps the n - L first and the L last.

Rows are planned as extra copies of a group's rows (column `darts_extra`), so a group split across two workers by
verl's chunking still works: each part selects among its own rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import numpy as np
import ray
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncAgentLoopManager
from verl.utils.ray_utils import auto_await

from ..core.darts import DartsConfig, LengthSpreadEma, allocate, dual_end_keep

GROUP, EXTRA = "darts_group", "darts_extra"  # planning columns, removed before the trainer sees the batch
COUNTS = ("darts_generated", "darts_aborted", "darts_dropped")  # per kept row: its part's totals / its rows
POPULATION = 1024  # fully-async plans one prompt at a time: against the EMA's most recent prompts


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
    running: set = field(default_factory=set)
    finished: list = field(default_factory=list)  # id() of outputs, in finishing order
    aborted: set = field(default_factory=set)


class DartsAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker generating r responses per group and keeping n (module docstring)."""

    def __init__(self, config, llm_client, *args, **kwargs):
        super().__init__(config, llm_client, *args, **kwargs)
        self.keep_last = darts_config(config).keep_last
        self._parts: dict[str, _Part] = {}
        acquire = llm_client._acquire_server

        async def acquire_abortable(request_id: str, **extra):
            server_id, handle = await acquire(request_id, **extra)
            return server_id, _AbortOnCancel(handle)

        llm_client._acquire_server = acquire_abortable

    async def generate_sequences(self, batch):
        if GROUP not in batch.non_tensor_batch or batch.meta_info.get("validate", False):
            return await super().generate_sequences(batch)
        groups, extra = batch.non_tensor_batch[GROUP], batch.non_tensor_batch[EXTRA]
        rows = [i for i in range(len(batch)) for _ in range(1 + int(extra[i]))]
        for key in dict.fromkeys(groups):
            mine = [i for i in range(len(batch)) if groups[i] == key]
            self._parts[key] = _Part(n=len(mine), r=sum(1 + int(extra[i]) for i in mine), keep_last=self.keep_last)
        expanded = batch.select_idxs(np.array(rows))
        expanded.meta_info = dict(batch.meta_info)
        try:
            return await super().generate_sequences(expanded)
        finally:
            for key in dict.fromkeys(groups):
                self._parts.pop(key, None)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        key = kwargs.pop(GROUP, None)
        kwargs.pop(EXTRA, None)
        part = self._parts.get(key) if key is not None else None
        if part is None:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                 **kwargs)
        task = asyncio.current_task()
        part.running.add(task)
        try:
            output = await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                   **kwargs)
        except asyncio.CancelledError:
            if task in part.aborted:  # ours: the group has its n
                task.uncancel()
                return None
            raise
        finally:
            part.running.discard(task)
        part.finished.append(id(output))
        if part.keep_last == 0 and len(part.finished) == part.n:
            for other in list(part.running):
                part.aborted.add(other)
                other.cancel()
        return output

    def _postprocess(self, inputs, input_non_tensor_batch=None, validate=False):
        if not input_non_tensor_batch or GROUP not in input_non_tensor_batch:
            return super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)
        groups = input_non_tensor_batch[GROUP]
        keep: list[int] = []
        for key in dict.fromkeys(groups):
            part = self._parts[key]
            rows = [i for i in range(len(inputs)) if groups[i] == key]
            rank = {id(inputs[i]): i for i in rows if inputs[i] is not None}
            kept = sorted(rank[o] for o in dual_end_keep(part.finished, part.n, part.keep_last))
            for i in kept:
                inputs[i].extra_fields.update({
                    "darts_generated": part.r / part.n, "darts_aborted": len(part.aborted) / part.n,
                    "darts_dropped": (len(part.finished) - part.n) / part.n})
            keep += kept
        return super()._postprocess([inputs[i] for i in keep],
                                    input_non_tensor_batch={k: v[keep] for k, v in input_non_tensor_batch.items()},
                                    validate=validate)



class _AbortOnCancel:
    """A rollout server's handle whose `generate` aborts its request on the server when the caller is cancelled."""

    def __init__(self, handle) -> None:
        self._handle = handle

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    @property
    def generate(self) -> "_AbortOnCancel":
        return self

    def remote(self, **kwargs):
        return _generate_or_abort(self._handle, kwargs)


async def _generate_or_abort(handle, kwargs: dict):
    ref = handle.generate.remote(**kwargs)
    try:
        return await ref
    except asyncio.CancelledError:  # fire and forget: vLLM's engine abort, and the server's own abort_request
        handle.__ray_call__.remote(abort_in_engine, kwargs["request_id"])
        handle.abort_request.remote(kwargs["request_id"], reset_prefix_cache=False)
        raise


def abort_in_engine(server, request_id: str, timeout_s: float = 10.0) -> bool:
    """Runs in verl's vLLM server actor (Ray's `__ray_call__`, on a thread of the actor) and aborts `request_id` with
    vLLM's own `AsyncLLM.abort`, on the engine's event loop; False where the server has no vLLM engine.

    vLLM gives each request an internal id, `<id>-<8 random characters>`; `AsyncLLM.abort` maps the id verl gave the
    request to it, while verl 0.9.1's `abort_request` looks the given id up among the internal ids, finds nothing and
    leaves the request decoding to its end (docs/darts.md). Servers whose `abort_request` works (the test suite's)
    are aborted through it; verl's finds nothing and changes nothing."""
    engine = getattr(server, "engine", None)
    handler = getattr(engine, "output_handler", None)  # AsyncLLM's output task: it runs on the engine's loop
    if not callable(getattr(engine, "abort", None)) or handler is None:
        return False
    asyncio.run_coroutine_threadsafe(engine.abort(request_id), handler.get_loop()).result(timeout_s)
    return True


class DartsManagerMixin:
    """Plans r per group and observes the kept responses; for a subclass of verl's `AgentLoopManager`."""

    agent_loop_workers_class = ray.remote(DartsAgentLoopWorker)  # verl's AgentLoopManager creates its workers from it

    def _init_darts(self) -> None:
        self.darts = darts_config(self.config)
        self.n = int(self.config.actor_rollout_ref.rollout.n)
        self.spread_ema = LengthSpreadEma(self.darts.ema_alpha)
        self.counts = dict.fromkeys(("prompts", "kept", *COUNTS), 0.0)
        self.kept_lengths: list[float] = []

    def _plan(self, prompts, population: bool):
        """Adds GROUP and EXTRA to the rows of `prompts` (groups of n consecutive rows: verl's interleaved repeat)."""
        if len(prompts) % self.n:
            raise ValueError(f"rollout_shaping: {len(prompts)} rows are not groups of rollout.n={self.n}")
        groups = len(prompts) // self.n
        keys = [prompt_key(prompts.non_tensor_batch, g * self.n) for g in range(groups)]
        if self.darts.adaptive:
            low, high = self.darts.bounds(self.n)
            others = [k for k in list(self.spread_ema.values)[-POPULATION:] if k not in keys] if population else []
            spreads = [self.spread_ema.get(k) for k in others + keys]
            responses = allocate(spreads, self.n, self.darts.mean_ratio, low, high)[len(others):]
        else:
            responses = [self.darts.fixed_responses(self.n)] * groups
        tag = uuid4().hex[:8]
        extra = np.zeros(len(prompts), dtype=np.int64)
        for g, r in enumerate(responses):
            share, rest = divmod(r - self.n, self.n)
            extra[g * self.n:(g + 1) * self.n] = [share + (j < rest) for j in range(self.n)]
        prompts.non_tensor_batch[GROUP] = np.array([f"{tag}:{i // self.n}" for i in range(len(prompts))], dtype=object)
        prompts.non_tensor_batch[EXTRA] = extra
        return keys

    def _observe(self, output, keys: list[str]) -> None:
        """Folds the kept lengths into the EMA, counts, and drops the planning and count columns."""
        lengths = output.batch["response_mask"].sum(-1).tolist()
        self.kept_lengths += lengths
        for g, key in enumerate(keys):
            self.spread_ema.update(key, lengths[g * self.n:(g + 1) * self.n])
        self.counts["prompts"] += len(keys)
        self.counts["kept"] += len(output)
        for name in COUNTS:
            self.counts[name] += float(np.sum(output.non_tensor_batch.pop(name).astype(np.float64)))
        for name in (GROUP, EXTRA):
            output.non_tensor_batch.pop(name, None)

    def pop_metrics(self) -> dict[str, float]:
        """`rollout_shaping/` metrics since the last call (responses generated, aborted, finished but dropped)."""
        c, self.counts = self.counts, dict.fromkeys(self.counts, 0.0)
        lengths, self.kept_lengths = self.kept_lengths, []
        if not c["prompts"]:
            return {}
        p50, p95 = np.percentile(lengths, [50, 95]).tolist()
        return {"rollout_shaping/kept_length_p50": p50, "rollout_shaping/kept_length_p95": p95,"rollout_shaping/generated": c["darts_generated"], "rollout_shaping/aborted": c["darts_aborted"],
                "rollout_shaping/dropped": c["darts_dropped"], "rollout_shaping/kept": c["kept"],
                "rollout_shaping/responses_per_prompt": c["darts_generated"] / c["prompts"],
                "rollout_shaping/ema_prompts": float(len(self.spread_ema.values))}

    def darts_state(self) -> dict[str, Any]:
        return {"ema": self.spread_ema.state_dict()}

    def load_darts_state(self, state: dict[str, Any]) -> None:
        self.spread_ema = LengthSpreadEma(self.darts.ema_alpha, state["ema"])


class DartsAgentLoopManager(DartsManagerMixin, AgentLoopManager):
    """The one-step-off trainer's manager (`actor_rollout_ref.rollout.agent.agent_loop_manager_class`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_darts()

    @auto_await  # as verl's: its validation calls this without await
    async def generate_sequences(self, prompts):
        if prompts.meta_info.get("validate", False):
            return await super().generate_sequences(prompts)
        keys = self._plan(prompts, population=False)
        output = await super().generate_sequences(prompts)
        self._observe(output, keys)
        return output


class DartsFullyAsyncAgentLoopManager(DartsManagerMixin, FullyAsyncAgentLoopManager):
    """The fully-async rollouter's manager: one prompt per call, planned against the EMA's recent prompts."""

    async def generate_sequences_single(self, prompts):
        keys = self._plan(prompts, population=True)
        output = await super().generate_sequences_single(prompts)
        self._observe(output, keys)
        return output


def install_in_rollouter(rollouter) -> bool:
    """Makes the fully-async rollouter's manager a `DartsFullyAsyncAgentLoopManager` with DARTS workers (verl
    creates it inside its rollouter, with no hook for its class); idempotent. Before the rollouter generates."""
    manager = rollouter.async_rollout_manager
    if isinstance(manager, DartsFullyAsyncAgentLoopManager):
        return False
    old = list(manager.agent_loop_workers)
    manager.__class__ = DartsFullyAsyncAgentLoopManager
    manager._init_darts()
    manager.agent_loop_workers_class = DartsFullyAsyncAgentLoopManager.agent_loop_workers_class
    # verl's own worker creation; a coroutine that never awaits (it only calls .remote()), run here to the end
    # because Ray's __ray_call__, which runs this, does not await
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
