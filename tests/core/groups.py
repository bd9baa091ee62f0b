"""A hand-made GRPO group for the core tests."""

import numpy as np
import torch

from recipe.darl.core import Group


def group(uid: str, version: int, rewards: list[float], prompt=(5, 6, 7), lengths=None, base=0.0) -> Group:
    """A group of len(rewards) responses; response i has tokens 10 * i + j and log-probs base - 0.1 * (i + 1)."""
    n = len(rewards)
    lengths = lengths or [2] * n
    width = max(lengths)
    responses = torch.tensor([[10 * i + j for j in range(width)] for i in range(n)])
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    lp = torch.tensor([[base - 0.1 * (i + 1)] * width for i in range(n)])
    return Group.from_padded(
        uid=uid, version=version, prompt_ids=torch.tensor(prompt), prompt_length=len(prompt), responses=responses,
        response_lengths=torch.tensor(lengths), response_mask=mask, rollout_log_probs=lp,
        rewards=torch.tensor(rewards),
        non_tensors={"uid": np.array([uid] * n, dtype=object), "min_global_steps": np.array([version] * n, dtype=object),
                     "acc": np.array(rewards, dtype=object)})

