"""Nodes without internet: `python -m recipe.darl.data.prepare --dataset all --model ...` readies them on a login node,
and a launch under HF_HUB_OFFLINE=1 says what is missing before Ray starts (recipe/darl/checks/preflight.py). Walked
on the CPU example: its model stands in for a fetched hub model (put into a Hugging Face cache as snapshot_download
leaves it), its data is built locally."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import ROOT, parse_dry_run
from omegaconf import OmegaConf

from recipe.darl.checks import preflight
from recipe.darl.data import prepare

REPO = "darl-example/tiny-arith"
CPU_SCRIPT = ROOT / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"


@pytest.fixture(scope="module")
def example() -> list[str]:
    """The CPU example's model folder, training and validation parquet (built locally on first use)."""
    out = subprocess.run([sys.executable, "-m", "recipe.darl.example.build", "--paths-only"], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=1800).stdout.split()
    assert len(out) == 3
    return out


def _cache(hf_home: Path, model_dir: str, repo: str = REPO) -> Path:
    """`repo` in HF_HOME's hub cache, laid out as snapshot_download leaves it (refs/main names the snapshot)."""
    folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    shutil.copytree(model_dir, snapshot)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    return snapshot


def _cfg(model: str, train: str, val: str):
    return OmegaConf.create({"actor_rollout_ref": {"model": {"path": model}},
                             "data": {"train_files": train, "val_files": val}})


def test_the_cpu_example_launches_offline_from_the_cache(example, tmp_path):
    model, train, val = example
    _cache(tmp_path / "hf", model)
    env = dict(os.environ, DARL_DRY_RUN="1", PYTHON=sys.executable, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1",
               MODEL_PATH=REPO, TRAIN_FILES=train, VAL_FILES=val, OUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1",
               RAY_AUTH_MODE="disabled", ROLLOUT="hf")
    p = subprocess.run(["bash", str(CPU_SCRIPT), f"hydra.run.dir={tmp_path}/hydra"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert parse_dry_run(p.stdout)["actor_rollout_ref"]["model"]["path"] == REPO
    # the same launch with an empty cache: refused before Ray, naming the model and the command that fetches it
    env["HF_HOME"] = str(tmp_path / "empty")
    p = subprocess.run(["bash", str(CPU_SCRIPT), f"hydra.run.dir={tmp_path}/hydra"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert f"actor_rollout_ref.model.path={REPO}: HF_HUB_OFFLINE=1 and the model is not in the Hugging Face cache" in p.stderr
    assert f"python -m recipe.darl.data.prepare --model {REPO}" in p.stderr


def test_offline_problems_name_what_is_missing(example, tmp_path, monkeypatch):
    model, train, val = example
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    offline = {"HF_HUB_OFFLINE": "1"}
    problems, lines = preflight.offline_problems(_cfg(REPO, train, val), offline)
    assert len(problems) == 1 and REPO in problems[0] and str(tmp_path / "hf" / "hub") in problems[0] and not lines
    assert preflight.offline_problems(_cfg(REPO, train, val), {}) == ([], [])  # online: the hub serves it
    snapshot = _cache(tmp_path / "hf", model)
    assert preflight.cached_model(REPO) == str(snapshot)
    assert preflight.offline_problems(_cfg(REPO, train, val), offline) == ([], [])
    assert preflight.offline_problems(_cfg(model, train, val), offline) == ([], [])  # a local folder needs no cache
    (snapshot / "model.safetensors").unlink()  # a partial download: no weights
    assert preflight.cached_model(REPO) is None
    # a data file that is not there: the command that prepares it
    missing = str(tmp_path / "data" / "gsm8k" / "train.parquet")
    problems, lines = preflight.offline_problems(_cfg(model, missing, val), {})
    assert problems == [] and lines == [
        f"[D-ARL] data.train_files: {missing} is missing; prepare it (on a node with internet): "
        f"python -m recipe.darl.data.prepare --dataset gsm8k --out {tmp_path / 'data' / 'gsm8k'}"]


def test_one_command_prepares_the_datasets_and_fetches_the_models(tmp_path, monkeypatch):
    """`--dataset all --model A --model B`: each dataset into <out>/<name>, each model fetched (the download itself,
    snapshot_download and `datasets`, replaced here: no network)."""
    fetched, prepared = [], []
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda repo, local_dir=None: fetched.append((repo, local_dir)) or str(local_dir or f"/cache/{repo}"))
    monkeypatch.setattr(prepare, "prepare", lambda name, out, **kw: prepared.append((name, out, kw["offline"])) or {})
    assert prepare.main(["--dataset", "all", "--out", str(tmp_path / "data"), "--model", "Qwen/Qwen3-1.7B",
                         "--model", "Qwen/Qwen3-4B", "--model-dir", str(tmp_path / "models")]) == 0
    assert fetched == [("Qwen/Qwen3-1.7B", str(tmp_path / "models" / "Qwen3-1.7B")),
                       ("Qwen/Qwen3-4B", str(tmp_path / "models" / "Qwen3-4B"))]
    assert prepared == [(name, str(tmp_path / "data" / name), False) for name in prepare.DATASETS]
    assert len(prepared) == 6
    fetched.clear()
    assert prepare.main(["--model", "Qwen/Qwen3-1.7B"]) == 0 and fetched == [("Qwen/Qwen3-1.7B", None)]  # the HF cache
    with pytest.raises(SystemExit):
        prepare.main(["--dataset", "all", "--out", str(tmp_path), "--split", "test"])
    with pytest.raises(SystemExit):
        prepare.main([])


def test_run_sh_passes_hf_hub_offline_to_the_launch(tmp_path):
    """sbatch --export=ALL carries HF_HUB_OFFLINE into the job; run.sh hands it on to the launch script."""
    from test_run_sh import write_stubs

    bin_dir = tmp_path / "bin"
    write_stubs(bin_dir)
    script = tmp_path / "record.sh"
    script.write_text('echo "HF_HUB_OFFLINE=${HF_HUB_OFFLINE-unset} HF_HOME=${HF_HOME-unset}"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN", "TRAINER_GPUS", "ROLLOUT_GPUS")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", STUB_LOG=str(tmp_path / "calls.log"), LOG_DIR=str(tmp_path / "logs"),
               VENV="none", RAY_HEAD_DELAY_S="0", SLURM_JOB_ID="777", SLURM_JOB_NAME="darl", SLURM_JOB_NODELIST="gpu1",
               SLURM_SUBMIT_DIR=str(ROOT), SLURM_GPUS_ON_NODE="8", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    subprocess.run(["bash", str(ROOT / "shells" / "run.sh"), str(script)], env=env, check=True, capture_output=True,
                   timeout=60)
    assert f"HF_HUB_OFFLINE=1 HF_HOME={tmp_path / 'hf'}" in (tmp_path / "logs" / "darl-777-restart0.log").read_text()
