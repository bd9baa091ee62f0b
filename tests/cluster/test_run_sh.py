"""shells/run.sh: syntax, the submit path, and a whole job run against stub Slurm and Ray commands."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import ROOT, SHELLS, base_env, parse_dry_run

RUN_SH = SHELLS / "run.sh"
# job 777's own ports: a 64-port slot of 20000-31999 by job id, 48 for torch.distributed, then the Ray head's
JOB_PORTS = 20000 + (777 % 187) * 64
RAY = JOB_PORTS + 48

STUBS = {
    # srun: record the call, drop its options, run the command (the stubs below, or bash)
    "srun": '#!/usr/bin/env bash\necho "srun $*" >> "$STUB_LOG"\nwhile [[ $# -gt 0 && "$1" == -* ]]; do shift; done\nexec "$@"\n',
    "scontrol": '#!/usr/bin/env bash\necho "scontrol $*" >> "$STUB_LOG"\n'
                'if [[ "$1 $2" == "show hostnames" ]]; then tr "," "\\n" <<< "$3"; fi\n',
    # ray: a node is active once its `ray start` ran (as a real cluster's status reports it)
    "ray": '#!/usr/bin/env bash\necho "ray $*" >> "$STUB_LOG"\n'
           'if [[ "$1" == status ]]; then printf "Node status\\n---\\nActive:\\n"; '
           'grep "^ray start" "$STUB_LOG" | awk \'{print " 1 node_" NR}\'; printf "Pending:\\n (no pending nodes)\\n"; fi\n',
    "hostname": '#!/usr/bin/env bash\necho "10.1.2.3 fe80::1"\n',
    "sbatch": '#!/usr/bin/env bash\necho "sbatch $*" >> "$STUB_LOG"\necho "Submitted batch job 42"\n',
}


def write_stubs(bin_dir):
    """The STUBS as executables in `bin_dir` (made here), to put first on PATH."""
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


@pytest.fixture
def slurm(tmp_path):
    """Stub commands first on PATH, a fake job's environment, and a launch script that records what it got."""
    bin_dir = tmp_path / "bin"
    write_stubs(bin_dir)
    script = tmp_path / "record.sh"
    script.write_text('echo "ARGS: $*"\necho "RAY_ADDRESS=$RAY_ADDRESS PYTHONPATH=$PYTHONPATH NCCL_DEBUG=$NCCL_DEBUG"\n'
                      'echo "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-unset} DARL_PORT_RANGE=$DARL_PORT_RANGE"\n'
                      '[[ -n "${SLEEP:-}" ]] && exec sleep "$SLEEP"\nexit "${EXIT_CODE:-0}"\n')
    env = dict(os.environ)
    for key in ("SLURM_JOB_ID", "DARL_PORT_RANGE", "SBATCH_ARGS", "GPU_CHECK", "GPUS_PER_NODE", "TRAINER_GPUS", "ROLLOUT_GPUS", "NNODES",
                "ROLLOUT_NNODES", "CUDA_DEVICE_MAX_CONNECTIONS", "DARL_PRINT_CMD", "DRY_RUN"):
        env.pop(key, None)
    env.update(PATH=f"{bin_dir}:{env['PATH']}", STUB_LOG=str(tmp_path / "calls.log"), LOG_DIR=str(tmp_path / "logs"),
               VENV="none", RAY_HEAD_DELAY_S="0")
    job = dict(env, SLURM_JOB_ID="777", SLURM_JOB_NAME="darl", SLURM_JOB_NODELIST="gpu1,gpu2,gpu3",
               SLURM_SUBMIT_DIR=str(ROOT), SLURM_GPUS_ON_NODE="8", SLURM_CPUS_PER_TASK="32", SLURM_RESTART_COUNT="1")
    return tmp_path, env, job, script


def calls(tmp):
    return (tmp / "calls.log").read_text().splitlines() if (tmp / "calls.log").exists() else []


def test_bash_syntax_and_documented_variables():
    subprocess.run(["bash", "-n", str(RUN_SH)], check=True)
    subprocess.run(["bash", "-n", str(SHELLS / "common.sh")], check=True)
    head = RUN_SH.read_text().split("set -euo pipefail")[0]
    assert "#SBATCH --requeue" in head and "#SBATCH --nodes=" in head and "#SBATCH --output=logs/%x-%j.out" in head
    for var in ("SCRIPT", "SBATCH_ARGS", "DRY_RUN", "LOG_DIR", "MODULES", "CONDA_ENV", "VENV", "GPUS_PER_NODE",
                "RAY_PORT", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "MODEL_PATH", "DATA_DIR", "TRAINER_GPUS", "ROLLOUT_GPUS"):
        assert f"#   {var}" in head or f" {var} [" in head or f"{var}," in head or f" {var} " in head, var


def test_submit_dry_run_prints_sbatch(slurm):
    tmp, env, _, _ = slurm
    env.update(DRY_RUN="1", SBATCH_ARGS="--nodes=2 --partition=gpu")
    script = "shells/one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh"
    out = subprocess.run(["bash", str(RUN_SH), script, "trainer.total_epochs=1"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("+ sbatch ") and "--nodes=2 --partition=gpu" in out and f"SCRIPT={script}" in out
    assert out.rstrip().endswith(f"{RUN_SH} trainer.total_epochs=1")
    assert not (tmp / "logs").exists() and not calls(tmp)


def test_submit_calls_sbatch(slurm):
    tmp, env, _, script = slurm
    subprocess.run(["bash", str(RUN_SH), str(script), "a=1"], env=env, check=True, capture_output=True)
    (call,) = calls(tmp)
    assert call.startswith(f"sbatch --chdir={ROOT} --output={tmp}/logs/%x-%j.out") and f"SCRIPT={script}" in call
    assert (tmp / "logs").is_dir()  # Slurm does not create the output folder itself


def test_job_starts_ray_on_every_node_then_the_script(slurm):
    tmp, _, job, script = slurm
    p = subprocess.run(["bash", str(RUN_SH), str(script), "x=1", "y=two words"], env=job, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    c = calls(tmp)
    assert "scontrol show hostnames gpu1,gpu2,gpu3" in c
    head = [x for x in c if x.startswith("ray start --head")]
    workers = [x for x in c if x.startswith(f"ray start --address=10.1.2.3:{RAY}")]
    assert len(head) == 1 and "--num-gpus=8" in head[0] and "--num-cpus=32" in head[0] and f"--port={RAY}" in head[0]
    assert len(workers) == 2
    assert any(x.startswith("srun --overlap --nodes=1 --ntasks=1 --nodelist=gpu1 ray start --head") for x in c)
    assert {x.split("--nodelist=")[1].split()[0] for x in c if "ray start --address" in x and x.startswith("srun")} == {"gpu2", "gpu3"}
    assert any(x.startswith(f"ray status --address=10.1.2.3:{RAY}") for x in c)
    assert not [x for x in c if x.startswith("ray stop")]  # never every Ray of the node: another job's may run there
    log = (tmp / "logs" / "darl-777-restart1.log").read_text()  # per job and restart
    assert "ARGS: x=1 y=two words" in log
    assert f"RAY_ADDRESS=10.1.2.3:{RAY} PYTHONPATH={ROOT}" in log and "NCCL_DEBUG=WARN" in log
    assert f"DARL_PORT_RANGE={JOB_PORTS}-{JOB_PORTS + 48}" in log  # the trainer's worker groups take their ports there
    # not set by run.sh: verl 0.9.1 sets it for Megatron only; with FSDP2 it serialises compute and prefetch
    assert "CUDA_DEVICE_MAX_CONNECTIONS=unset" in log
    assert (tmp / "logs" / "darl-777-ray-gpu1.log").exists() and (tmp / "logs" / "darl-777-ray-gpu3.log").exists()


def test_job_dry_run_prints_the_plan_and_runs_nothing(slurm):
    tmp, _, job, script = slurm
    job["DRY_RUN"] = "1"
    p = subprocess.run(["bash", str(RUN_SH), str(script), "k=v"], env=job, capture_output=True, text=True, timeout=60, check=True)
    lines = p.stdout.splitlines()
    assert lines[0].startswith("+ srun --overlap --nodes=1 --ntasks=1 --nodelist=gpu1 ray start --head")
    assert sum(f"ray start --address=10.1.2.3:{RAY}" in x for x in lines) == 2
    assert lines[-1] == f"+ env RAY_ADDRESS=10.1.2.3:{RAY} bash {script} k=v"
    assert not any(x.startswith(("ray ", "bash")) for x in calls(tmp))  # only hostnames and the head's address were asked
    assert not (tmp / "logs" / "darl-777-restart1.log").exists()


def test_job_propagates_the_scripts_exit_status(slurm):
    _, _, job, script = slurm
    job["EXIT_CODE"] = "3"
    assert subprocess.run(["bash", str(RUN_SH), str(script)], env=job, capture_output=True, timeout=60).returncode == 3


def test_job_refuses_more_gpus_than_allocated(slurm):
    """A script that is not a D-ARL launch script: its needs from TRAINER_GPUS / ROLLOUT_GPUS, as before."""
    tmp, _, job, script = slurm
    job.update(TRAINER_GPUS="16", ROLLOUT_GPUS="16")  # 32 > 3 nodes x 8
    p = subprocess.run(["bash", str(RUN_SH), str(script)], env=job, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "needs 32 GPUs" in p.stderr and "job 777 has 3 node(s) x 8 GPUs = 24" in p.stderr
    assert not any(x.startswith(("ray start", "srun")) for x in calls(tmp))


def test_job_passes_cuda_device_max_connections_through_when_set(slurm):
    tmp, _, job, script = slurm
    job["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    subprocess.run(["bash", str(RUN_SH), str(script)], env=job, capture_output=True, timeout=60, check=True)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=8" in (tmp / "logs" / "darl-777-restart1.log").read_text()
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in RUN_SH.read_text().split("set -euo pipefail")[1].replace(
        "no CUDA_DEVICE_MAX_CONNECTIONS", "")


# --------------------------------------------------------------------------- the GPU check: script needs vs. allocation

FOUR_B = "shells/one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh"  # trainer 2 + rollout 2
ONE_SEVEN_B = "shells/one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"  # 1 + 1
FULLY_ASYNC = "shells/fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"  # 1 + 1
V1 = "shells/v1_separate_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"  # 1 + 1, rollout under actor_rollout_ref


def _submit(env, script, *args, **extra):
    env = dict(env, **extra)
    return subprocess.run(["bash", str(RUN_SH), script, *args], env=env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)


def test_submit_asks_for_the_scripts_layout(slurm):
    """Without GPU flags in SBATCH_ARGS the request follows the script (2 + 2: one node of 4 GPUs), over the #SBATCH
    line's 2; with --nodes given, the GPUs per node for that many nodes."""
    tmp, env, _, _ = slurm
    assert _submit(env, FOUR_B).returncode == 0
    assert _submit(env, FOUR_B, SBATCH_ARGS="--nodes=2").returncode == 0
    first, second = calls(tmp)
    assert " --nodes=1 --gpus-per-node=4 " in first
    assert " --gpus-per-node=2 --nodes=2 " in second and "--nodes=1" not in second


def test_submit_refuses_the_4b_script_on_fewer_gpus_asked_for(slurm):
    """SBATCH_ARGS' own --gpus-per-node=2 (1 node) cannot hold 2 + 2: refused before sbatch, saying what and why."""
    tmp, env, _, _ = slurm
    p = _submit(env, FOUR_B, SBATCH_ARGS="--gpus-per-node=2")
    assert p.returncode == 1 and not calls(tmp) and not (tmp / "logs").exists()
    msg = p.stderr
    assert FOUR_B in msg and "needs 4 GPUs: trainer 1 node(s) x 2 + rollout 1 node(s) x 2" in msg
    assert "the job asks for (#SBATCH lines, SBATCH_ARGS) 1 node(s) x 2 GPUs = 2" in msg
    assert p.stdout == ""  # no sbatch command printed either
    # the same under DRY_RUN: refused, nothing printed
    p = _submit(env, FOUR_B, DRY_RUN="1", SBATCH_ARGS="--gpus-per-node=2")
    assert p.returncode == 1 and p.stdout == ""


@pytest.mark.parametrize("sbatch_args", ["--nodes=2", "-N 2", "-N2", "--nodes=2-4", "--gpus-per-node=4",
                                         "--gres=gpu:4", "--gres=gpu:a100:4", "--gpus=4", "-G 4",
                                         "--partition=gpu --gpus-per-node=8 --account=x"])
def test_submit_accepts_an_allocation_that_holds_the_script(slurm, sbatch_args):
    tmp, env, _, _ = slurm
    p = _submit(env, FOUR_B, "trainer.total_epochs=1", SBATCH_ARGS=sbatch_args)
    assert p.returncode == 0, p.stderr
    (call,) = calls(tmp)
    assert call.startswith("sbatch ") and sbatch_args in call and call.endswith("trainer.total_epochs=1")


@pytest.mark.parametrize("sbatch_args, extra, args, needs", [
    ("--gpus=3", {}, [], "needs 4 GPUs"),
    ("--gres=gpu:3", {}, [], "needs 4 GPUs"),
    # 4 + 1 = 5 of 2 x 3 = 6 GPUs, but the trainer's 4 must be on one node (verl's STRICT_PACK placement group)
    ("--nodes=2 --gpus-per-node=3", {"TRAINER_GPUS": "4", "ROLLOUT_GPUS": "1"}, [], "needs 5 GPUs"),
    # overrides on the command line count, as the script would pass them to Hydra (the last one wins)
    ("--gpus-per-node=4", {}, ["trainer.n_gpus_per_node=1", "trainer.n_gpus_per_node=3"], "needs 5 GPUs"),
    ("--gpus-per-node=4", {"ROLLOUT_NNODES": "2"}, [], "needs 6 GPUs"),
])
def test_submit_refuses_what_the_allocation_cannot_hold(slurm, sbatch_args, extra, args, needs):
    tmp, env, _, _ = slurm
    p = _submit(env, FOUR_B, *args, SBATCH_ARGS=sbatch_args, **extra)
    assert p.returncode == 1 and needs in p.stderr and not calls(tmp)


def test_submit_checks_the_fully_async_scripts_and_can_be_skipped(slurm):
    tmp, env, _, _ = slurm
    assert _submit(env, FULLY_ASYNC).returncode == 0  # 1 + 1 on the default 1 x 2
    p = _submit(env, FULLY_ASYNC, TRAINER_GPUS="2", SBATCH_ARGS="--gpus-per-node=2")
    assert p.returncode == 1 and FULLY_ASYNC in p.stderr and "needs 3 GPUs" in p.stderr
    assert _submit(env, FULLY_ASYNC, TRAINER_GPUS="2", GPU_CHECK="0", SBATCH_ARGS="--gpus-per-node=2").returncode == 0
    assert len(calls(tmp)) == 2


def test_submit_checks_the_v1_scripts(slurm):
    tmp, env, _, _ = slurm
    assert _submit(env, V1).returncode == 0  # 1 + 1 on the default 1 x 2
    p = _submit(env, V1, ROLLOUT_GPUS="2", SBATCH_ARGS="--gpus-per-node=2")
    assert p.returncode == 1 and "needs 3 GPUs: trainer 1 node(s) x 1 + rollout 1 node(s) x 2" in p.stderr
    assert len(calls(tmp)) == 1


def test_submit_refuses_a_missing_script(slurm):
    tmp, env, _, _ = slurm
    p = _submit(env, "shells/no_such_script.sh")
    assert p.returncode == 1 and "no_such_script.sh not found" in p.stderr and not calls(tmp)


def test_job_refuses_the_4b_script_on_too_few_gpus_before_ray(slurm):
    """Inside the job (sbatch run directly, or flags that did not hold): Slurm's nodes x GPUs, before any srun or ray."""
    tmp, _, job, _ = slurm
    job.update(SLURM_JOB_NODELIST="gpu1", SLURM_GPUS_ON_NODE="2")
    p = subprocess.run(["bash", str(RUN_SH), FOUR_B], env=job, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert FOUR_B in p.stderr and "needs 4 GPUs" in p.stderr and "job 777 has 1 node(s) x 2 GPUs = 2" in p.stderr
    assert calls(tmp) == ["scontrol show hostnames gpu1"]  # no srun, no ray, no launch
    assert not (tmp / "logs" / "darl-777-restart1.log").exists()


def test_job_accepts_the_4b_script_on_two_nodes(slurm):
    tmp, _, job, _ = slurm
    job.update(SLURM_JOB_NODELIST="gpu1,gpu2", SLURM_GPUS_ON_NODE="2", DRY_RUN="1")
    p = subprocess.run(["bash", str(RUN_SH), FOUR_B], env=job, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == f"+ env RAY_ADDRESS=10.1.2.3:{RAY} bash {FOUR_B}"


def test_usr1_before_the_time_limit_requeues(slurm):
    """A launch script with no child to forward USR1 to (it exec'd sleep): requeued at once, the script TERMed."""
    tmp, _, job, script = slurm
    job["SLEEP"] = "60"
    proc = subprocess.Popen(["bash", str(RUN_SH), str(script)], env=job, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run_log, deadline = tmp / "logs" / "darl-777-restart1.log", time.time() + 30
    while not (run_log.exists() and "ARGS:" in run_log.read_text()):  # the launch script is running
        assert time.time() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    proc.wait(timeout=30)
    assert "scontrol requeue 777" in calls(tmp)


# the trainer's driver as the launch script runs it: a python child that traps USR1, "saves", exits
DRIVER = """
import os, signal, sys, time
def note(msg):
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(msg + "\\n")
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
note(f"driver started {os.getpid()}")
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.05)
note("driver got USR1" if got else "driver timed out")
time.sleep(float(os.environ.get("SAVE_S", "1.5")))  # the rest of the step and the checkpoint
note("driver exits")
"""


def _driver_job(slurm, **extra):
    tmp, _, job, _ = slurm
    (tmp / "driver.py").write_text(DRIVER)
    launch = tmp / "launch.sh"
    launch.write_text(f'"{sys.executable}" "{tmp / "driver.py"}"\necho "launch script: driver exited with $?"\n')
    proc = subprocess.Popen(["bash", str(RUN_SH), str(launch)], env=dict(job, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not any(c.startswith("driver started") for c in calls(tmp)):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    pid = int(next(c for c in calls(tmp) if c.startswith("driver started")).split()[-1])
    proc.send_signal(signal.SIGUSR1)
    return tmp, proc, pid


def test_usr1_goes_to_the_driver_and_the_requeue_waits_for_the_script_to_exit(slurm):
    tmp, proc, _ = _driver_job(slurm)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    c = calls(tmp)
    assert c.index("driver got USR1") < c.index("driver exits") < c.index("scontrol requeue 777")
    assert c.count("scontrol requeue 777") == 1
    assert "USR1 forwarded to the driver; job 777 is requeued once" in stderr
    assert "launch script: driver exited with 0" in (tmp / "logs" / "darl-777-restart1.log").read_text()


def test_usr1_requeues_anyway_when_the_save_outlasts_stop_wait_s(slurm):
    tmp, proc, pid = _driver_job(slurm, STOP_WAIT_S="1", SAVE_S="30")
    try:
        proc.wait(timeout=30)  # run.sh has ended; the driver still "saves" (its output keeps the pipes open)
        c = calls(tmp)
        assert "driver got USR1" in c and "scontrol requeue 777" in c and "driver exits" not in c
    finally:
        os.kill(pid, signal.SIGKILL)  # Slurm's requeue would have ended it
    assert "still running 1 s after the USR1; requeueing anyway" in proc.communicate(timeout=30)[1]


def test_job_dry_run_composes_a_real_launch_script(slurm, tmp_path):
    """Inside a (stub) job: run.sh -> the pmis_sg script -> main_one_step_off with DARL_DRY_RUN=1, GPU counts from run.sh's env."""
    tmp, _, job, _ = slurm
    (tmp_path / "d").mkdir()
    env = base_env(tmp_path / "d")
    env.update({k: job[k] for k in ("PATH", "STUB_LOG", "LOG_DIR", "VENV", "RAY_HEAD_DELAY_S", "SLURM_JOB_ID",
                                    "SLURM_JOB_NAME", "SLURM_SUBMIT_DIR", "SLURM_GPUS_ON_NODE")})
    env.update(SLURM_JOB_NODELIST="gpu1", TRAINER_GPUS="4", ROLLOUT_GPUS="4")
    p = subprocess.run(["bash", str(RUN_SH), "shells/one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh",
                        "trainer.total_training_steps=3", f"hydra.run.dir={tmp_path}/hydra"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    cfg = parse_dry_run(Path(env["LOG_DIR"], "darl-777-restart0.log").read_text())
    assert cfg["trainer"]["n_gpus_per_node"] == 4 and cfg["rollout"]["n_gpus_per_node"] == 4
    assert cfg["trainer"]["total_training_steps"] == 3 and cfg["replay"]["enable"] is True
    assert cfg["trainer"]["resume_mode"] == "auto"
