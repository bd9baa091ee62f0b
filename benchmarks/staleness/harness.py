"""Controlled-staleness testbed for D-ARL: GRPO on a built-in example task (sums, or chains) in one process.

Rollouts of step t are sampled from the policy weights of version max(0, t - s) (the weights after
t - s updates), kept as state-dict snapshots, so the behavior/policy mismatch is real and its size
is known. The rollout log-probs are those of the sampling weights (log_softmax of the sampling
model's logits at the sampling temperature, as a rollout engine returns them), and each sample is
stamped with version t - s.

Nothing of the algorithm is re-implemented here: the step's decisions are `recipe.darl.core.ReplayStep`'s, the
object the verl trainers call (`recipe/darl/trainers/darl_run.py`); the harness owns only the model, the
generation, the forward passes and verl's GRPO advantages:

    fresh groups (Group.from_padded) -> ReplayStep.begin (plan, pi_old of the trained groups by `TensorPlane`,
    record, loss inputs) -> GRPO advantages (verl's compute_grpo_outcome_advantage) -> ReplayStep.loss per
    mini-batch -> ReplayStep.end

Methods (all with the same number of generated samples per step, so the same total per run):

- ``naive``: verl one-step-off as shipped. PPO-clip against the rollout log-probs: pi_old := mu,
  rho = 1 (batch_weights with old = rollout, `own`, `tokens`), no recompute, no correction.
- ``decoupled``: AReaL-style. pi_old recomputed with the current weights, token-level truncated IS
  with C = `threshold` (batch_weights with `own` + `tokens`), no replay (reduction R1 of docs/algorithm.md).
- ``icepop``: ``decoupled`` with verl's token-level IcePop (`RolloutCorrectionConfig.decoupled_token_icepop`): the
  weight pi_old / mu of a token outside [`icepop_low`, `icepop_high`] is 0 (verl's own
  `compute_rollout_correction_weights` decides which), inside it is not truncated; tokens keep their place in the
  loss's normalisation, as verl keeps response_mask.
- ``darl``: the replay buffer over K versions with every `replay.*` key of the trainers (`k`, `pmis`, `order`,
  `ratio`, `m2_budget`, `behavior_clip`, `prompt_replay`, ...). Per-prompt replay is off here unless a
  configuration sets it; run_study's `darl` sets it as the preset does.

Choices of the testbed (docs/evidence.md, "The testbed"):

- One optimizer update per step over `minibatches` mini-batches (default 1, as in verl's GRPO example);
  with a single mini-batch PPO's ratio is 1 for `decoupled`/`darl`, so their clipping
  only fires with `minibatches > 1`, exactly as in verl.
- The first s steps sample from version 0 (staleness grows from 0 to s).
- Rollout log-probs are computed by a teacher-forced forward of the sampling weights (the engine's
  numbers without engine numerics), so s = 0 makes `naive` and `decoupled` bitwise identical.
- Wall time counts generation and training, not evaluation.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from recipe.darl.core import ClipSettings, Group, LossInputs, ReplayConfig, ReplayStep, StepPlan, sample_chi2

METHODS = ("naive", "decoupled", "icepop", "darl")
TASKS = ("arithmetic", "scarce", "chains")


def example_settings(task: str):
    """The built-in example a task trains: the chains example for `chains`, the arithmetic one otherwise."""
    from recipe.darl.example.build import SETTINGS

    return SETTINGS["chains" if task == "chains" else "arithmetic"]


def task_module(task: str):
    """The module that writes a task's prompts and answers (`prompt_text`, `answer`)."""
    from recipe.darl.example import arithmetic, chains

    return chains if task == "chains" else arithmetic


@dataclass
class HarnessConfig:
    """One run. Defaults: verl's GRPO example settings (32 prompts x 8, T = 1, <= 32 tokens, Adam 1e-4)."""

    method: str = "darl"
    staleness: int = 1
    seed: int = 0
    steps: int = 300
    prompts_per_step: int = 32
    n: int = 8
    temperature: float = 1.0
    max_response_tokens: Optional[int] = None  # None: the task's example's (32 tokens; chains 64)
    lr: float = 1e-4
    grad_clip: float = 1.0  # verl's actor.grad_clip
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float = 3.0  # verl's dual clip
    threshold: float = 2.0  # rollout_is_threshold C (decoupled, darl)
    icepop_low: float = 0.5  # icepop: verl's decoupled_token_icepop defaults
    icepop_high: float = 5.0
    minibatches: int = 1  # optimizer mini-batches per pass
    epochs: int = 1  # passes over the step's batch (verl's ppo_epochs); 2 with decoupled: the equal-update baseline
    # D-ARL (method "darl"); the defaults are the `_pmis_sg` launch configuration's, with per-prompt replay off
    k: int = 4
    warmup: int = 5
    pmis: bool = True
    order: Optional[str] = None  # newest/least_reused; None follows pmis
    ratio: Any = None  # additive replay: replayed groups per fresh budget; False: fixed budget; None follows pmis
    m2_budget: Any = None  # second-moment gate; False: off; None follows pmis
    behavior_clip: Any = None  # trust region around the behavior policy; False: off; None follows pmis
    behavior_clip_high: Any = None  # its eps for A > 0; False: unbounded; None follows pmis
    behavior_weight: Optional[str] = None  # own/pmis; None follows pmis
    # ess/tokens, always recorded: runs archived before the preset moved to tokens (2026-12-02) hold null, which
    # then meant ess under pmis (benchmarks/staleness/names.py, ran_source_weight)
    source_weight: str = "tokens"
    filter_zero_adv: bool = True
    max_reuse: Any = None
    clip_decay: float = 1.0
    stop_grad: bool = True
    # data and evaluation
    reward: str = "arithmetic"  # arithmetic (verifier) or digits (dense: share of digits, for tests)
    # arithmetic: fresh 2-3 digit sums; scarce: a fixed pool of hard sums, revisited; chains: fresh chains of four
    # terms worked line by line, on the chains example's own 2.3M-parameter model (recipe/darl/example/chains.py)
    task: str = "arithmetic"
    pool_size: int = 256  # the scarce task's prompt pool
    # replay.prompt_replay: responses kept per prompt (per-prompt replay); False: off. Off here unless a configuration
    # sets it (run_study's `darl` sets 16, as the trainers' preset resolves it)
    prompt_replay: Any = False
    prompt_replay_max_age: Optional[int] = None  # replay.prompt_replay_max_age: steps a stored response stays usable
    eval_every: int = 20  # steps; 0: only at the start and the end
    val_size: int = 500
    eval_batch_size: int = 256
    model_dir: Optional[str] = None  # None: the cached example model (recipe.darl.example.build)
    label: Optional[str] = None  # a name for tables; default derived from the settings

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")
        if self.reward not in ("arithmetic", "digits"):
            raise ValueError(f"reward must be 'arithmetic' or 'digits', got {self.reward!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.max_response_tokens is None:
            self.max_response_tokens = example_settings(self.task).max_response_tokens
        if self.prompts_per_step % self.minibatches:
            raise ValueError("prompts_per_step must divide by minibatches")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.method == "darl":
            self.replay_config()  # validates the replay keys with the trainer's own checks

    def replay_config(self) -> ReplayConfig:
        return ReplayConfig(enable=True, k=self.k, pmis=self.pmis, warmup=self.warmup,
                            filter_zero_adv=self.filter_zero_adv, max_reuse=self.max_reuse,
                            behavior_weight=self.behavior_weight, source_weight=self.source_weight,
                            clip_decay=self.clip_decay, stop_grad=self.stop_grad, order=self.order,
                            ratio=self.ratio, m2_budget=self.m2_budget, behavior_clip=self.behavior_clip,
                            behavior_clip_high=self.behavior_clip_high, prompt_replay=self.prompt_replay,
                            prompt_replay_max_age=self.prompt_replay_max_age)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.method != "darl":
            return self.method
        rc = self.replay_config()
        parts = [f"darl_k{self.k}", rc.resolved("order"), rc.resolved_behavior_weight, rc.resolved_source_weight]
        for key in ("ratio", "m2_budget", "behavior_clip", "max_reuse"):
            if rc.resolved(key) is not None:
                parts.append(f"{key}{rc.resolved(key):g}")
        bclip = rc.behavior_clip_range()
        if bclip is not None and bclip[1] != bclip[0]:
            parts.append(f"high{bclip[1]:g}")
        if self.prompt_replay:
            parts.append(f"prompt{self.prompt_replay}"
                         + (f"age{self.prompt_replay_max_age}" if self.prompt_replay_max_age is not None else ""))
        if not self.filter_zero_adv:
            parts.append("keep0adv")
        if not self.stop_grad:
            parts.append("grad")
        return "-".join(parts)


def preset_overrides(name: str) -> dict[str, Any]:
    """`HarnessConfig` keys of the named configuration, read from the file the trainers select with `preset=name`
    (recipe/darl/config/preset/<name>.yaml); "staleness": 0 where it holds the rollouter on-policy (`sync`)."""
    from recipe.darl.config import presets

    values = presets.load(name)
    replay, corr = values["replay"], values["algorithm"]["rollout_correction"]
    out: dict[str, Any] = {"epochs": int(values["actor_rollout_ref"]["actor"]["ppo_epochs"])}
    if name == presets.ON_POLICY:
        out["staleness"] = 0
    threshold = corr["rollout_is_threshold"]
    if corr["bypass_mode"]:
        out["method"] = "naive"
    elif isinstance(threshold, str):  # verl's "low_high" bounds: IcePop
        low, high = (float(x) for x in threshold.split("_"))
        out.update(method="icepop", icepop_low=low, icepop_high=high)
    else:
        out.update(method="darl" if replay["enable"] else "decoupled", threshold=float(threshold))
    if replay["enable"]:
        if out["method"] != "darl":
            raise ValueError(f"preset {name}: replay needs recomputed old log-probs and a float C")
        harness_keys = {f.name for f in dataclasses.fields(HarnessConfig)}
        out.update({key: value for key, value in replay.items() if key in harness_keys and key != "enable"})
    return out


# ---- data ------------------------------------------------------------------------------------

def split_problems(config: HarnessConfig) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(train, val). Task "arithmetic": the example's RL-train problems, and `val_size` problems outside
    every set the example used (warm-start, train, val), so validation is held out from all training.
    Task "scarce": a fixed pool of `pool_size` hard problems revisited for epochs, and `val_size` held-out
    hard problems (`recipe.darl.example.build.problem_splits`). Task "chains": the chains example's 2,048 RL-train
    chains, read once in a 50-step run of 32 prompts, and `val_size` chains outside its every set (`chain_splits`)."""
    from recipe.darl.example.build import chain_splits, problem_splits

    if config.task == "chains":
        splits = chain_splits(example_settings("chains"), val_size=config.val_size)
        return splits["train"], splits["heldout"]
    splits = problem_splits(val_size=config.val_size, scarce_pool=config.pool_size)
    if config.task == "scarce":
        return splits["scarce_train"], splits["scarce_val"]
    return splits["train"], splits["heldout"]


# ---- the harness -----------------------------------------------------------------------------

class TensorPlane:
    """The harness's data plane (`recipe.darl.core.DataPlane`): the trained groups as one padded batch, pi_old by the
    harness's forward (naive: the rollout log-probs, no recompute)."""

    def __init__(self, harness: "Harness") -> None:
        self.harness = harness
        self.batch: dict[str, torch.Tensor] = {}

    def old_log_probs(self, plan: StepPlan) -> torch.Tensor:
        self.batch = self.harness.batch_of(plan.trained)
        return self.batch["rollout_log_probs"] if self.harness.config.method == "naive" else \
            self.harness.recompute(self.batch)

    def loss_layout(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, mask = self.harness.config, self.batch["response_mask"]
        # whole groups per mini-batch; a smaller selection (fewer groups than a mini-batch) is one mini-batch
        return mask, self.batch["rollout_log_probs"], (torch.arange(mask.shape[0]) // cfg.n) // (
            cfg.prompts_per_step // cfg.minibatches)

    def put_loss_inputs(self, plan: StepPlan, inputs: LossInputs) -> None:
        pass  # `Harness.update` takes them from the step's state


class Harness:
    """One run: `step()` does one RL step and returns its metrics; `run()` the whole schedule."""

    def __init__(self, config: HarnessConfig, log: Callable[[str], None] = lambda _: None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.log = log
        model_dir = config.model_dir
        if model_dir is None:
            from recipe.darl.example.build import build_example
            model_dir = build_example(settings=example_settings(config.task), log=log).model
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        torch.manual_seed(config.seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.train()
        self.rollout_model = copy.deepcopy(self.model)  # holds the snapshot rollouts are sampled from
        self.rollout_model.eval()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id

        self.task = task_module(config.task)
        self.train_problems, self.val_problems = split_problems(config)
        order = list(range(len(self.train_problems)))
        random.Random(config.seed).shuffle(order)
        self.order, self.cursor = order, 0
        self.prompt_cache: dict[tuple[int, ...], list[int]] = {}

        self.version = 0  # weights version: updates done so far
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {0: self._state()}
        self.replay = ReplayStep(config.replay_config() if config.method == "darl" else None)
        self.samples = 0
        self.wall = 0.0  # generation + training seconds, evaluation excluded
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []

    # ---- weights and sampling ----

    def _state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def _prompt_ids(self, problem: tuple[int, ...]) -> list[int]:
        if problem not in self.prompt_cache:
            from recipe.darl.example.warm_start import encode_prompts
            self.prompt_cache[problem] = encode_prompts(self.tokenizer, [problem], self.task)[0]
        return self.prompt_cache[problem]

    def _next_problems(self) -> list[tuple[int, ...]]:
        out = []
        for _ in range(self.config.prompts_per_step):
            out.append(self.train_problems[self.order[self.cursor % len(self.order)]])
            self.cursor += 1
        return out

    def _score(self, text: str, problem: tuple[int, ...]) -> float:
        if self.config.reward == "digits":  # dense test reward: the long-tail example's share of digit characters
            from recipe.darl.example.longtail import compute_score as digit_share
            return digit_share("", text, "")
        from recipe.darl.example.arithmetic import compute_score
        return compute_score(self.task.DATA_SOURCE, text, str(self.task.answer(*problem)))

    def token_log_probs(self, model, prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                        response_attention: torch.Tensor) -> torch.Tensor:
        """[B, L] log-probs of the response tokens at temperature T (teacher-forced; what verl's
        compute_log_prob returns, and what a rollout engine returns for its own samples)."""
        attention = torch.cat([prompt_mask, response_attention], dim=1)
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        ids = torch.cat([prompts, responses], dim=1)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=position_ids).logits
        width_p, width_r = prompts.shape[1], responses.shape[1]
        logits = logits[:, width_p - 1:width_p - 1 + width_r].float() / self.config.temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def generate(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """P x n samples from the weights of version max(0, step - s), packed into groups."""
        cfg = self.config
        version = max(0, step - cfg.staleness)
        self.rollout_model.load_state_dict(self.snapshots[version])
        problems = self._next_problems()
        prompt_lists = [self._prompt_ids(p) for p in problems]
        width_p = max(map(len, prompt_lists))
        prompts = torch.full((len(problems), width_p), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompts)
        for i, p in enumerate(prompt_lists):
            prompts[i, width_p - len(p):] = torch.tensor(p)
            prompt_mask[i, width_p - len(p):] = 1
        prompts = prompts.repeat_interleave(cfg.n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(cfg.n, dim=0)
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # the same seed and step draw the same samples
        out = self.rollout_model.generate(
            input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=cfg.max_response_tokens, do_sample=True,
            temperature=cfg.temperature, top_k=0, top_p=1.0, eos_token_id=self.eos_id, pad_token_id=self.pad_id)
        responses = out[:, width_p:]
        width_r = responses.shape[1]
        # the response runs to its first eos, included; later positions are padding
        is_eos = responses == self.eos_id
        first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full((responses.shape[0],), width_r))
        attention_r = (torch.arange(width_r).unsqueeze(0) < first.unsqueeze(1)).long()
        responses = torch.where(attention_r.bool(), responses, self.pad_id)
        rollout_lp = self.token_log_probs(self.rollout_model, prompts, prompt_mask, responses, attention_r)
        rollout_lp = torch.where(attention_r.bool(), rollout_lp, 0.0)
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        rewards = torch.tensor([self._score(t, problems[i // cfg.n]) for i, t in enumerate(texts)])

        groups = []
        for g, problem in enumerate(problems):
            rows = slice(g * cfg.n, (g + 1) * cfg.n)
            groups.append(Group.from_padded(
                uid=f"s{step}-g{g}", version=version, prompt_ids=prompts[g * cfg.n],
                prompt_length=len(prompt_lists[g]), responses=responses[rows], response_lengths=first[rows],
                response_mask=attention_r[rows], rollout_log_probs=rollout_lp[rows], rewards=rewards[rows],
                non_tensors={"problem": np.array(["+".join(map(str, problem)).replace("+-", "-")] * cfg.n,
                                                 dtype=object)}))
        self.samples += len(texts)
        return groups, {"reward_mean": float(rewards.mean()), "response_length": float(first.float().mean()),
                        "fresh_version": float(version)}

    # ---- batches ----

    def batch_of(self, groups: list[Group]) -> dict[str, torch.Tensor]:
        """Groups -> verl's padded layout (prompts left-padded, responses right-padded)."""
        width_p = max(g.prompt_ids.shape[0] for g in groups)
        width_r = max(int(g.lengths.max()) for g in groups)
        prompts, prompt_mask = [], []
        for g in groups:
            p = torch.full((width_p,), self.pad_id, dtype=torch.long)
            p[width_p - g.prompt_ids.shape[0]:] = g.prompt_ids.long()
            m = torch.zeros(width_p, dtype=torch.long)
            m[width_p - g.prompt_ids.shape[0]:] = 1
            prompts.append(p.expand(g.n, -1))
            prompt_mask.append(m.expand(g.n, -1))
        lengths = torch.cat([g.lengths for g in groups]).long()
        return {
            "prompts": torch.cat(prompts),
            "prompt_mask": torch.cat(prompt_mask),
            "responses": torch.cat([g.padded("response_ids", width_r, self.pad_id) for g in groups]).long(),
            "response_attention": (torch.arange(width_r).unsqueeze(0) < lengths.unsqueeze(1)).long(),
            "response_mask": torch.cat([g.padded("response_mask", width_r) for g in groups]).bool(),
            "rollout_log_probs": torch.cat([g.padded("rollout_log_probs", width_r) for g in groups]),
            "versions": torch.cat([g.versions for g in groups]),
            "rewards": torch.cat([g.rewards for g in groups]),
            "lengths": lengths,
            "uids": np.concatenate([np.array([g.uid] * g.n, dtype=object) for g in groups]),  # GRPO's index
        }

    @torch.no_grad()
    def recompute(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """log pi_old: the current weights' log-probs (verl's old_log_prob forward)."""
        self.model.eval()
        lp = self.token_log_probs(self.model, batch["prompts"], batch["prompt_mask"], batch["responses"],
                                  batch["response_attention"])
        self.model.train()
        return torch.where(batch["response_mask"], lp, 0.0)

    def advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """GRPO outcome advantages with verl's own function (std-normalized, eps 1e-6)."""
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        mask = batch["response_mask"]
        scores = torch.zeros(mask.shape)
        scores[torch.arange(mask.shape[0]), (batch["lengths"] - 1).clamp(min=0)] = batch["rewards"]
        adv, _ = compute_grpo_outcome_advantage(scores, mask.float(), batch["uids"], epsilon=1e-6,
                                                norm_adv_by_std_in_grpo=True)
        return adv

    # ---- the step ----

    def step(self) -> dict[str, Any]:
        cfg = self.config
        t = self.version  # the step's index = the current weights' version (pi_old's version)
        t0 = time.perf_counter()
        fresh, m = self.generate(t)
        t_gen = time.perf_counter() - t0

        t1 = time.perf_counter()
        m.update(step=t, samples=self.samples)
        plane = TensorPlane(self)
        state = self.replay.begin(plane, fresh, t, cfg.prompts_per_step, cfg.prompts_per_step // cfg.minibatches, 1,
                                  ClipSettings(cfg.threshold, cfg.clip_low, cfg.clip_high))
        plan = state.plan
        if plan.cands is not None:
            m.update(candidates=len(plan.cands.candidates), dropped_zero_adv=plan.cands.dropped_zero_adv,
                     history_groups=len(plan.cands.history), warmup=float(plan.cands.warmup))
        if plan.trained:
            m.update(self.update(plane.batch, state.old_log_probs, plan, state.inputs, state.minibatch))
        else:
            m.update(loss=None, skipped=True)
        self.replay.end(state)
        buffer = self.replay.buffer
        if buffer is not None:
            stats = buffer.stats()
            m["buffer_groups"] = stats["groups"]
            m["buffer_versions"] = len(stats["groups_per_version"])
            if buffer.prompts is not None:  # the per-prompt store's size (driver memory)
                m["history_responses"], m["history_bytes"] = stats["history_responses"], stats["history_bytes"]
        t_train = time.perf_counter() - t1

        self.version += 1
        self.snapshots[self.version] = self._state()
        for v in [v for v in self.snapshots if v < self.version - cfg.staleness]:
            del self.snapshots[v]
        self.wall += t_gen + t_train
        m.update(time_gen=t_gen, time_train=t_train, wall=self.wall)
        self.history.append(m)
        return m

    def update(self, batch: dict[str, torch.Tensor], old: torch.Tensor, plan: StepPlan, inputs: LossInputs,
               mb_index: torch.Tensor) -> dict[str, Any]:
        """The actor update on the plan's trained groups: `epochs` passes over `minibatches` mini-batches
        (mb_index: [N] each sample's)."""
        cfg = self.config
        groups, step = plan.trained, plan.version
        mask = batch["response_mask"]
        rollout = batch["rollout_log_probs"]
        weights = inputs.weights
        threshold = cfg.threshold
        if cfg.method == "icepop":
            weights.token_coef = icepop_coef(weights.token_coef, old, rollout, mask, cfg.icepop_low, cfg.icepop_high)
            threshold = cfg.icepop_high  # no truncation inside the bounds
        adv = self.advantages(batch)
        # mismatch of the trained batch; naive's pi_old is mu (0 by construction), so it is measured below
        chi2 = None if cfg.method == "naive" else sample_chi2(old, rollout, mask)

        losses, norms, clipped, kept, bclipped = [], [], 0, 0, 0
        passes = [mb for _ in range(cfg.epochs) for mb in range(int(mb_index.max()) + 1)]
        for mb in passes:
            rows = (mb_index == mb).nonzero().squeeze(-1)
            lp = self.token_log_probs(self.model, batch["prompts"][rows], batch["prompt_mask"][rows],
                                      batch["responses"][rows], batch["response_attention"][rows])
            if cfg.method == "naive" and mb == 0:
                # pi_old is not recomputed; for the metric only, the mismatch of the current weights
                chi2 = sample_chi2(torch.where(mask[rows], lp.detach(), 0.0), rollout[rows], mask[rows])
            loss, stats = self.replay.loss(lp, old[rows], adv[rows], mask[rows], inputs, rows, threshold,
                                           clip_ratio_c=cfg.clip_ratio_c)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            if torch.isfinite(norm):
                self.optimizer.step()
            losses.append(float(loss.detach()))
            norms.append(float(norm))
            clipped += int(stats["clipped"].sum())
            kept += int(stats["keep"].sum())
            bclipped += int(stats["behavior_clipped"].sum())
        present = weights.tokens > 0
        ess_frac = float((weights.ess[present] / weights.tokens[present]).mean()) if present.any() else float("nan")
        return {
            "loss": float(np.mean(losses)),
            "grad_norm": float(np.mean(norms)),
            "clip_fraction": clipped / max(kept, 1),
            "chi2_trained": _finite_mean(chi2),
            "ess_fraction": ess_frac,
            "truncated_fraction": weights.truncated_fraction,
            "m2_gated_fraction": weights.metrics["m2_gated_fraction"],
            "behavior_clip_fraction": bclipped / max(kept, 1),
            "updates": len(passes),
            "trained_groups": len(groups),
            "trained_staleness": float(torch.cat([step - g.versions for g in groups]).float().mean()),
            "trained_reuse": float(np.mean([g.times_trained for g in groups])),  # earlier updates on the same groups
            # share of trained groups whose pmis denominator mixes in another behavior version (0: pmis == own)
            "pmis_mixed_fraction": float(np.mean([any(j != g.version and j in weights.sources for j in g.recorded)
                                                  for g in groups])),
            "trained_versions": len(weights.sources),
            "skipped": False,
        }

    # ---- evaluation and the schedule ----

    def evaluate(self) -> dict[str, Any]:
        from recipe.darl.example.warm_start import greedy_accuracy

        t0 = time.perf_counter()
        acc = greedy_accuracy(self.model, self.tokenizer, self.val_problems,
                              max_new_tokens=self.config.max_response_tokens, batch_size=self.config.eval_batch_size,
                              task=self.task)
        point = {"step": self.version, "samples": self.samples, "wall": self.wall, "accuracy": acc,
                 "eval_s": time.perf_counter() - t0}
        self.evals.append(point)
        return point

    def run(self) -> dict[str, Any]:
        cfg = self.config
        self.evaluate()
        for _ in range(cfg.steps):
            m = self.step()
            if cfg.eval_every and self.version % cfg.eval_every == 0 and self.version < cfg.steps:
                p = self.evaluate()
                self.log(f"[{cfg.name} s={cfg.staleness} seed={cfg.seed}] step {self.version}: acc {p['accuracy']:.3f} "
                         f"reward {m['reward_mean']:.3f} wall {self.wall:.0f}s")
        self.evaluate()
        accs = [e["accuracy"] for e in self.evals]
        return {
            "name": cfg.name,
            "config": dataclasses.asdict(cfg),
            "evals": self.evals,
            "steps": self.history,
            "final_accuracy": accs[-1],
            "best_accuracy": max(accs),
            "initial_accuracy": accs[0],
            "samples": self.samples,
            "wall": self.wall,
            "step_time_mean": self.wall / max(len(self.history), 1),
        }


def icepop_coef(token_coef: torch.Tensor, old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor,
                low: float, high: float) -> torch.Tensor:
    """[B, L] token coefficients with 0 where verl's token IcePop weight pi_old / mu is 0 (outside [low, high])."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    verl_w, _ = compute_rollout_correction_weights(old - rollout, mask.float(), "token", f"{low}_{high}")
    return torch.where(verl_w > 0, token_coef, 0.0)


def _finite_mean(x: torch.Tensor) -> float:
    x = x[torch.isfinite(x)]
    return float(x.double().mean()) if x.numel() else float("nan")


def run(config: HarnessConfig, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """One run, single-threaded; returns the curves and the per-step metrics (JSON-serializable)."""
    torch.set_num_threads(1)
    return Harness(config, log=log).run()
