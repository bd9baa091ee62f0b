"""verl's vLLM rollout (`rollout.name=vllm`) through verl's own machinery on CPU, with weight sync from a real
FSDP2 trainer. Run by test_vllm_rollout.py in a fresh process (VERL_PLATFORM=cpu); one vLLM engine serves every
check. Steps, as verl's one-step-off trainer does them:

1. `LLMServerManager.create(config)` in standalone mode: verl looks "vllm" up in its replica registry (the CPU
   replica, recipe.darl.cpu.vllm_rollout), makes a rollout resource pool with one `CheckpointEngineWorker` (verl's
   vLLM `ServerAdapter`, the "ray_object_store" checkpoint engine), then starts verl's `vLLMHttpServer` on
   ``load_format=dummy`` (random weights);
2. the trainer: verl's `DetachActorWorker` (FSDP2 on CPU over gloo, fp32); `CheckpointEngineManager.update_weights`;
3. generation through verl's `LLMServerClient`: greedy and sampled, each token's log-prob compared with a
   teacher-forced forward of the trainer's module (transformers) on the same weights;
4. the trainer's weights are changed in place, synced as version 2, compared again (vLLM re-packs its CPU
   weights after each load: the keep-weights plugin), then a third sync;
5. the replica's control calls, and abort of a running request (what fully-async partial rollouts use).

Prints one JSON line with what the tests assert.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
import ray_sync_check  # noqa: E402  (the hf check: its config, clock and trainer-side helpers)
from ray_sync_check import TIMES, _perturb, _trainer_log_probs, mark  # noqa: E402,F401

# those helpers run inside Ray workers, which cannot import this folder: ship them by value, as __main__'s are
from ray import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(ray_sync_check)


def vllm_rollout() -> tuple[str, ...]:
    """The rollout overrides of verl's vLLM server on CPU (ray_sync_check.make_config has the rest)."""
    from recipe.darl.cpu.vllm_rollout import cpu_vllm_overrides

    return (*cpu_vllm_overrides(), "actor_rollout_ref.rollout.max_model_len=4096")


def _worker_facts(worker):
    import sys as _sys

    adapter = worker.server_adapter
    return {
        "adapter": type(adapter).__module__ + "." + type(adapter).__name__,
        "engine": type(worker.checkpoint_engine).__name__,
        "plugin_loaded": "recipe.darl.cpu.rollout" in _sys.modules,
        "use_shm": bool(getattr(adapter, "use_shm", False)),
        "socket": adapter.zmq_handle,  # the path verl's weight sync binds, vLLM's worker connects to
    }


def _server_facts(server):
    """Inside verl's vLLMHttpServer actor: what vLLM selected."""
    import importlib.metadata as md
    import os as _os

    import ray
    import vllm
    from vllm.platforms import current_platform

    return {"platform": current_platform.device_type, "vllm_version": vllm.__version__,
            "vllm_dist": md.version("vllm"), "kvcache_gib": _os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
            "verl_platform": _os.environ.get("VERL_PLATFORM"), "class": type(server).__name__,
            "socket_env": _os.environ.get("VERL_RAY_JOB_ID"), "job_id": ray.get_runtime_context().get_job_id()}


def _live_tokens(server) -> dict[str, int]:
    """The requests vLLM's engine is decoding, by internal id (`<request id>-<8 random characters>`), and the tokens
    each has decoded so far."""
    return {rid: state.detokenizer.num_output_tokens()
            for rid, state in server.engine.output_processor.request_states.items()}


def _abort_counting(server, request_id: str) -> int:
    """The tokens `request_id` has decoded at this moment; then the project's abort (it returns once vLLM's done)."""
    from recipe.darl.workers.darts_rollout import abort_in_engine

    found = [v for k, v in _live_tokens(server).items() if k.rsplit("-", 1)[0] == request_id]
    assert abort_in_engine(server, request_id)
    return found[0] if found else -1


def _rss_mb() -> dict:
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline", "memory_info"])
             if any("VLLM" in part or "vllm" in part.lower() for part in (p.info["cmdline"] or [])[:3])]
    return {"vllm_processes": len(procs), "rss_mb": round(sum(p.info["memory_info"].rss for p in procs) / 2**20)}


def main(model_path: str) -> None:
    import ray
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.llm_server import LLMServerManager

    config, actor_wg = ray_sync_check.start(model_path, vllm_rollout())
    trainer = actor_wg.workers[0]
    out = {}

    # 1. rollout server, exactly as the one-step-off trainer builds it
    t = time.time()
    manager = LLMServerManager.create(config=config)
    out["engine_start_s"] = round(time.time() - t, 1)
    replicas = manager.get_replicas()
    out["replica_class"] = type(replicas[0]).__name__
    out["server_addresses"] = manager.get_addresses()
    out["worker_facts"] = ray.get(replicas[0].workers[0].__ray_call__.remote(_worker_facts))
    server = replicas[0].servers[0]
    out["server_facts"] = ray.get(server.__ray_call__.remote(_server_facts))
    out["memory"] = _rss_mb()
    mark("rollout_up")

    # 2. the trainer's model and its checkpoint engine
    actor_wg.init_model()
    mark("trainer_up")
    ce_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
    ckpt = CheckpointEngineManager(config=ce_config, actor_wg=actor_wg, replicas=replicas)
    client = manager.get_client()
    prompt = [5, 17, 40, 9, 61, 22]

    async def generate(request_id, **params):
        return await client.generate(request_id, prompt_ids=prompt, sampling_params=params)

    def max_err(output, temperature):
        ref = ray.get(trainer.__ray_call__.remote(_trainer_log_probs, prompt, output.token_ids, temperature))
        return max(abs(a - b) for a, b in zip(output.log_probs, ref))

    before = asyncio.run(generate("before", temperature=1.0, logprobs=True))
    out["before"] = {"version": before.extra_fields.get("global_steps"), "n_log_probs": len(before.log_probs or []),
                     "n": len(before.token_ids), "err_vs_trainer": max_err(before, 1.0)}

    results = {}
    for version in (1, 2, 3):
        if version > 1:
            ray.get(trainer.__ray_call__.remote(_perturb))
        t = time.time()
        metrics = ckpt.update_weights(global_steps=version)
        sync_s = time.time() - t

        async def batch():
            return await asyncio.gather(
                generate(f"g{version}", temperature=0.0, logprobs=True),
                *[generate(f"s{version}_{i}", temperature=0.7, logprobs=True) for i in range(3)],
                *[generate(f"t{version}_{i}", temperature=1.0, logprobs=True) for i in range(2)])

        t = time.time()
        outs = asyncio.run(batch())
        gen_s = time.time() - t
        greedy, sampled, plain = outs[0], outs[1:4], outs[4:]
        results[version] = {
            "sync_seconds": round(sync_s, 3),
            "generate_seconds": round(gen_s, 3),
            "metrics": metrics,
            "versions": [o.extra_fields.get("global_steps") for o in outs],
            "min_max": [(o.extra_fields.get("min_global_steps"), o.extra_fields.get("max_global_steps"))
                        for o in outs],
            # temperature 0: vLLM reports log-probs of the unscaled distribution
            "greedy_err": max_err(greedy, 1.0),
            "sampled_err": max(max_err(o, 0.7) for o in sampled),
            "plain_err": max(max_err(o, 1.0) for o in plain),
            "greedy_tokens": greedy.token_ids,
            "lengths": [len(o.token_ids) for o in outs],
            "n_log_probs": [len(o.log_probs or []) for o in outs],
            "distinct_sampled": len({tuple(o.token_ids) for o in sampled + plain}),
        }
    out["syncs"] = results
    mark("synced")

    # 5. control calls (verl's RolloutReplica forwards them to the server) and abort of a running request
    replica = replicas[0]

    async def controls():
        await replica.clear_kv_cache()
        long = asyncio.create_task(client.generate("long", prompt_ids=prompt, sampling_params={
            "max_tokens": 4000, "ignore_eos": True, "logprobs": True, "temperature": 1.0}))
        await asyncio.sleep(1.5)
        await replica.abort_all_requests()
        aborted = await long
        await replica.resume_generation()
        after = await generate("after", temperature=0.0)
        return aborted, after

    aborted, after = asyncio.run(controls())
    out["aborted"] = {"stop_reason": aborted.stop_reason, "n": len(aborted.token_ids),
                      "n_log_probs": len(aborted.log_probs or []), "version": aborted.extra_fields.get("global_steps")}
    out["after_abort"] = {"stop_reason": after.stop_reason, "n": len(after.token_ids)}
    mark("controls")

    # 6. one request aborted by its id, as DARTS aborts a group's tail: verl's abort_request, then the project's
    async def one_abort():
        params = {"max_tokens": 4000, "ignore_eos": True, "temperature": 1.0}
        async def tail():  # straight to the server, with the id verl's client would have given it
            return await server.generate.remote(prompt_ids=prompt, sampling_params=params, request_id="tail")

        task = asyncio.create_task(tail())
        await asyncio.sleep(0.5)
        found = {"verl_result": await server.abort_request.remote("tail", reset_prefix_cache=False)}
        before = await server.__ray_call__.remote(_live_tokens)
        for _ in range(50):  # up to 10 s for 30 more tokens: a loaded machine decodes slowly
            await asyncio.sleep(0.2)
            after = await server.__ray_call__.remote(_live_tokens)
            if sum(after.values()) - sum(before.values()) >= 30:
                break
        found["live_ids"], found["decoded_after_verl_abort"] = list(before), sum(after.values()) - sum(before.values())
        found["tokens_at_abort"] = await server.__ray_call__.remote(_abort_counting, "tail")
        t = time.time()
        try:
            done = await asyncio.wait_for(task, 30)
            found.update(returned_tokens=len(done.token_ids), stop_reason=done.stop_reason,
                         returned_after_s=round(time.time() - t, 3))
        except (asyncio.TimeoutError, Exception) as e:  # noqa: BLE001 - reported, the test reads it
            found["returned_error"] = type(e).__name__
        found["live_after_ours"] = await server.__ray_call__.remote(_live_tokens)
        return found

    out["one_abort"] = asyncio.run(one_abort())
    mark("one_abort")
    out["times"] = TIMES
    print(json.dumps(out))
    sys.stdout.flush()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
