"""Fixtures for the hf rollout tests: the tiny model, a teacher-forced reference, subprocess runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipe.darl.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("rollout_tiny_qwen3"), seed=0)


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


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS"):
        env.pop(key, None)
    env.update(VERL_PLATFORM="cpu", OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               RAY_DEDUP_LOGS="0")
    env.update(extra)
    return env


@pytest.fixture
def run_script():
    """run_script(path, *args, timeout=...) -> the JSON object on the last stdout line starting with '{'."""

    def _run(path, *args, timeout: float = 170, **env: str):
        proc = subprocess.run([sys.executable, str(path), *map(str, args)], cwd=REPO, env=subprocess_env(**env),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            pytest.fail(f"{path} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-5000:]}\n"
                        f"--- stderr\n{proc.stderr[-8000:]}", pytrace=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no JSON line in the output:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return json.loads(lines[-1])

    return _run
