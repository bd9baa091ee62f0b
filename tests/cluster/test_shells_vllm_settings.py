"""The vLLM settings the CPU runs of verl's vLLM rollout showed to matter (tests/vllm), in the GPU launch scripts'
composed configs: one-step-off and fully-async.

- log-probs returned with every sample (`calculate_log_probs`): D-ARL's behavior policy mu, the replay buffer and
  the version-stamp check need them;
- `logprobs_mode=processed_logprobs`: vLLM then returns log_softmax(logits / T), what the trainer recomputes with
  the same temperature (matched to 1e-6 on CPU at T = 0.7 and 1.0); `raw_logprobs` would return T = 1's;
- sampling over the full vocabulary (`top_k=-1`, `top_p=1.0`, no repetition penalty): with truncation the
  processed log-probs are of a renormalized distribution the trainer never computes;
- greedy validation (`val_kwargs`).
"""

from __future__ import annotations

from cluster_helpers import SHELLS, base_env, compose

SCRIPTS = [SHELLS / "one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh",
           SHELLS / "fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"]


def test_gpu_scripts_set_the_vllm_settings_the_cpu_runs_rely_on(tmp_path):
    for script, cfg in zip(SCRIPTS, compose([(s, [], base_env(tmp_path)) for s in SCRIPTS])):
        rollout = cfg["actor_rollout_ref"]["rollout"]
        assert rollout["name"] == "vllm" and rollout["mode"] == "async", script.name
        assert rollout["calculate_log_probs"] is True
        assert rollout["logprobs_mode"] == "processed_logprobs"
        assert rollout["temperature"] == 1.0 and rollout["top_k"] == -1 and rollout["top_p"] == 1.0
        assert rollout.get("repetition_penalty", 1.0) == 1.0
        assert rollout["val_kwargs"]["do_sample"] is False and rollout["val_kwargs"]["temperature"] == 0
        # the CPU-only settings stay out of the GPU scripts: sleep mode and CUDA graphs are verl's defaults there
        assert rollout["enforce_eager"] is False
        assert rollout["checkpoint_engine"]["backend"] != "ray_object_store"
