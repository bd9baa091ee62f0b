"""The trainer tests' fixtures and stand-ins (tests/trainer), shared with the fault tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_TRAINER = Path(__file__).resolve().parents[1] / "trainer"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_conftest = _load("_trainer_conftest", _TRAINER / "conftest.py")
hooks = _load("_trainer_hooks", _TRAINER / "test_trainer_hooks.py")

paths = _conftest.paths
compose_config = _conftest.compose_config
batch_maker = _conftest.batch_maker
replay_cfg = hooks.replay_cfg


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def trainer_hooks():
    """tests/trainer/test_trainer_hooks.py: `make_trainer` (a DarlOneStepOffTrainer without Ray), `run_step`, `uids`."""
    return hooks
