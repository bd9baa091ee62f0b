"""What the end-to-end tests (tests/vllm, tests/faults) build and run: an untrained tiny model with a dense reward (share of digits in
the response, plus a tie-breaker below 1e-3 from the response's characters), so groups have non-zero advantages
from the first step; a CPU launch script run on it; verl's file-logger reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from recipe.darl.data.prepare import write_parquet
from recipe.darl.example.arithmetic import make_problems, records
from recipe.darl.example.tiny_model import build_tiny_model

# The tie-breaker: with the digit share alone, a group whose responses hold no digit has no advantage, and which
# groups do depends on the CPU's float results; distinct responses get distinct rewards, so every group is informative.
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    digits = sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
    return digits + 1e-3 * (sum(map(ord, solution_str)) % 997) / 997
'''


def build_inputs(root: Path, hidden_size: int = 64) -> dict[str, str]:
    """Model, data and reward under `root`; returns the scripts' MODEL_PATH / TRAIN_FILES / VAL_FILES and
    the reward override. vLLM's CPU attention needs a head size >= 32: hidden_size=128 (4 heads of 32)."""
    model = build_tiny_model(root / "model", seed=0, hidden_size=hidden_size)
    train = write_parquet(records(make_problems(64, seed=1), "train"), root / "train.parquet")
    val = write_parquet(records(make_problems(8, seed=2), "test"), root / "val.parquet")
    (root / "digits_reward.py").write_text(REWARD)
    return {"MODEL_PATH": str(model), "TRAIN_FILES": str(train), "VAL_FILES": str(val),
            "reward": f"reward.custom_reward_function.path={root / 'digits_reward.py'}"}


def read_log(path: Path) -> dict[int, dict]:
    """verl's jsonl file logger, merged per step."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(record["data"])
    return steps


K = 3  # replay window of the end-to-end runs


def run_script(script: Path, inputs: dict[str, str], root: Path, log: str, env: dict[str, str], *overrides: str,
               timeout: int) -> subprocess.CompletedProcess:
    """Runs a CPU launch script on `inputs` (outputs in root/out, verl's file logger in root/log) with replay
    K = 3, no warmup and responses of <= 12 tokens; asserts it succeeded, showing its output's tail if not."""
    run_env = dict(os.environ, MODEL_PATH=inputs["MODEL_PATH"], TRAIN_FILES=inputs["TRAIN_FILES"],
                   VAL_FILES=inputs["VAL_FILES"], OUT_DIR=str(root / "out"), VERL_FILE_LOGGER_PATH=str(root / log),
                   N_RESPONSES="4", MINI_BATCH_SIZE="2", PYTHON=sys.executable, **env)
    args = [inputs["reward"], f"replay.k={K}", "replay.warmup=0", "data.max_response_length=12", *overrides]
    done = subprocess.run(["bash", str(script), *args], env=run_env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def updates(path: Path) -> list[dict]:
    """verl's file-logger records that hold an actor update, in order (the fully-async trainer logs its last two
    updates under one step, which read_log would merge)."""
    records = [json.loads(line)["data"] for line in path.read_text().splitlines()]
    return [r for r in records if "actor/pg_loss" in r]


def assert_sharded(checkpoints: Path, step: int) -> None:
    """The latest checkpoint is `step`'s, with the actor saved as two shards and the replay buffer beside it."""
    assert int((checkpoints / "latest_checkpointed_iteration.txt").read_text()) == step
    folder = checkpoints / f"global_step_{step}"
    files = {p.name for p in folder.iterdir()} | {p.name for p in (folder / "actor").iterdir()}
    expected = {f"{kind}_world_size_2_rank_{r}.pt" for kind in ("model", "optim") for r in (0, 1)} | {"darl_replay.pt"}
    assert expected <= files, files
