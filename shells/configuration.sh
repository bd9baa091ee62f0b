# The configuration part of every launch script, GPU and CPU (sourced by common.sh and cpu/common.sh): a script's name
# ends in its configuration, which names a preset (docs/config.md#configurations); PRESET or `preset=<name>` runs
# another one through the same script.

# _<PRESET> when PRESET names another configuration than the script's own (DARL_PRESET)
darl_preset_suffix() {
    [[ -n "${PRESET:-}" && "${PRESET}" != "${DARL_PRESET:-}" ]] && printf '_%s' "$PRESET"
    return 0
}

# the script's configuration from the last part of its name: DARL_PRESET, PRESET [DARL_PRESET], DARL_CONFIG_ARGS
darl_configuration() {
    DARL_CONFIG_ARGS=()
    case "$1" in
        async) DARL_PRESET=naive ;;
        decoupled) DARL_PRESET=decoupled ;;
        pmis_sg) DARL_PRESET=darl_tokens_e2 ;;
        pmis_sg_darts) DARL_PRESET=darl_tokens_e2; DARL_CONFIG_ARGS=(rollout_shaping.enable=true rollout_shaping.adaptive=true) ;;
        *) echo "common.sh: unknown configuration '$1' (async | decoupled | pmis_sg | pmis_sg_darts)" >&2; return 2 ;;
    esac
    PRESET="${PRESET:-$DARL_PRESET}"
    # a preset=<name> on the command line wins over PRESET (one value: Hydra refuses two)
    local a
    for a in "${@:2}"; do [[ "$a" == preset=* ]] && PRESET="${a#preset=}"; done
    DARL_CONFIG_ARGS=("preset=$PRESET" "${DARL_CONFIG_ARGS[@]}")
}

# the fully-async rollouter's staleness bound [the caller's default, $1] and partial rollout [true]; preset=sync holds
# them at 0 and false
darl_staleness_args() {
    local threshold="${STALENESS_THRESHOLD:-$1}" partial="${PARTIAL_ROLLOUT:-true}"
    if [[ "${PRESET:-}" == sync ]]; then threshold="${STALENESS_THRESHOLD:-0}" partial="${PARTIAL_ROLLOUT:-false}"; fi
    echo "async_training.staleness_threshold=$threshold"
    echo "async_training.partial_rollout=$partial"
}
