"""verl's vLLM rollout on CPU inside verl's own machinery (vllm_sync_check.py, one engine for every test here):
verl's `LLMServerManager` builds the CPU vLLM replica, its `CheckpointEngineWorker` (verl's vLLM `ServerAdapter`,
the project's Ray object-store checkpoint engine) and verl's `vLLMHttpServer`; a real FSDP2 trainer worker syncs
its weights three times; every generated token's log-prob is compared with a teacher-forced transformers
forward of the trainer's module under the same weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.full  # a long launch: make test-all

HERE = Path(__file__).resolve().parent
# vLLM's log-prob of a generated token vs log_softmax(logits / T) of the trainer's fp32 module, same weights:
# measured <= 2e-6 on this machine (fp32 both sides; different kernels)
TOL = 1e-4
VERSIONS = ("1", "2", "3")


@pytest.fixture(scope="module")
def check(run_python, tiny_model_128, vllm_installed):
    return run_python([HERE / "vllm_sync_check.py", tiny_model_128], platform="cpu", timeout=900, RAY_DEDUP_LOGS="0")


def test_verl_builds_the_cpu_replica_and_its_vllm_server(check):
    assert check["replica_class"] == "CPUvLLMReplica"
    worker = dict(check["worker_facts"])
    socket = worker.pop("socket")
    assert worker == {"adapter": "verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter",
                      "engine": "RayObjectStoreCheckpointEngine", "plugin_loaded": True,
                      "use_shm": True}  # no CUDA IPC on CPU: weights reach vLLM through /dev/shm
    facts = check["server_facts"]
    # the weight-sync socket is named after the replica's own token, which vLLM's worker reads from the server's
    # environment, not after the Ray job id every fresh cluster shares (two launches on one host would collide)
    token = facts["socket_env"]
    assert re.fullmatch(r"[0-9a-f]{16}", token) and token != facts["job_id"], facts
    assert socket == f"ipc:///tmp/rl-colocate-zmq-{token}-replica-0-rank-0.sock", socket
    assert facts["class"] == "vLLMHttpServer" and facts["platform"] == "cpu"  # vLLM chose its CPU platform
    assert facts["vllm_dist"] == facts["vllm_version"] + "+cpu" and facts["kvcache_gib"] == "1"
    assert facts["verl_platform"] == "cpu"
    host, port = check["server_addresses"][0].rsplit(":", 1)
    assert host and int(port) > 0  # vLLM's OpenAI server listens


def test_generation_returns_each_sampled_tokens_log_prob(check):
    for version in VERSIONS:
        s = check["syncs"][version]
        assert s["n_log_probs"] == s["lengths"] and all(0 < n <= 8 for n in s["lengths"])  # response_length 8
        assert s["distinct_sampled"] >= 2  # temperature > 0 samples


def test_dummy_weights_differ_until_the_first_sync(check):
    before = check["before"]
    assert before["version"] is None and before["n_log_probs"] == before["n"]
    assert before["err_vs_trainer"] > 0.01  # load_format=dummy: random weights, not the trainer's


def test_every_sync_matches_teacher_forced_log_probs(check):
    for version in VERSIONS:
        s = check["syncs"][version]
        # greedy (unscaled distribution), T = 0.7 and T = 1.0 samples: vLLM's processed log-probs are
        # log_softmax(logits / T) of the weights just synced
        assert s["greedy_err"] < TOL and s["sampled_err"] < TOL and s["plain_err"] < TOL, s
        assert s["metrics"]["checkpoint_engine/tensors"] > 0


def test_each_sync_reaches_vllm(check):
    # the trainer's weights change between syncs; vLLM follows (its CPU linear layers keep their weights for
    # the reload: without the keep-weights plugin the second sync fails)
    syncs = check["syncs"]
    assert syncs["1"]["greedy_tokens"] != syncs["2"]["greedy_tokens"]


def test_responses_carry_the_synced_version(check):
    for version in VERSIONS:
        s = check["syncs"][version]
        assert s["versions"] == [int(version)] * len(s["versions"])
        assert all(lo == hi == int(version) for lo, hi in s["min_max"])


def test_abort_returns_the_partial_response_with_its_log_probs(check):
    # what verl's fully-async partial rollouts rely on: abort_all_requests hands back what was generated
    aborted = check["aborted"]
    assert aborted["stop_reason"] == "aborted" and 0 < aborted["n"] < 4000
    assert aborted["n_log_probs"] == aborted["n"] and aborted["version"] == 3
    assert check["after_abort"] == {"stop_reason": "completed", "n": 8}


def test_one_request_aborted_by_its_id_stops_decoding_on_the_server(check):
    """DARTS's tail abort on verl's vLLM server: verl 0.9.1's abort_request looks the id up among vLLM's internal ids
    (`<id>-<8 random characters>`), finds nothing and the request decodes on; `abort_in_engine` (vLLM's engine abort
    by the same id) stops it within an engine step or two, and the request leaves the engine."""
    found = check["one_abort"]
    assert found["verl_result"]["aborted"] is False and "not found" in found["verl_result"]["error"]
    assert len(found["live_ids"]) == 1 and found["live_ids"][0].startswith("tail-")  # the randomised internal id
    assert found["decoded_after_verl_abort"] >= 30, found  # still decoding after verl's abort
    assert "returned_error" not in found, found
    assert found["stop_reason"] == "aborted" and found["returned_tokens"] < 4000
    assert found["returned_tokens"] - found["tokens_at_abort"] <= 4, found  # no decoding after the abort
    assert found["live_after_ours"] == {}
