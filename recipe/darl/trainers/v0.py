"""The hooks D-ARL adds to both of verl's V0 trainers (one-step-off, fully-async), written once: `darl_v0_hooks(mode)`
decorates each trainer class (one class of ours over verl's) with them; the class body holds what is its own."""

from __future__ import annotations

from typing import Callable

from recipe.darl.robustness.job_ports import JobPortWorkerGroup, port_clash_named
from recipe.darl.trainer_mode import TrainerMode
from recipe.darl.trainers.console import CompactTracking
from recipe.darl.trainers.darl_run import DarlRun


def darl_v0_hooks(mode: TrainerMode) -> Callable[[type], type]:
    """A class decorator: the trainer holds D-ARL's run of `mode` as `self.darl`, takes worker ports from the job's
    range, installs the D-ARL loss in the actor, guards rewards and runs the replay step around verl's old-log-prob
    and update hooks. A hook the class defines itself is an error (it would be silently replaced)."""

    def install(cls: type) -> type:
        def __init__(self, config, *args, **kwargs):
            super(cls, self).__init__(config, *args, **kwargs)
            self.darl = DarlRun(self, config, mode)
            self.ray_worker_group_cls = JobPortWorkerGroup  # torch.distributed ports from the job's own range

        def _init_worker_groups(self):
            with port_clash_named():  # no free port in the job's range: an error naming the setting
                return super(cls, self)._init_worker_groups()

        def _init_models(self):
            with port_clash_named():  # rank 0 of each worker group binds its port here
                super(cls, self)._init_models()
            self.darl.install_loss(self.actor_wg)

        def _fit_compute_reward(self, batch):
            return self.darl.guard_rewards(super(cls, self)._fit_compute_reward(batch))

        def _fit_compute_log_prob(self, batch):
            return self.darl.compute_log_prob(batch, super(cls, self)._fit_compute_log_prob)

        def _fit_update_actor(self, batch):
            return self.darl.update_actor(batch, super(cls, self)._fit_update_actor)

        hooks = (__init__, _init_worker_groups, _init_models, _fit_compute_reward, _fit_compute_log_prob,
                 _fit_update_actor)
        if own := [h.__name__ for h in hooks if h.__name__ in vars(cls)]:
            raise TypeError(f"{cls.__qualname__} defines {own}, which darl_v0_hooks provides")
        for hook in hooks:
            hook.__qualname__ = f"{cls.__qualname__}.{hook.__name__}"
            setattr(cls, hook.__name__, hook)
        cls.logger = CompactTracking()
        cls.logger.__set_name__(cls, "logger")  # as in a class body (setattr does not call it)
        return cls

    return install
