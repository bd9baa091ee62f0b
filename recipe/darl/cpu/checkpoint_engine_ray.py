"""Weight sync trainer -> rollout through Ray's object store: verl checkpoint engine "ray_object_store".

For machines without NCCL (CPU): ``checkpoint_engine.backend=ray_object_store`` with
``checkpoint_engine.custom_backend_module=recipe.darl.cpu.rollout``, whose import registers this backend. Trainer
rank 0 packs the weight stream into buckets, `ray.put`s each and posts its ref to a channel actor; rollout workers
fetch the buckets in order (zero-copy on the same node) and yield views into them. Other trainer ranks only walk the
stream (producing a full tensor is collective).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
import warnings
from typing import Any, AsyncGenerator, Generator, Optional

import ray
import torch

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

BACKEND = "ray_object_store"
ALIGN = 64  # bytes: tensor offsets inside a bucket


def bucket_channel_class():
    """The channel actor's class, built here so Ray ships it by value: the actor's process then needs
    only asyncio, not this module (whose import pulls in verl, seconds of start-up on a small CPU box)."""
    import asyncio
    from collections import defaultdict

    class BucketChannel:
        """Ray actor (async, no resources): the ordered bucket posts of each sync. A post holds its object ref
        inside a list, so Ray passes the reference, not the bytes."""

        def __init__(self):
            self._syncs: dict[str, dict[str, Any]] = defaultdict(lambda: {"posts": [], "acks": {}, "fetched": {}})
            self._changed = asyncio.Condition()

        async def put(self, sync_id: str, post: tuple) -> int:
            async with self._changed:
                posts = self._syncs[sync_id]["posts"]
                posts.append(post)
                self._changed.notify_all()
                return len(posts) - 1

        async def get(self, sync_id: str, index: int, timeout_s: Optional[float] = None, receiver: int = -1) -> tuple:
            async with self._changed:
                sync = self._syncs[sync_id]
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: len(sync["posts"]) > index), timeout=timeout_s)
                except asyncio.TimeoutError:
                    raise TimeoutError(f"weight sync {sync_id[:8]}: receiver {receiver} waited {timeout_s} s for bucket "
                                       f"{index}; the sender posted {len(sync['posts'])}") from None
                sync["fetched"][receiver] = max(sync["fetched"].get(receiver, -1), index)
                return sync["posts"][index]

        async def ack(self, sync_id: str, receiver: int, index: int) -> None:
            async with self._changed:
                acks = self._syncs[sync_id]["acks"]
                acks[receiver] = max(acks.get(receiver, -1), index)
                self._changed.notify_all()

        async def wait_acked(self, sync_id: str, index: int, receivers: list[int], timeout_s: Optional[float] = None):
            """Until every receiver acknowledged post `index`; then drops the refs of posts <= index."""
            async with self._changed:
                sync = self._syncs[sync_id]
                acks = sync["acks"]
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: all(acks.get(r, -1) >= index for r in receivers)),
                                           timeout=timeout_s)
                except asyncio.TimeoutError:  # say who stalled and where: fetched but not consumed, or never fetched
                    where = "; ".join(f"receiver {r}: fetched up to {sync['fetched'].get(r, -1)}, acknowledged up to "
                                      f"{acks.get(r, -1)}" for r in receivers)
                    raise TimeoutError(f"weight sync {sync_id[:8]}: waited {timeout_s} s for every receiver to "
                                       f"acknowledge bucket {index} of {len(sync['posts'])} posted ({where}; -1: none)"
                                       ) from None
                posts = sync["posts"]
                for i in range(index + 1):
                    posts[i] = (posts[i][0], None, posts[i][2])

        async def clear(self, sync_id: str) -> None:
            async with self._changed:
                self._syncs.pop(sync_id, None)

    return BucketChannel


@CheckpointEngineRegistry.register(BACKEND)
class RayObjectStoreCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine moving full tensors through Ray's object store (no NCCL, works on CPU).

    Args (verl passes the first two; the others are engine kwargs):
        bucket_size: bytes per bucket (``update_weights_bucket_megabytes << 20``).
        is_master: True on trainer rank 0, the only sender (verl sets it for the trainer workers).
        max_inflight_buckets: buckets the master may post ahead of the slowest receiver's acknowledgement.
        timeout_s: how long a receiver waits for a post, and the master for acknowledgements.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, max_inflight_buckets: int = 2,
                 timeout_s: float = 600.0, **kwargs) -> None:
        self.bucket_size = max(1, int(bucket_size))
        self.is_master = is_master
        self.max_inflight_buckets = max(1, int(max_inflight_buckets))
        self.timeout_s = timeout_s
        self.channel = None
        self.sync_id: Optional[str] = None
        self.rank: Optional[int] = None
        self.world_size: Optional[int] = None
        if is_master and ray.is_initialized():
            self._create_channel()  # starts now, while the rest of the job is still being set up

    def _create_channel(self):
        if self.channel is None:
            self.channel = ray.remote(num_cpus=0)(bucket_channel_class()).remote()
        return self.channel

    def prepare(self) -> dict[str, Any]:
        """The master creates its channel (once) and names this sync; the others report nothing."""
        if not self.is_master:
            return {}
        self.sync_id = uuid.uuid4().hex
        return {"channel": self._create_channel(), "sync_id": self.sync_id}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """Trainer rank 0 sends (rank 0), other trainer ranks sit out (-1), rollout workers are 1..n."""
        master = metadata[0]
        assert master and "channel" in master, "trainer rank 0 must be the checkpoint engine master"
        world_size = 1 + rollout_world_size
        shared = {"world_size": world_size, "channel": master["channel"], "sync_id": master["sync_id"]}

        def kwargs(ranks: list[int]) -> dict[str, list]:
            return {"rank": ranks, **{key: [value] * len(ranks) for key, value in shared.items()}}

        return kwargs([0] + [-1] * (actor_wg_world_size - 1)), kwargs(list(range(1, world_size)))

    def init_process_group(self, rank: int, world_size: int, channel=None, sync_id: Optional[str] = None):
        self.rank = rank
        self.world_size = world_size
        self.channel = channel
        self.sync_id = sync_id

    def finalize(self):
        """Drop this sync's posts (the master) and forget the sync; the channel stays for the next one."""
        if self.rank == 0:  # init_process_group gave it the master's channel and sync
            self.channel.clear.remote(self.sync_id)  # fire and forget: every receiver is done by now
        self.sync_id = None
        self.rank = None

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: Optional[int] = None) -> dict[str, float]:
        """Master: pack, post and pace the buckets. Other trainer ranks: walk the stream, send nothing."""
        assert self.rank is not None and self.rank <= 0, "rollout workers do not send weights"
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        start = time.time()
        receivers = list(range(1, self.world_size))
        metas, parts, size = [], [], 0
        index, total_bytes, total_tensors = -1, 0, 0

        async def post(is_last: bool):
            nonlocal index, metas, parts, size, total_bytes
            ref = ray.put(torch.cat(parts or [torch.empty(0, dtype=torch.uint8)]).numpy())
            index = await self.channel.put.remote(self.sync_id, (metas, [ref], is_last))
            total_bytes += size
            metas, parts, size = [], [], 0
            if index >= self.max_inflight_buckets and receivers:  # the channel's ref keeps each bucket alive till then
                await self.channel.wait_acked.remote(self.sync_id, index - self.max_inflight_buckets, receivers,
                                                     self.timeout_s)

        async for name, tensor in ensure_async_iterator(weights):
            tensor = tensor.detach().cpu()
            nbytes = tensor.nbytes
            if parts and size + nbytes > self.bucket_size:
                await post(is_last=False)
            pad = -size % ALIGN  # keep every tensor aligned, so the receiver can view the bytes as its dtype
            parts.append(torch.zeros(pad, dtype=torch.uint8))
            size += pad
            metas.append((name, tuple(tensor.shape), tensor.dtype, size, nbytes))
            parts.append(tensor.contiguous().reshape(-1).view(torch.uint8))
            size += nbytes
            total_tensors += 1
        await post(is_last=True)
        if receivers:  # keep the buckets alive until every receiver has them
            await self.channel.wait_acked.remote(self.sync_id, index, receivers, self.timeout_s)
        seconds = time.time() - start
        logger.info("ray_object_store: sent %d tensors (%.1f MB) in %d buckets, %.2fs, version %s", total_tensors,
                    total_bytes / 2**20, index + 1, seconds, global_steps)
        return {
            "checkpoint_engine/payload_mbytes": total_bytes / 2**20,
            "checkpoint_engine/tensors": float(total_tensors),
            "checkpoint_engine/buckets": float(index + 1),
            "checkpoint_engine/send_seconds": seconds,
        }

    async def receive_weights(self, global_steps: Optional[int] = None
                              ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Rollout worker: yield (name, tensor) views into the received buckets, in the sender's order."""
        assert self.rank is not None and self.rank > 0, "only rollout workers receive weights"
        index = 0
        while True:
            metas, refs, is_last = await self.channel.get.remote(self.sync_id, index, self.timeout_s, self.rank)
            array = await refs[0]
            with warnings.catch_warnings():  # the object store hands out read-only memory; nobody writes it
                warnings.simplefilter("ignore", UserWarning)
                buffer = torch.from_numpy(array)
            for name, shape, dtype, offset, nbytes in metas:
                yield name, buffer[offset:offset + nbytes].view(dtype).view(shape)
            await self.channel.ack.remote(self.sync_id, self.rank, index)
            index += 1
            if is_last:
                return
