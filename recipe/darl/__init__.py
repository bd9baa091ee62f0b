"""D-ARL on verl 0.9.1. `recipe.darl.core` holds the algorithm in plain PyTorch."""

__version__ = "0.1.0"
