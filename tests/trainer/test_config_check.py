"""The config checks run before Ray: each bad setting is reported, naming its key, all at once."""

import pytest
from omegaconf import OmegaConf

from recipe.darl.checks.config_check import ConfigError, check_config, validate_or_raise
from recipe.darl.checks.fixups import apply_compat_aliases, apply_fixups
from recipe.darl.main_one_step_off import rewrite_plus_overrides
from recipe.darl.main_v1 import launch_mode
from recipe.darl.trainer_mode import FULLY_ASYNC, ONE_STEP_OFF, TrainerMode

ONE, FA = TrainerMode(ONE_STEP_OFF), TrainerMode(FULLY_ASYNC)  # the modes main_one_step_off and main_fully_async launch

REPLAY_ON = ("replay.enable=true", "algorithm.rollout_correction.bypass_mode=false")


def problems(cfg, mode=ONE):
    return apply_fixups(cfg, mode, importable=lambda: True)[0] + check_config(cfg, mode)


def test_shipped_defaults_and_a_replay_setup_are_valid(compose_config):
    assert problems(compose_config()) == []
    assert problems(compose_config(*REPLAY_ON, "replay.k=4", "algorithm.rollout_is=true")) == []
    # the two-sided trust region is one flag through Hydra
    assert problems(compose_config(*REPLAY_ON, "replay.behavior_clip_high=0.2")) == []
    assert problems(compose_config(*REPLAY_ON, "replay.prompt_replay=16")) == []


@pytest.mark.parametrize(
    "overrides,key",
    [
        (REPLAY_ON + ("replay.k=0",), "replay.k"),
        (REPLAY_ON + ("replay.warmup=-1",), "replay.warmup"),
        (REPLAY_ON + ("++replay.pmsi=true",), "replay.pmsi"),
        (REPLAY_ON + ("actor_rollout_ref.rollout.calculate_log_probs=false",), "calculate_log_probs"),
        (("replay.enable=true",), "bypass_mode"),
        (("actor_rollout_ref.hybrid_engine=true",), "hybrid_engine"),
        (REPLAY_ON + ("data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"), "data.train_batch_size"),
        (REPLAY_ON + ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=1",
                      "trainer.n_gpus_per_node=8"), "data-parallel"),
        (REPLAY_ON + ("data.train_batch_size=32", "replay.max_groups=16"), "replay.max_groups"),
        (("actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=1",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"), "ppo_micro_batch_size_per_gpu"),
        (("algorithm.rollout_is=false", "algorithm.rollout_correction.rollout_is=token"), "algorithm.rollout_is"),
        (("algorithm.rollout_is_threshold=3.0", "algorithm.rollout_correction.rollout_is_threshold=5.0"), "algorithm.rollout_is_threshold"),
        (("algorithm.rollout_is_threshold=-1.0",), "rollout_is_threshold must be > 0"),
        (("actor_rollout_ref.model.path=/no/such/model",), "actor_rollout_ref.model.path"),
        (("data.train_files=/no/such/train.parquet",), "data.train_files"),
        (REPLAY_ON + ("algorithm.rollout_correction.rollout_rs=token_k1",), "rollout_rs"),
        (REPLAY_ON + ("algorithm.adv_estimator=gae",), "algorithm.adv_estimator"),
        (REPLAY_ON + ("actor_rollout_ref.actor.shuffle=true",), "actor_rollout_ref.actor.shuffle"),
        (("algorithm.rollout_correction.rollout_is=token",), "bypass_mode=true with rollout_is"),
        (REPLAY_ON + ("replay.order=chi2",), "replay.order must be null, 'newest' or 'least_reused'"),
        (REPLAY_ON + ("replay.behavior_clip_high=0.3", "replay.behavior_clip=false"), "replay.behavior_clip_high"),
        (REPLAY_ON + ("replay.prompt_replay=1",), "replay.prompt_replay must be null, false or an integer >= 2"),
        (REPLAY_ON + ("actor_rollout_ref.rollout.n=32",), "replay.prompt_replay=16 (responses kept per prompt; null follows the preset's 16) is below actor_rollout_ref.rollout.n=32"),
        (("replay.prompt_replay=16",), "replay.prompt_replay=16 needs replay.enable=true"),
        (("replay.prompt_replay=4",), "replay.prompt_replay=4 needs replay.enable=true"),
        (("+reward.custom_reward_function.reward_kwargs.code_sandbox=bwrap",),
         "reward.custom_reward_function.reward_kwargs.code_sandbox must be one of auto, namespaces, limits, got 'bwrap'"),
        # what verl 0.9.1 refuses only after Ray, the workers and the models have started
        (("trainer.resume_mode=latest",), "trainer.resume_mode=latest: must be one of auto, disable, resume_path"),
        (("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/run1"), "trainer.resume_from_path=<checkpoint dir>"),
        (("trainer.default_hdfs_dir=hdfs://ckpt",), "trainer.default_hdfs_dir is set"),
        (("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",), "log_prob_use_dynamic_bsz must be equal"),
        (("actor_rollout_ref.rollout.tensor_model_parallel_size=2",), "rollout.nnodes=1 x rollout.n_gpus_per_node=1 GPUs"),
        (("rollout.n_gpus_per_node=0",), "rollout.n_gpus_per_node=0 GPUs"),
        (("actor_rollout_ref.rollout.calculate_log_probs=false",), "bypass_mode=true (the rollout's log-probs"),
        (("algorithm.rollout_correction.rollout_is=seq",), "rollout_is=seq: must be one of null, token, sequence"),
        (("actor_rollout_ref.rollout.agent.num_workers=3",), "must split evenly over actor_rollout_ref.rollout.agent.num_workers=3"),
        (("algorithm.adv_estimator=gae", "critic.strategy=fsdp2"), "critic.strategy='fsdp2'"),
    ],
)
def test_each_problem_names_its_key(compose_config, overrides, key):
    found = problems(compose_config(*overrides))
    assert any(key in p for p in found), found


def test_every_problem_is_reported_at_once(compose_config):
    cfg = compose_config("replay.enable=true", "replay.k=0", "replay.warmup=-2", "actor_rollout_ref.hybrid_engine=true",
                         "actor_rollout_ref.model.path=/no/such/model")
    with pytest.raises(ConfigError) as err:
        validate_or_raise(cfg, ONE, extra=apply_fixups(cfg, ONE)[0])
    text = str(err.value)
    for key in ("replay.k", "replay.warmup", "hybrid_engine", "bypass_mode", "actor_rollout_ref.model.path"):
        assert key in text


def test_compat_aliases_map_onto_rollout_correction(compose_config):
    cfg = compose_config("algorithm.rollout_is=true", "algorithm.rollout_is_threshold=3.5")
    assert apply_compat_aliases(cfg) == []
    assert cfg.algorithm.rollout_correction.rollout_is == "token"
    assert cfg.algorithm.rollout_correction.rollout_is_threshold == 3.5
    assert "rollout_is" not in cfg.algorithm  # verl's AlgoConfig would reject the alias keys
    OmegaConf.to_object(cfg.algorithm.rollout_correction)


def test_plus_prefix_overrides_compose(compose_config):
    argv = ["+replay.enable=True", "+replay.k=4", "+replay.pmis=True", "+replay.warmup=5", "algorithm.rollout_is=True",
            "+algorithm.rollout_is_threshold=2.0", "+trainer.val_only=true"]
    rewritten = rewrite_plus_overrides(argv)
    assert rewritten[:4] == ["++replay.enable=True", "++replay.k=4", "++replay.pmis=True", "++replay.warmup=5"]
    assert rewritten[-1] == "+trainer.val_only=true"  # other keys are left to Hydra's own rules
    cfg = compose_config(*rewritten[:-1], "algorithm.rollout_correction.bypass_mode=false")
    assert cfg.replay.enable is True and cfg.replay.k == 4
    assert problems(cfg) == []


def test_rollout_is_alias_means_decoupled_unless_bypass_was_set(compose_config):
    # the original D-ARL repository's verl computed rollout_is weights from old log-probs the trainer recomputed: decoupled mode
    cfg = compose_config("algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2.0")
    assert problems(cfg) == []
    assert cfg.algorithm.rollout_correction.bypass_mode is False
    assert cfg.algorithm.rollout_correction.rollout_is == "token"
    # nothing asked: one-step-off's default, bypass
    plain = compose_config()
    assert problems(plain) == [] and plain.algorithm.rollout_correction.bypass_mode is True
    # explicitly false agrees; explicitly true contradicts the alias
    assert problems(compose_config("algorithm.rollout_is=true", "algorithm.rollout_correction.bypass_mode=false")) == []
    again = compose_config("algorithm.rollout_is=true")
    assert apply_fixups(again, ONE, importable=lambda: True)[1] == [
        "[D-ARL] config: algorithm.rollout_is (the original repository's) -> algorithm.rollout_correction.rollout_is="
        "token, rollout_is_threshold=2.0, bypass_mode=False"]  # what the entry point prints
    found = problems(compose_config("algorithm.rollout_is=true", "algorithm.rollout_correction.bypass_mode=true"))
    assert any("algorithm.rollout_is=true" in p and "bypass_mode=true" in p for p in found)


def test_rollout_shaping_composes_and_installs_darts_manager(compose_config):
    cfg = compose_config("rollout_shaping.enable=true", "rollout_shaping.adaptive=true")
    assert problems(cfg) == []
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "recipe.darl.workers.darts_rollout.DartsAgentLoopManager"
    off = compose_config()
    assert problems(off) == [] and off.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class") is None


def test_rollout_shaping_problems_name_their_keys(compose_config):
    found = problems(compose_config("rollout_shaping.enable=true", "rollout_shaping.keep_last=8",
                                    "rollout_shaping.responses=3", "actor_rollout_ref.rollout.n=8"))
    assert any("rollout_shaping.keep_last (L)" in p for p in found)
    assert any("rollout_shaping.responses must be null or an integer >= actor_rollout_ref.rollout.n=8" in p for p in found)
    other = problems(compose_config("rollout_shaping.enable=true",
                                    "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.Manager"))
    assert any("needs DARTS' rollout manager" in p and "my.Manager" in p for p in other)
    with pytest.raises(Exception, match="rollout_shaping"):
        compose_config("rollout_shaping.typo=1")  # Hydra: not in the struct


@pytest.mark.parametrize("name", ["sglang", "trtllm"])
def test_darts_is_refused_on_rollouts_without_a_per_request_abort(compose_config, name):
    found = problems(compose_config("rollout_shaping.enable=true", f"actor_rollout_ref.rollout.name={name}"))
    assert any(f"rollout.name={name}" in p and "per-request abort" in p for p in found), found
    assert not any("per-request abort" in p for p in problems(compose_config(f"actor_rollout_ref.rollout.name={name}")))


def test_the_console_mode_is_checked(compose_config):
    assert compose_config().console == "compact"
    assert not any("console" in p for p in problems(compose_config("console=full")))
    assert any("console=fancy: must be one of compact, full" in p for p in problems(compose_config("console=fancy")))


def test_darts_is_refused_with_full_determinism(compose_config):
    found = problems(compose_config("rollout_shaping.enable=true", "actor_rollout_ref.rollout.full_determinism=true"))
    assert any("full_determinism=true" in p and "other groups' requests" in p for p in found), found
    assert not any("full_determinism" in p for p in problems(compose_config("actor_rollout_ref.rollout.full_determinism=true")))


def test_rollout_shaping_in_the_fully_async_config(compose_config):
    cfg = compose_config("rollout_shaping.enable=true", "rollout_shaping.keep_last=1", "actor_rollout_ref.rollout.n=4",
                         config_name="fully_async_trainer")
    assert [p for p in problems(cfg, FA) if "rollout_shaping" in p] == []
    assert cfg.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class") is None  # installed in the rollouter


@pytest.mark.parametrize(
    "overrides,key",
    [
        (("data.gen_batch_size=2",), "data.gen_batch_size=2: must be 1"),
        (("algorithm.rollout_correction.bypass_mode=false", "actor_rollout_ref.rollout.calculate_log_probs=false"),
         "verl's fully-async rollouter needs actor_rollout_ref.rollout.calculate_log_probs=true"),
        (("rollout.n_gpus_per_node=1",), "rollout.nnodes=1 x rollout.n_gpus_per_node=1 GPUs"),
        (("reward.reward_model.enable=true",), "needs reward.reward_model.enable_resource_pool=true"),
    ],
)
def test_each_fully_async_launch_problem_names_its_key(compose_config, overrides, key):
    assert problems(compose_config(config_name="fully_async_trainer"), FA) == []
    found = problems(compose_config(*overrides, config_name="fully_async_trainer"), FA)
    assert any(key in p for p in found), found


def v1_problems(cfg):
    return problems(cfg, launch_mode(cfg))


def test_the_v1_config_and_a_replay_setup_are_valid(compose_config):
    cfg = compose_config(*REPLAY_ON, "replay.k=4", "algorithm.rollout_is=true", config_name="v1_trainer")
    assert v1_problems(cfg) == []
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "colocate_async"
    separate = ("trainer.v1.trainer_mode=separate_async", "data.train_batch_size=32",
                "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")
    assert v1_problems(compose_config(*REPLAY_ON, *separate, config_name="v1_trainer")) == []
    # without replay verl's own step computes the reference log-probs a KL term reads
    kl = ("actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true")
    assert v1_problems(compose_config(*kl, config_name="v1_trainer")) == []
    # the V0 trainers' rule on the same setting is the opposite one
    assert any("hybrid_engine" in p for p in problems(cfg))


@pytest.mark.parametrize(
    "overrides,key",
    [
        (("trainer.v1.trainer_mode=sync",), "trainer.v1.trainer_mode='sync'"),
        (("actor_rollout_ref.hybrid_engine=false",), "actor_rollout_ref.hybrid_engine=false"),
        (REPLAY_ON + ("trainer.v1.trainer_mode=separate_async", "trainer.v1.separate_async.parameter_sync_step=2"),
         "parameter_sync_step=2"),
        (("rollout_shaping.enable=true",), "DARTS runs on the one-step-off and fully-async trainers"),
        (("trainer.v1.trainer_mode=separate_async", "data.train_batch_size=32",
          "actor_rollout_ref.actor.ppo_mini_batch_size=16"), "data.train_batch_size=32 must equal"),
        (REPLAY_ON + ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"), "log_prob_micro_batch_size_per_gpu=8"),
        (REPLAY_ON + ("actor_rollout_ref.actor.use_kl_loss=true",), "actor_rollout_ref.actor.use_kl_loss=true"),
        (REPLAY_ON + ("algorithm.use_kl_in_reward=true",), "algorithm.use_kl_in_reward=true"),
        (("trainer.v1.trainer_mode=separate_async",), "actor_rollout_ref.rollout.nnodes=0 x"),
        (("trainer.v1.trainer_mode=separate_async",), "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"),
        (("trainer.n_gpus_per_node=3",), "colocate_async: the trainer's 3 x 1 GPUs"),
    ],
)
def test_each_v1_problem_names_its_key(compose_config, overrides, key):
    found = v1_problems(compose_config(*overrides, config_name="v1_trainer"))
    assert any(key in p for p in found), found


def test_a_rule_applies_in_its_trainer_modes_under_its_condition():
    """The rule table's engine on a hand-made config: the mode, the condition key and the allowed values decide; True
    does not pass for 1 (nor 0 for False)."""
    from omegaconf import OmegaConf

    from recipe.darl.checks.rules import Rule, rule_problems

    rules = (Rule("a.b", (1,), "why", when=("replay.enable", True), modes=("fully_async",)),
             Rule("flag", (False,)))
    cfg = OmegaConf.create({"a": {"b": 2}, "replay": {"enable": True}, "flag": 0})
    assert rule_problems(cfg, "fully_async", rules) == [
        "a.b=2 with replay.enable=true: must be 1 (why)", "flag=0: must be false"]
    assert rule_problems(cfg, "one_step_off", rules) == ["flag=0: must be false"]  # not in its modes
    cfg.replay.enable, cfg.flag, cfg.a.b = False, False, True
    assert rule_problems(cfg, "fully_async", rules) == []  # condition off; a.b is not checked
    cfg.replay.enable = True
    assert rule_problems(cfg, "fully_async", rules) == ["a.b=true with replay.enable=true: must be 1 (why)"]
