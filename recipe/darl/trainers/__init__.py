"""The trainers: `DarlTrainer` (verl's one-step-off) and `DarlFullyAsyncTrainer` (its fully-async) with its task
runner. Entry points: `recipe.darl.main_darl`, `recipe.darl.main_fully_async`."""
