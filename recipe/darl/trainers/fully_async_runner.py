"""verl's fully-async task runner, building the D-ARL trainer (`DarlFullyAsyncTaskRunner`).

`FullyAsyncTaskRunner._create_trainer` names `FullyAsyncTrainer` from its module, so the runner points that
name at `DarlFullyAsyncTrainer` for the duration of the call. The runner must reach the Ray worker by
reference, so that verl's `_create_trainer` there reads the real module's globals: it cannot live in the
trainer's module (pickled by value, fully_async.py says why) nor in the entry point (run as
`__main__`, which cloudpickle also ships by value).
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
