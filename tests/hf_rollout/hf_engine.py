"""Token-in, token-out generation with a transformers causal LM: sampling, log-probs, a KV-cached batch.

Pure PyTorch, no Ray and no verl: the Ray server actor (`hf_server.py`) drives it from one worker thread.

A `Cohort` is a set of requests prefilled together (prompts left-padded to a common length) that then
decode in lock step, one token per row per `step`, with the KV cache of transformers' `DynamicCache`.
Finished (or aborted) rows are dropped from the cache, so a cohort only computes for live rows.

Sampling follows vLLM's order (`vllm/v1/sample/sampler.py`): repetition penalty on the raw logits, then
temperature, then top-k, then top-p, then a draw from the softmax of what is left. Temperature below
1e-5 is greedy: argmax of the (penalised) logits, with no temperature, top-k or top-p.

Which log-prob is returned for each sampled token (`logprobs_mode`, the rollout config key verl already
has for vLLM):

- ``processed_logprobs`` (verl's default): what vLLM returns in that mode, the log-probability under
  the distribution the token was actually drawn from: log_softmax over the temperature-scaled logits
  after top-k/top-p filtering (renormalised over the kept tokens); for greedy rows log_softmax of the
  unscaled logits. With top_k=-1 and top_p=1 this is log_softmax(logits / T), what verl's actor
  computes when it recomputes old log-probs.
- ``temperature_logprobs`` (not a vLLM mode): log_softmax(logits / T) over the whole vocabulary,
  before top-k/top-p, i.e. the trainer's quantity even when top-k/top-p are active.
- ``raw_logprobs`` (vLLM's own default): log_softmax of the unscaled, unpenalised logits.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterable, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

SAMPLING_EPS = 1e-5  # vLLM's: temperature below this is greedy
LOGPROBS_MODES = ("processed_logprobs", "temperature_logprobs", "raw_logprobs")

# sampling parameters that are accepted and have no effect here (vLLM names)
_IGNORED_PARAMS = {"logprobs", "prompt_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
                   "include_stop_str_in_output", "output_kind", "extra_args", "n"}
_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "min_tokens": 0}


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    """Sampling parameters of one request, resolved and validated."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1  # <= 0: off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: Optional[int] = None
    logprobs: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def resolve_sampling(
    params: dict[str, Any],
    prompt_len: int,
    *,
    response_length: int,
    prompt_length: int,
    max_model_len: int,
    ignore_eos: bool = False,
    repetition_penalty: float = 1.0,
) -> SamplingSpec:
    """A `SamplingSpec` from the sampling-params dict verl's agent loop sends (vLLM names).

    max_tokens: ``max_tokens`` (or SGLang's ``max_new_tokens``) when given, else
    min(response_length, prompt_length + response_length - len(prompt)), as verl's vLLM server does;
    then clamped to [1, max_model_len - len(prompt)].
    """
    params = dict(params)
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(f"prompt of {prompt_len} tokens leaves no room within max_model_len={max_model_len}")
    if "max_tokens" in params:
        max_tokens = params.pop("max_tokens")
    elif "max_new_tokens" in params:
        max_tokens = params.pop("max_new_tokens")
    else:
        max_tokens = min(response_length, prompt_length + response_length - prompt_len)
    max_tokens = max(1, min(int(max_tokens), room))

    top_k = params.pop("top_k", -1)
    top_k = -1 if top_k is None or int(top_k) <= 0 else int(top_k)
    top_p = params.pop("top_p", 1.0)
    top_p = 1.0 if top_p is None else float(top_p)
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    temperature = params.pop("temperature", 1.0)
    temperature = 1.0 if temperature is None else float(temperature)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    rep = params.pop("repetition_penalty", None)
    rep = float(repetition_penalty if rep is None else rep)
    if rep <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {rep}")
    stop = params.pop("stop_token_ids", None) or ()
    seed = params.pop("seed", None)
    want_logprobs = params.pop("logprobs", None)  # vLLM: None/absent = no log-probs, 0 = the sampled token's
    spec = SamplingSpec(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=rep,
        ignore_eos=bool(params.pop("ignore_eos", ignore_eos)),
        stop_token_ids=tuple(int(t) for t in stop),
        seed=None if seed is None else int(seed),
        logprobs=want_logprobs is not None and want_logprobs is not False,
    )
    for key, neutral in _NEUTRAL.items():
        value = params.pop(key, None)
        if value is not None and value != neutral:
            raise NotImplementedError(f"the hf rollout does not implement sampling param {key}={value!r}")
    for key in _IGNORED_PARAMS:
        params.pop(key, None)
    if params.get("stop"):
        raise NotImplementedError("the hf rollout does not implement stop strings; use stop_token_ids")
    params.pop("stop", None)
    if params:
        logger.warning("hf rollout: ignoring unknown sampling params %s", sorted(params))
    return spec


@dataclasses.dataclass
class RowResult:
    """A row that left its cohort: the generated tokens, their log-probs, why it stopped."""

    key: Any
    token_ids: list[int]
    log_probs: list[float]
    stop_reason: str  # "completed" or "aborted"


class _Row:
    __slots__ = ("key", "prompt", "spec", "tokens", "log_probs", "generator", "stop_ids")

    def __init__(self, key, prompt: list[int], spec: SamplingSpec, eos_ids: frozenset[int]):
        self.key = key
        self.prompt = prompt
        self.spec = spec
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.generator = torch.Generator().manual_seed(spec.seed) if spec.seed is not None else None
        self.stop_ids = frozenset(spec.stop_token_ids) | (frozenset() if spec.ignore_eos else eos_ids)


class Cohort:
    """Requests decoding together: the live rows, their KV cache and the logits of their next token."""

    def __init__(self, rows: list[_Row], cache, attention_mask: torch.Tensor, last_position: torch.Tensor,
                 next_logits: torch.Tensor):
        self.rows = rows
        self.cache = cache
        self.attention_mask = attention_mask
        self.last_position = last_position
        self.next_logits = next_logits

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def keys(self) -> list[Any]:
        return [row.key for row in self.rows]

    def _keep(self, keep: list[int]) -> None:
        if len(keep) == len(self.rows):
            return
        if keep:
            index = torch.tensor(keep, dtype=torch.long)
            self.cache.batch_select_indices(index)
            self.attention_mask = self.attention_mask[index]
            self.last_position = self.last_position[index]
            self.next_logits = self.next_logits[index]
        else:
            self.cache = None
        self.rows = [self.rows[i] for i in keep]


class HFGenerator:
    """Batched sampling with a transformers causal LM (`model` in eval mode, on CPU or any device)."""

    def __init__(self, model: torch.nn.Module, eos_token_ids: Iterable[int], pad_token_id: int = 0,
                 logprobs_mode: str = "processed_logprobs", seed: int = 0):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.model = model
        self.eos_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.logprobs_mode = logprobs_mode
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ model calls

    @torch.no_grad()
    def prefill(self, requests: Sequence[tuple[Any, list[int], SamplingSpec]]) -> Cohort:
        """Start a cohort: `requests` are (key, prompt_ids, spec); prompts are left-padded together."""
        from transformers import DynamicCache

        if not requests:
            raise ValueError("prefill needs at least one request")
        rows = [_Row(key, list(prompt), spec, self.eos_ids) for key, prompt, spec in requests]
        if any(not row.prompt for row in rows):
            raise ValueError("empty prompt")
        length = max(len(row.prompt) for row in rows)
        device = self.device
        input_ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, length - len(row.prompt):] = torch.tensor(row.prompt, dtype=torch.long)
            attention_mask[i, length - len(row.prompt):] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
            position_ids=position_ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1,
        )
        return Cohort(rows, out.past_key_values, attention_mask.to(device), position_ids[:, -1].to(device),
                      out.logits[:, -1].float())

    @torch.no_grad()
    def step(self, cohort: Cohort) -> list[RowResult]:
        """Sample one token for every live row, then run the model on the rows still going.

        Returns the rows that finished at this step (EOS/stop token or max_tokens reached).
        """
        if not cohort.rows:
            return []
        tokens, log_probs = self.sample(cohort.next_logits, cohort.rows)
        tokens_list, log_probs_list = tokens.tolist(), log_probs.tolist()
        finished, keep = [], []
        for i, row in enumerate(cohort.rows):
            token = tokens_list[i]
            row.tokens.append(token)
            if row.spec.logprobs:
                row.log_probs.append(log_probs_list[i])
            if token in row.stop_ids or len(row.tokens) >= row.spec.max_tokens:
                finished.append(RowResult(row.key, row.tokens, row.log_probs, "completed"))
            else:
                keep.append(i)
        if keep:
            next_tokens = tokens[keep] if len(keep) < len(cohort.rows) else tokens
            cohort._keep(keep)
            device = self.device
            cohort.attention_mask = torch.cat(
                [cohort.attention_mask, torch.ones((len(keep), 1), dtype=cohort.attention_mask.dtype, device=device)],
                dim=1,
            )
            cohort.last_position = cohort.last_position + 1
            out = self.model(
                input_ids=next_tokens.unsqueeze(1).to(device), attention_mask=cohort.attention_mask,
                position_ids=cohort.last_position.unsqueeze(1), past_key_values=cohort.cache, use_cache=True,
            )
            cohort.cache = out.past_key_values
            cohort.next_logits = out.logits[:, -1].float()
        else:
            cohort._keep([])
        return finished

    def remove(self, cohort: Cohort, keys: Iterable[Any]) -> list[RowResult]:
        """Take rows out of a cohort (abort): what they generated so far, stop_reason "aborted"."""
        keys = set(keys)
        removed = [RowResult(row.key, row.tokens, row.log_probs, "aborted") for row in cohort.rows if row.key in keys]
        if removed:
            cohort._keep([i for i, row in enumerate(cohort.rows) if row.key not in keys])
        return removed

    # ------------------------------------------------------------------ sampling

    def sample(self, logits: torch.Tensor, rows: Sequence[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row from `logits` [B, V] (float32) and its log-prob (see `logprobs_mode`)."""
        logits = logits.float()
        raw = logits
        specs = [row.spec for row in rows]
        device = logits.device

        # repetition penalty (vLLM/HF rule) over prompt and generated tokens
        if any(spec.repetition_penalty != 1.0 for spec in specs):
            logits = logits.clone()
            for i, row in enumerate(rows):
                penalty = row.spec.repetition_penalty
                if penalty == 1.0:
                    continue
                seen = torch.tensor(sorted(set(row.prompt) | set(row.tokens)), dtype=torch.long, device=device)
                values = logits[i, seen]
                logits[i, seen] = torch.where(values > 0, values / penalty, values * penalty)

        greedy = torch.tensor([spec.greedy for spec in specs], device=device)
        temperature = torch.tensor([1.0 if spec.greedy else spec.temperature for spec in specs],
                                   dtype=torch.float32, device=device)
        scaled = logits / temperature.unsqueeze(1)
        filtered = self._top_k_top_p(scaled, specs)
        processed = torch.log_softmax(filtered, dim=-1)

        tokens = torch.empty(len(rows), dtype=torch.long, device=device)
        greedy_tokens = logits.argmax(dim=-1)
        random_rows = [i for i, spec in enumerate(specs) if not spec.greedy]
        if random_rows:
            probs = processed.exp()
            shared = [i for i in random_rows if rows[i].generator is None]
            if shared:
                drawn = torch.multinomial(probs[shared], 1, generator=self.generator).squeeze(1)
                tokens[shared] = drawn
            for i in random_rows:
                if rows[i].generator is not None:
                    tokens[i] = torch.multinomial(probs[i], 1, generator=rows[i].generator)[0]
        tokens = torch.where(greedy, greedy_tokens, tokens)

        if self.logprobs_mode == "processed_logprobs":
            source = torch.where(greedy.unsqueeze(1), torch.log_softmax(logits, dim=-1), processed)
        elif self.logprobs_mode == "temperature_logprobs":
            source = torch.log_softmax(scaled, dim=-1)
        else:  # raw_logprobs
            source = torch.log_softmax(raw, dim=-1)
        log_probs = source.gather(1, tokens.unsqueeze(1)).squeeze(1)
        return tokens, log_probs

    @staticmethod
    def _top_k_top_p(scaled: torch.Tensor, specs: Sequence[SamplingSpec]) -> torch.Tensor:
        """Mask (to -inf) what top-k, then top-p, removes; rows without either are returned as they are."""
        vocab = scaled.shape[-1]
        top_k = [spec.top_k if 0 < spec.top_k < vocab and not spec.greedy else vocab for spec in specs]
        top_p = [spec.top_p if not spec.greedy else 1.0 for spec in specs]
        if all(k == vocab for k in top_k) and all(p >= 1.0 for p in top_p):
            return scaled
        device = scaled.device
        sorted_logits, sorted_index = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        k = torch.tensor(top_k, device=device).unsqueeze(1)
        remove_sorted = ranks >= k  # top-k: keep the k largest
        sorted_logits = sorted_logits.masked_fill(remove_sorted, float("-inf"))
        p = torch.tensor(top_p, dtype=torch.float32, device=device).unsqueeze(1)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
        remove_sorted = remove_sorted | ((mass_before >= p) & (p < 1.0))  # top-p: the smallest set reaching p
        remove_sorted[:, 0] = False  # always keep the most likely token
        remove = torch.zeros_like(remove_sorted).scatter(1, sorted_index, remove_sorted)
        return scaled.masked_fill(remove, float("-inf"))

    # ------------------------------------------------------------------ weights and scoring

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy full tensors into the model's parameters/buffers by their Hugging Face names.

        Names of parameters tied to another (e.g. ``lm_head.weight`` with tied embeddings) land on the
        shared tensor. Returns the number of tensors copied; an unknown name raises KeyError.
        """
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(dict(self.model.named_buffers(remove_duplicate=False)))
        count = 0
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                raise KeyError(f"hf rollout: the model has no parameter or buffer named {name!r}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"hf rollout: {name} has shape {tuple(target.shape)}, received {tuple(tensor.shape)}")
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            count += 1
        return count

    @torch.no_grad()
    def score(self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Teacher-forced log_softmax(logits / T) of each response token given the prompt and earlier tokens."""
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
        temperature = 1.0 if temperature < SAMPLING_EPS else temperature
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        index = torch.tensor(response_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        return log_probs.gather(1, index).squeeze(1).tolist()
