#!/usr/bin/env bash
# The first design's study (docs/evidence.md, dated section; method names as they are now: darl_v1 was "darl"): every table and figure there comes from it.
# Resumable: runs already in OUT/results.jsonl are skipped. About 2.5 hours with 2 jobs on 2 cores.
#   bash benchmarks/staleness/study_v1.sh [OUT]          (default runs/staleness)
#   STEPS=10 SEEDS=0 bash benchmarks/staleness/study_v1.sh runs/staleness-mini    # reduced: 1 seed, 10 steps
#   python -m benchmarks.staleness.run_study --report-only --out docs/evidence/v1  # figures from the committed results
set -euo pipefail
OUT="${1:-runs/staleness}"
STEPS="${STEPS:-50}"
SEEDS="${SEEDS:-0 1 2}"
JOBS="${JOBS:-2}"
export OMP_NUM_THREADS=1
# the shipped CPU scripts' optimizer settings: lr 5e-5, two mini-batches per step (shells/cpu/common.sh)
common=(--out "$OUT" --seeds $SEEDS --steps "$STEPS" --eval-every 10 --val-size 500 --lr 5e-5 --minibatches 2 --jobs "$JOBS")
study() { "${PYTHON:-python}" -m benchmarks.staleness.run_study "${common[@]}" "$@"; }

study --staleness 4 --methods naive decoupled darl_v1
study --staleness 1 --methods naive decoupled darl_v1
study --staleness 4 --methods darl_v1_k1 replay_uniform pmis_no_selection selection_no_pmis darl_v1_keep_zero_adv darl_v1_k2 darl_v1_k8
study --staleness 8 --methods naive decoupled darl_v1
study --staleness 2 --methods naive decoupled darl_v1
# added after the s = 4 ablations singled out the chi2 selection: selection with each group trained at
# most once, and replay with pmis weights but no selection at s = 1 (the one-step-off trainer's setting)
study --staleness 4 --methods darl_v1_max_reuse1
study --staleness 1 --methods pmis_no_selection
study --report-only
