"""Each D-ARL trainer and rollout manager is one class of ours over verl's: D-ARL's state is held (`trainer.darl`,
`manager.planner`), never mixed into the bases."""

from __future__ import annotations

import pytest

from recipe.darl.trainers.fully_async import DarlFullyAsyncTrainerImpl
from recipe.darl.trainers.one_step_off import DarlOneStepOffTrainer
from recipe.darl.trainers.v1 import DarlColocateAsyncTrainer, DarlSeparateAsyncTrainer
from recipe.darl.workers.darts_rollout import DartsAgentLoopManager, DartsFullyAsyncAgentLoopManager


@pytest.mark.parametrize("cls", [DarlOneStepOffTrainer, DarlFullyAsyncTrainerImpl, DarlColocateAsyncTrainer,
                                 DarlSeparateAsyncTrainer, DartsAgentLoopManager, DartsFullyAsyncAgentLoopManager])
def test_one_class_of_ours_over_verls(cls):
    ours = [k for k in cls.__mro__ if k.__module__.startswith("recipe.")]
    assert ours == [cls], [k.__qualname__ for k in ours]
    assert cls.__mro__[1].__module__.startswith("verl."), cls.__mro__[1]


def test_the_v1_trainers_are_found_by_their_names():
    import pickle

    from recipe.darl.trainers import v1

    for cls in (DarlColocateAsyncTrainer, DarlSeparateAsyncTrainer):
        assert getattr(v1, cls.__qualname__) is cls and pickle.loads(pickle.dumps(cls)) is cls


@pytest.mark.parametrize("cls", [DarlOneStepOffTrainer, DarlFullyAsyncTrainerImpl])
def test_the_v0_trainers_keep_their_tracking_compact(cls):
    from types import SimpleNamespace

    from recipe.darl.trainers.console import CompactConsole

    trainer = cls.__new__(cls)
    trainer.config = {"console": "compact"}
    trainer.logger = SimpleNamespace(logger={"console": object()})  # verl's Tracking, as its fit assigns it
    assert isinstance(trainer.logger.logger["console"], CompactConsole)
    assert "_darl_logger" in vars(trainer)
