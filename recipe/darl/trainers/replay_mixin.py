"""The D-ARL replay step, shared by the one-step-off and the fully-async trainer (docs/algorithm.md, 'The replay step').

    fresh batch (version v) -> reward -> merge with buffered candidates -> old_log_prob recompute
    -> record -> select whole groups -> advantages on the selected groups
    -> actor update with the D-ARL loss -> insert and evict -> replay/ metrics

`ReplayStepMixin` overrides the fit_step hooks both verl trainers inherit from `SeparateRayPPOTrainer`
(`_init_models`, `_fit_compute_log_prob`, `_fit_update_actor`) and calls `super()` for verl's own work,
so it sits before the verl trainer in the bases. With `replay.enable=false` every hook falls through.
The trainer saves and restores the buffer with `save_replay` / `load_replay` in its own checkpoint hooks.
"""

from __future__ import annotations

import math
import os
import time
from functools import partial
from typing import Optional

import numpy as np
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.fs import local_mkdir_safe

from recipe.darl.workers.actor_loss import darl_loss
from recipe.darl.robustness.checkpoint_files import read_checked, write_checked
from recipe.darl.probes import fault_point
from ..core import Group, ReplayBuffer, Selection, StepCandidates, group_multiple, group_scores, sample_chi2, select_for_step
from ..core.config import ReplayConfig
from recipe.darl.trainers.batches import batch_from_groups, groups_from_batch, loss_inputs, replay_metrics

BUFFER_FILE = "darl_replay.pt"


class ReplayStepMixin:
    """D-ARL replay over a verl trainer's fit_step hooks. Call `_init_replay(config)` after the trainer's
    own __init__."""

    def _replay_version(self) -> int:
        """The version of pi_old, the weights the step's old log-probs are computed with, in the unit the
        rollout stamps samples with (`min_global_steps`): staleness is measured against it."""
        return self.global_steps

    def _replay_budget(self) -> int:
        """B: the groups a step trains on without replay (one-step-off: `data.train_batch_size`)."""
        return int(self.config.data.train_batch_size)

    def _init_replay(self, config) -> None:
        self.replay = ReplayConfig.from_dict(OmegaConf.to_container(config.replay, resolve=True))
        self.buffer: Optional[ReplayBuffer] = ReplayBuffer.from_config(self.replay) if self.replay.enable else None
        self._step_state: Optional[dict] = None

    # ---- setup -------------------------------------------------------------------------------

    def _init_models(self):
        super()._init_models()
        if self.replay.enable:
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            self.actor_wg.set_loss_fn(partial(
                darl_loss, config=actor_config, threshold=self._threshold(), stop_grad=self.replay.stop_grad,
                behavior_clip=self.replay.behavior_clip_range(),
            ))

    def _threshold(self) -> float:
        return float(self.config.algorithm.rollout_correction.rollout_is_threshold)

    def _dp_size(self) -> int:
        sp = self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1) or 1
        return self.actor_rollout_wg.world_size // sp

    # ---- the replay step ---------------------------------------------------------------------

    def _fit_compute_log_prob(self, batch: DataProto) -> DataProto:
        if not self.replay.enable:
            return super()._fit_compute_log_prob(batch)
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        n = self.config.actor_rollout_ref.rollout.n
        for key, values in self.reward_extra_infos_dict.items():  # stored with the groups, like the rewards
            batch.non_tensor_batch.setdefault(key, np.asarray(values))
        fresh = groups_from_batch(batch, self.reward_tensor)
        self.metrics["replay/fresh_version"] = max(g.version for g in fresh)  # the rollout's version stamp
        cands = self.buffer.begin_step(fresh, self._replay_version())
        timing["buffer"] = time.perf_counter() - t0
        prompt_width = batch.batch["prompts"].shape[1]
        response_width = batch.batch["responses"].shape[1]
        if not cands.candidates:
            self._step_state = {"cands": cands, "selection": Selection([], 0, 0, True, "no candidate groups"),
                                "scores": [], "weights": None, "timing": timing}
            return super()._fit_compute_log_prob(batch)

        if self.replay.resolved("order") != "chi2":
            # nothing to score: select first, then recompute pi_old of the selected groups only
            t0 = time.perf_counter()
            selection = self._select(cands.candidates, None, cands)
            timing["select"] = time.perf_counter() - t0
            picked = [cands.candidates[i] for i in selection.selected]
            scores = [float("nan")] * len(cands.candidates)
            if picked:
                part = self._recompute(picked, prompt_width, response_width, batch.meta_info, timing)
                for i, s in zip(selection.selected, self._score(picked, part, timing)):
                    scores[i] = s
                merged, rows_of = part, picked
            else:  # no update this step; the later hooks still want old log-probs
                merged = self._recompute(cands.candidates, prompt_width, response_width, batch.meta_info, timing)
                rows_of = cands.candidates
        else:
            if self.replay.rescore == "lazy":
                merged, scores = self._score_lazily(cands, prompt_width, response_width, batch.meta_info, timing)
            else:
                merged = self._recompute(cands.candidates, prompt_width, response_width, batch.meta_info, timing)
                scores = self._score(cands.candidates, merged, timing)
            rows_of = cands.candidates  # the groups whose rows `merged` holds, in order (lazy: the kept ones)
            t0 = time.perf_counter()
            selection = self._select(cands.candidates, scores, cands)
            timing["select"] = time.perf_counter() - t0
        state = {"cands": cands, "selection": selection, "scores": scores, "weights": None, "timing": timing}
        self._step_state = state
        if selection.skipped:
            print(f"[D-ARL] step {self._replay_version()}: no update ({selection.reason})")
            return self._use_rewards_of(merged)

        # train in arrival order, so mini-batches mix scores instead of sorting them
        order = sorted(selection.selected, key=lambda i: cands.candidates[i].seq)
        selected = [cands.candidates[i] for i in order]
        row = {id(g): j for j, g in enumerate(rows_of)}
        chosen = merged.select_idxs(np.concatenate([np.arange(row[id(g)] * n, (row[id(g)] + 1) * n) for g in selected]))
        t0 = time.perf_counter()
        state["mini_batch_groups"] = min(len(selected), self.config.actor_rollout_ref.actor.ppo_mini_batch_size)
        state["weights"] = loss_inputs(
            chosen, selected, self.replay, self._replay_version(), self._threshold(),
            clip_low=self._clip("clip_ratio_low"), clip_high=self._clip("clip_ratio_high"),
            mini_batch_samples=state["mini_batch_groups"] * n, dp_size=self._dp_size(),
        )
        timing["weights"] = time.perf_counter() - t0
        state["selected_groups"] = selected
        return self._use_rewards_of(chosen)

    def _select(self, groups: list[Group], scores: Optional[list[float]], cands: StepCandidates) -> Selection:
        """Whole mini-batches in `replay.order` (fresh groups first with `replay.ratio`); fewer eligible than
        one mini-batch: one smaller mini-batch, as small as the workers' split allows (dp shards, fixed
        micro-batches). scores: chi2 group scores, needed only by order chi2; cands: the step's candidates (its
        fresh and history groups)."""
        n = self.config.actor_rollout_ref.rollout.n
        actor = self.config.actor_rollout_ref.actor
        dp = self._dp_size()
        per_step = dp if actor.get("use_dynamic_bsz", False) else dp * int(actor.ppo_micro_batch_size_per_gpu or 1)
        full = group_multiple(n, actor.ppo_mini_batch_size, dp)
        smallest = per_step // math.gcd(per_step, n)
        return select_for_step(groups, cands.fresh, self.replay, self._replay_budget(), full,
                               smallest if smallest <= full else None, scores, cands.history)

    def _use_rewards_of(self, batch: DataProto) -> DataProto:
        """Points the step's rewards (read by `_fit_compute_advantage`) and token counts at the rows of `batch`."""
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        self.reward_tensor = batch.batch["token_level_scores"]
        self.reward_extra_infos_dict = {k: batch.non_tensor_batch[k] for k in self.reward_extra_infos_dict}
        return batch

    def _clip(self, key: str) -> float:
        actor = self.config.actor_rollout_ref.actor
        value = actor.get(key)
        return float(actor.clip_ratio if value is None else value)

    def _recompute(self, groups: list[Group], prompt_width: int, response_width: int, meta_info: dict,
                   timing: dict) -> DataProto:
        """One batched old_log_prob forward over `groups`, recorded in each group as this step's version."""
        merged = batch_from_groups(groups, prompt_width, response_width, meta_info)
        merged.meta_info["global_token_num"] = merged.batch["attention_mask"].sum(-1).tolist()
        t0 = time.perf_counter()
        # the candidate count varies: pad to what the workers' split needs, as verl's dispatch would
        rollout = self.config.actor_rollout_ref.rollout
        divisor = self._dp_size()
        if not rollout.get("log_prob_use_dynamic_bsz", False):
            divisor *= int(rollout.log_prob_micro_batch_size_per_gpu or 1)
        padded, pad = pad_dataproto_to_divisor(merged, divisor)
        padded = super()._fit_compute_log_prob(padded)
        merged = unpad_dataproto(padded, pad)
        timing["recompute"] = timing.get("recompute", 0.0) + time.perf_counter() - t0
        old = merged.batch["old_log_probs"]
        start = 0
        for g in groups:
            g.record(self._replay_version(), old[start:start + g.n])
            start += g.n
        return merged

    def _score(self, groups: list[Group], merged: DataProto, timing: dict) -> list[float]:
        t0 = time.perf_counter()
        sample = sample_chi2(merged.batch["old_log_probs"], merged.batch["rollout_log_probs"], merged.batch["response_mask"])
        index = torch.cat([torch.full((g.n,), i) for i, g in enumerate(groups)])
        scores = group_scores(sample, index, len(groups)).tolist()
        for g, s in zip(groups, scores):
            g.score = s
        timing["score"] = time.perf_counter() - t0
        return scores

    def _score_lazily(self, cands: StepCandidates, prompt_width: int, response_width: int, meta_info: dict,
                      timing: dict) -> tuple[DataProto, list[float]]:
        """`rescore: lazy`: recompute the fresh groups, reuse the last score of buffered ones; then
        recompute only the buffered groups that the selection would take (the loss needs their pi_old)."""
        fresh_ids = {id(g) for g in cands.fresh}
        stale = [g for g in cands.candidates if id(g) not in fresh_ids]
        fresh_batch = self._recompute(cands.fresh, prompt_width, response_width, meta_info, timing) if cands.fresh else None
        if fresh_batch is not None:
            self._score(cands.fresh, fresh_batch, timing)
        n = self.config.actor_rollout_ref.rollout.n
        pre = self._select(cands.candidates, [g.score if g.score is not None else float("inf") for g in cands.candidates],
                           cands)
        wanted = {id(cands.candidates[i]) for i in pre.selected}
        rescored = [g for g in stale if id(g) in wanted]
        parts = {}
        if rescored:
            stale_batch = self._recompute(rescored, prompt_width, response_width, meta_info, timing)
            self._score(rescored, stale_batch, timing)
            parts.update({id(g): (stale_batch, i) for i, g in enumerate(rescored)})
        if fresh_batch is not None:
            parts.update({id(g): (fresh_batch, i) for i, g in enumerate(cands.fresh)})
        # candidates not recomputed this step cannot be trained on: the loss needs this step's pi_old
        keep = [g for g in cands.candidates if id(g) in parts]
        cands.candidates[:] = keep
        batches = []
        for g in keep:
            src, i = parts[id(g)]
            part = src.select_idxs(np.arange(i * n, (i + 1) * n))
            part.meta_info.pop("global_token_num", None)  # per-batch; set again for the rows trained
            batches.append(part)
        merged = DataProto.concat(batches)
        return merged, [g.score for g in keep]

    def _fit_update_actor(self, batch: DataProto) -> DataProto:
        if not self.replay.enable:
            return super()._fit_update_actor(batch)
        state = self._step_state
        selection: Selection = state["selection"]
        if not selection.skipped:
            actor = self.config.actor_rollout_ref.actor
            full = actor.ppo_mini_batch_size
            actor.ppo_mini_batch_size = state["mini_batch_groups"]  # fewer groups than a mini-batch: one smaller
            try:
                batch = super()._fit_update_actor(batch)
            finally:
                actor.ppo_mini_batch_size = full
        t0 = time.perf_counter()
        trained = state.get("selected_groups", []) if not selection.skipped else []
        evicted = self.buffer.end_step(state["cands"], trained)
        state["timing"]["buffer"] += time.perf_counter() - t0
        self.metrics.update(replay_metrics(
            self._replay_version(), state["cands"], state["scores"], selection, state["weights"],
            self.buffer.stats(), vars(evicted), state["timing"],
        ))
        self._step_state = None
        return batch

    # ---- the buffer in checkpoints ----------------------------------------------------------

    def save_replay(self, folder: str) -> None:
        """Writes the buffer into a checkpoint folder, atomically and with a checksum (robustness/checkpoint_files.py); call
        before verl writes its tracker file, so a checkpoint that resume can find always holds the buffer."""
        if self.buffer is None:
            return
        local_mkdir_safe(folder)
        step = _folder_step(folder)
        write_checked(os.path.join(folder, BUFFER_FILE), {"replay": self.buffer.state_dict(), "config": vars(self.replay)},
                      before_replace=lambda: fault_point("buffer_write", step))

    def load_replay(self, folder: str) -> None:
        """Restores the buffer from the checkpoint folder verl just resumed from; a torn or corrupted file raises
        `CorruptCheckpointError` naming it."""
        if self.buffer is None:
            return
        path = os.path.join(folder, BUFFER_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"resuming with replay.enable=true from {folder}, which has no {BUFFER_FILE}: "
                "the checkpoint was written without replay; resume with replay.enable=false or start fresh"
            )
        self.buffer.load_state_dict(read_checked(path)["replay"])
        b = self.buffer
        print(f"[D-ARL] restored the replay buffer: {len(b)} groups, versions {sorted({g.version for g in b.groups})}, "
              f"steps_done {b.steps_done}, next_seq {b.next_seq}, from {path}")


def _folder_step(folder: str) -> int:
    """t of a `global_step_<t>` folder (-1 for another name): the step the fault hook is keyed by."""
    name = os.path.basename(os.path.normpath(folder))
    return int(name[len("global_step_"):]) if name.startswith("global_step_") and name[12:].isdigit() else -1
