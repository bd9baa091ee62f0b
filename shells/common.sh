# Shared part of the D-ARL launch scripts (sourced, not run). A script's body is `darl_script "${BASH_SOURCE[0]}" "$@"`:
# its file name says what runs,
#     <trainer>_grpo_<model>_<dataset>_fsdp2_<trainer GPUs>_<rollout GPUs>_replay_4_<configuration>.sh
# trainer: one_step_off | fully_async | v1_separate_async; model: 1.7b | 4b; dataset: gsm8k | math; configuration:
# async (preset naive), decoupled (preset decoupled), pmis_sg (preset darl_tokens_e2, D-ARL), pmis_sg_darts (the same
# with DARTS). The command is `python -m recipe.darl.main_<trainer>` with the common overrides below, then
# `preset=<name>` (PRESET, docs/config.md#configurations), then the command line's ("$@"; Hydra: the last value of a
# key wins, `+key=value` adds a key).
#
# Environment variables (all optional; defaults in brackets):
#   PYTHON            python interpreter [python3]
#   MODEL_PATH        HF model folder or hub id [Qwen/Qwen3-1.7B or Qwen/Qwen3-4B, from the script]
#   DATA_DIR          folder written by `python -m recipe.darl.data.prepare` [$HOME/data]
#   TRAIN_FILES       training parquet (a path, or a Hydra list "['a.parquet','b.parquet']")
#                     [gsm8k: $DATA_DIR/gsm8k/train.parquet; math: $DATA_DIR/math/train.parquet]
#   VAL_FILES         validation parquet(s) [gsm8k: $DATA_DIR/gsm8k/test.parquet; math: $DATA_DIR/math500/test.parquet]
#   NNODES            trainer nodes (trainer.nnodes) [1]
#   TRAINER_GPUS      trainer GPUs per node (trainer.n_gpus_per_node) [from the script's name, e.g. 1]
#   ROLLOUT_NNODES    rollout nodes (rollout.nnodes) [1]
#   ROLLOUT_GPUS      rollout GPUs per node (rollout.n_gpus_per_node) [from the script's name, e.g. 1]
#   ROLLOUT_TP        vLLM tensor parallel size per replica [1]
#   GPU_MEMORY_UTILIZATION  vLLM's share of each rollout GPU [0.8; verl's own tests use 0.6-0.8]. The weight
#                     sync's buffers (up to 3 x WEIGHT_SYNC_BUCKET_MB) live outside it on the same GPU (docs/performance.md, 'GPU memory')
#   WEIGHT_SYNC_BUCKET_MB  checkpoint_engine.update_weights_bucket_megabytes [1024; verl's default is 2048]
#   MAX_TOKENS_PER_GPU  actor.ppo_max_token_len_per_gpu, the tokens of one micro-batch (dynamic batch size);
#                     the log-prob passes take twice as many [1.7b: 24576; 4b: 16384; at least prompt + response]
#   TRAIN_BATCH_SIZE  prompts per step (data.train_batch_size) [128]
#   MINI_BATCH_SIZE   prompts per optimizer step (actor.ppo_mini_batch_size) [32]
#   N_RESPONSES       responses per prompt, the GRPO group (rollout.n) [8]
#   MAX_PROMPT_LENGTH / MAX_RESPONSE_LENGTH  tokens [gsm8k: 512 / 1024; math: 1024 / 3072]
#   LR                actor learning rate [1e-6]
#   TOTAL_EPOCHS      [gsm8k: 5; math: 3]
#   SAVE_FREQ / TEST_FREQ  steps between checkpoints / validations [20 / 10]
#   ENABLE_THINKING   Qwen3 chat template's enable_thinking (data.apply_chat_template_kwargs) [false]
#   PROJECT_NAME      trainer.project_name [darl]
#   EXPERIMENT_NAME   trainer.experiment_name [the script's file name without .sh, then _seed<SEED> when SEED is set]
#   SEED              the run's seed: data order (data.seed=SEED), rollout sampler and mini-batch shuffle
#                     (rollout.seed and actor.data_loader_seed = 42 + SEED) [unset: verl's defaults, 1 and 42]
#   LOGGER            trainer.logger, a Hydra list ['["console","tensorboard"]', plus "wandb" when WANDB_API_KEY
#                     is set or ~/.netrc has a key for api.wandb.ai (`wandb login`)]; e.g. '["console","wandb"]'.
#                     A logger with wandb and no wandb credentials is refused before Ray starts.
#                     tensorboard writes to $TENSORBOARD_DIR [verl: tensorboard_log/<project>/<experiment>]
#   CKPT_ROOT         checkpoints go to $CKPT_ROOT/$PROJECT_NAME/$EXPERIMENT_NAME [$HOME/checkpoints]
#   CKPT_DIR          or set that folder directly; it must stay the same across restarts for resume
#   RESUME_MODE       trainer.resume_mode: auto (latest checkpoint in CKPT_DIR, if any) | disable | resume_path [auto]
#   PRESET            the configuration (docs/config.md#configurations) [from the script's name; another one adds
#                     _<PRESET> to EXPERIMENT_NAME, so its checkpoints are its own]
#   DARL_DRY_RUN      1: print the resolved config and exit before Ray starts (no GPU needed)
#   DARL_PRINT_CMD    1: print the command instead of running it
#   GPU_CHECK         0: skip the check that the environment's torch can use CUDA, made before Ray starts [1]
#   HF_HUB_OFFLINE    1: nothing from the Hugging Face hub; the model must be in HF_HOME's cache (or MODEL_PATH a
#                     folder) and the data prepared (python -m recipe.darl.data.prepare --dataset all --model ...)

source "$(dirname "${BASH_SOURCE[0]}")/configuration.sh"

# True when wandb can log without asking: WANDB_API_KEY, a keyless WANDB_MODE (offline, disabled, dryrun), or a key
# for its host in the netrc file `wandb login` writes (the same test as recipe/darl/checks/preflight.py, which refuses
# a wandb logger without them).
darl_wandb_configured() {
    [[ -n "${WANDB_API_KEY:-}" ]] && return 0
    case "${WANDB_MODE:-}" in offline|disabled|dryrun) return 0 ;; esac
    local host="${WANDB_BASE_URL:-https://api.wandb.ai}"
    host="${host#*://}"
    host="${host%%[:/]*}"
    grep -Eqs "(^|[[:space:]])machine[[:space:]]+${host//./\\.}([[:space:]]|\$)" "${NETRC:-$HOME/.netrc}"
}

darl_setup() {
    local model="$1" dataset="$2" trainer_gpus="$3" rollout_gpus="$4"
    DARL_REPO_ROOT="${DARL_REPO_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
    PYTHON="${PYTHON:-python3}"
    DATA_DIR="${DATA_DIR:-$HOME/data}"
    case "$model" in
        1.7b) MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-1.7B}"; _max_tokens_per_gpu=24576 ;;
        4b)   MODEL_PATH="${MODEL_PATH:-Qwen/Qwen3-4B}";   _max_tokens_per_gpu=16384 ;;
        *) echo "darl_setup: unknown model '$model' (1.7b | 4b)" >&2; return 2 ;;
    esac
    case "$dataset" in
        gsm8k)
            TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/gsm8k/train.parquet}"
            VAL_FILES="${VAL_FILES:-$DATA_DIR/gsm8k/test.parquet}"
            MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-512}"
            MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-1024}"
            TOTAL_EPOCHS="${TOTAL_EPOCHS:-5}" ;;
        math)
            TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/math/train.parquet}"
            VAL_FILES="${VAL_FILES:-$DATA_DIR/math500/test.parquet}"
            MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-1024}"
            MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-3072}"
            TOTAL_EPOCHS="${TOTAL_EPOCHS:-3}" ;;
        *) echo "darl_setup: unknown dataset '$dataset' (gsm8k | math)" >&2; return 2 ;;
    esac
    NNODES="${NNODES:-1}"
    TRAINER_GPUS="${TRAINER_GPUS:-$trainer_gpus}"
    ROLLOUT_NNODES="${ROLLOUT_NNODES:-1}"
    ROLLOUT_GPUS="${ROLLOUT_GPUS:-$rollout_gpus}"
    ROLLOUT_TP="${ROLLOUT_TP:-1}"
    GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.8}"
    WEIGHT_SYNC_BUCKET_MB="${WEIGHT_SYNC_BUCKET_MB:-1024}"
    TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-128}"
    MINI_BATCH_SIZE="${MINI_BATCH_SIZE:-32}"
    N_RESPONSES="${N_RESPONSES:-8}"
    LR="${LR:-1e-6}"
    SAVE_FREQ="${SAVE_FREQ:-20}"
    TEST_FREQ="${TEST_FREQ:-10}"
    ENABLE_THINKING="${ENABLE_THINKING:-false}"
    PROJECT_NAME="${PROJECT_NAME:-darl}"
    # the name follows the layout that runs (the script's own unless TRAINER_GPUS, ROLLOUT_GPUS or the node counts
    # change it), so an automatic resume never takes another layout's checkpoints
    local stem layout="fsdp2_${TRAINER_GPUS}_${ROLLOUT_GPUS}"
    (( NNODES > 1 || ROLLOUT_NNODES > 1 )) && layout="fsdp2_${NNODES}x${TRAINER_GPUS}_${ROLLOUT_NNODES}x${ROLLOUT_GPUS}"
    stem="$(basename "$0" .sh)"
    stem="${stem/fsdp2_${trainer_gpus}_${rollout_gpus}_/${layout}_}"
    EXPERIMENT_NAME="${EXPERIMENT_NAME:-$stem$(darl_preset_suffix)${SEED:+_seed$SEED}}"
    if [[ -z "${LOGGER:-}" ]]; then
        if darl_wandb_configured; then LOGGER='["console","tensorboard","wandb"]'; else LOGGER='["console","tensorboard"]'; fi
    fi
    CKPT_ROOT="${CKPT_ROOT:-$HOME/checkpoints}"
    CKPT_DIR="${CKPT_DIR:-$CKPT_ROOT/$PROJECT_NAME/$EXPERIMENT_NAME}"
    RESUME_MODE="${RESUME_MODE:-auto}"
    _max_tokens_per_gpu="${MAX_TOKENS_PER_GPU:-$_max_tokens_per_gpu}"
    local seq_len=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
    (( _max_tokens_per_gpu < seq_len )) && _max_tokens_per_gpu=$seq_len
    _log_prob_tokens_per_gpu=$((2 * _max_tokens_per_gpu))

    DARL_COMMON_ARGS=(
        # data: parquet from recipe.darl.data.prepare; the reward: recipe.darl.rewards (math-verify, code tests)
        "data.train_files=$TRAIN_FILES"
        "data.val_files=$VAL_FILES"
        data.prompt_key=prompt
        "data.train_batch_size=$TRAIN_BATCH_SIZE"
        "data.max_prompt_length=$MAX_PROMPT_LENGTH"
        "data.max_response_length=$MAX_RESPONSE_LENGTH"
        data.filter_overlong_prompts=true
        data.truncation=error
        "+data.apply_chat_template_kwargs.enable_thinking=$ENABLE_THINKING"
        reward.custom_reward_function.path=pkg://recipe.darl.rewards
        reward.custom_reward_function.name=compute_score
        # GRPO, no KL (use_kl_loss=false, no reference model)
        algorithm.adv_estimator=grpo
        algorithm.use_kl_in_reward=false
        # model and FSDP2 actor
        "actor_rollout_ref.model.path=$MODEL_PATH"
        actor_rollout_ref.model.use_remove_padding=true
        actor_rollout_ref.model.enable_gradient_checkpointing=true
        actor_rollout_ref.actor.strategy=fsdp2
        actor_rollout_ref.actor.fsdp_config.strategy=fsdp2
        critic.strategy=fsdp2
        "actor_rollout_ref.actor.optim.lr=$LR"
        actor_rollout_ref.actor.optim.weight_decay=0.01
        "actor_rollout_ref.actor.ppo_mini_batch_size=$MINI_BATCH_SIZE"
        actor_rollout_ref.actor.use_dynamic_bsz=true
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$_max_tokens_per_gpu"
        actor_rollout_ref.actor.use_kl_loss=false
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.actor.loss_agg_mode=token-mean
        actor_rollout_ref.actor.clip_ratio_low=0.2
        actor_rollout_ref.actor.clip_ratio_high=0.2
        actor_rollout_ref.actor.fsdp_config.param_offload=false
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
        # vLLM rollout on its own GPUs (one-step-off: hybrid_engine=false)
        actor_rollout_ref.hybrid_engine=false
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.mode=async
        "actor_rollout_ref.rollout.n=$N_RESPONSES"
        "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
        "actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEMORY_UTILIZATION"
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=$WEIGHT_SYNC_BUCKET_MB"
        # sampling and the log-probs vLLM returns (D-ARL's behavior policy mu; version stamps come with them):
        # vLLM reports log_softmax(logits / T) of the full vocabulary, the distribution the trainer recomputes,
        # only with processed_logprobs (temperature applied) and no top-k/top-p truncation; checked on CPU with
        # verl's vLLM server to 1e-6 (tests/vllm) and asserted here by tests/cluster/test_shells_vllm_settings.py
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.top_p=1.0
        actor_rollout_ref.rollout.top_k=-1
        actor_rollout_ref.rollout.logprobs_mode=processed_logprobs
        actor_rollout_ref.rollout.calculate_log_probs=true
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$_log_prob_tokens_per_gpu"
        actor_rollout_ref.rollout.val_kwargs.do_sample=false
        actor_rollout_ref.rollout.val_kwargs.temperature=0
        actor_rollout_ref.rollout.val_kwargs.n=1
        # GPUs: trainer and rollout pools are separate
        "trainer.nnodes=$NNODES"
        "trainer.n_gpus_per_node=$TRAINER_GPUS"
        "rollout.nnodes=$ROLLOUT_NNODES"
        "rollout.n_gpus_per_node=$ROLLOUT_GPUS"
        # logging, validation, checkpoints and resume
        "trainer.logger=$LOGGER"
        "trainer.project_name=$PROJECT_NAME"
        "trainer.experiment_name=$EXPERIMENT_NAME"
        trainer.critic_warmup=0
        trainer.val_before_train=true
        "trainer.test_freq=$TEST_FREQ"
        "trainer.save_freq=$SAVE_FREQ"
        "trainer.total_epochs=$TOTAL_EPOCHS"
        "trainer.default_local_dir=$CKPT_DIR"
        "trainer.resume_mode=$RESUME_MODE"
        trainer.max_actor_ckpt_to_keep=3
        trainer.log_val_generations=5
    )
    if [[ -n "${SEED:-}" ]]; then
        [[ "$SEED" =~ ^[0-9]+$ ]] || { echo "common.sh: SEED must be a non-negative integer (got '$SEED')" >&2; return 1; }
        DARL_SEED_ARGS=("data.seed=$SEED" "actor_rollout_ref.rollout.seed=$((42 + SEED))"
                        "actor_rollout_ref.actor.data_loader_seed=$((42 + SEED))")
        DARL_COMMON_ARGS+=("${DARL_SEED_ARGS[@]}")
    fi
}

# a launch script's whole body: what its file name says (the header of this file)
darl_script() {
    local name re='^(one_step_off|fully_async|v1_separate_async)_grpo_([0-9.]+b)_([a-z0-9]+)_fsdp2_([0-9]+)_([0-9]+)_replay_4_([a-z_]+)$'
    name="$(basename "$1" .sh)"
    shift
    [[ "$name" =~ $re ]] || { echo "common.sh: '$name' is not <trainer>_grpo_<model>_<dataset>_fsdp2_<T>_<R>_replay_4_<configuration>" >&2; return 2; }
    local trainer="${BASH_REMATCH[1]}" model="${BASH_REMATCH[2]}" dataset="${BASH_REMATCH[3]}"
    local trainer_gpus="${BASH_REMATCH[4]}" rollout_gpus="${BASH_REMATCH[5]}"
    darl_configuration "${BASH_REMATCH[6]}" "$@" || return
    local a args=()
    for a in "$@"; do [[ "$a" == preset=* ]] || args+=("$a"); done
    if [[ "$trainer" == v1_separate_async ]]; then  # one mini-batch a step (darl_v1_run)
        TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-32}" MINI_BATCH_SIZE="${MINI_BATCH_SIZE:-${TRAIN_BATCH_SIZE:-32}}"
    fi
    darl_setup "$model" "$dataset" "$trainer_gpus" "$rollout_gpus" || return
    case "$trainer" in
        one_step_off) darl_run "${DARL_CONFIG_ARGS[@]}" "${args[@]}" ;;
        fully_async) darl_fully_async_run "${DARL_CONFIG_ARGS[@]}" "${args[@]}" ;;
        v1_separate_async) darl_v1_run "${DARL_CONFIG_ARGS[@]}" "${args[@]}" ;;
    esac
}

darl_run() {
    local cmd=("$PYTHON" -m "${DARL_MAIN:-recipe.darl.main_one_step_off}" "${DARL_COMMON_ARGS[@]}" "$@")
    if [[ -n "${DARL_PRINT_CMD:-}" && "${DARL_PRINT_CMD}" != 0 ]]; then
        printf '%q ' "${cmd[@]}"
        printf '\n'
        return 0
    fi
    # the recipe imports from the repository root, whatever the working directory
    export PYTHONPATH="$DARL_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
    # the environment's torch can use CUDA, before Ray starts (recipe/darl/checks/preflight.py; run.sh checked it
    # already when DARL_GPU_ENV_CHECKED is set; GPU_CHECK=0 skips it)
    if [[ -z "${DARL_DRY_RUN:-}" && -z "${DARL_GPU_ENV_CHECKED:-}" && "${GPU_CHECK:-1}" != 0 ]]; then
        "$PYTHON" -m recipe.darl.checks.preflight --gpus $(( NNODES * TRAINER_GPUS + ROLLOUT_NNODES * ROLLOUT_GPUS )) || return 1
    fi
    echo "[darl] $EXPERIMENT_NAME: trainer ${NNODES}x${TRAINER_GPUS} GPU, rollout ${ROLLOUT_NNODES}x${ROLLOUT_GPUS} GPU, checkpoints $CKPT_DIR" >&2
    "${cmd[@]}"
}

# verl's fully-async pipeline (recipe.darl.main_fully_async): a rollouter streams groups into verl's MessageQueue,
# each trainer step takes MINI_BATCH_SIZE * REQUIRE_BATCHES prompts, weights sync every SYNC_STEPS steps, and the
# rollouter may run STALENESS_THRESHOLD syncs' worth of samples ahead. Variables [defaults]:
#   REQUIRE_BATCHES [1]  SYNC_STEPS [4]  STALENESS_THRESHOLD [0.5; 0 with preset=sync]  PARTIAL_ROLLOUT [true; false with sync]
# At 0.5 (verl's recommended range, below 1) rollouts are at most about one version stale, where the preset did not
# separate from decoupled PPO on the CPU testbed; its gain was measured at STALENESS_THRESHOLD=4 (README).
#   TOTAL_ROLLOUT_PROMPTS prompts the rollouter generates in all [20000]
darl_fully_async_run() {
    DARL_MAIN=recipe.darl.main_fully_async darl_run \
        data.train_batch_size=0 \
        "rollout.total_rollout_steps=${TOTAL_ROLLOUT_PROMPTS:-20000}" \
        "rollout.n=$N_RESPONSES" \
        "async_training.require_batches=${REQUIRE_BATCHES:-1}" \
        "async_training.trigger_parameter_sync_step=${SYNC_STEPS:-4}" \
        $(darl_staleness_args 0.5) \
        "$@"
}

# verl's V1 trainer in separate_async mode (recipe.darl.main_v1): rollout on ROLLOUT_GPUS of its own, weights synced
# over NCCL after every step. verl 0.9.1's separate_async trains one mini-batch per local step, and D-ARL takes one
# replay step per weight sync (trainer.v1.separate_async.parameter_sync_step=1), so a step is one mini-batch: the V1
# scripts set TRAIN_BATCH_SIZE = MINI_BATCH_SIZE [32] before darl_setup. The trainer's workers also hold verl's
# hybrid rollout replicas (hybrid_engine=true: its false path fails in verl 0.9.1 before the first step).
darl_v1_run() {
    local args=() a
    for a in "${DARL_COMMON_ARGS[@]}"; do
        case "$a" in actor_rollout_ref.hybrid_engine=*|rollout.nnodes=*|rollout.n_gpus_per_node=*) ;; *) args+=("$a") ;; esac
    done
    DARL_COMMON_ARGS=("${args[@]}")
    DARL_MAIN=recipe.darl.main_v1 darl_run \
        trainer.v1.trainer_mode=separate_async \
        actor_rollout_ref.hybrid_engine=true \
        "actor_rollout_ref.rollout.nnodes=$ROLLOUT_NNODES" \
        "actor_rollout_ref.rollout.n_gpus_per_node=$ROLLOUT_GPUS" \
        actor_rollout_ref.rollout.checkpoint_engine.backend=nccl \
        "$@"
}
