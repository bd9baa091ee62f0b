"""Fully-async launch scripts (GPU: Qwen3-1.7B GSM8K; CPU: the built-in example, with DARL_DRY_RUN=1) compose on CPU
through recipe.darl.main_fully_async, and resolve to the three launch configurations (`_async`, `_decoupled`, `_pmis_sg`)."""

import subprocess

import pytest

from cluster_helpers import ROOT, SHELLS, VARIANTS, base_env, compose, configuration_keys, diff_keys, run_dry

NAME_KEYS = {"trainer.experiment_name", "trainer.default_local_dir", "actor_rollout_ref.rollout.trace.experiment_name"}


def _configs(scripts, env, real: bool):
    jobs = [(s, [], env) for s in scripts]
    return dict(zip(VARIANTS, run_dry(jobs, timeout=240) if real else compose(jobs)))


@pytest.mark.parametrize("where", ["gpu", "cpu"])
def test_fully_async_scripts_resolve_to_the_three_launch_configurations(where, tmp_path):
    env = base_env(tmp_path)
    if where == "gpu":
        scripts = [SHELLS / f"fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_{v}.sh" for v in VARIANTS]
        env.update(SYNC_STEPS="2", STALENESS_THRESHOLD="1.0")
    else:
        scripts = [SHELLS / "cpu" / f"fully_async_grpo_tiny_arith_cpu_replay_4_{v}.sh" for v in VARIANTS]
        env.update(TRAIN_FILES=str(tmp_path / "data/gsm8k/train.parquet"), VAL_FILES=str(tmp_path / "data/gsm8k/test.parquet"),
                   STEPS="8", OUT_DIR=str(tmp_path / "out"))
    configs = _configs(scripts, env, real=where == "cpu")  # the CPU scripts' own exports reach Python: a real dry run
    for variant, cfg in configs.items():
        at, corr, replay = cfg["async_training"], cfg["algorithm"]["rollout_correction"], cfg["replay"]
        assert cfg["data"]["train_batch_size"] == 0 and cfg["data"]["gen_batch_size"] == 1
        assert cfg["actor_rollout_ref"]["hybrid_engine"] is False and cfg["actor_rollout_ref"]["actor"]["shuffle"] is False
        assert cfg["rollout"]["n"] == cfg["actor_rollout_ref"]["rollout"]["n"] == 8
        assert "rollout_is" not in cfg["algorithm"]  # the algorithm.rollout_is* aliases were mapped
        if where == "gpu":
            assert at["trigger_parameter_sync_step"] == 2 and at["staleness_threshold"] == 1.0
            assert cfg["actor_rollout_ref"]["rollout"]["name"] == "vllm"
        else:
            assert at["trigger_parameter_sync_step"] == 1 and at["staleness_threshold"] == 2
            assert cfg["actor_rollout_ref"]["rollout"]["name"] == "hf" and cfg["trainer"]["device"] == "cpu"
            # STEPS x prompts per step (mini-batch 8 x require_batches 2, the one-step-off scripts' 16)
            assert at["require_batches"] == 2 and cfg["rollout"]["total_rollout_steps"] == 8 * 16
            assert cfg["ray_kwargs"]["ray_init"]["num_cpus"] == 32  # verl's fully-async actors ask for 23
            assert cfg["actor_rollout_ref"]["rollout"]["checkpoint_engine"]["custom_backend_module"] == "recipe.darl.cpu.rollout"
        if variant == "async":
            assert corr["bypass_mode"] is True and replay["enable"] is False
        elif variant == "decoupled":
            assert corr["bypass_mode"] is False and corr["rollout_is"] == "token" and replay["enable"] is False
        else:
            assert corr["bypass_mode"] is False and corr["rollout_is"] == "token" and corr["rollout_is_threshold"] == 2.0
            assert replay["enable"] is True and replay["k"] == 4 and replay["pmis"] is True
            assert cfg["actor_rollout_ref"]["actor"]["ppo_epochs"] == 2  # the preset's two passes
    a_d = diff_keys(configs["async"], configs["decoupled"]) - NAME_KEYS
    assert a_d == {"preset", "algorithm.rollout_correction.bypass_mode", "algorithm.rollout_correction.rollout_is"}
    d_p = diff_keys(configs["decoupled"], configs["pmis_sg"]) - NAME_KEYS
    assert d_p <= configuration_keys() and "replay.enable" in d_p and "actor_rollout_ref.actor.ppo_epochs" in d_p


def test_run_sh_submits_a_fully_async_script(tmp_path):
    env = base_env(tmp_path)
    env.pop("DARL_DRY_RUN")
    env.update(DRY_RUN="1", LOG_DIR=str(tmp_path / "logs"), VENV="none")
    script = "shells/fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"
    out = subprocess.run(["bash", str(SHELLS / "run.sh"), script, "async_training.staleness_threshold=1.0"], env=env,
                         capture_output=True, text=True, check=True, cwd=str(ROOT)).stdout
    assert out.startswith("+ sbatch ") and f"SCRIPT={script}" in out
    assert out.rstrip().endswith("async_training.staleness_threshold=1.0")
