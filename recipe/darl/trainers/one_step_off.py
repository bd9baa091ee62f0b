"""D-ARL on verl's one-step-off trainer. Every fresh batch is one version old; replay adds groups up to K
versions old. With `replay.enable=false` this is verl's one-step-off trainer with the run guard."""

from __future__ import annotations

from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

from recipe.darl.robustness.rollout_watch import generation_timeout, guard_generation, guard_weight_sync
from recipe.darl.trainer_mode import ONE_STEP_OFF, TrainerMode
from recipe.darl.trainers.darl_run import BUFFER_FILE
from recipe.darl.trainers.v0 import darl_v0_hooks

__all__ = ["BUFFER_FILE", "DarlOneStepOffTrainer"]


@darl_v0_hooks(TrainerMode(ONE_STEP_OFF))
class DarlOneStepOffTrainer(OneStepOffRayTrainer):
    """One-step-off PPO/GRPO with D-ARL replay and the multi-behavior loss, and the run guard (`self.darl`)."""

    def _save_checkpoint(self):
        return self.darl.save_step_checkpoint(super()._save_checkpoint)

    def _load_checkpoint(self):
        return self.darl.load_step_checkpoint(super()._load_checkpoint)

    def _rollout_servers(self) -> tuple[list, list]:
        manager = getattr(self, "llm_server_manager", None)
        return getattr(manager, "server_handles", []), getattr(manager, "server_addresses", [])

    async def _async_gen_next_batch(self, continuous_iterator):
        # a dead server or a generation past faults.generation_timeout_s: an error naming the servers and the step
        step = self.global_steps + (1 if getattr(self, "_darl_generating", False) else 0)  # the first batch is step t's
        self._darl_generating = True
        handles, addresses = self._rollout_servers()
        return await guard_generation(
            super()._async_gen_next_batch(continuous_iterator),
            what=f"generating the batch of trainer step {step} (rollout weights of step {step - 1})",
            timeout_s=generation_timeout(self.config), handles=handles, addresses=addresses)

    def _fit_update_weights(self):
        # one server killed inside the sync leaves verl's sender waiting on it forever, hence the watch
        handles, addresses = self._rollout_servers()
        return guard_weight_sync(super()._fit_update_weights, handles=handles, addresses=addresses,
                                 what=f"syncing weights to the rollout at trainer step {self.global_steps}",
                                 timeout_s=generation_timeout(self.config))

    def _fit_save_checkpoint(self):
        if not self.darl.stop_requested():
            return super()._fit_save_checkpoint()
        # save and end verl's fit after this step; the next batch's generation is cancelled and its prompts, drawn
        # before the dataloader was saved, are skipped on resume (as after any one-step-off checkpoint)
        self.is_last_step = True
        self.darl.save_for_stop(f"step {self.global_steps}")
