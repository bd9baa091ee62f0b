"""verl's config, Ray and a real FSDP2 trainer worker on CPU, for a rollout server to sync weights from
(tests/vllm/vllm_sync_check.py, on verl's vLLM server): `start` builds verl's ppo_trainer config for one trainer
rank and one standalone rollout replica, starts Ray and the trainer's worker group; `_perturb` and
`_trainer_log_probs` run inside the trainer worker.
"""

from __future__ import annotations

import os
import time

T0 = time.time()
TIMES = {}


def mark(name):
    TIMES[name] = round(time.time() - T0, 2)


def make_config(model_path: str, rollout: tuple[str, ...]):
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


def master_port_range() -> list[int]:
    """The trainer's process-group port, below Linux's ephemeral range and one block per pytest worker. verl picks a
    free port, closes it and binds it seconds later; a connection of a job on the other worker could take an ephemeral
    port in between (EADDRINUSE at init_process_group)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    return [20000 + 1000 * worker, 21000 + 1000 * worker]


def start(model_path: str, rollout: tuple[str, ...]):
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
        master_port_range=master_port_range(),
    )
    mark("trainer_spawned")
    return config, actor_wg
