"""The CPU platform plugin (recipe/darl/cpu/platform.py): chosen by VERL_PLATFORM=cpu, inert without it.

verl fixes its platform when it is first asked for, in each process, so every check runs verl in a
fresh process (conftest.py): one with VERL_PLATFORM=cpu that probes verl's device layer and then
runs a Ray worker group of verl's FSDP2 engines, one without the variable.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

# verl 0.9.1's built-in platforms (platform_manager.py registers these three)
BUILTIN_PLATFORMS = ["nvidia", "huawei", "amd"]

ACTIVE = r"""
import json, math, os, socket, sys
import torch
import verl
from omegaconf import OmegaConf
from torch.distributed.fsdp import CPUOffloadPolicy
from verl.plugin.platform import PlatformRegistry, get_platform
from verl.plugin.platform.platform_manager import _detect_platform_name
from verl.utils import device as dev
from verl.utils.flops_counter import get_device_flops
import verl.utils.distributed as distributed

model_path, out_file = sys.argv[1], sys.argv[2]
p = get_platform()
out = {
    "plugin_loaded": "recipe.darl.cpu.platform" in sys.modules,
    "registered": list(PlatformRegistry.registered_names()),
    "detected": _detect_platform_name(),
    "class": f"{type(p).__module__}.{type(p).__name__}",
    "device_name": dev.get_device_name(),
    "backend": dev.get_nccl_backend(),
    "ray_resource": dev.get_resource_name(),
    "ray_options": p.ray_resource_options(0.5),
    "device_id": dev.get_device_id(),
    "tensor_device": torch.ones(2).to(dev.get_device_id()).device.type,
    "device_module_name": dev.get_torch_device().get_device_name(),
    "max_memory_allocated": dev.get_torch_device().max_memory_allocated(),
    "flops_finite": math.isfinite(get_device_flops()),
    "available": dev.is_device_available(),
    "capability": list(dev.get_device_capability()),
    "auto_detect_candidate": p.is_platform_available(use_smi_check=True),
    "engine_device_env": os.environ.get("VERL_ENGINE_DEVICE"),
    "pin_memory": CPUOffloadPolicy(pin_memory=True).pin_memory,
}
from verl.workers.engine import EngineRegistry
out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__

cfg = OmegaConf.create({"trainer": {"device": "cpu"}})
dev.auto_set_device(cfg)
out["trainer_device"] = cfg.trainer.device

# point 2: verl's process-group setup, as its Ray workers call it, asks for a backend torch accepts
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist_env = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
os.environ.update(dist_env)
distributed.initialize_global_process_group_ray(timeout_second=60)
t = torch.ones(3)
torch.distributed.all_reduce(t)
out["pg_backend"] = torch.distributed.get_backend()
out["all_reduce"] = t.tolist()
torch.distributed.destroy_process_group()
for key in dist_env:
    del os.environ[key]

# A Ray worker group of verl's TrainingWorker: the workers inherit this environment (VERL_PLATFORM=cpu,
# OMP_NUM_THREADS=1) and load the plugin through the entry point.
import ray
from verl import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
from verl.trainer.config import CheckpointConfig
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPEngineConfig, HFModelConfig, TrainingWorkerConfig
from verl.workers.engine_workers import TrainingWorker
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

world_size = 2
# point 10: verl's ResourcePoolManager counts GPUs only, so Ray gets logical GPUs; the workers ask for CPUs
ray.init(num_cpus=world_size, num_gpus=world_size, include_dashboard=False, log_to_driver=False)
manager = ResourcePoolManager(resource_pool_spec={"pool": [world_size]}, mapping={"ref": "pool"}, max_colocate_count=1)
manager.create_resource_pool()
config = TrainingWorkerConfig(
    model_type="language_model",
    model_config=HFModelConfig(path=model_path, override_config={"attn_implementation": "sdpa"}, use_remove_padding=True),
    # a forward-only engine, as verl builds the reference policy's: FSDP2 with a CPU offload policy (point 8)
    engine_config=FSDPEngineConfig(strategy="fsdp2", forward_only=True, use_torch_compile=False, use_dynamic_bsz=False,
                                   infer_micro_batch_size_per_gpu=2,
                                   mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}),
    optimizer_config=None,
    checkpoint_config=CheckpointConfig(),
)
group = RayWorkerGroup(resource_pool=manager.get_resource_pool("ref"), device_name="cpu",
                       ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(TrainingWorker), config=config))
group.reset()

def probe(worker):
    from verl.plugin.platform import get_platform
    return [type(get_platform()).__name__, torch.distributed.get_backend(), torch.distributed.get_world_size()]
out["workers"] = ray.get([w.__ray_call__.remote(probe) for w in group.workers])

B, P, R = 4, 6, 5
g = torch.Generator().manual_seed(0)
input_ids = torch.randint(4, 100, (B, P + R), generator=g)
attention_mask = torch.ones(B, P + R, dtype=torch.long)
attention_mask[1, :2] = 0  # left-padded prompt
attention_mask[2, -2:] = 0  # right-padded response
position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
tensors = dict(prompts=input_ids[:, :P], responses=input_ids[:, P:], input_ids=input_ids, attention_mask=attention_mask,
               position_ids=position_ids, response_mask=attention_mask[:, P:])
batch = left_right_2_no_padding(DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}).to_tensordict())
tu.assign_non_tensor(batch, calculate_entropy=False, compute_loss=False)
output = group.infer_batch(batch).get()
log_probs = no_padding_2_padding(tu.get(output, "log_probs"), DataProto.from_dict(tensors=tensors).to_tensordict())
ray.shutdown()
torch.save({"log_probs": log_probs, **tensors}, out_file)
print(json.dumps(out))
"""

INACTIVE = r"""
import json, os, sys
import verl
from torch.distributed.fsdp import CPUOffloadPolicy
from verl.plugin.platform import PlatformRegistry
from verl.plugin.platform.platform_manager import _detect_platform_name
import verl.utils.distributed as distributed

print(json.dumps({
    "plugin_loaded": "recipe.darl.cpu.platform" in sys.modules,
    "registered": list(PlatformRegistry.registered_names()),
    "detected": _detect_platform_name(),
    "engine_device_env": os.environ.get("VERL_ENGINE_DEVICE"),
    "backend_patched": hasattr(distributed.initialize_global_process_group_ray, "_darl_cpu"),
    "pin_memory": CPUOffloadPolicy(pin_memory=True).pin_memory,
}))
"""


@pytest.fixture(scope="module")
def active(run_python, tiny_model_path, tmp_path_factory):
    out_file = tmp_path_factory.mktemp("platform_cpu") / "log_probs.pt"
    out = run_python(["-c", ACTIVE, tiny_model_path, str(out_file)], platform="cpu", timeout=300)
    out["log_probs_file"] = out_file
    return out


def test_entry_point_is_registered():
    eps = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert eps.get("darl_cpu") == "recipe.darl.cpu.platform", (
        "run `pip install --no-deps --no-build-isolation -e .` so setup.py's entry point is registered"
    )


def test_verl_platform_cpu_selects_the_cpu_platform(active):
    assert active["plugin_loaded"]
    assert active["registered"] == BUILTIN_PLATFORMS + ["cpu"]
    assert active["detected"] == "cpu"
    assert active["class"] == "recipe.darl.cpu.platform.PlatformCPU"
    assert active["device_name"] == "cpu"
    assert active["backend"] == "gloo"
    assert active["ray_resource"] == "CPU"
    assert active["ray_options"] == {"num_cpus": 0.5}
    assert active["available"] and active["capability"] == [None, None]
    assert active["auto_detect_candidate"] is False  # never picked without VERL_PLATFORM
    assert active["trainer_device"] == "cpu"  # point 1: auto_set_device keeps trainer.device=cpu


def test_cpu_points_are_handled(active):
    """Points 2, 3, 6, 7 and 8 of recipe/darl/cpu/platform.py's docstring (what stock verl needs on CPU)."""
    assert active["pg_backend"] == "gloo" and active["all_reduce"] == [1.0, 1.0, 1.0]  # 2
    assert active["engine_device_env"] == "cuda" and active["engine"] == "FSDPEngineWithLMHead"  # 3
    assert active["device_id"] == "cpu" and active["tensor_device"] == "cpu"  # 6
    assert active["device_module_name"] == "CPU" and active["flops_finite"]  # 7
    assert active["max_memory_allocated"] == 0
    assert active["pin_memory"] is False  # 8


def test_ray_worker_group_of_fsdp2_engines_on_cpu(active, tiny_model_path):
    """Two Ray workers load the plugin, form a gloo group, shard the model with FSDP2 and match transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    assert active["workers"] == [["PlatformCPU", "gloo", 2]] * 2
    result = torch.load(active["log_probs_file"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=result["input_ids"], attention_mask=result["attention_mask"],
                       position_ids=result["position_ids"]).logits
    width = result["prompts"].shape[1]
    expected = torch.log_softmax(logits[:, width - 1:-1], -1).gather(-1, result["responses"].unsqueeze(-1)).squeeze(-1)
    mask = result["response_mask"].bool()
    torch.testing.assert_close(result["log_probs"][mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_without_verl_platform_nothing_changes(run_python):
    out = run_python(INACTIVE, platform=None)
    assert out["plugin_loaded"]  # the entry point was imported ...
    assert out["registered"] == BUILTIN_PLATFORMS  # ... and registered nothing,
    # so detection runs on verl's own registry, as without the plugin: probes, then falls back to "nvidia"
    assert out["detected"] in BUILTIN_PLATFORMS
    assert out["engine_device_env"] is None
    assert out["backend_patched"] is False
    assert out["pin_memory"] is True


def test_cpu_overrides_compose_with_verls_trainer_config(tiny_model_path):
    """The overrides cpu_overrides() hands to a trainer are valid for verl's ppo_trainer config and mean what they say."""
    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass

    from recipe.darl.cpu.platform import cpu_overrides

    overrides = cpu_overrides(ray_gpus=4) + [
        f"actor_rollout_ref.model.path={tiny_model_path}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert cfg.trainer.device == "cpu"
    assert cfg.ray_kwargs.ray_init.num_gpus == 4 and cfg.ray_kwargs.ray_init.num_cpus == 16
    assert cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.fsdp_config.strategy == "fsdp2" and actor.fsdp_config.use_torch_compile is False
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert dict(actor.fsdp_config.mixed_precision) == fp32
    assert cfg.actor_rollout_ref.ref.fsdp_config.use_torch_compile is False
    assert dict(cfg.actor_rollout_ref.ref.fsdp_config.mixed_precision) == fp32
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    assert model.hf_config._attn_implementation == "sdpa"
