"""The trainers: `DarlOneStepOffTrainer` (verl's one-step-off) and `DarlFullyAsyncTrainer` (its fully-async) with its task
runner. Entry points: `recipe.darl.main_one_step_off`, `recipe.darl.main_fully_async`."""
