#!/usr/bin/env bash
# A multi-node Ray cluster on this host, its head and worker raylets started as shells/run.sh starts them (ray start
# --head / ray start --address, logical CPUs and GPUs per node: two nodes for the trainer, one for the rollout), and
# the CPU one-step-off launch with trainer.nnodes=2 on it: the job must train, its two trainer ranks on two nodes.
#   bash tests/cluster/two_node_check.sh [OUT]        (make two-node-check; not part of make test; about 5 min)
# On one host the raylets need their own dashboard-agent ports (on separate hosts run.sh gives them all the same).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/outputs/two_node_check}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
RAY="$(dirname "$PY")/ray"
PORTS=$(( 20000 + RANDOM % 150 * 64 ))  # a slot as run.sh's: Ray head, dashboard, client server, agents
export RAY_ADDRESS="127.0.0.1:$(( PORTS + 48 ))" DARL_PORT_RANGE="$PORTS-$(( PORTS + 47 ))"
rm -rf "$OUT" && mkdir -p "$OUT"
stop() { "$RAY" stop --force > /dev/null 2>&1 || true; }
trap stop EXIT

# one logical GPU a node, as on a real cluster where a node's share of a pool fills the node: the trainer's two
# nodes (trainer.nnodes=2 x 1) and the rollout's own node; without that, Ray may pack both trainer ranks on one node
"$RAY" start --head --node-ip-address=127.0.0.1 --port=$(( PORTS + 48 )) --dashboard-port=$(( PORTS + 50 )) \
    --ray-client-server-port=$(( PORTS + 51 )) --dashboard-agent-listen-port=$(( PORTS + 49 )) --num-cpus=16 \
    --num-gpus=1 --disable-usage-stats > "$OUT/ray-head.log" 2>&1
for i in 1 2; do
    "$RAY" start --address="$RAY_ADDRESS" --dashboard-agent-listen-port=$(( PORTS + 52 + i )) --num-cpus=16 \
        --num-gpus=1 --disable-usage-stats > "$OUT/ray-worker$i.log" 2>&1
done
alive="$("$RAY" status --address="$RAY_ADDRESS" | awk '/^Active:/{a=1;next} /^(Pending|Recent failures):/{a=0} a && /node_/{n++} END{print n+0}')"
echo "[two-node] Ray cluster up: $alive node(s) at $RAY_ADDRESS"
(( alive == 3 ))

# two trainer ranks, one per node, and the rollout process on the third
OUT_DIR="$OUT/run" STEPS=3 TEST_FREQ=-1 SAVE_FREQ=-1 RESUME_MODE=disable TRAINER_RANKS=2 PYTHON="$PY" \
VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl" \
    bash "$ROOT/shells/cpu/one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh" \
    trainer.nnodes=2 trainer.n_gpus_per_node=1 trainer.val_before_train=false replay.warmup=1 2>&1 | tee "$OUT/run.log"

"$PY" - "$OUT/metrics.jsonl" "$RAY_ADDRESS" <<'EOF'
import json, sys
from collections import Counter
from ray.util.state import list_actors

steps = {json.loads(line)["step"] for line in open(sys.argv[1]) if "actor/pg_loss" in line}
actors = list_actors(address=sys.argv[2], limit=1000, detail=True, raise_on_missing_output=False)
print("[two-node] actors:", sorted({(a.class_name, a.node_id[:8], a.state) for a in actors}), flush=True)
# the trainer ranks are verl's colocated WorkerDict actors (the rollout runs in vLLMHttpServer)
nodes = Counter(a.node_id for a in actors if "WorkerDict" in (a.class_name or ""))
print(f"[two-node] trained steps {sorted(steps)}; trainer workers per node {dict(nodes)}", flush=True)
assert steps == {1, 2, 3}, steps
assert len(nodes) == 2 and set(nodes.values()) == {1}, "the two trainer ranks did not run on two nodes"
print("[two-node] passed")
EOF
