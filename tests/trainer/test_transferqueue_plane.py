"""The V1 trainer's row conversion (trainers/transferqueue_plane.py): verl V1 trajectory rows, as its agent loop writes them into
TransferQueue, to replay groups and back; the rows a step writes back give verl's own GRPO the same advantages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.darl.trainers.transferqueue_plane import groups_from_rows, rows_from_groups, rows_of

TOKEN_FIELDS = ("prompts", "responses", "response_mask", "loss_mask", "input_ids", "position_ids", "rollout_log_probs",
                "rm_scores")


def agent_loop_rows(seed: int = 0):
    """Two prompts x 3 responses of varied lengths, fields and tags as verl 0.9.1's agent loop puts them
    (agent_loop_tq.py), version stamps differing inside the second group (a partial rollout)."""
    g = torch.Generator().manual_seed(seed)
    rows, tags, keys = [], [], []
    for p, (uid, plen) in enumerate((("5f0c-aa", 5), ("9b1e-bb", 7))):
        prompt = torch.randint(3, 50, (plen,), generator=g)
        for s in range(3):
            length = 2 + s + p
            response = torch.randint(3, 50, (length,), generator=g)
            mask = torch.ones(length, dtype=torch.int64)
            mask[0] = 0 if s == 1 else 1  # a masked token inside a response (a tool turn)
            scores = torch.zeros(length)
            scores[-1] = float(s == p)
            vmin, vmax = (3, 3) if p == 0 else (2 + (s == 0), 4)
            ids = torch.cat([prompt, response])
            rows.append({"uid": uid, "session_id": s, "global_steps": 4, "data_source": "arith", "num_turns": 2,
                         "reward_model": {"ground_truth": str(p)}, "raw_prompt": [{"role": "user", "content": "1+1"}],
                         "extra_fields": {"min_global_steps": vmin, "max_global_steps": vmax},
                         "multi_modal_inputs": {}, "dummy_tensor": torch.zeros(1, dtype=torch.uint8),
                         "prompts": prompt, "responses": response, "response_mask": mask, "loss_mask": mask,
                         "input_ids": ids, "position_ids": torch.arange(ids.shape[0]),
                         "rollout_log_probs": -torch.rand(length, generator=g), "rm_scores": scores})
            tags.append({"status": "success", "prompt_len": plen, "response_len": length, "seq_len": plen + length,
                         "global_steps": 4, "min_global_steps": vmin, "max_global_steps": vmax})
            keys.append(f"{uid}_{s}_0")
    return keys, rows, tags


def test_rows_to_groups_and_back_keep_every_field():
    keys, rows, tags = agent_loop_rows()
    stored = rows_of(list_of_dict_to_tensordict(rows))  # what kv_batch_get hands back, row by row
    groups = groups_from_rows(stored, tags)
    assert [g.uid for g in groups] == ["5f0c-aa", "9b1e-bb"] and [g.n for g in groups] == [3, 3]
    assert [g.version for g in groups] == [3, 2]  # the smallest min_global_steps of the group
    assert groups[1].rewards.tolist() == [0.0, 1.0, 0.0]
    new_keys, new_rows, new_tags = rows_from_groups(groups, step=7)
    assert new_keys == [f"{uid}-r7_{s}_0" for uid in ("5f0c-aa", "9b1e-bb") for s in range(3)]
    back = rows_of(list_of_dict_to_tensordict(new_rows))
    for old, new in zip(rows, back):
        for name in TOKEN_FIELDS:
            assert torch.equal(old[name].to(new[name].dtype), new[name]), name
        assert new["uid"] == old["uid"] + "-r7"
        for name in ("session_id", "global_steps", "data_source", "num_turns", "reward_model", "raw_prompt",
                     "extra_fields", "multi_modal_inputs"):
            assert new[name] == old[name], name
        assert "dummy_tensor" not in new
    # a group's samples are stamped with the group's version: the oldest weights any of its tokens came from
    assert new_tags == [{**old, "min_global_steps": version} for old, version in zip(tags, [3, 3, 3, 2, 2, 2])]


def test_rebuilt_rows_give_verls_grpo_advantages():
    keys, rows, tags = agent_loop_rows(seed=1)
    new_keys, new_rows, _ = rows_from_groups(groups_from_rows(rows_of(list_of_dict_to_tensordict(rows)), tags), step=3)
    td = list_of_dict_to_tensordict(new_rows)
    scores = torch.nested.as_nested_tensor([r["rm_scores"] for r in new_rows], layout=torch.jagged).to_padded_tensor(0.0)
    mask = torch.nested.as_nested_tensor([r["response_mask"] for r in new_rows], layout=torch.jagged).to_padded_tensor(0)
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": np.array(list(td["uid"]), dtype=object)})
    got = compute_advantage_for_multi_trajectories(data, batch_keys=new_keys, adv_estimator="grpo", num_repeat=3)
    original_mask = torch.nested.as_nested_tensor([r["response_mask"] for r in rows], layout=torch.jagged).to_padded_tensor(0)
    original_scores = torch.nested.as_nested_tensor([r["rm_scores"] for r in rows], layout=torch.jagged).to_padded_tensor(0.0)
    expected, _ = compute_grpo_outcome_advantage(original_scores, original_mask, np.array([r["uid"] for r in rows]))
    assert torch.allclose(got.batch["advantages"], expected)
    assert expected.abs().sum() > 0


def test_rows_with_fields_replay_cannot_rebuild_are_refused():
    keys, rows, tags = agent_loop_rows()
    rows[0]["routed_experts"] = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="routed_experts"):
        groups_from_rows(rows, tags)
    keys, rows, tags = agent_loop_rows()
    tags[2]["min_global_steps"] = None
    with pytest.raises(ValueError, match="min_global_steps"):
        groups_from_rows(rows, tags)
