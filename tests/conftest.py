"""Shared test helpers: exact state equality, the tiny model, and Python subprocesses running verl on CPU.

The CPU platform is chosen when verl is imported (VERL_PLATFORM=cpu, read by the plugin and by verl's
platform detection), so a test that needs it runs verl in a fresh Python process with that
environment; the pytest process itself never selects a platform.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from subprocess_json import last_json_object

REPO = Path(__file__).resolve().parents[1]
# as the CPU scripts do (shells/cpu/common.sh): no idle Ray workers prestarted on a 2-core machine
os.environ.setdefault("RAY_enable_worker_prestart", "0")
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# the test suite's transformers rollout (tests/hf_rollout, `rollout.name=hf`), registered in every process of a test's
# job: verl imports the modules VERL_USE_EXTERNAL_MODULES names when it is imported (before this file imports verl)
TESTS = Path(__file__).resolve().parent
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
os.environ["VERL_USE_EXTERNAL_MODULES"] = "hf_rollout"
os.environ.setdefault("ROLLOUT", "hf")  # the CPU scripts' engine in tests, unless a test names vllm
# the fault injector at the product's probe points (recipe/darl/probes.py): a no-op unless DARL_FAULT_INJECT is set;
# every process a test starts inherits it
os.environ["DARL_PROBES"] = str(Path(__file__).resolve().parent / "faults" / "inject.py")


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


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    """The tiny Qwen3 model and tokenizer (recipe.darl.example.tiny_model, seed 0), built once per session."""
    from recipe.darl.example.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"), seed=0)


def subprocess_env(platform: str | None = "cpu", **extra: str) -> dict[str, str]:
    """The test process's environment with VERL_PLATFORM set to `platform` (removed if None)."""
    env = dict(os.environ)
    for key in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS"):
        env.pop(key, None)
    env["VERL_USE_EXTERNAL_MODULES"] = "hf_rollout"  # the test suite's rollout backend (tests/hf_rollout)
    if platform is not None:
        env["VERL_PLATFORM"] = platform
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def run_python():
    """run_python(code_or_argv, platform="cpu", timeout=..., **env) -> the last JSON object printed on stdout.

    `code_or_argv` is Python source (run with -c) or a list of arguments to the interpreter.
    The process fails the test if it exits non-zero; its output is shown then.
    """

    def _run(code_or_argv, platform: str | None = "cpu", timeout: float = 120, **env: str):
        argv = ["-c", code_or_argv] if isinstance(code_or_argv, str) else [str(a) for a in code_or_argv]
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=subprocess_env(platform, **env),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            pytest.fail(f"subprocess exited with {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
                        f"--- stderr\n{proc.stderr[-8000:]}", pytrace=False)
        found = last_json_object(proc.stdout)
        assert found is not None, f"no JSON line in the subprocess output:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return found

    return _run


# `pytest -m unit`: the tests that start no Ray cluster, no launch script and no vLLM (a few minutes on 2 cores)
UNIT = ("core/", "staleness/", "darts/", "test_docs.py", "trainer/test_replay_step.py", "trainer/test_transferqueue_plane.py",
        "trainer/test_trainer_hooks.py", "trainer/test_config_check.py", "faults/test_reward_guard.py", "faults/test_trainer_checkpoints.py",
        "faults/test_run_records.py", "example/test_arithmetic.py", "rollout/test_hf_engine.py")


# the files that launch training jobs or compose many configs, longest first: `make test` runs files on two pytest workers (pytest-xdist,
# --dist loadfile), which take files in collection order, so the long ones start first and the short ones fill in
LONG = ("vllm/test_pipeline_fully_async.py", "vllm/test_pipeline_one_step_off.py", "faults/test_kill_resume.py",
        "faults/test_stop_signal.py", "faults/test_two_jobs.py", "v1/test_v1_trainer.py", "vllm/test_vllm_rollout.py",
        "trainer/test_launch_each_trainer.py", "cluster/test_documented_commands.py", "cluster/test_presets.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix()
        return LONG.index(path) if path in LONG else len(LONG)

    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix()
        if path.startswith(UNIT):
            item.add_marker(pytest.mark.unit)
    items.sort(key=rank)  # stable: within a file, and among the other files, pytest's order
