"""A relaunch keeps the earlier launch's records (recipe/darl/robustness/run_records.py): two launches in one folder,
verl's own file logger writing between them, every line of both on disk afterwards; the wandb run id made once,
kept beside the checkpoints and exported to the trackers' environment."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.darl.robustness.run_records import LAUNCHES_FILE, WANDB_ID_FILE, keep_run_records, launch_files


def _verl_tracking():
    """verl/utils/tracking.py itself, loaded from its file when verl is not imported yet (importing the package
    pulls in torch and Ray: seconds)."""
    if "verl.utils.tracking" in sys.modules:
        return sys.modules["verl.utils.tracking"]
    path = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "utils" / "tracking.py"
    spec = importlib.util.spec_from_file_location("_verl_tracking", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(tmp_path, logger, resume_mode="auto"):
    return OmegaConf.create({
        "trainer": {"logger": logger, "project_name": "proj", "experiment_name": "exp", "resume_mode": resume_mode,
                    "default_local_dir": str(tmp_path / "checkpoints")},
        "ray_kwargs": {"ray_init": {"num_cpus": None, "runtime_env": {"py_executable": None}}},
    })


def _train(tracking, steps, save_to=None):
    """One launch's trainer: verl's Tracking with the file backend logs `steps`; a checkpoint tracker after them."""
    tracker = tracking.Tracking("proj", "exp", default_backend=["file"])
    for step in steps:
        tracker.log({"actor/pg_loss": float(step)}, step=step)
    tracker.finish()
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        (save_to / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))


ENV_KEYS = ("WANDB_RUN_ID", "WANDB_RESUME", "VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """os.environ without the variables read here, restored afterwards (keep_run_records sets some itself)."""
    saved = {key: os.environ.pop(key, None) for key in ENV_KEYS}
    monkeypatch.chdir(tmp_path)
    yield os.environ
    for key, value in saved.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value


@pytest.mark.parametrize("where", ["path", "root"])
def test_two_launches_keep_every_logged_step_and_one_wandb_run(tmp_path, clean_env, capsys, where):
    tracking = _verl_tracking()
    if where == "path":  # what the CPU scripts set: $OUT_DIR/metrics.jsonl
        clean_env["VERL_FILE_LOGGER_PATH"] = str(tmp_path / "out" / "metrics.jsonl")
        (tmp_path / "out").mkdir()
        metrics = tmp_path / "out" / "metrics.jsonl"
    else:  # verl's default: <root>/<project>/<experiment>.jsonl
        clean_env["VERL_FILE_LOGGER_ROOT"] = str(tmp_path / "logs")
        metrics = tmp_path / "logs" / "proj" / "exp.jsonl"
    ckpt = tmp_path / "checkpoints"

    first = keep_run_records(cfg := _config(tmp_path, ["console", "file", "wandb"]))
    run_id = os.environ["WANDB_RUN_ID"]
    assert first["kept"] is None and first["metrics"] == str(metrics)
    assert len(run_id) == 8 and run_id.isalnum() and run_id == run_id.lower() and first["wandb_run_id"] == run_id
    assert os.environ["WANDB_RESUME"] == "allow"
    assert (ckpt / WANDB_ID_FILE).read_text().strip() == run_id
    assert dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars) == {"WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow"}
    _train(tracking, [1, 2, 3], save_to=ckpt)  # killed after step 3 (its checkpoint written)

    # the relaunch: the same command, so the same environment; the driver's process starts without the exports
    del clean_env["WANDB_RUN_ID"]
    del clean_env["WANDB_RESUME"]
    capsys.readouterr()
    second = keep_run_records(cfg := _config(tmp_path, ["console", "file", "wandb"]))
    line = capsys.readouterr().out
    assert second["kept"] == str(metrics.with_name(metrics.stem + ".001.jsonl"))
    assert os.environ["WANDB_RUN_ID"] == run_id and second["wandb_run_id"] == run_id
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.WANDB_RUN_ID == run_id
    assert line.count("\n") == 1 and "[D-ARL] metrics of the earlier launch kept as" in line and run_id in line
    assert "(1 earlier launch file(s) beside it" in line
    _train(tracking, [4, 5])

    files = launch_files(str(metrics))
    assert files == sorted(str(p) for p in metrics.parent.glob(metrics.stem + "*.jsonl"))  # sorted(): launch order
    assert [Path(f).name for f in files] == [f"{metrics.stem}.001.jsonl", metrics.name]
    lines = [json.loads(line) for f in files for line in Path(f).read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5]

    # a third launch: the second's file goes to .002, after .001
    del clean_env["WANDB_RUN_ID"]
    capsys.readouterr()
    third = keep_run_records(_config(tmp_path, ["file", "wandb"]))
    assert "(2 earlier launch file(s) beside it" in capsys.readouterr().out
    assert Path(third["kept"]).name == f"{metrics.stem}.002.jsonl" and third["wandb_run_id"] == run_id
    _train(tracking, [6])
    assert [json.loads(line)["step"] for f in launch_files(str(metrics)) for line in Path(f).read_text().splitlines()] \
        == [1, 2, 3, 4, 5, 6]


def test_a_wandb_run_id_set_by_the_user_is_kept(tmp_path, clean_env):
    clean_env["WANDB_RUN_ID"] = "mine1234"
    cfg = _config(tmp_path, ["wandb"])
    done = keep_run_records(cfg)
    assert done["wandb_run_id"] == "mine1234" and os.environ["WANDB_RUN_ID"] == "mine1234"
    assert "WANDB_RESUME" not in os.environ  # the user's choice too
    assert not (tmp_path / "checkpoints" / WANDB_ID_FILE).exists()
    assert dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars) == {"WANDB_RUN_ID": "mine1234"}


def test_a_launch_that_does_not_resume_starts_a_new_wandb_run(tmp_path, clean_env):
    first = keep_run_records(_config(tmp_path, ["wandb"]))["wandb_run_id"]
    del clean_env["WANDB_RUN_ID"]
    # killed before its first checkpoint: the relaunch starts at step 1 again
    second = keep_run_records(_config(tmp_path, ["wandb"]))["wandb_run_id"]
    assert second != first and (tmp_path / "checkpoints" / WANDB_ID_FILE).read_text().strip() == second
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    del clean_env["WANDB_RUN_ID"]
    assert keep_run_records(_config(tmp_path, ["wandb"], resume_mode="disable"))["wandb_run_id"] != second


def test_without_those_loggers_only_the_launch_is_recorded(tmp_path, clean_env, capsys):
    metrics = tmp_path / "proj" / "exp.jsonl"
    metrics.parent.mkdir()
    metrics.write_text('{"step": 1, "data": {}}\n')
    launches = str(tmp_path / "checkpoints" / LAUNCHES_FILE)
    assert keep_run_records(_config(tmp_path, ["console", "tensorboard"])) == {"kept": None, "metrics": None,
                                                                              "wandb_run_id": None, "launches": launches}
    assert metrics.exists() and "WANDB_RUN_ID" not in os.environ
    assert capsys.readouterr().out == f"[D-ARL] provenance and resolved config of this launch appended to {launches}\n"
    # an empty file (a launch that died before logging) is not kept
    metrics.write_text("")
    assert keep_run_records(_config(tmp_path, ["file"]))["kept"] is None and metrics.exists()


def test_every_launch_appends_its_provenance_and_resolved_config(tmp_path, clean_env):
    """Two launches of one run: two lines in launches.jsonl, each with the commit of this checkout, the host, the
    installed verl, and the config with its interpolations resolved (and the wandb id the launch exported)."""
    import json
    import socket
    import subprocess

    cfg = _config(tmp_path, ["wandb"])
    cfg.trainer.total = "${trainer.project_name}-${trainer.experiment_name}"  # an interpolation, resolved on record
    keep_run_records(cfg)
    keep_run_records(cfg)
    lines = [json.loads(x) for x in (tmp_path / "checkpoints" / LAUNCHES_FILE).read_text().splitlines()]
    assert len(lines) == 2
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(__file__)).stdout.strip()
    for line in lines:
        p = line["provenance"]
        assert p["commit"] == head and isinstance(p["dirty"], bool) and p["host"] == socket.gethostname()
        assert p["cores"] == os.cpu_count() and p["date"].startswith("20")
        assert line["versions"]["verl"] == "0.9.1"
        assert line["config"]["trainer"]["total"] == "proj-exp"
        assert line["config"]["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["WANDB_RUN_ID"] == os.environ[
            "WANDB_RUN_ID"]


def test_a_remote_checkpoint_folder_gets_no_local_launch_record(tmp_path, clean_env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path, ["console"])
    cfg.trainer.default_local_dir = "hdfs://namenode/ckpt"
    assert keep_run_records(cfg)["launches"] is None and list(tmp_path.iterdir()) == []  # no local "hdfs:" folder

