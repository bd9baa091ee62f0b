"""The fully-async D-ARL trainer without Ray: its config against the installed verl's fully-async yaml,
the checks of the fully-async keys, and the shared replay step on `FullyAsyncTrainer`'s hooks (versions
are parameter versions, the budget is ppo_mini_batch_size * require_batches, the buffer survives
verl's own `load_checkpoint`), and the actor classes as Ray ships them. The whole pipeline runs in
tests/vllm/test_pipeline_fully_async.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from importlib import resources

import pytest
from omegaconf import OmegaConf
from ray import cloudpickle
from torchdata.stateful_dataloader import StatefulDataLoader

from recipe.darl.checks.config_check import check_config, fully_async_findings, validate_or_raise
from recipe.darl.checks.fixups import apply_compat_aliases, apply_fixups
from recipe.darl.main_fully_async import MODE
from recipe.darl.trainers.darl_run import DarlRun
from recipe.darl.trainers.task_runners import DarlFullyAsyncTaskRunner, DarlTaskRunner
from recipe.darl.trainers.fully_async import DarlFullyAsyncTrainer, DarlFullyAsyncTrainerImpl, FullyAsyncTrainerBase

from test_trainer_hooks import make_trainer, run_step, uids

FULLY_ASYNC = "fully_async_trainer"


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def test_config_restates_verls_fully_async_yaml(compose_config):
    verl_yaml = resources.files("verl.experimental.fully_async_policy") / "config" / "fully_async_ppo_trainer.yaml"
    theirs = OmegaConf.to_container(OmegaConf.load(str(verl_yaml)))
    theirs.pop("hydra"), theirs.pop("defaults")
    cfg = compose_config(config_name=FULLY_ASYNC)
    assert apply_compat_aliases(cfg) == []  # bypass_mode null -> verl's default
    ours = OmegaConf.to_container(cfg, resolve=True)
    for key, value in _leaves(theirs):
        node = ours
        for part in key.split("."):
            node = node[part]
        assert node == value, f"{key}: ours {node!r}, verl's fully_async_ppo_trainer.yaml {value!r}"
    assert ours["replay"]["pmis"] is True and ours["data"]["train_batch_size"] == 0


def _fa(compose_config, *overrides):
    return compose_config("replay.enable=true", "algorithm.rollout_is=true", "actor_rollout_ref.rollout.n=2",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.n_gpus_per_node=1",
                          *overrides, config_name=FULLY_ASYNC)


def test_fully_async_checks_name_the_keys_and_numbers(compose_config):
    cfg = _fa(compose_config, "async_training.staleness_threshold=1.5", "replay.k=2")
    assert apply_compat_aliases(cfg) + check_config(cfg, MODE) == []
    assert cfg.algorithm.rollout_correction.bypass_mode is False  # the alias algorithm.rollout_is: decoupled
    warnings = fully_async_findings(cfg)[1]
    assert len(warnings) == 1 and "replay.k=2" in warnings[0] and "3 versions old" in warnings[0] and "k >= 4" in warnings[0]
    assert fully_async_findings(_fa(compose_config, "replay.k=4", "async_training.staleness_threshold=1.5"))[1] == []
    # 100 rollout prompts / (2 per step * 4 per sync) = 12 syncs = 48 trainer steps: warmup 48 never replays
    bad = _fa(compose_config, "replay.warmup=48")
    apply_compat_aliases(bad)
    assert any("replay.warmup=48" in p for p in check_config(bad, MODE))
    wrong_batch = _fa(compose_config, "data.train_batch_size=4")
    apply_compat_aliases(wrong_batch)
    assert any("data.train_batch_size=4: must be 0" in p for p in check_config(wrong_batch, MODE))
    with pytest.raises(ValueError, match="bypass_mode=true"):
        bad_mode = _fa(compose_config, "algorithm.rollout_correction.bypass_mode=true")
        validate_or_raise(bad_mode, MODE, extra=apply_fixups(bad_mode, MODE)[0])


def test_the_ray_actor_wraps_the_replay_trainer():
    assert issubclass(DarlFullyAsyncTrainerImpl, FullyAsyncTrainerBase)
    assert DarlFullyAsyncTrainer.__ray_metadata__.modified_class.__ray_actor_class__ is DarlFullyAsyncTrainerImpl
    assert DarlFullyAsyncTrainer._default_options == {"num_cpus": 10}  # verl's FullyAsyncTrainer resources


CHECK_SHIPPED = """
import inspect, sys
from ray import cloudpickle
trainer, runner, one_step_runner = cloudpickle.loads(sys.stdin.buffer.read())
mro = set(map(id, trainer.__mro__))
for name, f in trainer.__dict__.items():
    code = getattr(inspect.unwrap(f), "__code__", None) if callable(f) else None
    if code is not None and "__class__" in code.co_freevars:
        cell = inspect.unwrap(f).__closure__[code.co_freevars.index("__class__")]
        if id(cell.cell_contents) not in mro:
            print("super-cell", name)
from verl.experimental.fully_async_policy import fully_async_main
create = next(k.__dict__["_create_trainer"] for k in runner.__mro__[2:] if "_create_trainer" in k.__dict__)
if inspect.unwrap(create).__globals__ is not fully_async_main.__dict__:
    print("runner-globals")
from verl.experimental.one_step_off_policy import main_ppo
run = next(k.__dict__["run"] for k in one_step_runner.__mro__[2:] if "run" in k.__dict__)
if inspect.unwrap(run).__globals__ is not main_ppo.__dict__:
    print("one-step-off-runner-globals")
"""


def test_the_actor_classes_unpickle_as_ray_ships_them():
    """What Ray ships to the workers. The trainer: every method's zero-argument super() names a class of
    the instance's MRO there (verl's FullyAsyncTrainer methods call super(); a by-value copy of that class
    in their cells failed the first fit step with 'obj must be an instance or subtype'). The task runner:
    verl's `_create_trainer` reads the real module's globals, where `task_runners` swaps the trainer (a
    by-value copy built verl's plain trainer without a word); the one-step-off runner's `run` likewise."""
    shipped = cloudpickle.dumps((DarlFullyAsyncTrainer.__ray_metadata__.modified_class,
                                 DarlFullyAsyncTaskRunner.__ray_metadata__.modified_class,
                                 DarlTaskRunner.__ray_metadata__.modified_class))
    out = subprocess.run([sys.executable, "-c", CHECK_SHIPPED], input=shipped, capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().splitlines() == []


def make_fa_trainer(cfg, deltas: dict[str, float]) -> DarlFullyAsyncTrainerImpl:
    """The plain fully-async D-ARL trainer without Ray, old log-probs = rollout + deltas[uid]."""
    donor = make_trainer(cfg, deltas, MODE)  # the stand-ins of the one-step-off hook test
    trainer = DarlFullyAsyncTrainerImpl.__new__(DarlFullyAsyncTrainerImpl)
    trainer.__dict__.update(donor.__dict__)
    trainer.darl = DarlRun(trainer, cfg, MODE)
    trainer.require_batches = int(cfg.async_training.require_batches)
    trainer.current_param_version = 0
    trainer.trigger_parameter_sync_step = int(cfg.async_training.trigger_parameter_sync_step)
    trainer.train_dataloader = StatefulDataLoader(list(range(64)), batch_size=4)
    return trainer


def test_replay_step_on_fully_async_hooks_uses_param_versions_and_survives_load_checkpoint(compose_config, batch_maker,
                                                                                        state_equal):
    cfg = _fa(compose_config, "replay.warmup=0", "async_training.require_batches=2", "trainer.resume_mode=auto")
    validate_or_raise(cfg, MODE, extra=apply_fixups(cfg, MODE)[0])
    deltas: dict[str, float] = {}
    trainer = make_fa_trainer(cfg, deltas)
    assert MODE.step_budget(cfg) == 4  # ppo_mini_batch_size 2 x require_batches 2
    # samples stamped with parameter versions 0 and 1 (a fresh batch spans a sync), trained at version 2
    first = batch_maker(versions=[0, 0, 1, 1], rewards=[[1, 0], [0, 1], [1, 0], [0, 1]], seed=11)
    deltas.update({u: 0.0 for u in uids(first)})
    trainer.current_param_version = 2
    run_step(trainer, first)
    m = trainer.metrics
    assert m["replay/staleness_mean"] == pytest.approx(1.5) and m["replay/staleness_max"] == 2
    assert len(trainer.trained[-1]) == 8 and len(trainer.darl.buffer) == 4
    assert all(2 in g.recorded for g in trainer.darl.buffer.groups)  # pi_old recorded as parameter version 2

    trainer.current_param_version = 3
    second = batch_maker(versions=[2, 2], rewards=[[1, 0], [0, 1]], seed=12)
    deltas.update({u: 0.0 for u in uids(second)})
    run_step(trainer, second)
    # 2 fresh groups + round(0.5 * 4) = 2 replayed (least reused: all once; newer version first)
    assert len(trainer.trained[-1]) == 8 and trainer.metrics["replay/selected"] == 4
    assert set(uids(trainer.trained[-1])) >= set(uids(second))

    # verl's checkpoint layout: global_step_{current_param_version}/actor, the tracker file, our buffer file
    folder = trainer._checkpoint_folder()
    os.makedirs(os.path.join(folder, "actor"))
    trainer.darl.save_replay(folder)
    with open(os.path.join(cfg.trainer.default_local_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("3")
    saved = trainer.darl.buffer.state_dict()
    resumed = make_fa_trainer(cfg, {})
    assert asyncio.run(resumed.load_checkpoint()) == 3
    assert resumed.current_param_version == 3 and resumed.global_steps == 3 * 4 + 1
    assert state_equal(resumed.darl.buffer.state_dict(), saved)
