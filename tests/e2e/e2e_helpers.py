"""What both end-to-end tests build: an untrained tiny model with a dense reward (share of digits in the
response), so groups have non-zero advantages from the first step, and verl's file-logger reader."""

from __future__ import annotations

import json
from pathlib import Path

from recipe.darl.example.arithmetic import make_problems, records, write_parquet
from recipe.darl.example.tiny_model import build_tiny_model

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
'''


def build_inputs(root: Path) -> dict[str, str]:
    """Model, data and reward under `root`; returns the scripts' MODEL_PATH / TRAIN_FILES / VAL_FILES and
    the reward override."""
    model = build_tiny_model(root / "model", seed=0, hidden_size=64)
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
