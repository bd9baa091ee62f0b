"""Fixtures for the hf rollout tests: a teacher-forced reference and script runs (the tiny model and
`run_python` come from tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def reference_model(tiny_model_path):
    """The tiny model loaded separately (fp32, sdpa): the teacher-forced reference."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


@pytest.fixture(scope="session")
def teacher_forced(reference_model):
    """teacher_forced(prompt, response, model=None) -> logits [len(response), V] (float32) that predicted each
    response token given the prompt and the earlier response tokens."""

    @torch.no_grad()
    def _logits(prompt, response, model=None):
        model = model or reference_model
        ids = torch.tensor([list(prompt) + list(response)])
        return model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()

    return _logits


@pytest.fixture
def run_script(run_python):
    """run_script(path, *args, timeout=...) -> the JSON object on the last stdout line starting with '{'."""

    def _run(path, *args, timeout: float = 170, **env: str):
        return run_python([path, *args], platform="cpu", timeout=timeout, RAY_DEDUP_LOGS="0", **env)

    return _run
