"""Launch scripts: environment variables and pass-through overrides reach the config; verl's own checks pass."""

import subprocess
import sys

from cluster_helpers import SHELLS, VARIANTS, base_env, compose

SCRIPTS = sorted(SHELLS.glob("one_step_off_grpo_*_replay_4_*.sh"))
PMIS_17B = SHELLS / "one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"


def test_the_suite_is_complete():
    """The original scripts' three names for Qwen3-1.7B / GSM8K, plus Qwen3-4B and MATH variants, each an executable thin wrapper."""
    names = {p.name for p in SCRIPTS}
    for family in ("1.7b_gsm8k_fsdp2_1_1", "4b_gsm8k_fsdp2_2_2", "1.7b_math_fsdp2_1_1", "4b_math_fsdp2_2_2"):
        for v in VARIANTS:
            assert f"one_step_off_grpo_{family}_replay_4_{v}.sh" in names
    for p in SCRIPTS:
        text = p.read_text()
        assert text.startswith("#!/usr/bin/env bash") and 'source "$(dirname "${BASH_SOURCE[0]}")/common.sh"' in text
        assert text.rstrip().endswith('"$@"') and len(text.splitlines()) < 25
        assert p.stat().st_mode & 0o111
        subprocess.run(["bash", "-n", str(p)], check=True)


def test_defaults_without_python(tmp_path):
    """DARL_PRINT_CMD=1 prints the command: hub model ids and $DATA_DIR layout are the defaults."""
    env = base_env(tmp_path)
    for key in ("MODEL_PATH", "DATA_DIR", "DARL_DRY_RUN", "CKPT_ROOT"):
        env.pop(key)
    env.update(DARL_PRINT_CMD="1", HOME=str(tmp_path))
    for p in SCRIPTS:
        out = subprocess.run(["bash", str(p)], env=env, capture_output=True, text=True, check=True).stdout
        model = "Qwen/Qwen3-4B" if "_4b_" in p.name else "Qwen/Qwen3-1.7B"
        dataset = "math" if "_math_" in p.name else "gsm8k"
        val = "math500/test.parquet" if dataset == "math" else "gsm8k/test.parquet"
        assert f"actor_rollout_ref.model.path={model} " in out
        assert f"data.train_files={tmp_path}/data/{dataset}/train.parquet " in out
        assert f"data.val_files={tmp_path}/data/{val} " in out
        assert f"trainer.default_local_dir={tmp_path}/checkpoints/darl/{p.stem} " in out
        assert out.startswith(f"{sys.executable} -m recipe.darl.main_one_step_off ")


def test_env_and_passthrough_overrides(tmp_path):
    """GPU counts, names and logger from the environment; extra arguments (the original scripts' `+replay.*` too) win."""
    env = base_env(tmp_path)
    env.update(TRAINER_GPUS="4", ROLLOUT_GPUS="2", NNODES="2", ROLLOUT_NNODES="1", LOGGER='["console"]',
               EXPERIMENT_NAME="my_run", PROJECT_NAME="proj", ROLLOUT_TP="2", TRAIN_BATCH_SIZE="64", N_RESPONSES="16")
    (cfg,) = compose([(PMIS_17B, ["+replay.k=2", "trainer.total_training_steps=7", "replay.max_reuse=3"], env)])
    assert cfg["trainer"]["n_gpus_per_node"] == 4 and cfg["trainer"]["nnodes"] == 2
    assert cfg["rollout"] == {"nnodes": 1, "n_gpus_per_node": 2}
    assert cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 2
    assert cfg["actor_rollout_ref"]["rollout"]["n"] == 16 and cfg["data"]["train_batch_size"] == 64
    assert cfg["trainer"]["logger"] == ["console"]
    assert cfg["trainer"]["experiment_name"] == "my_run" and cfg["trainer"]["project_name"] == "proj"
    assert cfg["trainer"]["default_local_dir"] == str(tmp_path / "ckpt" / "proj" / "my_run")
    assert cfg["trainer"]["total_training_steps"] == 7
    assert cfg["replay"]["k"] == 2 and cfg["replay"]["max_reuse"] == 3 and cfg["replay"]["enable"] is True


def test_seed_sets_data_order_sampler_and_shuffle_and_names_the_run(tmp_path):
    env = base_env(tmp_path)
    (default,) = compose([(PMIS_17B, [], env)])
    env["SEED"] = "7"
    (cfg,) = compose([(PMIS_17B, [], env)])
    assert cfg["data"]["seed"] == 7 and cfg["actor_rollout_ref"]["rollout"]["seed"] == 49
    assert cfg["actor_rollout_ref"]["actor"]["data_loader_seed"] == 49
    assert cfg["trainer"]["experiment_name"] == PMIS_17B.stem + "_seed7"
    assert cfg["trainer"]["default_local_dir"].endswith(PMIS_17B.stem + "_seed7")  # its own checkpoints
    assert default["trainer"]["experiment_name"] == PMIS_17B.stem and default["actor_rollout_ref"]["rollout"]["seed"] == 42
    env["SEED"] = "x1"
    p = subprocess.run(["bash", str(PMIS_17B)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode != 0 and "SEED must be a non-negative integer (got 'x1')" in p.stderr


def test_dry_run_reports_config_errors(tmp_path):
    """The dry run runs D-ARL's checks: a missing data file and a replay typo fail before Ray, naming the keys."""
    env = base_env(tmp_path)
    env["TRAIN_FILES"] = str(tmp_path / "nope.parquet")
    p = subprocess.run(["bash", str(PMIS_17B), "+replay.kk=3"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode != 0
    assert "nope.parquet does not exist" in p.stderr and "replay.kk" in p.stderr


def test_memory_settings_from_the_environment(tmp_path):
    """The knobs docs/performance.md ('GPU memory') names for 40 GB cards: vLLM's share, the weight-sync bucket, the micro-batch tokens."""
    import shlex

    env = base_env(tmp_path)
    env.update(DARL_PRINT_CMD="1")

    def words(**extra):
        out = subprocess.run(["bash", str(PMIS_17B)], env=dict(env, **extra), capture_output=True, text=True,
                             check=True).stdout
        return dict(w.split("=", 1) for w in shlex.split(out) if "=" in w)

    default = words()
    assert default["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.8"
    assert default["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"] == "1024"
    assert default["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "24576"
    assert default["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == "49152"
    low = words(GPU_MEMORY_UTILIZATION="0.7", WEIGHT_SYNC_BUCKET_MB="512", MAX_TOKENS_PER_GPU="8192")
    assert low["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.7"
    assert low["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"] == "512"
    assert low["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "8192"
    assert low["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == "16384"
    # never below one whole sequence (prompt 512 + response 1024 on GSM8K)
    assert words(MAX_TOKENS_PER_GPU="1000")["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "1536"


def test_darts_variants_compose_with_rollout_shaping(tmp_path):
    """The DARTS launch scripts (one-step-off and fully-async): the preset plus rollout_shaping, composed and checked."""
    env = base_env(tmp_path)
    one_step_off, fully_async = compose([
        (SHELLS / "one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg_darts.sh", [], env),
        (SHELLS / "fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg_darts.sh", [], env)])
    from recipe.darl.core.darts import DartsConfig

    for cfg in (one_step_off, fully_async):
        assert cfg["rollout_shaping"]["enable"] is True and cfg["rollout_shaping"]["adaptive"] is True
        assert cfg["replay"]["enable"] is True
        # the released code's settings for n = 8: r_i in [10, 16] with mean 12, L_i = (16 - r_i) // 2, 10 warm-up steps
        darts = DartsConfig.from_dict(cfg["rollout_shaping"], n=8)
        assert darts.bounds(8) == (10, 16) and darts.mean_ratio * 8 == 12 and darts.warmup_steps == 10
        assert [darts.keep_last_for(r, 8) for r in (10, 12, 16)] == [3, 2, 0]
    manager = "recipe.darl.workers.darts_rollout.DartsAgentLoopManager"
    assert one_step_off["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] == manager
    assert fully_async["actor_rollout_ref"]["rollout"]["agent"].get("agent_loop_manager_class") is None
