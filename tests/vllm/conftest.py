"""Fixtures of the vLLM tests: the tiny model at a size vLLM's CPU attention supports (head size 32), and a clear
failure when vLLM is not installed (make install installs it; nothing here is skipped)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_installed():
    from recipe.darl.cpu.vllm_rollout import vllm_missing_reason

    reason = vllm_missing_reason()
    if reason is not None:
        pytest.fail(reason, pytrace=False)


@pytest.fixture(scope="session")
def tiny_model_128(tmp_path_factory) -> str:
    """The tiny Qwen3 (seed 0) with hidden size 128: 4 heads of 32 (vLLM's CPU attention needs a head size >= 32)."""
    from recipe.darl.example.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_h128"), seed=0, hidden_size=128)
