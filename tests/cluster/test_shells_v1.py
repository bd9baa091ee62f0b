"""verl V1 launch scripts (GPU: Qwen3-1.7B GSM8K through separate_async; CPU: the built-in example through
colocate_async, with DARL_DRY_RUN=1) compose through recipe.darl.main_v1 and resolve to the three launch
configurations (`_async`, `_decoupled`, `_pmis_sg`)."""

from types import SimpleNamespace

import pytest

from recipe.darl.checks.config_check import ConfigError

from cluster_helpers import (NAME_KEYS, configuration_keys, SHELLS, VARIANTS, base_env, check_verl_validation, compose,
                             diff_keys, run_dry)


def _check_configurations(configs: dict) -> None:
    for variant, cfg in configs.items():
        corr, replay = cfg["algorithm"]["rollout_correction"], cfg["replay"]
        if variant == "async":
            assert corr["bypass_mode"] is True and replay["enable"] is False
        elif variant == "decoupled":
            assert corr["bypass_mode"] is False and corr["rollout_is"] == "token" and replay["enable"] is False
        else:
            assert corr["bypass_mode"] is False and corr["rollout_is_threshold"] == 2.0
            assert replay["enable"] is True and replay["k"] == 4 and replay["pmis"] is True and replay["stop_grad"] is True
            assert cfg["actor_rollout_ref"]["actor"]["ppo_epochs"] == 2  # the preset's two passes
    a_d = diff_keys(configs["async"], configs["decoupled"]) - NAME_KEYS
    d_p = diff_keys(configs["decoupled"], configs["pmis_sg"]) - NAME_KEYS
    assert a_d <= configuration_keys() and d_p <= configuration_keys(), (a_d, d_p)


def test_gpu_v1_scripts_resolve_to_separate_async_with_their_own_rollout_gpu(tmp_path):
    env = base_env(tmp_path)
    scripts = [SHELLS / f"v1_separate_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_{v}.sh" for v in VARIANTS]
    configs = dict(zip(VARIANTS, compose([(s, [], env) for s in scripts])))
    _check_configurations(configs)
    for cfg in configs.values():
        arr, trainer = cfg["actor_rollout_ref"], cfg["trainer"]
        assert trainer["use_v1"] is True and trainer["v1"]["trainer_mode"] == "separate_async"
        assert trainer["v1"]["separate_async"]["parameter_sync_step"] == 1
        assert arr["hybrid_engine"] is True and arr["rollout"]["name"] == "vllm"
        assert arr["rollout"]["nnodes"] == 1 and arr["rollout"]["n_gpus_per_node"] == 1 and trainer["n_gpus_per_node"] == 1
        assert arr["rollout"]["checkpoint_engine"]["backend"] == "nccl"
        # verl's separate_async: one mini-batch per weight sync
        assert cfg["data"]["train_batch_size"] == arr["actor"]["ppo_mini_batch_size"] == 32
        assert arr["rollout"]["calculate_log_probs"] is True and arr["actor"]["shuffle"] is False
        assert "rollout" not in cfg  # the V0 trainers' top-level rollout GPUs are not V1's keys
    check_verl_validation(SimpleNamespace(configs=configs))


def test_cpu_v1_scripts_resolve_to_colocate_async(tmp_path):
    env = base_env(tmp_path)
    env.update(TRAIN_FILES=str(tmp_path / "data/gsm8k/train.parquet"), VAL_FILES=str(tmp_path / "data/gsm8k/test.parquet"),
               STEPS="5", OUT_DIR=str(tmp_path / "out"), TRAINER_RANKS="2")
    scripts = [SHELLS / "cpu" / f"v1_colocate_async_grpo_tiny_arith_cpu_replay_4_{v}.sh" for v in VARIANTS]
    configs = dict(zip(VARIANTS, run_dry([(s, [], env) for s in scripts], timeout=240)))  # the scripts' exports matter
    _check_configurations(configs)
    for cfg in configs.values():
        arr, trainer = cfg["actor_rollout_ref"], cfg["trainer"]
        assert trainer["use_v1"] is True and trainer["v1"]["trainer_mode"] == "colocate_async"
        assert arr["hybrid_engine"] is True and arr["rollout"]["nnodes"] == 0 and trainer["device"] == "cpu"
        assert cfg["transfer_queue"]["backend"]["SimpleStorage"]["num_data_storage_units"] == 1
        # 8 prompts x 8 responses per mini-batch over 2 ranks: the old log-probs in micro-batches of 32
        assert arr["rollout"]["log_prob_micro_batch_size_per_gpu"] == arr["actor"]["ppo_micro_batch_size_per_gpu"] == 32


def test_a_replay_step_per_weight_sync_is_checked_before_ray(tmp_path):
    script = SHELLS / "v1_separate_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"
    with pytest.raises(ConfigError, match=r"parameter_sync_step=4 with replay.enable=true: must be 1 \(D-ARL takes one replay step per weight sync"):
        compose([(script, ["trainer.v1.separate_async.parameter_sync_step=4", "data.train_batch_size=128"],
                  base_env(tmp_path))])
