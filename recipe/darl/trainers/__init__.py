"""The trainers: `DarlTrainer` on verl's one-step-off trainer, `DarlFullyAsyncTrainer` on its fully-async
trainer, and the fully-async task runner that builds the latter. Entry points: `recipe.darl.main_darl`,
`recipe.darl.main_fully_async`."""
