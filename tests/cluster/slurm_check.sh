#!/usr/bin/env bash
# run.sh on a real Slurm: a one-node cluster on this host (Debian's slurm-wlm and munge; slurmctld and slurmd as
# root, proctrack/linuxproc, task/none, one partition), then `bash shells/run.sh <a CPU launch script>`: the job trains
# under sbatch with Ray started by srun; `bash shells/run.sh shells/eval.sh` evaluates its checkpoint as a job (a few
# packaged AIME24 problems, results in $LOG_DIR/eval/); a short time limit's signal saves at a step boundary; the
# requeued job resumes from that checkpoint with the buffer. `make slurm-check` (root; installs the packages when
# missing; not in make test).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/darl-slurm-check}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
log() { echo "[slurm-check] $*"; }
[[ "$(id -u)" == 0 ]] || { echo "slurm_check.sh: run as root (it starts slurmctld and slurmd)" >&2; exit 1; }
command -v slurmctld >/dev/null || { apt-get update -q && apt-get install -y -q slurm-wlm munge; }

# the cluster: this host, one partition
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 1024 ))"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$WORK"
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=darlcheck
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
JobRequeue=1
KillWait=30
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=check Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
pkill -x slurmctld || true; pkill -x slurmd || true; pkill -x munged || true; sleep 1
[[ -s /etc/munge/munge.key ]] || mungekey --create
mkdir -p /run/munge && chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged
slurmctld -c && slurmd -c
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed" && break; sleep 1; done
sinfo

# a job: run.sh submits itself, starts Ray with srun and runs the CPU script on the tests' transformers rollout (the
# CPU scripts' vLLM engine would double the time); its resources are logical, as the CPU scripts' own Ray cluster's
RAY="$(dirname "$PY")/ray"
export GPU_CHECK=0 CPUS_PER_NODE=32 GPUS_PER_NODE=4 RAY_HEAD_DELAY_S=5 ROLLOUT=hf LOG_DIR="$WORK/logs" PYTHON="$PY"
export PYTHONPATH="$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}" VERL_USE_EXTERNAL_MODULES=hf_rollout TEST_FREQ=-1
mkdir -p "$LOG_DIR"
submit() {  # submit NAME SBATCH_ARGS [VAR=VALUE...]: run.sh's job; prints its id
    local name="$1" args="$2"
    shift 2
    env "$@" SBATCH_ARGS="--gpus-per-node=0 --cpus-per-task=$CPUS --mem=8G --job-name=$name $args" \
        bash "$ROOT/shells/run.sh" shells/cpu/one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh replay.warmup=1 | sed -n 's/^Submitted batch job //p'
}
wait_done() {  # wait_done ID SECONDS: until Slurm forgets the job or it ends
    local deadline=$(( SECONDS + $2 )) state
    while (( SECONDS < deadline )); do
        state="$(squeue -h -j "$1" -o %T 2>/dev/null || true)"
        [[ -z "$state" ]] && return 0
        sleep 5
    done
    log "job $1 still $state after $2 s"; scancel "$1"; return 1
}
fail() { log "FAILED: $*"; exit 1; }
# a cancelled job can leave its Ray head's address file behind, which a later plain ray.init() would join
trap '"$RAY" stop --force >/dev/null 2>&1 || true; rm -f /tmp/ray/ray_current_cluster' EXIT

log "1. a job trains under sbatch, beside another Ray on the node that its end leaves running"
"$RAY" start --head --port=6390 --dashboard-port=6391 --num-cpus=1 --disable-usage-stats > "$WORK/bystander.log" 2>&1 \
    || fail "the bystander Ray did not start: $WORK/bystander.log"
rm -rf "$WORK/train"
id="$(submit darltrain "--time=00:15:00" OUT_DIR="$WORK/train" STEPS=4 SAVE_FREQ=2)"
wait_done "$id" 900 || fail "job $id"
run_log="$LOG_DIR/darltrain-$id-restart0.log"
grep -q "ray start --head" "$LOG_DIR/darltrain-$id.out" || fail "no Ray head started by srun in $LOG_DIR/darltrain-$id.out"
grep -q "\[darl\] step 4/4" "$run_log" || fail "no step 4 in $run_log"
grep -q "exited with status 0" "$LOG_DIR/darltrain-$id.out" || fail "the script failed: $LOG_DIR/darltrain-$id.out"
log "job $id trained 4 steps: $(grep -a -o '\[darl\] step 4/4.*' "$run_log" | head -1)"
"$RAY" status --address=127.0.0.1:6390 > /dev/null 2>&1 || fail "job $id stopped another Ray on its node"
raylets="$(pgrep -c -f 'ray/core/src/ray/raylet/raylet' || true)"
(( raylets == 1 )) || fail "job $id left its Ray running ($raylets raylets on the node, the bystander's included)"
log "job $id stopped its own Ray and left the bystander's running"
"$RAY" stop --force > /dev/null 2>&1 || true

log "2. the run's checkpoint is evaluated as a job (shells/eval.sh, no Ray), results beside the training logs"
ckpt="$WORK/train/checkpoints/global_step_4"
[[ -f "$ckpt/actor/fsdp_config.json" ]] || fail "no checkpoint $ckpt"
"$PY" -m recipe.darl.data.prepare --dataset aime24 --out "$WORK/data/aime24" --offline > /dev/null  # from the wheel
id="$(DATA_DIR="$WORK/data" SBATCH_ARGS="--gpus-per-node=0 --cpus-per-task=$CPUS --mem=8G --job-name=darleval --time=00:10:00" \
    bash "$ROOT/shells/run.sh" shells/eval.sh --model "$ckpt" --benchmarks aime24 --limit 2 --k 2 --max-new-tokens 16 \
    | sed -n 's/^Submitted batch job //p')"
wait_done "$id" 600 || fail "job $id"
[[ "$(scontrol show job "$id")" == *JobState=COMPLETED* ]] || fail "job $id did not complete: $LOG_DIR/darleval-$id.out"
out="$LOG_DIR/eval/train_global_step_4-$id"  # <experiment folder>_global_step_N
for f in results.md results.csv results.json generations.jsonl; do [[ -s "$out/$f" ]] || fail "no $out/$f"; done
grep -q '"kind": "verl-fsdp"' "$out/results.json" || fail "the checkpoint was not merged: $out/results.json"
grep -q "| AIME24 | 2 |" "$out/results.md" || fail "no AIME24 row of 2 problems in $out/results.md"
log "job $id evaluated $ckpt into $out: $(grep '| AIME24 |' "$out/results.md")"

log "3. a time limit's signal saves at a step boundary; the requeued job resumes with the buffer"
rm -rf "$WORK/requeue"
id="$(submit darlreq "--time=00:03:00 --signal=B:USR1@60" OUT_DIR="$WORK/requeue" STEPS=30 SAVE_FREQ=1000 STOP_WAIT_S=50)"
first="$LOG_DIR/darlreq-$id-restart0.log" second="$LOG_DIR/darlreq-$id-restart1.log"
deadline=$(( SECONDS + 900 ))  # Slurm holds a requeued job about two minutes before it starts again
until grep -qs "restored the replay buffer" "$second" || (( SECONDS > deadline )); do sleep 5; done
scancel "$id"  # each restart gets three minutes: the check ends with the first resume
grep -q "SIGUSR1: stop requested" "$first" || fail "no stop request in $first"
grep -q "requeueing job $id" "$LOG_DIR/darlreq-$id.out" || fail "no requeue in $LOG_DIR/darlreq-$id.out"
grep -q "Resuming from" "$second" && grep -q "restored the replay buffer" "$second" || fail "no resume with the buffer in $second"
log "job $id: $(grep -a -o 'Resuming from [^ ]*' "$second" | head -1), $(grep -a -o 'restored the replay buffer: [0-9]* groups' "$second" | head -1)"
log "passed"
