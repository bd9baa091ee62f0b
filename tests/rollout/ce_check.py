"""The ray_object_store checkpoint engine over plain Ray actors, driven with verl's protocol by hand.

Run by test_checkpoint_engine_ray.py in a fresh process. Two trainer ranks (rank 0 sends, rank 1 only
walks its stream), two receivers, small buckets (many per sync, tensors larger than a bucket, odd
sizes and dtypes), at most one bucket in flight; two syncs on the same channel; a receiver with no
sender times out; a sender whose receiver never takes its buckets times out naming it. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import ray
import torch


def make_weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "a.weight": torch.randn(33, 17, generator=g),  # 2244 bytes
        "a.bias": torch.randn(17, generator=g).to(torch.bfloat16),
        "mask": torch.rand(13, generator=g) > 0.5,  # bool, odd length: misaligns what follows
        "steps": torch.tensor(version, dtype=torch.int64),  # 0-dim
        "empty": torch.zeros(0, 4),
        "big": torch.randn(64, 64, generator=g).t(),  # 16 KB > bucket, non-contiguous
        "half": torch.randn(7, 3, generator=g).to(torch.float16),
    }


@ray.remote(num_cpus=0)
class Host:
    """A process holding several engines (verl gives each its own worker; two processes suffice here)."""

    def __init__(self):
        torch.set_num_threads(1)
        from recipe.darl.cpu.checkpoint_engine_ray import RayObjectStoreCheckpointEngine

        self.cls = RayObjectStoreCheckpointEngine
        self.engines = {}

    def new(self, key, **kwargs):
        self.engines[key] = self.cls(**kwargs)

    def call(self, key, method, **kwargs):
        return getattr(self.engines[key], method)(**kwargs)

    async def send(self, key, version):
        return await self.engines[key].send_weights(iter(make_weights(version).items()), global_steps=version)

    async def receive(self, key, version, delay: float = 0.0):
        received = {}
        async for name, tensor in self.engines[key].receive_weights(global_steps=version):
            received[name] = tensor.clone()
            await asyncio.sleep(delay)  # a slow consumer: the sender must wait for it
        return received


def sync(trainers, rollouts, version, delay=0.0):
    """trainers/rollouts: (host, key) pairs; verl's CheckpointEngineManager sequence."""
    from recipe.darl.cpu.checkpoint_engine_ray import RayObjectStoreCheckpointEngine as Engine

    everyone = trainers + rollouts
    metadata = ray.get([h.call.remote(k, "prepare") for h, k in everyone])
    actor_kwargs, rollout_kwargs = Engine.build_topology(len(trainers), len(rollouts), metadata)
    calls = [h.call.remote(k, "init_process_group", **{n: v[i] for n, v in actor_kwargs.items()})
             for i, (h, k) in enumerate(trainers)]
    calls += [h.call.remote(k, "init_process_group", **{n: v[i] for n, v in rollout_kwargs.items()})
              for i, (h, k) in enumerate(rollouts)]
    ray.get(calls)
    start = time.time()
    results = ray.get([h.send.remote(k, version) for h, k in trainers]
                      + [h.receive.remote(k, version, delay if i == 0 else 0.0) for i, (h, k) in enumerate(rollouts)])
    seconds = time.time() - start
    ray.get([h.call.remote(k, "finalize") for h, k in everyone])
    return results[: len(trainers)], results[len(trainers):], seconds, actor_kwargs["rank"], rollout_kwargs["rank"]


def main():
    ray.init(num_cpus=4, include_dashboard=False)
    bucket = 4096
    trainer_host, rollout_host = Host.remote(), Host.remote()
    ray.get([trainer_host.new.remote("t0", bucket_size=bucket, is_master=True, max_inflight_buckets=1),
             trainer_host.new.remote("t1", bucket_size=bucket, is_master=False),
             rollout_host.new.remote("r0", bucket_size=bucket),
             rollout_host.new.remote("r1", bucket_size=bucket),
             rollout_host.new.remote("lonely", bucket_size=bucket, timeout_s=1.0)])
    trainers = [(trainer_host, "t0"), (trainer_host, "t1")]
    rollouts = [(rollout_host, "r0"), (rollout_host, "r1")]
    out = {"syncs": []}
    for version in (1, 2):
        sent, received, seconds, actor_ranks, rollout_ranks = sync(trainers, rollouts, version, delay=0.01)
        expected = make_weights(version)
        exact = all(
            set(r) == set(expected) and all(r[n].dtype == expected[n].dtype and r[n].shape == expected[n].shape
                                            and torch.equal(r[n], expected[n]) for n in expected)
            for r in received
        )
        out["syncs"].append({"exact": exact, "order": [list(r) for r in received][0] == list(expected),
                             "metrics": sent[0], "rank1_metrics": sent[1], "seconds": seconds,
                             "actor_ranks": actor_ranks, "rollout_ranks": rollout_ranks})

    # a receiver whose sender never comes fails after timeout_s instead of hanging
    from recipe.darl.cpu.checkpoint_engine_ray import RayObjectStoreCheckpointEngine as Engine

    metadata = ray.get([trainer_host.call.remote("t0", "prepare"), rollout_host.call.remote("lonely", "prepare")])
    _, rollout_kwargs = Engine.build_topology(1, 1, metadata)
    ray.get(rollout_host.call.remote("lonely", "init_process_group", **{k: v[0] for k, v in rollout_kwargs.items()}))
    start = time.time()
    try:
        ray.get(rollout_host.receive.remote("lonely", 3))
        out["timeout"] = "no error"
    except Exception as error:  # noqa: BLE001
        out["timeout"] = type(getattr(error, "cause", None) or error).__name__
    out["timeout_seconds"] = time.time() - start

    # a sender whose second receiver never takes its buckets fails after timeout_s, naming that receiver
    ray.get([trainer_host.new.remote("m", bucket_size=1 << 20, is_master=True, timeout_s=1.0),
             rollout_host.new.remote("taker", bucket_size=1 << 20), rollout_host.new.remote("idle", bucket_size=1 << 20)])
    metadata = ray.get([trainer_host.call.remote("m", "prepare"), rollout_host.call.remote("taker", "prepare"),
                        rollout_host.call.remote("idle", "prepare")])
    actor_kwargs, rollout_kwargs = Engine.build_topology(1, 2, metadata)
    ray.get([trainer_host.call.remote("m", "init_process_group", **{k: v[0] for k, v in actor_kwargs.items()})]
            + [rollout_host.call.remote(key, "init_process_group", **{k: v[i] for k, v in rollout_kwargs.items()})
               for i, key in enumerate(("taker", "idle"))])
    taken = rollout_host.receive.remote("taker", 4)
    try:
        ray.get(trainer_host.send.remote("m", 4))
        out["stalled"] = "no error"
    except Exception as error:  # noqa: BLE001
        out["stalled"] = str(getattr(error, "cause", None) or error)
    out["taker_names"], out["names"] = sorted(ray.get(taken)), sorted(make_weights(4))
    print(json.dumps(out))
    sys.stdout.flush()
    ray.shutdown()


if __name__ == "__main__":
    main()
