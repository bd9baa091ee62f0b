"""verl's fully-async task runner, building the D-ARL trainer (`DarlFullyAsyncTaskRunner`).

`_create_trainer` reads `FullyAsyncTrainer` from verl's module, so the runner points that global at ours for the
call. It must reach the worker by reference to swap the real global: hence neither in the trainer's module nor in
`__main__`, both pickled by value.
"""

from __future__ import annotations

import contextlib

import ray
from verl.experimental.fully_async_policy import fully_async_main

FullyAsyncTaskRunnerBase = fully_async_main.FullyAsyncTaskRunner.__ray_metadata__.modified_class.__ray_actor_class__


@contextlib.contextmanager
def _trainer_class(cls):
    saved = fully_async_main.FullyAsyncTrainer
    fully_async_main.FullyAsyncTrainer = cls
    try:
        yield
    finally:
        fully_async_main.FullyAsyncTrainer = saved


class DarlFullyAsyncTaskRunnerImpl(FullyAsyncTaskRunnerBase):
    """verl's fully-async task runner, building the D-ARL trainer."""

    def _create_trainer(self, config) -> None:
        from .fully_async import DarlFullyAsyncTrainer

        with _trainer_class(DarlFullyAsyncTrainer):
            super()._create_trainer(config)


DarlFullyAsyncTaskRunner = ray.remote(num_cpus=1)(DarlFullyAsyncTaskRunnerImpl)
