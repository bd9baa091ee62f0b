"""`HFReplica`: verl's `RolloutReplica` for the hf rollout (``actor_rollout_ref.rollout.name=hf``).

verl builds the replica in the process that creates `LLMServerManager` (the task runner). In standalone
mode (`init_standalone`, what the one-step-off trainer uses) verl first creates a rollout resource pool
and one `CheckpointEngineWorker` per rollout "GPU" (the receiving end of weight sync, holding an
`HFServerAdapter`), then calls `launch_servers`, which starts one `HFRolloutServer` actor on the node
of the replica's worker and hands its handle to the worker's adapter. Hybrid and colocated modes
(workers built by verl around the trainer or in the same placement group) go through the same method.
"""

from __future__ import annotations

import logging
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl.workers.rollout.replica import RolloutReplica

from .hf_server import HFRolloutServer, engine_options

logger = logging.getLogger(__name__)

SERVER_NAME_PREFIX = "hf_server_"


def _worker_node_id(worker) -> str:
    return ray.get_runtime_context().get_node_id()


def _attach_server(worker, server) -> bool:
    """Runs inside a rollout worker: give its server adapter the handle of the replica's server."""
    adapter = getattr(worker, "server_adapter", None) or getattr(worker, "rollout", None)
    if adapter is None or not hasattr(adapter, "attach_server"):
        return False
    adapter.attach_server(server)
    return True


class HFReplica(RolloutReplica):
    """One transformers generation server per replica; a replica spans exactly one rollout worker."""

    def __init__(self, replica_rank, config, model_config, gpus_per_node: int = 8, is_reward_model: bool = False,
                 is_teacher_model: bool = False, name_suffix: str = "") -> None:
        super().__init__(replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model,
                         name_suffix)
        if self.world_size != 1:
            raise ValueError(
                "the hf rollout runs one process per replica: set actor_rollout_ref.rollout."
                "tensor_model_parallel_size=1 (verl's default is 2), data_parallel_size=1 and "
                f"pipeline_model_parallel_size=1 (got world size {self.world_size})"
            )
        engine_options(self.config)  # unknown engine_kwargs.hf keys fail here, in the driver
        self.server_class = ray.remote(HFRolloutServer)

    def _server_name(self) -> str:
        role = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
        return f"{SERVER_NAME_PREFIX}{role}{self.replica_rank}_0{self.name_suffix}"

    async def launch_servers(self):
        assert len(self.workers) == self.world_size, f"{len(self.workers)} workers for world size {self.world_size}"
        node_id = await self.workers[0].__ray_call__.remote(_worker_node_id)
        name = self._server_name()
        env_vars = {key: os.environ[key] for key in ("VERL_PLATFORM", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM")
                    if key in os.environ}
        server = self.server_class.options(
            name=name,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            max_concurrency=self.max_concurrency,
            num_cpus=0,  # the replica's worker holds the replica's share of the pool; this runs beside it
            runtime_env={"env_vars": env_vars},
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.ready.remote()  # the model is loaded
        attached = await self.workers[0].__ray_call__.remote(_attach_server, server)
        if not attached:
            logger.warning("hf rollout replica %d: the worker has no hf server adapter; weight sync "
                           "will look the server up by name (%s)", self.replica_rank, name)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{node_id[:16]}/{name}"  # any unique string: no HTTP endpoint
