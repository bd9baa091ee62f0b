# Sourced by the CPU studies after ROOT is set. Their archived runs used the test suite's transformers rollout
# (tests/hf_rollout, docs/cpu.md "The tests' transformers rollout"), so they keep it unless ROLLOUT=vllm is set.
export ROLLOUT="${ROLLOUT:-hf}"
if [[ "$ROLLOUT" == hf ]]; then
    export PYTHONPATH="$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}" VERL_USE_EXTERNAL_MODULES=hf_rollout
fi
