"""A reward function that raises or hangs, and rewards that are NaN or infinite (docs/faults.md, docs/metrics.md).

`GuardedRewardManager` is verl's `naive` reward manager with a time limit per call (`faults.reward_timeout_s`) and
a failure policy (`faults.reward_errors`): `raise` ends the run with a `RewardError` naming the function and the
sample; `zero` scores the sample 0.0 and prints a line. Every sample carries `darl_reward_failed` (0.0 or 1.0), which
`DarlRun.guard_rewards` (trainers/darl_run.py) counts as `faults/reward_failed` and drops. A timed-out call's thread cannot
be stopped and runs on. `sanitize_rewards` replaces NaN/inf rewards by 0.0: one NaN would turn a whole GRPO group's
advantages, and then the update, into NaN.
"""

from __future__ import annotations

import asyncio

import torch
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

FAILED_KEY = "darl_reward_failed"


class RewardError(RuntimeError):
    """A reward function raised or outlived `faults.reward_timeout_s`; names the function and the sample."""


def describe_sample(data) -> str:
    nt = data[-1].non_tensor_batch
    extra = nt.get("extra_info", {}) or {}
    parts = [f"data_source={nt.get('data_source')!r}"]
    if isinstance(extra, dict):
        parts += [f"{key}={extra[key]!r}" for key in ("index", "split") if key in extra]
    parts.append(f"ground_truth={str((nt.get('reward_model', {}) or {}).get('ground_truth'))[:80]!r}")
    return ", ".join(parts)


class GuardedRewardManager(NaiveRewardManager):
    """verl's naive reward manager with a time limit and an error policy (module docstring)."""

    def __init__(self, config, tokenizer, compute_score, *args, **kwargs):
        super().__init__(config, tokenizer, compute_score, *args, **kwargs)
        faults = config.get("faults") or {}
        self.timeout_s = float(faults.get("reward_timeout_s") or 0) or None
        self.on_error = faults.get("reward_errors", "raise") or "raise"
        fn = config.reward.get("custom_reward_function") or {}
        self.reward_name = (f"{fn.get('name') or 'compute_score'} from {fn.get('path')}" if fn.get("path")
                            else "verl's default_compute_score")
        self._keys: list[str] = []  # extra-info keys of a successful call, filled with 0.0 on a failure
        self.failures = 0

    async def run_single(self, data) -> dict:
        try:
            call = super().run_single(data)
            result = await (asyncio.wait_for(call, self.timeout_s) if self.timeout_s else call)
        except asyncio.TimeoutError:
            failure = f"took longer than faults.reward_timeout_s={self.timeout_s:g} s"
        except Exception as e:  # noqa: BLE001 - reported with the sample, or counted
            failure = f"raised {type(e).__name__}: {e}"
        else:
            info = result.setdefault("reward_extra_info", {})
            self._keys = [k for k in info if k != FAILED_KEY] or self._keys
            info[FAILED_KEY] = 0.0
            return result
        sample = describe_sample(data)
        if self.on_error != "zero":
            raise RewardError(f"the reward function ({self.reward_name}) {failure}, on the sample {sample}. "
                              "Fix the reward, or set faults.reward_errors=zero to count such samples as reward 0 "
                              "(logged as faults/reward_failed)")
        self.failures += 1
        print(f"[D-ARL] reward ({self.reward_name}) {failure} on {sample}: scored 0.0 "
              f"({self.failures} failure(s) in this reward worker)", flush=True)
        info = {**dict.fromkeys(self._keys or ["acc"], 0.0), FAILED_KEY: 1.0}
        return {"reward_score": 0.0, "reward_extra_info": info}


def sanitize_rewards(reward_tensor: torch.Tensor) -> int:
    """Replaces NaN/inf token rewards of a [B, L] `reward_tensor` by 0 in place; returns how many samples (rows)
    had one."""
    rows = int((~torch.isfinite(reward_tensor)).any(dim=-1).sum())
    reward_tensor.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return rows
