"""The hf rollout server: a Ray actor that serves verl's token-in/token-out `generate` with transformers.

One actor per replica (`HFReplica.launch_servers`). It holds the model, batches concurrent requests
(`HFGenerator` cohorts) and answers the control calls verl's `RolloutReplica` forwards. Model calls run
on one worker thread, so the actor's event loop stays free for new requests, aborts and weight loads,
and a weight load never interleaves with a decode step.

Scheduling: requests queue up; when the oldest has waited ``batch_wait_ms`` or no new one arrived for
``batch_quiet_ms`` (or ``max_batch_size`` are waiting), the queue becomes a cohort, prefilled together.
Up to ``max_cohorts`` cohorts decode at once, one step each in turn, so stragglers start without
waiting for a running cohort to finish.

Knobs: ``actor_rollout_ref.rollout.engine_kwargs.hf`` (`ENGINE_DEFAULTS`); sampling and log-prob
semantics: `hf_engine`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from typing import Any, Optional

import torch

from recipe.darl.probes import probe
from .hf_engine import LOGPROBS_MODES, HFGenerator, RowResult, resolve_sampling

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

ENGINE_DEFAULTS = {
    "num_threads": 1,  # torch threads of the server process
    "batch_wait_ms": 20.0,  # the oldest queued request starts a cohort after at most this long
    "batch_quiet_ms": 3.0,  # ... or once no new request arrived for this long
    "max_batch_size": None,  # rows per cohort; None: rollout.max_num_seqs
    "max_cohorts": 4,  # cohorts decoding at the same time
    "attn_implementation": None,  # None: model.override_config.attn_implementation, else "sdpa"
}


def engine_options(config) -> dict[str, Any]:
    """`ENGINE_DEFAULTS` updated with ``rollout.engine_kwargs.hf``."""
    options = dict(ENGINE_DEFAULTS)
    engine_kwargs = getattr(config, "engine_kwargs", None) or {}
    user = engine_kwargs.get("hf", None) or {}
    unknown = set(user) - set(options)
    if unknown:
        raise ValueError(f"unknown rollout.engine_kwargs.hf keys {sorted(unknown)}; known: {sorted(options)}")
    options.update(dict(user))
    return options


def torch_dtype(name: Any) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    from verl.utils.torch_dtypes import PrecisionType

    return PrecisionType.to_dtype(name)


class _Request:
    __slots__ = ("request_id", "prompt_ids", "spec", "future", "arrived", "version_start")

    def __init__(self, request_id: str, prompt_ids: list[int], spec, future: asyncio.Future):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.spec = spec
        self.future = future
        self.arrived = time.monotonic()
        self.version_start = None


class HFRolloutServer:
    """Ray actor (async): transformers generation on CPU for one rollout replica.

    Args:
        config: the rollout config (`RolloutConfig` or its DictConfig).
        model_config: the model config (`HFModelConfig` or its DictConfig with ``_target_``).
        replica_rank: rank of the replica (seeds the sampler with ``config.seed + replica_rank``).
    """

    def __init__(self, config, model_config, replica_rank: int = 0, node_rank: int = 0, **kwargs):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        self.config: RolloutConfig = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig) \
            if not isinstance(config, RolloutConfig) else config
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig) \
            if not isinstance(model_config, HFModelConfig) else model_config
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.options = engine_options(self.config)
        torch.set_num_threads(int(self.options["num_threads"]))

        self.global_steps: Optional[int] = None  # version of the weights, set by weight sync
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf_rollout")
        self.generator = self._build_generator()

        max_batch = self.options["max_batch_size"] or self.config.max_num_seqs
        self._max_batch = max(1, int(max_batch))
        self._max_cohorts = max(1, int(self.options["max_cohorts"]))
        self._wait_s = float(self.options["batch_wait_ms"]) / 1000.0
        self._quiet_s = float(self.options["batch_quiet_ms"]) / 1000.0

        self._pending: list[_Request] = []
        self._cohorts: list[tuple[Any, dict[str, _Request]]] = []
        self._starting: dict[str, _Request] = {}  # the batch being prefilled, not yet a cohort
        self._to_abort: set[str] = set()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._scheduler: Optional[asyncio.Task] = None
        self._last_arrival = 0.0

        # admission gate (abort_all_requests closes it, resume_generation opens it)
        self._paused = False
        self._rejecting = False
        self._resume = asyncio.Event()
        self._resume.set()
        self._updating = False  # between begin_weight_update and finish_weight_update
        self._buckets = 0  # weight buckets loaded since begin_weight_update
        self._profiler = None
        self.stats = {"requests": 0, "cohorts": 0, "max_cohort_size": 0, "tokens": 0, "aborted": 0,
                      "weight_updates": 0}

    # ------------------------------------------------------------------ setup

    def _build_generator(self) -> HFGenerator:
        from transformers import AutoModelForCausalLM

        mc = self.model_config
        dtype = torch_dtype(self.config.dtype)
        attn = self.options["attn_implementation"] or (mc.override_config or {}).get("attn_implementation") or "sdpa"
        if self.config.load_format == "dummy":
            # like vLLM: random weights of the right shapes; the first weight sync brings the real ones
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.config.seed)
                model = AutoModelForCausalLM.from_config(mc.hf_config, dtype=dtype, attn_implementation=attn,
                                                         trust_remote_code=mc.trust_remote_code)
        else:
            model = AutoModelForCausalLM.from_pretrained(mc.local_path, dtype=dtype, attn_implementation=attn,
                                                         trust_remote_code=mc.trust_remote_code)
        model.eval()
        model.requires_grad_(False)

        eos = set()
        for source in (getattr(mc.tokenizer, "eos_token_id", None), getattr(mc.generation_config, "eos_token_id", None)):
            if source is None:
                continue
            eos.update([source] if isinstance(source, int) else source)
        if not eos and getattr(mc.hf_config, "eos_token_id", None) is not None:
            source = mc.hf_config.eos_token_id
            eos.update([source] if isinstance(source, int) else source)
        pad = getattr(mc.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = min(eos) if eos else 0

        mode = self.config.logprobs_mode or "processed_logprobs"
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"rollout.logprobs_mode={mode!r}: the hf rollout supports {LOGPROBS_MODES}")

        from verl.workers.rollout.utils import get_max_position_embeddings

        # vLLM's rule: max_model_len defaults to (and may not exceed) the model's position limit
        max_positions = get_max_position_embeddings(mc.hf_config)
        self.max_model_len = int(self.config.max_model_len or max_positions)
        if self.max_model_len > max_positions:
            raise ValueError(f"max_model_len ({self.max_model_len}) > max_position_embeddings ({max_positions})")
        return HFGenerator(model, eos, pad_token_id=pad, logprobs_mode=mode,
                           seed=int(self.config.seed) + int(self.replica_rank))

    async def ready(self) -> dict[str, Any]:
        """Returns once the model is loaded: a few facts about the server."""
        return {
            "replica_rank": self.replica_rank,
            "pid": os.getpid(),
            "dtype": str(next(self.generator.model.parameters()).dtype),
            "logprobs_mode": self.generator.logprobs_mode,
            "eos_token_ids": sorted(self.generator.eos_ids),
            "max_model_len": self.max_model_len,
            "global_steps": self.global_steps,
        }

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------ generate

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        priority: int = 0,
        **kwargs,
    ):
        """Generate a response to `prompt_ids`; returns verl's `TokenOutput`.

        ``log_probs`` are present when ``sampling_params["logprobs"]`` is truthy (verl sends
        ``rollout.calculate_log_probs``). ``extra_fields``: ``global_steps`` (weights version when the
        request finished) and ``min_global_steps``/``max_global_steps`` (versions at start and finish).
        """
        from verl.utils.tokenizer import normalize_token_ids
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or audio_data is not None:
            raise NotImplementedError("the hf rollout is text-only")
        prompt_ids = normalize_token_ids(prompt_ids)
        spec = resolve_sampling(
            sampling_params or {}, len(prompt_ids),
            response_length=self.config.response_length, prompt_length=self.config.prompt_length,
            max_model_len=self.max_model_len, ignore_eos=self.config.ignore_eos,
            repetition_penalty=self.config.repetition_penalty,
        )

        while self._paused:
            if self._rejecting:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                                   extra_fields=self._versions(self.global_steps))
            await self._resume.wait()

        request = _Request(str(request_id), prompt_ids, spec, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        self._last_arrival = request.arrived
        self._drained.clear()
        self._wake.set()
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.create_task(self._schedule())
        result: RowResult = await request.future
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs if spec.logprobs else None,
            stop_reason=result.stop_reason,
            extra_fields=self._versions(request.version_start),
        )

    def _versions(self, start) -> dict[str, Any]:
        end = self.global_steps
        start = end if start is None else start
        return {"global_steps": end, "min_global_steps": start, "max_global_steps": end}

    def _admit_now(self) -> bool:
        if not self._pending or self._updating or len(self._cohorts) >= self._max_cohorts:
            return False
        now = time.monotonic()
        return (len(self._pending) >= self._max_batch or now - self._pending[0].arrived >= self._wait_s
                or now - self._last_arrival >= self._quiet_s)

    async def _schedule(self) -> None:
        """The batching loop: admit queued requests as cohorts, step every cohort in turn."""
        try:
            while True:
                if not self._cohorts and not self._pending:
                    if not self._starting:
                        self._drained.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._cohorts and not self._admit_now():
                    # idle but for queued requests: wait for the batching window (or a wake-up)
                    self._wake.clear()
                    if self._pending and not self._updating:
                        now = time.monotonic()
                        delay = min(self._pending[0].arrived + self._wait_s, self._last_arrival + self._quiet_s) - now
                        try:
                            await asyncio.wait_for(self._wake.wait(), timeout=max(delay, 1e-4))
                        except asyncio.TimeoutError:
                            pass
                    else:
                        await self._wake.wait()
                    continue
                if self._admit_now():
                    await self._start_cohort()
                for cohort in list(self._cohorts):
                    await self._step_cohort(cohort)
                await asyncio.sleep(0)  # let control calls and new requests in between steps
        except Exception as error:  # never leave callers waiting on a dead loop
            logger.exception("hf rollout scheduler failed")
            waiting = self._pending + [r for _, requests in self._cohorts for r in requests.values()]
            self._pending, self._cohorts = [], []
            for request in waiting:
                if not request.future.done():
                    request.future.set_exception(error)
            raise

    async def _start_cohort(self) -> None:
        batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch:]
        requests = {}
        for request in batch:
            request.version_start = self.global_steps
            requests[request.request_id + f"#{id(request)}"] = request
        self._starting = requests
        try:
            cohort = await self._run(self.generator.prefill,
                                     [(key, r.prompt_ids, r.spec) for key, r in requests.items()])
        except Exception as error:
            for request in requests.values():
                if not request.future.done():
                    request.future.set_exception(error)
            return
        finally:
            self._starting = {}
        self._cohorts.append((cohort, requests))  # an abort during the prefill applies at its first step
        self.stats["cohorts"] += 1
        self.stats["max_cohort_size"] = max(self.stats["max_cohort_size"], len(requests))

    async def _step_cohort(self, entry) -> None:
        cohort, requests = entry
        probe("decode", self.global_steps or 0)  # mid-generation, with the weights of version `global_steps`
        aborted = [key for key, r in requests.items() if r.request_id in self._to_abort or "*" in self._to_abort]
        results: list[RowResult] = self.generator.remove(cohort, aborted) if aborted else []
        if len(cohort):
            try:
                results += await self._run(self.generator.step, cohort)
            except Exception as error:
                for key in cohort.keys:
                    request = requests.pop(key)
                    if not request.future.done():
                        request.future.set_exception(error)
                cohort._keep([])
        for result in results:
            request = requests.pop(result.key)
            self.stats["requests"] += 1
            self.stats["tokens"] += len(result.token_ids)
            self.stats["aborted"] += result.stop_reason == "aborted"
            if not request.future.done():
                request.future.set_result(result)
        if not len(cohort):
            self._cohorts.remove(entry)
            if not self._cohorts and not self._starting:
                self._to_abort.clear()

    async def _wait_drained(self) -> None:
        while self._cohorts or self._starting:
            self._wake.set()
            await asyncio.sleep(0.001)

    # ------------------------------------------------------------------ control calls

    async def abort_all_requests(self, reject_request: bool = False, **kwargs) -> dict[str, Any]:
        """Abort every queued and running request; running ones return what they generated so far
        (stop_reason "aborted"). New requests then wait for `resume_generation` (or, with
        ``reject_request=True``, return at once as aborted)."""
        self._paused = True
        self._rejecting = reject_request
        self._resume.clear()
        request_ids = [r.request_id for r in self._pending]
        for request in self._pending:
            if not request.future.done():
                request.future.set_result(RowResult(None, [], [], "aborted"))
        self._pending = []
        running = [r.request_id for _, requests in self._cohorts for r in requests.values()]
        running += [r.request_id for r in self._starting.values()]
        request_ids += running
        if running:
            self._to_abort.add("*")
            await self._wait_drained()
        self._to_abort.discard("*")
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def abort_request(self, request_id: str, **kwargs) -> dict[str, Any]:
        """Abort one request (queued or running)."""
        for request in list(self._pending):
            if request.request_id == request_id:
                self._pending.remove(request)
                request.future.set_result(RowResult(None, [], [], "aborted"))
                return {"aborted": True, "request_id": request_id}
        running = [r.request_id for _, requests in self._cohorts for r in requests.values()]
        if request_id in running or any(r.request_id == request_id for r in self._starting.values()):
            self._to_abort.add(request_id)
            self._wake.set()
            return {"aborted": True, "request_id": request_id}
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        self._paused = False
        self._rejecting = False
        self._resume.set()

    async def wait_for_requests_to_drain(self) -> None:
        await self._drained.wait()

    async def wake_up(self, tags: Optional[list[str]] = None, **kwargs) -> None:
        """Nothing to do on CPU: weights and state stay in memory."""

    async def sleep(self, **kwargs) -> None:
        """Nothing to do on CPU: there is no accelerator memory to hand back."""

    async def clear_kv_cache(self) -> None:
        """No cache outlives a request here (no prefix caching): nothing to clear."""

    async def release_kv_cache(self) -> None:
        """No persistent KV cache to release on CPU."""

    async def resume_kv_cache(self) -> None:
        """No persistent KV cache to restore on CPU."""

    async def start_profile(self, **kwargs) -> None:
        """Starts a torch CPU profiler when ``rollout.profiler`` asks for the torch tool; else nothing."""
        profiler = self.config.profiler
        if profiler is None or getattr(profiler, "tool", None) != "torch" or self._profiler is not None:
            return
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profiler.__enter__()

    async def stop_profile(self) -> None:
        if self._profiler is None:
            return
        self._profiler.__exit__(None, None, None)
        save_path = getattr(self.config.profiler, "save_path", None) or "."
        os.makedirs(save_path, exist_ok=True)
        self._profiler.export_chrome_trace(os.path.join(save_path, f"hf_rollout_replica{self.replica_rank}.json"))
        self._profiler = None

    async def set_global_steps(self, global_steps: int) -> None:
        """Set the version stamp returned with every response (the trainer step of the weights)."""
        self.global_steps = global_steps

    async def get_global_steps(self) -> Optional[int]:
        return self.global_steps

    # ------------------------------------------------------------------ weights

    async def begin_weight_update(self) -> None:
        """Stop starting cohorts and wait for the running ones, so no request mixes two weight versions."""
        self._updating = True
        self._buckets = 0  # loaded in this update
        await self._wait_drained()

    async def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Copy (name, full tensor) pairs into the model (Hugging Face names); returns how many."""
        if not self._updating:
            await self.begin_weight_update()
        count = await self._run(self.generator.load_weights, named_tensors)
        self._buckets += 1
        if self._buckets == 1:  # one bucket in, the rest not: a kill here lands inside the trainer's weight sync
            probe("weight_update", self.stats["weight_updates"] + 1)
        return count

    async def finish_weight_update(self, global_steps: Optional[int] = None) -> None:
        """End a weight update: set the version stamp (when given) and admit requests again."""
        if global_steps is not None:
            self.global_steps = global_steps
        self.stats["weight_updates"] += 1
        self._updating = False
        self._wake.set()

    async def compute_log_probs(self, prompt_ids: list[int], response_ids: list[int],
                                temperature: float = 1.0) -> list[float]:
        """Teacher-forced log_softmax(logits / T) of `response_ids` after `prompt_ids` (a check and a tool)."""
        return await self._run(self.generator.score, list(prompt_ids), list(response_ids), float(temperature))

    async def shutdown(self) -> None:
        """Stop the batching loop (requests still waiting are aborted) and the model thread."""
        await self.abort_all_requests(reject_request=True)
        if self._scheduler is not None:
            self._scheduler.cancel()
            self._scheduler = None
        self._executor.shutdown(wait=False)

    async def get_stats(self) -> dict[str, int]:
        """Counters: finished requests, cohorts started, the largest cohort, tokens, aborts, weight updates."""
        return dict(self.stats)

    async def state_checksum(self) -> float:
        """Sum of all parameters in float64: a cheap fingerprint of the loaded weights."""
        def _sum():
            return float(sum(p.detach().double().sum() for p in self.generator.model.parameters()))
        return await self._run(_sum)
