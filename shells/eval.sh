#!/usr/bin/env bash
# A checkpoint's evaluation (python -m recipe.darl.eval), as a Slurm job beside training:
#   bash shells/run.sh shells/eval.sh --model ~/checkpoints/darl/<experiment>/global_step_100 --benchmarks all
#   bash shells/eval.sh --model CKPT ...                 # the same on this machine
# Arguments are recipe.darl.eval's (--model, --benchmarks, --data-dir, --k, ...). The results (results.md, .json,
# .csv, generations.jsonl) go where the training logs go, $LOG_DIR/eval/<name>[-<job id>], unless --out is given;
# <name> is the checkpoint's <experiment>_global_step_<N>, or the model folder's name. run.sh asks for EVAL_GPUS
# GPUs on one node and starts no Ray for it. Variables [defaults]:
#   PYTHON [python3]   DATA_DIR [$HOME/data]   LOG_DIR [the repository's logs/]
#   EVAL_GPUS  GPUs of the job and vLLM's tensor parallel size (--tensor-parallel-size) [1]
#   DARL_PRINT_CMD  1: print the command instead of running it
set -euo pipefail
DARL_REPO_ROOT="${DARL_REPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
PYTHON="${PYTHON:-python3}"
LOG_DIR="${LOG_DIR:-$DARL_REPO_ROOT/logs}"

model="" out=""
for ((i = 1; i <= $#; i++)); do
    case "${!i}" in
        --model) j=$((i + 1)); model="${!j:-}" ;;
        --model=*) model="${!i#--model=}" ;;
        --out|--out=*) out=given ;;
    esac
done
if [[ -z "$model" ]]; then
    echo "shells/eval.sh: --model CKPT is required (a verl checkpoint folder, a Hugging Face folder or hub id)" >&2
    exit 2
fi
args=(--data-dir "${DATA_DIR:-$HOME/data}" --tensor-parallel-size "${EVAL_GPUS:-1}")
if [[ -z "$out" ]]; then
    name="$(basename "${model%/}")"
    if [[ "$name" == global_step_* ]]; then  # the experiment's folder (the CPU scripts save under <experiment>/checkpoints)
        parent="$(dirname "${model%/}")"
        [[ "$(basename "$parent")" == checkpoints ]] && parent="$(dirname "$parent")"
        name="$(basename "$parent")_$name"
    fi
    args+=(--out "$LOG_DIR/eval/$name${SLURM_JOB_ID:+-$SLURM_JOB_ID}")
fi
cmd=("$PYTHON" -m recipe.darl.eval "${args[@]}" "$@")  # the command line's flags come last and win
if [[ -n "${DARL_PRINT_CMD:-}" && "$DARL_PRINT_CMD" != 0 ]]; then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    exit 0
fi
export PYTHONPATH="$DARL_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${cmd[@]}"
