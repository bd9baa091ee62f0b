"""DataProto <-> groups, mini-batch assignment against verl's own splitting, loss inputs."""

import pytest
import torch
from tensordict import TensorDict
from verl.protocol import BatchData
from verl.utils import tensordict_utils as tu

from recipe.darl.core import ReplayConfig, ReplayStep, Selection, StepPlan, batch_weights
from recipe.darl.core.packing import minibatch_index
from recipe.darl.trainers.dataproto_plane import batch_from_groups, groups_from_batch


def test_groups_round_trip_to_the_same_verl_batch(batch_maker):
    batch = batch_maker(versions=[3, 3, 2], rewards=[[1, 0, 1], [0, 0, 1], [1, 1, 0]])
    groups = groups_from_batch(batch, batch.batch["rm_scores"])
    assert [g.n for g in groups] == [3, 3, 3] and [g.version for g in groups] == [3, 3, 2]
    rebuilt = batch_from_groups(groups, prompt_width=4, response_width=5, meta_info=batch.meta_info)
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "rollout_log_probs"):
        assert torch.equal(rebuilt.batch[key], batch.batch[key].to(rebuilt.batch[key].dtype)), key
    assert torch.equal(rebuilt.batch["token_level_scores"], batch.batch["rm_scores"])
    for key in ("uid", "min_global_steps", "data_source", "acc"):
        assert list(rebuilt.non_tensor_batch[key]) == list(batch.non_tensor_batch[key]), key


def test_groups_from_batch_refuses_what_it_cannot_store(batch_maker):
    batch = batch_maker(versions=[1], rewards=[[1, 0]])
    batch.batch["routed_experts"] = torch.zeros(2, 9)
    with pytest.raises(ValueError, match="routed_experts"):
        groups_from_batch(batch, batch.batch["rm_scores"])
    batch = batch_maker(versions=[1], rewards=[[1, 0]])
    batch.non_tensor_batch.pop("min_global_steps")
    with pytest.raises(KeyError, match="min_global_steps"):
        groups_from_batch(batch, batch.batch["rm_scores"])


@pytest.mark.parametrize("num,mini,dp", [(16, 8, 1), (16, 8, 2), (24, 8, 4), (8, 8, 2)])
def test_minibatch_index_matches_verl_split(num, mini, dp):
    """verl chunks the batch over dp ranks, then each rank iterates mini-batches of mini/dp (shuffle off)."""
    td = TensorDict({"row": torch.arange(num)}, batch_size=[num])
    expected = torch.empty(num, dtype=torch.long)
    for shard in BatchData(td).chunk(chunks=dp):
        for m, mb in enumerate(tu.make_iterator(shard, mini_batch_size=mini // dp, epochs=1, seed=42,
                                                dataloader_kwargs={"shuffle": False})):
            expected[mb["row"]] = m
    assert torch.equal(minibatch_index(num, mini, dp), expected)


def test_loss_inputs_are_the_core_weights(batch_maker):
    batch = batch_maker(versions=[5, 4], rewards=[[1, 0], [0, 1]], seed=3)
    groups = groups_from_batch(batch, batch.batch["rm_scores"])
    old = batch.batch["rollout_log_probs"] + 0.1 * batch.batch["response_mask"]
    batch.batch["old_log_probs"] = old
    groups[1].record(5, old[2:])  # the version-4 group was rescored at step 5
    step = ReplayStep(ReplayConfig(enable=True, clip_decay=0.5))
    plan = StepPlan(version=6, selection=Selection([0, 1], 2, 2, False), trained=groups)
    mask = batch.batch["response_mask"]
    inputs = step.loss_inputs(plan, mask, old, batch.batch["rollout_log_probs"], 2.0, 0.2, 0.3, minibatch_index(4, 4, 1))
    batch.batch.update(inputs.batch_fields(mask.shape[1]))
    w = inputs.weights
    known = torch.tensor([False, False, True, True])
    direct = batch_weights(batch.batch["response_mask"], old, batch.batch["rollout_log_probs"], torch.tensor([5, 5, 4, 4]),
                           "pmis", "ess", 2.0, recorded={5: (known, torch.where(known.unsqueeze(1), old, 0.0))})
    torch.testing.assert_close(batch.batch["darl_token_coef"], direct.token_coef.float())
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(batch.batch["darl_log_denominator"][mask], direct.log_denominator.float()[mask])
    assert batch.batch["darl_clip_low"][:, 0].tolist() == pytest.approx([0.1, 0.1, 0.05, 0.05])
    assert batch.batch["darl_clip_high"][:, 0].tolist() == pytest.approx([0.15, 0.15, 0.075, 0.075])
    assert w.sources == [4, 5]
