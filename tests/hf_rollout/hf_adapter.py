"""`HFServerAdapter`: verl's `BaseRollout` for the hf rollout, living in the rollout worker process.

verl builds it through ``_ROLLOUT_REGISTRY[("hf", "async")]`` inside `CheckpointEngineWorker` (standalone
and colocated modes) or inside the trainer's `ActorRolloutRefWorker` (hybrid mode). Weight sync hands it
the checkpoint engine's stream of (name, full tensor) pairs; it forwards them in buckets to the replica's
`HFRolloutServer`, then stamps the server with the synced version (``global_steps``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

import ray
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor that owns exactly its bytes: pickling a view would ship its whole storage."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        return tensor.to("cpu")
    if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.nbytes:
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


class HFServerAdapter(BaseRollout):
    """Client of one `HFRolloutServer`: weight updates and the resume/release calls."""

    def __init__(self, config, model_config, device_mesh=None, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.is_leader_rank = self.rollout_rank == 0
        self.server_handle: Optional[ray.actor.ActorHandle] = None
        self.last_update: dict[str, Any] = {}

    def attach_server(self, server: ray.actor.ActorHandle) -> None:
        """Called by `HFReplica.launch_servers` with the server of this replica."""
        self.server_handle = server

    def _server(self) -> ray.actor.ActorHandle:
        if self.server_handle is None:
            from .hf_replica import SERVER_NAME_PREFIX

            self.server_handle = ray.get_actor(f"{SERVER_NAME_PREFIX}{self.replica_rank}_0")
        return self.server_handle

    async def resume(self, tags: list[str]):
        """Weights and KV cache never leave memory on CPU: forwards `wake_up` (a no-op on the server)."""
        if self.is_leader_rank:
            await self._server().wake_up.remote(tags=tags)

    async def release(self):
        """Forwards `sleep` (a no-op on the server)."""
        if self.is_leader_rank:
            await self._server().sleep.remote()

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: Optional[int] = None,
                             **kwargs):
        """Load a full set (or a subset) of weights into the server, then stamp it with `global_steps`.

        Args:
            weights: (name, tensor) pairs, sync or async iterator (Hugging Face names, full tensors).
            wire_format: only ``named_tensors`` (full tensors).
            global_steps: the trainer step of these weights; becomes the version `generate` reports.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes wire_format='named_tensors', got {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the hf rollout loads merged weights only (model.lora.merge=True)")
        if not self.is_leader_rank:  # one server per replica: other ranks only drain the stream
            async for _ in ensure_async_iterator(weights):
                pass
            return
        start = time.time()
        server = self._server()
        bucket_bytes = max(1, int(self.config.checkpoint_engine.update_weights_bucket_megabytes)) << 20
        await server.begin_weight_update.remote()
        bucket, size, count, total = [], 0, 0, 0
        complete = False
        try:
            async for name, tensor in ensure_async_iterator(weights):
                tensor = _owned(tensor)
                bucket.append((name, tensor))
                size += tensor.nbytes
                if size >= bucket_bytes:
                    count += await server.load_weights.remote(bucket)
                    total += size
                    bucket, size = [], 0
            if bucket:
                count += await server.load_weights.remote(bucket)
                total += size
            complete = True
        finally:
            # a failed update leaves the version stamp alone (and the server admitting requests again)
            await server.finish_weight_update.remote(global_steps if complete else None)
        self.last_update = {"tensors": count, "bytes": total, "seconds": time.time() - start,
                            "global_steps": global_steps}
        logger.info("hf rollout replica %d: loaded %d tensors (%.1f MB) in %.2fs, version %s", self.replica_rank,
                    count, total / 2**20, time.time() - start, global_steps)

    def generate_sequences(self, prompts):
        raise NotImplementedError("the hf rollout serves requests through its server (LLMServerManager)")
