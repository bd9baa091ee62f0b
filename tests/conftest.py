"""Shared test helpers."""

import numpy as np
import pytest
import torch


def _state_equal(a, b) -> bool:
    """Exact equality of nested state: tensors (dtype and values), numpy arrays, dicts, lists, scalars."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and all(x == y for x, y in zip(a.ravel(), b.ravel())))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="session")
def state_equal():
    return _state_equal
