#!/usr/bin/env bash
#SBATCH --job-name=darl
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=32
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%j.out
#
# D-ARL on a Slurm cluster: one Ray cluster over the job's nodes, then one launch script.
#
#   bash shells/run.sh [SCRIPT] [hydra overrides...]      # submits itself with sbatch
#   SBATCH_ARGS="--nodes=2 --partition=gpu" bash shells/run.sh shells/one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh
#   bash shells/run.sh shells/fully_async_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh   # the fully-async trainer
#   TRAINER_GPUS=4 ROLLOUT_GPUS=4 bash shells/run.sh SCRIPT    # one node of 8 GPUs (sbatch: --nodes=1 --gpus-per-node=8)
#   bash shells/run.sh shells/eval.sh --model CKPT             # a checkpoint's evaluation, as a job
#   sbatch --nodes=2 shells/run.sh SCRIPT ...               # also works; submit from the repository root
# Every example run.sh is documented with: shells/examples.txt (each passes DRY_RUN=1 in tests/cluster).
#
# Run outside a job, the script calls `sbatch` on itself (creating the log folder first, which a plain
# `sbatch` needs to exist). Inside the job it loads the environment, starts the Ray head on the first
# node and a Ray worker on every other node (srun), waits until all of them joined, then runs SCRIPT on
# the first node with RAY_ADDRESS set, so verl joins that cluster. The #SBATCH lines above are
# defaults; flags given to sbatch (or in SBATCH_ARGS) override them. Submitted by run.sh, the job asks for the
# script's layout: the fewest nodes of NODE_GPUS GPUs that hold its trainer and rollout pools (--nodes), and the most
# GPUs one of them uses (--gpus-per-node), unless SBATCH_ARGS names the nodes or the GPUs itself.
#
# Preemption and time limits: --requeue lets Slurm put a preempted job back in the queue, and
# --signal=B:USR1@600 sends this script USR1 10 minutes before the time limit. run.sh then forwards USR1 to
# the trainer's driver (the python child of the launch script), which writes darl_stop_request in the checkpoint
# folder; the trainer saves a checkpoint at its next step boundary (fully-async: its next weight sync) whatever
# trainer.save_freq says, and exits. Once the launch script has exited, run.sh calls `scontrol requeue` (a requeue
# kills a running job, so it must come after the save). The step in progress plus the save must fit in those
# 600 s: if the script is still running STOP_WAIT_S after the signal, run.sh requeues anyway and the job resumes
# from the last periodic checkpoint. A preempted job gets no USR1 and also resumes from the last periodic one.
# The launch scripts use trainer.resume_mode=auto with a checkpoint folder that does not depend on the job id
# ($CKPT_ROOT/$PROJECT_NAME/$EXPERIMENT_NAME), so the requeued job resumes from the latest checkpoint
# (D-ARL's replay buffer is saved with it). Keep EXPERIMENT_NAME distinct per run. To stop a run by hand at its
# next step boundary, with a checkpoint: `touch <checkpoint dir>/darl_stop_request` or `kill -USR1 <driver pid>`
# (no requeue then).
#
# Variables (environment; defaults in brackets):
#   SCRIPT         launch script to run; the first argument wins if it ends in .sh
#                  [shells/one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh]
#   SBATCH_ARGS    extra sbatch flags when submitting, e.g. "--nodes=2 --partition=gpu --account=x" []
#   DRY_RUN        1: print what would run (the sbatch command; inside a job the srun/ray commands and
#                  the launch command) and exit [0]
#   DARL_ROOT      repository root [the folder above this script; inside a job: $SLURM_SUBMIT_DIR]
#   LOG_DIR        logs: Slurm's <job>-<id>.out, Ray's per node, the run's per restart [$DARL_ROOT/logs]
#   MODULES        environment modules to load, e.g. "cuda/13.0 nccl" (torch 2.11 is built for CUDA 13) []
#   CONDA_SH       conda's profile script [$(conda info --base)/etc/profile.d/conda.sh when conda exists]
#   CONDA_ENV      conda environment (name or path) to activate []
#   VENV           virtualenv folder to activate (bin/activate), "none" for none [when CONDA_ENV is unset: for a
#                  script that needs GPUs, $DARL_ROOT/.venv-gpu (`make install-gpu`) if it exists, else none; for
#                  another, $DARL_ROOT/.venv (`make install`, the CPU stack) if it exists]. A script that needs GPUs
#                  stops before Ray when the environment's torch cannot use CUDA, naming the python it found
#   PYTHON         interpreter for the launch script [python3]
#   GPUS_PER_NODE  GPUs Ray may use on each node [$SLURM_GPUS_ON_NODE, else nvidia-smi's count]
#   NODE_GPUS      GPUs of one of the cluster's nodes, for the request run.sh derives from the script [8]
#   CPUS_PER_NODE  CPUs Ray may use on each node [$SLURM_CPUS_PER_TASK, else nproc]
#   RAY_PORT       Ray head port [a port of the job's own range, below]
#   DARL_PORT_RANGE  torch.distributed ports of the job's worker groups, LO-HI [a 48-port slot of 20000-31999 chosen
#                  by the job id; the Ray head's ports follow it, so two jobs on one node do not collide]
#   RAY_HEAD_IP    the head's address [the first node's first IP address]
#   RAY_WAIT_S     seconds to wait for all Ray nodes [300]
#   RAY_HEAD_DELAY_S  seconds between starting the head and the workers [10]
#   GPU_CHECK      0: skip the GPU check below and the CUDA check of the environment [1]
#   STOP_WAIT_S    seconds to wait, after the USR1, for the trainer to save and exit before requeueing anyway;
#                  keep it under --signal's lead time [540]
#   NCCL_DEBUG [WARN]   NCCL_SOCKET_IFNAME / NCCL_IB_HCA / NCCL_IB_DISABLE / GLOO_SOCKET_IFNAME [unset:
#   NCCL's own choice]   TOKENIZERS_PARALLELISM [false]   VLLM_USE_V1 [1]   RAY_DEDUP_LOGS [0]
#   HF_HOME, HF_HUB_OFFLINE (1 on nodes without internet: the model from HF_HOME's cache, prepared with
#   `python -m recipe.darl.data.prepare --model ...` on a login node), WANDB_API_KEY, WANDB_MODE,
#   CUDA_DEVICE_MAX_CONNECTIONS: passed through as set (run.sh does not
#   set CUDA_DEVICE_MAX_CONNECTIONS: verl 0.9.1 sets it for Megatron only; with FSDP2, 1 serialises compute
#   and prefetch, verl PR #6976)
#   The launch scripts' own variables (MODEL_PATH, DATA_DIR, TRAINER_GPUS, ROLLOUT_GPUS, NNODES,
#   ROLLOUT_NNODES, EXPERIMENT_NAME, PROJECT_NAME, LOGGER, CKPT_ROOT, ...; see shells/common.sh) pass
#   through to SCRIPT.
#
# GPU check, before sbatch and again in the job before Ray starts: SCRIPT's GPU needs are read from the
# command it would run (DARL_PRINT_CMD=1: trainer.nnodes x trainer.n_gpus_per_node and rollout.nnodes x
# rollout.n_gpus_per_node, after the environment and the overrides given here); for a script that is not a
# D-ARL launch script, from NNODES*TRAINER_GPUS + ROLLOUT_NNODES*ROLLOUT_GPUS when those are set. verl puts
# each node's share of a pool on one node (a STRICT_PACK placement group), so the shares must pack into the
# job's nodes x GPUs per node: at submission from SBATCH_ARGS and the #SBATCH lines above (--nodes,
# --gpus-per-node, --gres=gpu:N, --gpus), in the job from Slurm's node list and GPUS_PER_NODE.
# A job that cannot hold them is refused with what the script needs and what the job has.
# shells/eval.sh (recipe.darl.eval) needs EVAL_GPUS GPUs [1] on one node and runs without Ray.
set -euo pipefail

DRY_RUN="${DRY_RUN:-0}"
DEFAULT_SCRIPT="shells/one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"

exec 3>&1  # commands are printed here (stdout), whatever their own output is redirected to
log() { echo "[run.sh $(date '+%F %T')] $*" >&2; }
print_cmd() { { printf '+'; printf ' %q' "$@"; printf '\n'; } >&3; }
show() {  # print a command; run it unless DRY_RUN
    print_cmd "$@"
    if [[ "$DRY_RUN" == 1 ]]; then return 0; fi
    "$@"
}

if [[ $# -gt 0 && "$1" == *.sh ]]; then
    SCRIPT="$1"
    shift
fi
SCRIPT="${SCRIPT:-$DEFAULT_SCRIPT}"

# ---------------------------------------------------------------- GPU needs and the allocation
NEEDS=()  # trainer nodes, trainer GPUs per node, rollout nodes, rollout GPUs per node (empty: unknown)
NEEDS_FROM=""
last_value() {  # last_value KEY WORDS...: the last KEY=value (also +KEY, ++KEY) among WORDS, as Hydra takes it
    local key="$1" w v=""
    shift
    for w in "$@"; do
        w="${w#++}"
        w="${w#+}"
        if [[ "$w" == "$key="* ]]; then v="${w#"$key="}"; fi
    done
    printf '%s' "$v"
}
script_gpu_needs() {  # script_gpu_needs SCRIPT_FILE [overrides...]: fills NEEDS and NEEDS_FROM
    local file="$1" out tn tg rn rg
    shift
    NEEDS=() SCRIPT_KIND=train
    if grep -qs 'recipe\.darl\.eval' "$file"; then  # an evaluation (shells/eval.sh): one node, no Ray
        tn=1 tg="${EVAL_GPUS:-1}" rn=0 rg=0 SCRIPT_KIND=eval
        NEEDS_FROM="EVAL_GPUS"
    elif grep -qsE '(^|[^_[:alnum:]])darl_(setup|script) ' "$file"; then  # a GPU launch script (shells/common.sh)
        if ! out="$(DARL_PRINT_CMD=1 DRY_RUN=0 bash "$file" "$@" 2>/dev/null)"; then
            log "warning: $SCRIPT failed to print its command (DARL_PRINT_CMD=1); its GPU needs are not checked"
            return 0
        fi
        local -a words
        read -r -a words <<< "$out"
        tn="$(last_value trainer.nnodes "${words[@]}")"
        tg="$(last_value trainer.n_gpus_per_node "${words[@]}")"
        rn="$(last_value rollout.nnodes "${words[@]}")"
        rg="$(last_value rollout.n_gpus_per_node "${words[@]}")"
        # verl's V1 scripts (recipe.darl.main_v1) name the rollout's own GPUs under actor_rollout_ref.rollout
        [[ -z "$rn" ]] && rn="$(last_value actor_rollout_ref.rollout.nnodes "${words[@]}")"
        [[ -z "$rg" ]] && rg="$(last_value actor_rollout_ref.rollout.n_gpus_per_node "${words[@]}")"
        NEEDS_FROM="the command it would run, DARL_PRINT_CMD=1"
    elif [[ -n "${TRAINER_GPUS:-}" && -n "${ROLLOUT_GPUS:-}" ]]; then
        tn="${NNODES:-1}" tg="$TRAINER_GPUS" rn="${ROLLOUT_NNODES:-1}" rg="$ROLLOUT_GPUS"
        NEEDS_FROM="NNODES, TRAINER_GPUS, ROLLOUT_NNODES, ROLLOUT_GPUS"
    else
        return 0
    fi
    local x
    for x in "$tn" "$tg" "$rn" "$rg"; do
        if ! [[ "$x" =~ ^[0-9]+$ ]]; then
            log "warning: could not read $SCRIPT's GPU needs from $NEEDS_FROM (got '$tn' '$tg' '$rn' '$rg'); not checked"
            return 0
        fi
    done
    NEEDS=("$tn" "$tg" "$rn" "$rg")
}
pools_fit() {  # pools_fit NODES GPUS_PER_NODE: NEEDS' per-node shares packed into the nodes (first fit, largest first)
    local nodes="$1" per="$2" i share placed
    local -a free=() shares=()
    for ((i = 0; i < nodes; i++)); do free+=("$per"); done
    for ((i = 0; i < NEEDS[0]; i++)); do shares+=("${NEEDS[1]}"); done
    for ((i = 0; i < NEEDS[2]; i++)); do shares+=("${NEEDS[3]}"); done
    (( ${#shares[@]} )) || return 0
    mapfile -t shares < <(printf '%s\n' "${shares[@]}" | sort -rn)
    for share in "${shares[@]}"; do
        placed=0
        for ((i = 0; i < nodes; i++)); do
            if (( free[i] >= share )); then free[i]=$(( free[i] - share )); placed=1; break; fi
        done
        (( placed )) || return 1
    done
}
layout_request() {  # layout_request [NODES]: REQ_NODES x REQ_PER_NODE, the fewest nodes (NODES when given) of at most
    # NODE_GPUS GPUs that hold NEEDS, each with as few GPUs as it can; both empty when none does
    local max="${NODE_GPUS:-8}" n p last
    REQ_NODES="" REQ_PER_NODE=""
    (( ${#NEEDS[@]} )) || return 0
    last="${1:-$(( NEEDS[0] + NEEDS[2] > 1 ? NEEDS[0] + NEEDS[2] : 1 ))}"
    for ((n = ${1:-1}; n <= last; n++)); do
        for ((p = 1; p <= max; p++)); do
            if pools_fit "$n" "$p"; then REQ_NODES=$n REQ_PER_NODE=$p; return 0; fi
        done
    done
}
check_gpus() {  # check_gpus NODES GPUS_PER_NODE TOTAL_GPUS WHO: exits 1 when SCRIPT's needs do not fit
    local nodes="$1" per="$2" total="$3" who="$4"
    [[ "${GPU_CHECK:-1}" == 0 || ${#NEEDS[@]} -eq 0 ]] && return 0
    local need=$(( NEEDS[0] * NEEDS[1] + NEEDS[2] * NEEDS[3] ))
    local have ok=1 x
    for x in "$nodes" "$per" "$total"; do
        if [[ -n "$x" && ! "$x" =~ ^[0-9]+$ ]]; then
            log "warning: could not read what $who ('$nodes' nodes, '$per' GPUs per node, '$total' GPUs); $SCRIPT's GPUs not checked"
            return 0
        fi
    done
    if [[ -n "$per" ]]; then
        have="$nodes node(s) x $per GPUs = $(( nodes * per ))"
        pools_fit "$nodes" "$per" || ok=0
    elif [[ -n "$total" ]]; then
        have="$total GPUs in all (--gpus)"
        (( need <= total )) || ok=0
    else
        log "warning: not known how many GPUs $who per node; $SCRIPT's $need GPUs not checked"
        return 0
    fi
    if (( ! ok )); then
        log "error: $SCRIPT needs $need GPUs: trainer ${NEEDS[0]} node(s) x ${NEEDS[1]} + rollout ${NEEDS[2]} node(s) x ${NEEDS[3]}" \
            "(from $NEEDS_FROM), but $who $have; verl places each node's share of a pool on one node." \
            "Ask for more (e.g. SBATCH_ARGS=\"--nodes=2\" or \"--gpus-per-node=4\") or lower" \
            "NNODES/TRAINER_GPUS/ROLLOUT_NNODES/ROLLOUT_GPUS; GPU_CHECK=0 skips this check"
        exit 1
    fi
}
sbatch_allocation() {  # sbatch_allocation FLAGS...: ALLOC_NODES, ALLOC_PER_NODE, ALLOC_TOTAL from sbatch flags
    local a next="" v
    for a in "$@"; do
        if [[ -n "$next" ]]; then a="$next=$a"; next=""; fi
        case "$a" in
            --nodes|-N|--gpus-per-node|--gres|--gpus|-G) next="$a"; continue ;;
            -N[0-9]*) a="--nodes=${a#-N}" ;;
            -G[0-9]*) a="--gpus=${a#-G}" ;;
        esac
        case "$a" in
            --nodes=*|-N=*) v="${a#*=}"; ALLOC_NODES="${v%%[-:]*}" ;;  # a range: its minimum
            --gpus-per-node=*) v="${a#*=}"; ALLOC_PER_NODE="${v##*:}" ALLOC_TOTAL="" ;;  # [type:]count
            --gres=*) v="${a#*=}"
                if [[ ",$v" =~ ,gpu(:[A-Za-z0-9_.-]+)?:([0-9]+)(\(|,|$) ]]; then ALLOC_PER_NODE="${BASH_REMATCH[2]}" ALLOC_TOTAL=""
                elif [[ ",$v," == *,gpu,* ]]; then ALLOC_PER_NODE=1 ALLOC_TOTAL=""; fi ;;
            --gpus=*|-G=*) v="${a#*=}"; ALLOC_TOTAL="${v##*:}" ALLOC_PER_NODE="" ;;  # GPUs of the whole job
        esac
    done
}

# ---------------------------------------------------------------- outside a job: submit
if [[ -z "${SLURM_JOB_ID:-}" ]]; then
    DARL_ROOT="${DARL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
    LOG_DIR="${LOG_DIR:-$DARL_ROOT/logs}"
    read -r -a extra <<< "${SBATCH_ARGS:-}"
    script_file="$SCRIPT"
    [[ -f "$script_file" ]] || script_file="$DARL_ROOT/$SCRIPT"
    if [[ ! -f "$script_file" ]]; then
        log "error: launch script $SCRIPT not found (relative to $PWD or $DARL_ROOT)"
        exit 1
    fi
    script_gpu_needs "$script_file" "$@"
    # the script's layout as the request (--nodes, --gpus-per-node), where SBATCH_ARGS names no GPUs (and no nodes)
    ALLOC_NODES="" ALLOC_PER_NODE="" ALLOC_TOTAL=""
    sbatch_allocation "${extra[@]}"
    layout=()
    if [[ -z "$ALLOC_PER_NODE$ALLOC_TOTAL" ]]; then
        layout_request "$ALLOC_NODES"
        if [[ -n "$REQ_NODES" ]]; then
            [[ -n "$ALLOC_NODES" ]] || layout+=("--nodes=$REQ_NODES")
            layout+=("--gpus-per-node=$REQ_PER_NODE")
        fi
    fi
    # the allocation asked for: the #SBATCH lines of this file, the layout, SBATCH_ARGS (sbatch: the last flag wins)
    mapfile -t header < <(sed -n 's/^#SBATCH[[:space:]]\{1,\}//p' "${BASH_SOURCE[0]}")
    ALLOC_NODES=1 ALLOC_PER_NODE="" ALLOC_TOTAL=""
    sbatch_allocation "${header[@]}" "${layout[@]}" "${extra[@]}"
    check_gpus "$ALLOC_NODES" "$ALLOC_PER_NODE" "$ALLOC_TOTAL" "the job asks for (#SBATCH lines, SBATCH_ARGS)"
    [[ "$DRY_RUN" == 1 ]] || mkdir -p "$LOG_DIR"
    show sbatch --chdir="$DARL_ROOT" --output="$LOG_DIR/%x-%j.out" \
        --export="ALL,DARL_ROOT=$DARL_ROOT,LOG_DIR=$LOG_DIR,SCRIPT=$SCRIPT" \
        "${layout[@]}" "${extra[@]}" "$DARL_ROOT/shells/run.sh" "$@"
    exit 0
fi

# ---------------------------------------------------------------- inside the job
DARL_ROOT="${DARL_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
cd "$DARL_ROOT"
LOG_DIR="${LOG_DIR:-$DARL_ROOT/logs}"
mkdir -p "$LOG_DIR"
JOB_TAG="${SLURM_JOB_NAME:-darl}-${SLURM_JOB_ID}"
RESTART="${SLURM_RESTART_COUNT:-0}"
log "job $SLURM_JOB_ID (restart $RESTART) in $DARL_ROOT, script $SCRIPT"

# environment: modules, conda, virtualenv (the GPU stack for a script that needs GPUs)
script_gpu_needs "$SCRIPT" "$@"
GPUS_NEEDED=0
(( ${#NEEDS[@]} )) && GPUS_NEEDED=$(( NEEDS[0] * NEEDS[1] + NEEDS[2] * NEEDS[3] ))
if [[ -n "${MODULES:-}" ]]; then
    for m in $MODULES; do module load "$m"; done
fi
if [[ -n "${CONDA_ENV:-}" ]]; then
    if [[ -z "${CONDA_SH:-}" ]] && command -v conda >/dev/null 2>&1; then
        CONDA_SH="$(conda info --base)/etc/profile.d/conda.sh"
    fi
    # shellcheck disable=SC1090
    source "${CONDA_SH:?set CONDA_SH to conda.sh}"
    conda activate "$CONDA_ENV"
fi
VENV="${VENV:-}"
if [[ -z "$VENV" && -z "${CONDA_ENV:-}" ]]; then
    if (( GPUS_NEEDED > 0 )); then
        VENV=none
        [[ -f "$DARL_ROOT/.venv-gpu/bin/activate" ]] && VENV="$DARL_ROOT/.venv-gpu"
    elif [[ -f "$DARL_ROOT/.venv/bin/activate" ]]; then
        VENV="$DARL_ROOT/.venv"
    fi
fi
if [[ -n "$VENV" && "$VENV" != none ]]; then
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi
export PYTHON="${PYTHON:-python3}"
log "environment: $(command -v "$PYTHON" || echo "$PYTHON (not found)") (VENV=${VENV:-none}, CONDA_ENV=${CONDA_ENV:-none})" \
    "for $GPUS_NEEDED GPU(s)${HF_HUB_OFFLINE:+, HF_HUB_OFFLINE=$HF_HUB_OFFLINE}"
export PYTHONPATH="$DARL_ROOT${PYTHONPATH:+:$PYTHONPATH}"

# CUDA / NCCL / libraries (no CUDA_DEVICE_MAX_CONNECTIONS: see the variables above)
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
export VLLM_USE_V1="${VLLM_USE_V1:-1}"
export RAY_DEDUP_LOGS="${RAY_DEDUP_LOGS:-0}"
for v in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE GLOO_SOCKET_IFNAME; do
    if [[ -n "${!v:-}" ]]; then export "${v?}"; fi
done

# nodes and resources
mapfile -t NODES < <(scontrol show hostnames "${SLURM_JOB_NODELIST:?}")
HEAD="${NODES[0]}"
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
    if [[ -n "${SLURM_GPUS_ON_NODE:-}" ]]; then
        GPUS_PER_NODE="$SLURM_GPUS_ON_NODE"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        GPUS_PER_NODE="$(nvidia-smi -L | grep -c '^GPU')"
    else
        GPUS_PER_NODE=0
    fi
fi
check_gpus "${#NODES[@]}" "$GPUS_PER_NODE" "" "job $SLURM_JOB_ID has"
# the environment's torch can use CUDA (recipe/darl/checks/preflight.py), before Ray and the launch start (not for a
# config dry run, DARL_DRY_RUN=1)
if (( GPUS_NEEDED > 0 )) && [[ "${GPU_CHECK:-1}" != 0 && -z "${DARL_DRY_RUN:-}" ]]; then
    if ! "$PYTHON" -m recipe.darl.checks.preflight --gpus "$GPUS_NEEDED"; then
        if [[ "$DRY_RUN" != 1 ]]; then exit 1; fi
        log "warning (DRY_RUN): the job would stop here"
    fi
    export DARL_GPU_ENV_CHECKED=1  # the launch script's own check (shells/common.sh) is then skipped
fi
if [[ "$SCRIPT_KIND" == eval ]]; then  # an evaluation: no Ray, the script on this node; its output also to a log
    RUN_LOG="$LOG_DIR/$JOB_TAG-restart$RESTART.log"
    log "running $SCRIPT $*; log $RUN_LOG"
    print_cmd bash "$SCRIPT" "$@"
    [[ "$DRY_RUN" == 1 ]] && exit 0
    set +e
    bash "$SCRIPT" "$@" 2>&1 | tee -a "$RUN_LOG"
    exit "${PIPESTATUS[0]}"
fi
CPUS_PER_NODE="${CPUS_PER_NODE:-${SLURM_CPUS_PER_TASK:-$(nproc)}}"
# the job's own ports, below the kernel's ephemeral range: 48 for torch.distributed, then the Ray head's
JOB_PORTS=$(( 20000 + (SLURM_JOB_ID % 187) * 64 ))
export DARL_PORT_RANGE="${DARL_PORT_RANGE:-$JOB_PORTS-$(( JOB_PORTS + 48 ))}"
RAY_PORT="${RAY_PORT:-$(( JOB_PORTS + 48 ))}"
if [[ -z "${RAY_HEAD_IP:-}" ]]; then
    RAY_HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 --nodelist="$HEAD" hostname --ip-address | awk '{print $1}')"
fi
export RAY_ADDRESS="$RAY_HEAD_IP:$RAY_PORT"
log "nodes: ${NODES[*]} (head $HEAD at $RAY_ADDRESS), $GPUS_PER_NODE GPU and $CPUS_PER_NODE CPU per node"

RAY_PIDS=()
cleanup() {
    [[ "$DRY_RUN" == 1 ]] && return 0
    # this job's Ray only: srun passes SIGTERM to each node's `ray start --block`, which stops the processes it
    # started (a `ray stop` would stop every Ray of this user on the node, another job's included)
    for pid in "${RAY_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    local deadline=$(( SECONDS + ${RAY_STOP_WAIT_S:-30} ))
    for pid in "${RAY_PIDS[@]}"; do
        while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}
REQUEUE=0 STOP_DEADLINE=0
on_usr1() {  # --signal=B:USR1@600: the time limit is near
    if [[ -n "${TRAIN_PID:-}" ]] && pkill -USR1 -P "$TRAIN_PID"; then
        # the driver (child of the launch script) asks the trainer to save at its next step boundary and exit;
        # the requeue waits for that (the end of this script), since requeueing a running job kills it
        REQUEUE=1 STOP_DEADLINE=$(( SECONDS + ${STOP_WAIT_S:-540} ))
        log "time limit near: USR1 forwarded to the driver; job $SLURM_JOB_ID is requeued once $SCRIPT has exited"
    else  # nothing running that could save: requeue now (resume from the latest checkpoint)
        log "time limit near: requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID" || true
        [[ -n "${TRAIN_PID:-}" ]] && kill -TERM "$TRAIN_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap on_usr1 USR1

# Ray head on the first node, a worker on each other node
ray_common=(--num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" --dashboard-agent-listen-port=$(( JOB_PORTS + 49 )) --block)
start_bg() {  # start_bg LOGFILE CMD...: print CMD; unless DRY_RUN, run it in the background into LOGFILE
    local logfile="$1"
    shift
    print_cmd "$@"
    if [[ "$DRY_RUN" == 1 ]]; then return 0; fi
    "$@" > "$logfile" 2>&1 &
    RAY_PIDS+=($!)
}
start_bg "$LOG_DIR/$JOB_TAG-ray-$HEAD.log" srun --overlap --nodes=1 --ntasks=1 --nodelist="$HEAD" \
    ray start --head --node-ip-address="$RAY_HEAD_IP" --port="$RAY_PORT" --dashboard-host=0.0.0.0 \
    --dashboard-port=$(( JOB_PORTS + 50 )) --ray-client-server-port=$(( JOB_PORTS + 51 )) "${ray_common[@]}"
[[ "$DRY_RUN" == 1 ]] || sleep "${RAY_HEAD_DELAY_S:-10}"
for node in "${NODES[@]:1}"; do
    start_bg "$LOG_DIR/$JOB_TAG-ray-$node.log" srun --overlap --nodes=1 --ntasks=1 --nodelist="$node" \
        ray start --address="$RAY_ADDRESS" "${ray_common[@]}"
done

if [[ "$DRY_RUN" != 1 ]]; then
    deadline=$(( SECONDS + ${RAY_WAIT_S:-300} ))
    while :; do
        alive="$(ray status --address="$RAY_ADDRESS" 2>/dev/null | awk '/^Active:/{a=1;next} /^(Pending|Recent failures):/{a=0} a && /node_/{n++} END{print n+0}')"
        (( alive >= ${#NODES[@]} )) && break
        if (( SECONDS > deadline )); then
            log "error: only $alive of ${#NODES[@]} Ray nodes joined within ${RAY_WAIT_S:-300} s; see $LOG_DIR/$JOB_TAG-ray-*.log"
            exit 1
        fi
        sleep 5
    done
    log "Ray cluster up: $alive node(s)"
fi

# the launch script, on this (the first) node; its output also goes to a per-restart log
RUN_LOG="$LOG_DIR/$JOB_TAG-restart$RESTART.log"
log "running $SCRIPT $*; log $RUN_LOG"
if [[ "$DRY_RUN" == 1 ]]; then
    show env RAY_ADDRESS="$RAY_ADDRESS" bash "$SCRIPT" "$@"
    exit 0
fi
set +e
# tee is run.sh's child, not the launch script's: a USR1 goes to every child of the launch script (the driver)
exec 4> >(tee -a "$RUN_LOG")
bash "$SCRIPT" "$@" >&4 2>&4 &
TRAIN_PID=$!
exec 4>&-
wait "$TRAIN_PID"
status=$?
# a USR1 interrupts the wait; wait on for the script's shutdown (after a forwarded USR1, until STOP_DEADLINE)
while kill -0 "$TRAIN_PID" 2>/dev/null; do
    if (( REQUEUE && SECONDS >= STOP_DEADLINE )); then
        log "$SCRIPT still running ${STOP_WAIT_S:-540} s after the USR1; requeueing anyway (resume from the latest checkpoint)"
        break
    fi
    sleep 1
done
if ! kill -0 "$TRAIN_PID" 2>/dev/null; then
    wait "$TRAIN_PID"
    status=$?
    log "$SCRIPT exited with status $status"
fi
set -e
if (( REQUEUE )); then
    log "requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" || true
fi
exit "$status"
