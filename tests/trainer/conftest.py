"""Composed D-ARL configs and verl-layout batches for the trainer tests."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    return {"model": str(model), "train": str(data), "val": str(data), "ckpt": str(tmp_path / "ckpt")}


@pytest.fixture
def compose_config(paths):
    """compose(*overrides) -> the composed config, with paths that exist and a valid replay setup."""

    def _compose(*overrides: str, valid_base: bool = True, config_name: str = "one_step_off_trainer"):
        base = [
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.model.path={paths['model']}",
            f"data.train_files={paths['train']}",
            f"data.val_files={paths['val']}",
            f"trainer.default_local_dir={paths['ckpt']}",
        ] if valid_base else []
        with initialize_config_module(config_module="recipe.darl.config", version_base=None):
            return compose(config_name=config_name, overrides=base + list(overrides))

    return _compose


def make_batch(
    versions: list[int], rewards: list[list[float]], prompt_width: int = 4, response_width: int = 5, seed: int = 0
) -> DataProto:
    """A generated batch in verl's agent-loop layout: one group per entry of `rewards` (n = its length)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for version, group_rewards in zip(versions, rewards):
        uid = str(uuid.UUID(int=int(torch.randint(0, 2**62, (1,), generator=g))))
        plen = int(torch.randint(1, prompt_width + 1, (1,), generator=g))
        prompt = torch.randint(5, 50, (plen,), generator=g)
        for r in group_rewards:
            rlen = int(torch.randint(1, response_width + 1, (1,), generator=g))
            rows.append((uid, version, prompt, torch.randint(5, 50, (rlen,), generator=g), -torch.rand(rlen, generator=g), r))
    B = len(rows)
    prompts = torch.zeros(B, prompt_width, dtype=torch.long)
    responses = torch.zeros(B, response_width, dtype=torch.long)
    attention = torch.zeros(B, prompt_width + response_width, dtype=torch.long)
    rollout = torch.zeros(B, response_width)
    scores = torch.zeros(B, response_width)
    for i, (_, _, p, resp, lp, r) in enumerate(rows):
        prompts[i, prompt_width - len(p):] = p
        attention[i, prompt_width - len(p):prompt_width] = 1
        responses[i, :len(resp)] = resp
        attention[i, prompt_width:prompt_width + len(resp)] = 1
        rollout[i, :len(resp)] = lp
        scores[i, len(resp) - 1] = r
    response_mask = attention[:, prompt_width:].clone()
    tensors = {
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
        "position_ids": compute_position_id_with_mask(attention), "rollout_log_probs": rollout, "rm_scores": scores,
    }
    non_tensors = {
        "uid": np.array([r[0] for r in rows], dtype=object),
        "min_global_steps": np.array([r[1] for r in rows], dtype=object),
        "data_source": np.array(["toy"] * B, dtype=object),
        "acc": np.array([r[5] for r in rows], dtype=np.float32),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"reward_extra_keys": ["acc"]})


@pytest.fixture
def batch_maker():
    return make_batch
