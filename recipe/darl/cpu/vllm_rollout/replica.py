"""`CPUvLLMReplica`: verl's `vLLMReplica` on a machine without an accelerator (``VERL_PLATFORM=cpu``).

verl's `launch_servers` asks Ray for each worker's accelerator id, and Ray hands out none for "CPU". This one launches
verl's own `vLLMHttpServer` as verl does, on one node, with "cpu" devices and the environment a CPU engine needs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import uuid

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl.plugin.platform import get_platform
from verl.utils.net_utils import is_valid_ipv6_address
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

logger = logging.getLogger(__name__)

# passed from the process that builds the replica to the server actor (and from it to vLLM's engine process)
FORWARDED_ENV = ("VERL_PLATFORM", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                 "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
                 "VLLM_LOGGING_LEVEL")


# verl names the socket that carries each weight sync into vLLM after the Ray job id (`ipc:///tmp/rl-colocate-zmq-<job
# id>-replica-<r>-rank-<k>.sock`, the vLLM side reading it from VERL_RAY_JOB_ID). Every Ray cluster numbers its first
# job 01000000, so two launches on one host share the path, and when their syncs overlap one sender takes the other's
# receiver while the other waits for good. Each replica launch names its sockets after a token of its own instead.
SOCKET_ENV = "VERL_RAY_JOB_ID"
_SOCKET_NAME = re.compile(r"rl-colocate-zmq-.*?-replica-")


def _weight_socket_adapters(worker) -> list:
    """Inside a rollout worker (verl's CheckpointEngineWorker; a trainer worker in hybrid modes): the objects that
    open verl's weight-sync socket (vLLM's ServerAdapter, which holds its path as `zmq_handle`)."""
    holders = [getattr(worker, "server_adapter", None), getattr(worker, "rollout", None),
               *(getattr(w, "rollout", None) for w in getattr(worker, "worker_dict", {}).values())]
    return [h for h in holders if isinstance(getattr(h, "zmq_handle", None), str)]


def _weight_socket_paths(worker) -> list[str]:
    """Inside a rollout worker: the paths its weight-sync sockets will use."""
    return [adapter.zmq_handle for adapter in _weight_socket_adapters(worker)]


def _name_weight_socket(worker, token: str) -> None:
    """Inside a rollout worker: its weight-sync socket paths renamed after `token`."""
    for adapter in _weight_socket_adapters(worker):
        adapter.zmq_handle = _SOCKET_NAME.sub(f"rl-colocate-zmq-{token}-replica-", adapter.zmq_handle)


def _set_socket_env(server, token: str) -> None:
    """Inside verl's vLLMHttpServer, before it starts vLLM's processes (which inherit the variable)."""
    os.environ[SOCKET_ENV] = token


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica whose servers run on CPU: one node; no accelerator ids."""

    async def launch_servers(self):
        assert len(self.workers) == self.world_size, f"{len(self.workers)} workers for world size {self.world_size}"
        if self.nnodes != 1:
            raise ValueError(f"the CPU vLLM rollout runs each replica on one node (got {self.nnodes} nodes per replica)")
        # each worker's node through Ray's __ray_call__: verl's rollout workers have no method that reports it
        node_ids = await asyncio.gather(*[worker.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
                                          for worker in self.workers])
        if len(set(node_ids)) != 1:
            raise ValueError(f"the CPU vLLM rollout runs each replica on one node; its workers are on {set(node_ids)}")

        env = {key: os.environ[key] for key in FORWARDED_ENV if key in os.environ}
        # vLLM's CPU KV cache in whole GiB; vLLM's default sizes it from free memory, far more than a small model needs
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.update(get_platform().rollout_env_vars())

        prefix = self._get_server_name_prefix()  # verl's naming: ServerAdapter looks the server up by it
        role = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
        name = f"{prefix}server_{role}{self.replica_rank}_0{self.name_suffix}"
        server = self.server_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_ids[0], soft=False),
            runtime_env={"env_vars": env},
            name=name,
            max_concurrency=self.max_concurrency,
            num_cpus=0,  # the replica's workers hold its share of the pool; the server runs beside them
        ).remote(
            config=self.config,
            model_config=self.model_config,
            rollout_mode=self.rollout_mode,
            workers=self.workers,
            replica_rank=self.replica_rank,
            node_rank=0,
            gpus_per_node=self.gpus_per_replica_node,
            nnodes=1,
            cuda_visible_devices=",".join(["cpu"] * len(self.workers)),  # read by nothing on CPU
        )
        self.servers.append(server)
        await self._name_weight_sockets(server)

        master_address, master_port, dp_rpc_port = await server.get_master_address.remote()
        await server.launch_server.remote(master_address=master_address, master_port=master_port,
                                          dp_rpc_port=dp_rpc_port)
        address, port = await server.get_server_address.remote()
        self._server_handle = server
        self._server_address = f"[{address}]:{port}" if is_valid_ipv6_address(address) else f"{address}:{port}"
        logger.info("CPU vLLM replica %d: server %s at %s", self.replica_rank, name, self._server_address)

    async def _name_weight_sockets(self, server) -> None:
        """Both ends of this replica's weight-sync sockets named after one token (see SOCKET_ENV), through
        __ray_call__: verl's workers and server have no method that sets the name. Where a worker holds no adapter
        yet, verl's naming stays (the vLLM side must match the sender's)."""
        found = await asyncio.gather(*[w.__ray_call__.remote(_weight_socket_paths) for w in self.workers])
        if not all(found):
            logger.warning("CPU vLLM replica %d: weight-sync sockets keep verl's per-job names; two launches on this "
                           "host may collide", self.replica_rank)
            return
        token = uuid.uuid4().hex[:16]
        await asyncio.gather(*[w.__ray_call__.remote(_name_weight_socket, token) for w in self.workers])
        await server.__ray_call__.remote(_set_socket_env, token)
