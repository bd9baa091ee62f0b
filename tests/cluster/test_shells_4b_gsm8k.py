"""Launch scripts for Qwen3-4B on GSM8K: the three launch configurations compose on CPU (DARL_DRY_RUN=1)."""

FAMILY = "4b_gsm8k_fsdp2_2_2"


def test_resolved_config_key_values(family, checks):
    checks.key_values(family, trainer_gpus=2, rollout_gpus=2, dataset="gsm8k")


def test_launch_scripts_differ_only_in_their_configuration_flags(family, checks):
    checks.only_configuration_keys(family)


def test_verl_accepts_the_resolved_configs(family, checks):
    checks.verl_validation(family)
