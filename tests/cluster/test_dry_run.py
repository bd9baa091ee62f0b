"""A launch script's dry run (DARL_DRY_RUN=1: bash, the entry point's Hydra main, D-ARL's checks, the resolved config
printed) gives the config the other tests here compose in their own process from the script's printed command
(cluster_helpers.compose), for each trainer's entry point, the DARTS scripts included."""

from cluster_helpers import SHELLS, base_env, compose, diff_keys, run_dry

SCRIPTS = [SHELLS / "one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh",
           SHELLS / "fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg_darts.sh",
           SHELLS / "v1_separate_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"]


def test_a_dry_run_resolves_to_the_config_composed_in_process(tmp_path):
    env = base_env(tmp_path)
    jobs = [(s, ["+replay.k=3", "trainer.total_training_steps=7"], env) for s in SCRIPTS]
    real, composed = run_dry(jobs, timeout=240), compose(jobs)
    for script, a, b in zip(SCRIPTS, real, composed):
        assert diff_keys(a, b) == set(), script.name
        assert a["replay"]["k"] == 3 and a["trainer"]["total_training_steps"] == 7  # the overrides reached both
    assert real[1]["rollout_shaping"]["enable"] is True and "async_training" in real[1]
    assert real[2]["trainer"]["v1"]["trainer_mode"] == "separate_async"


def test_the_original_repositorys_entry_point_name_runs_the_one_step_off_trainer(tmp_path):
    """`python -m recipe.darl.main_darl` (the original D-ARL scripts' entry point) resolves the one-step-off script to
    the config `main_one_step_off` gives, its `+replay.*` overrides read as the original scripts write them."""
    env = base_env(tmp_path)
    args = ["+replay.k=3", "+replay.enable=true"]
    ours, original = run_dry([(SCRIPTS[0], args, env), (SCRIPTS[0], args, {**env, "DARL_MAIN": "recipe.darl.main_darl"})],
                             timeout=240)
    assert diff_keys(ours, original) == set() and original["replay"]["k"] == 3
