"""Recipes built on verl. `recipe.darl`: distribution-matched asynchronous RL."""
