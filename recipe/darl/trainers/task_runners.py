"""verl's task runners, building the D-ARL trainers: `DarlTaskRunner` (one-step-off), `DarlFullyAsyncTaskRunner`
and `DarlTaskRunnerV1` (verl's V1 trainer).

verl's runners read their trainer class from their module's globals when they build it, so each D-ARL runner points
that global at the D-ARL trainer for the call and otherwise runs verl's own code. A runner must reach the worker by
reference to swap the real global: hence here, neither in a trainer's module nor in `__main__`, both pickled by value.
"""

from __future__ import annotations

import ray
from verl.experimental.fully_async_policy import fully_async_main
from verl.experimental.one_step_off_policy import main_ppo as one_step_off_main
from verl.trainer import main_ppo

from recipe.darl.probes import swapped

# Ray refuses a subclass of an actor class, and verl's runners take no trainer class: the plain classes behind them
OneStepTaskRunnerBase = one_step_off_main.OneStepTaskRunner.__ray_metadata__.modified_class.__ray_actor_class__
FullyAsyncTaskRunnerBase = fully_async_main.FullyAsyncTaskRunner.__ray_metadata__.modified_class.__ray_actor_class__
TaskRunnerV1Base = main_ppo.TaskRunnerV1.__ray_metadata__.modified_class.__ray_actor_class__


class DarlTaskRunnerImpl(OneStepTaskRunnerBase):
    """verl's one-step-off task runner (tokenizer, datasets, workers, `fit`), building the D-ARL trainer."""

    def run(self, config) -> None:
        from .one_step_off import DarlOneStepOffTrainer

        with swapped(one_step_off_main, "OneStepOffRayTrainer", DarlOneStepOffTrainer):
            super().run(config)


class DarlFullyAsyncTaskRunnerImpl(FullyAsyncTaskRunnerBase):
    """verl's fully-async task runner, building the D-ARL trainer."""

    def _create_trainer(self, config) -> None:
        from .fully_async import DarlFullyAsyncTrainer

        with swapped(fully_async_main, "FullyAsyncTrainer", DarlFullyAsyncTrainer):
            super()._create_trainer(config)


class DarlTaskRunnerV1Impl(TaskRunnerV1Base):
    """verl's V1 task runner (TransferQueue, trainer, agent loop, `fit`), building the D-ARL trainer of the mode."""

    def run(self, config) -> None:
        import verl.trainer.ppo.v1 as v1

        from .v1 import TRAINERS  # trainer.v1.trainer_mode is one of them: checked before Ray starts

        with swapped(v1, "get_trainer_cls", TRAINERS.__getitem__):
            super().run(config)


DarlTaskRunner = ray.remote(num_cpus=1, max_concurrency=100)(DarlTaskRunnerImpl)
DarlFullyAsyncTaskRunner = ray.remote(num_cpus=1)(DarlFullyAsyncTaskRunnerImpl)
DarlTaskRunnerV1 = ray.remote(num_cpus=1)(DarlTaskRunnerV1Impl)
