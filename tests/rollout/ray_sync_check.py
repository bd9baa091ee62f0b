"""verl's standalone rollout path with the hf backend, and weight sync from a real FSDP2 trainer, on CPU.

Run by test_ray_integration.py in a fresh process (VERL_PLATFORM=cpu). Steps, as verl's one-step-off
trainer does them:

1. `LLMServerManager.create(config)` in standalone mode: verl looks "hf" up in its replica registry,
   makes a rollout resource pool with one `CheckpointEngineWorker` (which builds the hf server adapter
   from `_ROLLOUT_REGISTRY` and the "ray_object_store" checkpoint engine from `custom_backend_module`),
   then `HFReplica.launch_servers` starts the server actor (``load_format=dummy``: random weights);
2. the trainer: verl's `DetachActorWorker` (role "actor", FSDP2 on CPU over gloo, fp32) in a Ray worker
   group; `CheckpointEngineManager(...).update_weights(global_steps=1)`;
3. generation through verl's `LLMServerClient` (its load balancer), the control calls of the replica;
4. the trainer's weights are changed in place, synced as version 2, and compared again.

Prints one JSON line with what the test asserts.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

T0 = time.time()
TIMES = {}


def mark(name):
    TIMES[name] = round(time.time() - T0, 2)


HF_ROLLOUT = ("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.free_cache_engine=False",
              "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1")


def make_config(model_path: str, rollout: tuple[str, ...] = HF_ROLLOUT):
    """verl's ppo_trainer config for one FSDP2 trainer rank and one standalone rollout replica on CPU; `rollout`: the
    engine's overrides (also used by tests/vllm/vllm_sync_check.py)."""
    from hydra import compose, initialize_config_module

    overrides = [
        f"actor_rollout_ref.model.path={model_path}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        *rollout,
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.load_format=dummy",
        "actor_rollout_ref.rollout.prompt_length=16",
        "actor_rollout_ref.rollout.response_length=8",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.darl.cpu.rollout",
        "actor_rollout_ref.hybrid_engine=False",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _perturb(worker):
    """Inside the trainer worker: change every parameter in place (FSDP2 shards; world size 1)."""
    import torch

    with torch.no_grad():
        for i, p in enumerate(worker.actor.engine.module.parameters()):
            local = p.to_local() if hasattr(p, "to_local") else p
            local.mul_(1.0 + 0.05 * ((i % 3) - 1)).add_(0.02)
    return True


def _trainer_log_probs(worker, prompt, response, temperature):
    """Inside the trainer worker: teacher-forced log_softmax(logits / T) of `response` with the FSDP2 module."""
    import torch

    module = worker.actor.engine.module
    with torch.no_grad():
        ids = torch.tensor([list(prompt) + list(response)])
        logits = module(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        log_probs = torch.log_softmax(logits[len(prompt) - 1:-1] / temperature, -1)
        return log_probs.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


def _trainer_checksum(worker):
    import torch

    return float(sum(p.full_tensor().double().sum() if hasattr(p, "full_tensor") else p.double().sum()
                     for p in worker.actor.engine.module.parameters()))


def _worker_facts(worker):
    import sys as _sys

    return {
        "adapter": type(worker.server_adapter).__module__ + "." + type(worker.server_adapter).__name__,
        "engine": type(worker.checkpoint_engine).__name__,
        "plugin_loaded": "recipe.darl.cpu.rollout" in _sys.modules,
        "has_server": worker.server_adapter.server_handle is not None,
    }


def start(model_path: str, rollout: tuple[str, ...] = HF_ROLLOUT):
    """The config, Ray (CPU counts as GPUs for verl's pools), and the trainer worker group (FSDP2 on CPU), whose
    process starts while the rollout comes up; returns (config, actor_wg). Shared with vllm_sync_check.py."""
    import ray
    import torch
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    torch.set_num_threads(1)
    config = make_config(model_path, rollout)
    mark("config")
    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {k: os.environ[k] for k in ("VERL_PLATFORM", "OMP_NUM_THREADS",
                                                                   "VERL_USE_EXTERNAL_MODULES", "TOKENIZERS_PARALLELISM")
                                       if k in os.environ}})
    mark("ray_init")
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1, name_prefix="trainer_pool")
    actor_wg = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(DetachActorWorker), config=config.actor_rollout_ref,
                                               role="actor"),
        device_name="cpu",
    )
    mark("trainer_spawned")
    return config, actor_wg


def main(model_path: str) -> None:
    import ray
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.llm_server import LLMServerManager

    config, actor_wg = start(model_path)
    trainer = actor_wg.workers[0]
    out = {}

    # 1. rollout servers, exactly as the one-step-off trainer builds them
    manager = LLMServerManager.create(config=config)
    replicas = manager.get_replicas()
    out["replica_class"] = type(replicas[0]).__name__
    out["server_addresses"] = manager.get_addresses()
    out["worker_facts"] = ray.get(replicas[0].workers[0].__ray_call__.remote(_worker_facts))
    server = replicas[0].servers[0]
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

    before = asyncio.run(generate("before", temperature=0.0, logprobs=True))
    out["before_version"] = before.extra_fields.get("global_steps")
    out["dummy_differs"] = ray.get(server.state_checksum.remote()) != ray.get(trainer.__ray_call__.remote(
        _trainer_checksum))

    results = {}
    for version in (1, 2):
        if version == 2:
            ray.get(trainer.__ray_call__.remote(_perturb))
        t = time.time()
        metrics = ckpt.update_weights(global_steps=version)
        sync_s = time.time() - t

        async def batch():
            outs = await asyncio.gather(
                generate(f"g{version}", temperature=0.0, logprobs=True),
                *[generate(f"s{version}_{i}", temperature=0.7, logprobs=True) for i in range(3)])
            return outs

        outs = asyncio.run(batch())
        greedy = outs[0]
        trainer_greedy = ray.get(trainer.__ray_call__.remote(_trainer_log_probs, prompt, greedy.token_ids, 1.0))
        fixed = [33, 12, 80, 7, 45]
        rollout_fixed = ray.get(server.compute_log_probs.remote(prompt, fixed, 0.7))
        trainer_fixed = ray.get(trainer.__ray_call__.remote(_trainer_log_probs, prompt, fixed, 0.7))
        sampled_err = 0.0
        for o in outs[1:]:
            ref = ray.get(trainer.__ray_call__.remote(_trainer_log_probs, prompt, o.token_ids, 0.7))
            sampled_err = max(sampled_err, max(abs(a - b) for a, b in zip(o.log_probs, ref)))
        results[version] = {
            "sync_seconds": round(sync_s, 3),
            "metrics": metrics,
            "versions": [o.extra_fields.get("global_steps") for o in outs],
            "min_max": [(o.extra_fields.get("min_global_steps"), o.extra_fields.get("max_global_steps"))
                        for o in outs],
            "checksum_equal": abs(ray.get(server.state_checksum.remote())
                                  - ray.get(trainer.__ray_call__.remote(_trainer_checksum))) < 1e-6,
            "greedy_err": max(abs(a - b) for a, b in zip(greedy.log_probs, trainer_greedy)),
            "fixed_err": max(abs(a - b) for a, b in zip(rollout_fixed, trainer_fixed)),
            "sampled_err": sampled_err,
            "greedy_tokens": greedy.token_ids,
            "lengths": [len(o.token_ids) for o in outs],
            "rollout_fixed": rollout_fixed,
        }
    out["syncs"] = results
    mark("synced")

    # 3. the replica's control calls (verl's RolloutReplica forwards them to the server)
    replica = replicas[0]

    async def controls():
        await replica.wake_up()
        await replica.sleep()
        await replica.clear_kv_cache()
        await replica.release_kv_cache()
        await replica.resume_kv_cache()
        await replica.start_profile()
        await replica.stop_profile()
        long = asyncio.create_task(client.generate("long", prompt_ids=prompt, sampling_params={
            "max_tokens": 4000, "ignore_eos": True, "logprobs": True}))
        await asyncio.sleep(1.0)
        await replica.abort_all_requests()
        aborted = await long
        await replica.resume_generation()
        after = await generate("after", temperature=0.0)
        return aborted, after

    aborted, after = asyncio.run(controls())
    out["aborted"] = {"stop_reason": aborted.stop_reason, "n": len(aborted.token_ids),
                      "n_log_probs": len(aborted.log_probs or []), "version": aborted.extra_fields.get("global_steps")}
    out["after_abort"] = {"stop_reason": after.stop_reason, "n": len(after.token_ids)}
    out["server_stats"] = ray.get(server.get_stats.remote())
    mark("controls")
    out["times"] = TIMES
    print(json.dumps(out))
    sys.stdout.flush()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
