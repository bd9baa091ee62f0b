"""verl on machines without a GPU, each piece registered through verl's own hooks: the CPU platform
(`platform`, `VERL_PLATFORM=cpu`), the "hf" rollout backend (`rollout`) and weight sync through the Ray
object store (`checkpoint_engine_ray`)."""
