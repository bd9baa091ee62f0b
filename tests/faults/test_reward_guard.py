"""A reward that raises, hangs or returns NaN (recipe/darl/robustness/reward_guard.py), through verl's own naive reward
manager's `run_single` on a one-sample DataProto."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto

from recipe.darl.core.darts import DartsConfig
from recipe.darl.robustness import reward_guard as fw
from recipe.darl.trainers.darl_run import DarlRun


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


def _config(**faults):
    return OmegaConf.create({"faults": {"reward_timeout_s": None, "reward_errors": "raise", **faults},
                             "reward": {"custom_reward_function": {"path": "/rewards/my_reward.py", "name": "score_fn"}}})


def _sample(index=7) -> DataProto:
    return DataProto.from_dict(
        tensors={"responses": torch.tensor([[3, 4, 5, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]])},
        non_tensors={"data_source": np.array(["gsm8k"], dtype=object),
                     "reward_model": np.array([{"ground_truth": "72"}], dtype=object),
                     "extra_info": np.array([{"index": index, "split": "train"}], dtype=object)})


def _score(fn, data=None, **faults):
    async def main():
        manager = fw.GuardedRewardManager(_config(**faults), Tokenizer(), fn)
        return await manager.run_single(data if data is not None else _sample()), manager

    return asyncio.run(main())


def test_a_working_reward_passes_through_with_the_failure_flag_off():
    seen = {}

    def fn(data_source, solution_str, ground_truth, extra_info=None, **kw):
        seen.update(solution_str=solution_str, ground_truth=ground_truth)
        return 1.0

    result, _ = _score(fn)
    assert result == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0, fw.FAILED_KEY: 0.0}}
    assert seen == {"solution_str": "def", "ground_truth": "72"}  # the three valid response tokens, decoded


def test_a_reward_that_raises_is_an_error_naming_the_reward_and_the_sample():
    def fn(**kw):
        raise KeyError("answer")

    with pytest.raises(fw.RewardError) as e:
        _score(fn)
    text = str(e.value)
    assert text.startswith("the reward function (score_fn from /rewards/my_reward.py) raised KeyError: 'answer', on the "
                           "sample data_source='gsm8k', index=7, split='train', ground_truth='72'")
    assert "faults.reward_errors=zero" in text


def test_with_reward_errors_zero_the_sample_scores_zero_and_is_flagged(capsys):
    def fn(**kw):
        raise ValueError("bad latex")

    result, manager = _score(fn, reward_errors="zero")
    assert result == {"reward_score": 0.0, "reward_extra_info": {"acc": 0.0, fw.FAILED_KEY: 1.0}}
    assert manager.failures == 1
    assert "raised ValueError: bad latex on data_source='gsm8k', index=7" in capsys.readouterr().out


def test_a_failure_after_a_dict_reward_fills_its_keys():
    calls = []

    def fn(**kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("x")
        return {"score": 0.5, "acc": 1.0, "format": 1.0}

    async def main():
        manager = fw.GuardedRewardManager(_config(reward_errors="zero"), Tokenizer(), fn)
        return [await manager.run_single(_sample()) for _ in range(2)]

    ok, failed = asyncio.run(main())
    assert ok["reward_extra_info"] == {"score": 0.5, "acc": 1.0, "format": 1.0, fw.FAILED_KEY: 0.0}
    assert failed["reward_extra_info"] == {"score": 0.0, "acc": 0.0, "format": 0.0, fw.FAILED_KEY: 1.0}


def test_a_reward_that_hangs_is_bounded_by_the_timeout():
    def fn(**kw):
        time.sleep(3)
        return 1.0

    t0 = time.time()
    with pytest.raises(fw.RewardError, match=r"took longer than faults.reward_timeout_s=0.3 s, on the sample"):
        _score(fn, reward_timeout_s=0.3)
    assert time.time() - t0 < 2.9 + 0.5  # the error came at the limit (asyncio.run then waits for the thread)


def test_non_finite_rewards_become_zero_and_are_counted():
    r = torch.tensor([[0.0, 1.0], [0.0, math.nan], [math.inf, -math.inf], [0.0, 0.5]])
    assert fw.sanitize_rewards(r) == 2
    assert torch.equal(r, torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.5]]))
    assert fw.sanitize_rewards(r) == 0


class _Verl:
    def _fit_compute_reward(self, batch):
        self.reward_tensor = batch.batch["rm_scores"]
        self.reward_extra_infos_dict = {"acc": np.array([1.0, 0.0, 0.0]), fw.FAILED_KEY: np.array([0.0, 1.0, 1.0])}
        return batch


class _Trainer(_Verl):
    global_steps = 4

    def _fit_compute_reward(self, batch):  # as the trainers' hook
        return self.darl.guard_rewards(super()._fit_compute_reward(batch))


def test_the_trainer_counts_failed_and_non_finite_rewards(capsys):
    trainer = _Trainer()
    trainer.darl = object.__new__(DarlRun)  # the reward guard reads the trainer and DARTS' settings only
    trainer.darl.trainer, trainer.darl.darts = trainer, DartsConfig()  # rollout shaping off: no manager is called
    trainer.metrics = {}
    batch = DataProto.from_dict(tensors={"rm_scores": torch.tensor([[0.0, 1.0], [0.0, math.nan], [0.0, 0.0]])},
                                non_tensors={"acc": np.array([1.0, 0.0, 0.0]), fw.FAILED_KEY: np.array([0.0, 1.0, 1.0])},
                                meta_info={"reward_extra_keys": ["acc", fw.FAILED_KEY]})
    out = trainer._fit_compute_reward(batch)
    assert trainer.metrics == {"faults/reward_failed": 2.0, "faults/nonfinite_rewards": 1.0}
    # the flag is gone from the batch and the extra infos (replay buffers saved without it keep merging)
    assert fw.FAILED_KEY not in out.non_tensor_batch and out.meta_info["reward_extra_keys"] == ["acc"]
    assert list(trainer.reward_extra_infos_dict) == ["acc"]
    assert torch.isfinite(out.batch["rm_scores"]).all() and out.batch["rm_scores"] is trainer.reward_tensor
    assert "step 4: 1 sample(s) with a NaN or infinite reward scored 0.0" in capsys.readouterr().out
