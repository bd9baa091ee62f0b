"""Every shells/run.sh example (shells/examples.txt, the list the docs print) with DRY_RUN=1: the sbatch request follows
the script's layout, the run's name and checkpoint folder follow it too, and inside a (stub) job run.sh activates the
GPU environment, checks it, and starts Ray on the layout's nodes (an evaluation: no Ray)."""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import ROOT, SHELLS, base_env
from test_run_sh import STUBS

EXAMPLES = [line for line in (SHELLS / "examples.txt").read_text().splitlines() if line.strip() and not line.startswith("#")]
NODE_GPUS = 8
JOB_VARS = ("DARL_DRY_RUN", "PYTHON", "VENV", "CONDA_ENV", "DARL_ROOT", "DRY_RUN", "HF_HUB_OFFLINE", "DARL_GPU_ENV_CHECKED")


def _parse(line: str) -> tuple[dict[str, str], list[str]]:
    words, env = shlex.split(line), {}
    while re.match(r"^[A-Z_]+=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = str(Path(value).expanduser()) if value.startswith("~") else value
    return env, [str(Path(w).expanduser()) if w.startswith("~") else w for w in words]


def _layout(env: dict[str, str], script: str) -> tuple[int, int, int, int]:
    """(trainer nodes, trainer GPUs per node, rollout nodes, rollout GPUs per node) the example runs."""
    if script.endswith("eval.sh"):
        return 1, int(env.get("EVAL_GPUS", 1)), 0, 0
    t, r = re.search(r"_fsdp2_(\d+)_(\d+)_", script).groups()
    return (int(env.get("NNODES", 1)), int(env.get("TRAINER_GPUS", t)), int(env.get("ROLLOUT_NNODES", 1)),
            int(env.get("ROLLOUT_GPUS", r)))


def _request(layout: tuple[int, int, int, int]) -> tuple[int, int]:
    total = layout[0] * layout[1] + layout[2] * layout[3]
    return math.ceil(total / NODE_GPUS), min(total, NODE_GPUS)


def _tag(layout: tuple[int, int, int, int]) -> str:
    tn, tg, rn, rg = layout
    return f"fsdp2_{tn}x{tg}_{rn}x{rg}" if tn > 1 or rn > 1 else f"fsdp2_{tg}_{rg}"


def test_the_list_holds_one_and_two_nodes_of_8_gpus_for_both_models_and_an_evaluation():
    got = set()
    for env, words in map(_parse, EXAMPLES):
        assert words[:2] == ["bash", "shells/run.sh"], words
        script, layout = words[2], _layout(env, words[2])
        model = re.search(r"_grpo_([0-9.]+b)_", script)
        got.add((model.group(1) if model else "eval", _request(layout)))
    assert {("1.7b", (1, 8)), ("4b", (1, 8)), ("1.7b", (2, 8)), ("4b", (2, 8)), ("eval", (1, 1))} <= got, got


@pytest.mark.parametrize("line", EXAMPLES)
def test_submit_asks_for_the_layout(line, tmp_path):
    env_vars, words = _parse(line)
    env = dict(base_env(tmp_path), **env_vars, DRY_RUN="1", VENV="none", LOG_DIR=str(tmp_path / "logs"))
    p = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    (out,) = p.stdout.splitlines()
    nodes, per_node = _request(_layout(env_vars, words[2]))
    assert out.startswith("+ sbatch ") and f" --nodes={nodes} --gpus-per-node={per_node} " in out, out
    assert f"SCRIPT={words[2]}" in out and env_vars.get("SBATCH_ARGS", "") in out
    assert shlex.split(out.split(f"{ROOT}/shells/run.sh")[-1]) == words[3:]  # the script's arguments, as given


TRAINING = [line for line in EXAMPLES if "eval.sh" not in line]


def _command(line: str, tmp_path: Path) -> list[str]:
    env_vars, words = _parse(line)
    env = dict(base_env(tmp_path), **env_vars, DARL_PRINT_CMD="1")
    return shlex.split(subprocess.run(["bash", words[2]], cwd=ROOT, env=env, capture_output=True, text=True,
                                      check=True, timeout=60).stdout)


def _value(words: list[str], key: str) -> str:
    return [w.split("=", 1)[1] for w in words if w.startswith(f"{key}=")][-1]


@pytest.mark.parametrize("line", TRAINING)
def test_the_run_is_named_after_its_layout(line, tmp_path):
    env_vars, words = _parse(line)
    layout, cmd = _layout(env_vars, words[2]), _command(line, tmp_path)
    assert [int(_value(cmd, k)) for k in ("trainer.nnodes", "trainer.n_gpus_per_node", "rollout.nnodes",
                                           "rollout.n_gpus_per_node")] == list(layout)
    name = _value(cmd, "trainer.experiment_name")
    stem = Path(words[2]).stem
    assert name == re.sub(r"_fsdp2_\d+_\d+_", f"_{_tag(layout)}_", stem), name
    assert _value(cmd, "trainer.default_local_dir") == str(tmp_path / "ckpt" / "darl" / name)
    assert _value(cmd, "trainer.resume_mode") == "auto"


def test_no_two_layouts_share_a_checkpoint_folder(tmp_path):
    """resume_mode=auto takes the latest checkpoint of the folder: one folder per (script, layout)."""
    folders: dict[str, tuple] = {}
    for line in TRAINING:
        env_vars, words = _parse(line)
        folder = _value(_command(line, tmp_path), "trainer.default_local_dir")
        key = (words[2], _layout(env_vars, words[2]))
        assert folders.setdefault(folder, key) == key, (folder, key, folders[folder])
    assert len(set(folders.values())) == len(folders) >= 8


def _fake_root(tmp_path: Path, gpu_env: bool = True) -> Path:
    """A checkout (shells/ and recipe/ linked), the CPU .venv beside it, and a fake GPU .venv-gpu whose python3 records
    its calls and answers the CUDA check as a GPU node's would."""
    root = tmp_path / "root"
    root.mkdir()
    for name in ("shells", "recipe", ".venv"):
        (root / name).symlink_to(ROOT / name)
    if gpu_env:
        bin_dir = root / ".venv-gpu" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "activate").write_text(f'export VIRTUAL_ENV="{root}/.venv-gpu"\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\n')
        (bin_dir / "python3").write_text(
            '#!/usr/bin/env bash\necho "python3 $*" >> "$STUB_LOG"\n'
            'if [[ "$*" == "-m recipe.darl.checks.preflight --gpus "* ]]; then echo "torch 2.11.0+cu130: 8 GPUs" >&2; exit 0; fi\n'
            f'exec "{sys.executable}" "$@"\n')
        (bin_dir / "python3").chmod(0o755)
    return root


def _job_env(tmp_path: Path, root: Path, nodes: int, per_node: int, **extra) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = base_env(tmp_path)
    for key in JOB_VARS:
        env.pop(key, None)
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", STUB_LOG=str(tmp_path / "calls.log"), LOG_DIR=str(tmp_path / "logs"),
               RAY_HEAD_DELAY_S="0", SLURM_JOB_ID="777", SLURM_JOB_NAME="darl", SLURM_SUBMIT_DIR=str(root),
               SLURM_JOB_NODELIST=",".join(f"gpu{i}" for i in range(1, nodes + 1)), SLURM_GPUS_ON_NODE=str(per_node),
               SLURM_CPUS_PER_TASK="32", **extra)
    return env


@pytest.mark.parametrize("line", EXAMPLES)
def test_the_job_runs_the_layout_in_the_gpu_environment(line, tmp_path):
    env_vars, words = _parse(line)
    layout = _layout(env_vars, words[2])
    nodes, per_node = _request(layout)
    root = _fake_root(tmp_path)
    env = _job_env(tmp_path, root, nodes, per_node, DRY_RUN="1", **env_vars)
    p = subprocess.run(["bash", str(root / "shells" / "run.sh"), *words[2:]], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    total = layout[0] * layout[1] + layout[2] * layout[3]
    assert f"environment: {root}/.venv-gpu/bin/python3 (VENV={root}/.venv-gpu" in p.stderr
    assert f"python3 -m recipe.darl.checks.preflight --gpus {total}" in (tmp_path / "calls.log").read_text()
    assert "warning" not in p.stderr
    assert ("HF_HUB_OFFLINE=1" in p.stderr) == ("HF_HUB_OFFLINE" in env_vars)
    lines = p.stdout.splitlines()
    if words[2].endswith("eval.sh"):
        assert len(lines) == 1 and shlex.split(lines[0][2:]) == ["bash", *words[2:]]  # no Ray for an evaluation
    else:
        assert sum("ray start" in x for x in lines) == nodes
        assert shlex.split(lines[-1][2:])[-(len(words) - 1):] == ["bash", *words[2:]]


FOUR_B = "shells/one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh"


def test_a_gpu_job_never_takes_the_cpu_venv_and_stops_before_ray_without_cuda(tmp_path):
    root = _fake_root(tmp_path, gpu_env=False)
    # by default a GPU job leaves the CPU stack (.venv) alone: no environment activated
    p = subprocess.run(["bash", str(root / "shells" / "run.sh"), FOUR_B], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=_job_env(tmp_path, root, 1, 4, DRY_RUN="1"))
    assert "(VENV=none, CONDA_ENV=none) for 4 GPU(s)" in p.stderr and "warning (DRY_RUN): the job would stop" in p.stderr
    # pointed at the CPU stack: refused before any srun or ray, naming the interpreter and its environment
    (tmp_path / "calls.log").unlink(missing_ok=True)
    env = _job_env(tmp_path, root, 1, 4, VENV=str(ROOT / ".venv"))
    p = subprocess.run(["bash", str(root / "shells" / "run.sh"), FOUR_B], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1
    assert f"(environment {ROOT / '.venv'})" in p.stderr and "a build without CUDA" in p.stderr and "make install-gpu" in p.stderr
    calls = (tmp_path / "calls.log").read_text() if (tmp_path / "calls.log").exists() else ""
    assert "srun" not in calls and "ray" not in calls


def test_a_direct_launch_stops_before_ray_without_cuda(tmp_path):
    """The launch script on its own (no run.sh): shells/common.sh checks the environment before python starts Ray."""
    env = base_env(tmp_path)
    env.pop("DARL_DRY_RUN")
    p = subprocess.run(["bash", str(ROOT / FOUR_B)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "the launch asks for 4 GPU(s)" in p.stderr and sys.executable in p.stderr
    assert "[darl]" not in p.stderr  # stopped before the launch line (and python's ray.init)


def test_make_install_gpu_builds_its_own_environment():
    out = subprocess.run(["make", "-n", "install-gpu"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m venv .venv-gpu" in out and ".venv-gpu/bin/python -m pip install -r requirements-cuda.txt" in out
    assert "flash-attn==2.8.3 --no-build-isolation" in out and ".venv/" not in out
    reqs = (ROOT / "requirements-cuda.txt").read_text()
    assert re.search(r"^transferqueue==", reqs, re.M) and re.search(r"^verl\[vllm[^\]]*\]==0\.9\.1", reqs, re.M)
    skipped = subprocess.run(["make", "-n", "install-gpu", "FLASH_ATTN=0"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    assert 'if [ "0" = 1 ]' in skipped


def test_eval_sh_writes_its_results_where_the_training_logs_go(tmp_path):
    env = dict(base_env(tmp_path), DARL_PRINT_CMD="1", LOG_DIR=str(tmp_path / "logs"), SLURM_JOB_ID="42", EVAL_GPUS="2")
    ckpt = tmp_path / "ckpt" / "darl" / "one_step_off_grpo_1.7b_gsm8k_fsdp2_4_4_replay_4_pmis_sg" / "global_step_100"

    def command(*args):
        out = subprocess.run(["bash", str(SHELLS / "eval.sh"), *args], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return shlex.split(out.stdout)

    words = command("--model", str(ckpt), "--benchmarks", "gsm8k")
    assert words[1:3] == ["-m", "recipe.darl.eval"] and words[-4:] == ["--model", str(ckpt), "--benchmarks", "gsm8k"]
    assert _value_flag(words, "--out") == str(tmp_path / "logs" / "eval" / f"{ckpt.parent.name}_global_step_100-42")
    assert _value_flag(words, "--tensor-parallel-size") == "2" and _value_flag(words, "--data-dir") == env["DATA_DIR"]
    cpu_ckpt = tmp_path / "outputs" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg" / "checkpoints" / "global_step_8"
    assert _value_flag(command("--model", str(cpu_ckpt)), "--out").endswith(  # the CPU scripts' <experiment>/checkpoints
        "/eval/one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg_global_step_8-42")
    assert "--out" not in command("--model=Qwen/Qwen3-1.7B", "--out", "/x")[:-2]  # the caller's --out only
    assert _value_flag(command("--model=Qwen/Qwen3-1.7B"), "--out").endswith("/logs/eval/Qwen3-1.7B-42")
    assert subprocess.run(["bash", str(SHELLS / "eval.sh")], env=env, capture_output=True).returncode == 2


def _value_flag(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


# the one documented line that must be refused (docs/cluster.md, "GPU check"): the 4B script's 2 + 2 GPUs on nodes of 2
REFUSED = 'SBATCH_ARGS="--gpus-per-node=2" bash shells/run.sh shells/one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh'


def _documented_run_sh_lines() -> list[str]:
    """Every `bash shells/run.sh ...` command line of README and docs/ (trailing comment and a DRY_RUN=1 prefix off)."""
    lines = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            if re.match(r"^([A-Z_]+=\S+ )*bash shells/run\.sh ", line):
                lines.append(re.sub(r"^DRY_RUN=1 ", "", line.split("   #")[0].rstrip()))
    return lines


def test_every_run_sh_line_of_the_docs_is_a_tested_example(tmp_path):
    lines = _documented_run_sh_lines()
    assert len(lines) >= 5 and REFUSED in lines
    assert [line for line in lines if line != REFUSED and line not in EXAMPLES] == []
    env_vars, words = _parse(REFUSED)
    env = dict(base_env(tmp_path), **env_vars, DRY_RUN="1", VENV="none", LOG_DIR=str(tmp_path / "logs"))
    p = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "needs 4 GPUs" in p.stderr, p.stderr[-2000:]
