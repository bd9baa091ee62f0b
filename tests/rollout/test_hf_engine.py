"""The hf rollout's generation engine (tests/hf_rollout/hf_engine.py), in process, no Ray.

Every generated sequence is checked against a teacher-forced forward of the same weights (a separately
loaded copy of the tiny model): greedy tokens are the argmax, log-probs are log_softmax(logits / T).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_rollout.hf_engine import HFGenerator, SamplingSpec, resolve_sampling

PROMPTS = [[5, 17, 40, 9], [60, 3, 22, 81, 14, 35, 7, 90, 41, 12, 66], [30, 31], [44, 8, 19, 70, 23, 55, 61]]
TOL = 1e-5


@pytest.fixture(scope="module")
def model(tiny_model_path):
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


def make(model, mode="processed_logprobs", eos=(2,), seed=0):
    return HFGenerator(model, eos_token_ids=eos, pad_token_id=0, logprobs_mode=mode, seed=seed)


def run(gen, prompts, specs):
    """Generate every prompt in one cohort; results in prompt order: (tokens, log_probs, stop_reason)."""
    if isinstance(specs, SamplingSpec):
        specs = [specs] * len(prompts)
    cohort = gen.prefill([(i, p, s) for i, (p, s) in enumerate(zip(prompts, specs))])
    results = {}
    while len(cohort):
        for r in gen.step(cohort):
            results[r.key] = (r.token_ids, r.log_probs, r.stop_reason)
    return [results[i] for i in range(len(prompts))]


def test_greedy_is_teacher_forced_argmax(model, teacher_forced):
    spec = SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True)
    for prompt, (tokens, log_probs, reason) in zip(PROMPTS, run(make(model), PROMPTS, spec)):
        logits = teacher_forced(prompt, tokens)
        assert tokens == logits.argmax(-1).tolist()
        # greedy: vLLM's processed log-probs are of the unscaled logits
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(log_probs), expected, atol=TOL, rtol=0)
        assert reason == "completed" and len(tokens) == 12


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_log_probs_match_teacher_forced(model, teacher_forced, temperature):
    spec = SamplingSpec(max_tokens=16, temperature=temperature, ignore_eos=True)
    results = run(make(model, seed=3), PROMPTS, spec)
    worst = 0.0
    for prompt, (tokens, log_probs, _) in zip(PROMPTS, results):
        logits = teacher_forced(prompt, tokens)
        expected = torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
        worst = max(worst, (torch.tensor(log_probs) - expected).abs().max().item())
    assert worst < TOL, worst
    # sampled, not greedy: some token is not the argmax
    greedy = run(make(model), PROMPTS, SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert [r[0] for r in results] != [g[0] for g in greedy]


def test_top_k_1_is_greedy(model):
    greedy = run(make(model), PROMPTS, SamplingSpec(max_tokens=10, temperature=0.0, ignore_eos=True))
    top1 = run(make(model, seed=11), PROMPTS, SamplingSpec(max_tokens=10, temperature=1.0, top_k=1, ignore_eos=True))
    assert [r[0] for r in top1] == [g[0] for g in greedy]
    # the sampling distribution is a point mass: processed log-prob 0
    assert all(abs(lp) < TOL for r in top1 for lp in r[1])


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (-1, 0.3), (8, 0.5)])
def test_top_k_top_p_log_prob_modes(model, teacher_forced, top_k, top_p):
    """processed_logprobs (vLLM in verl): renormalised over the kept tokens; temperature_logprobs: full vocab."""
    temperature = 0.8
    spec = SamplingSpec(max_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p, ignore_eos=True, seed=5)
    processed = run(make(model, "processed_logprobs"), PROMPTS, spec)
    full = run(make(model, "temperature_logprobs"), PROMPTS, spec)
    raw = run(make(model, "raw_logprobs"), PROMPTS, spec)
    for prompt, p, f, r in zip(PROMPTS, processed, full, raw):
        assert p[0] == f[0] == r[0]  # per-request seed: same tokens whatever the log-prob mode
        tokens = torch.tensor(p[0])
        scaled = teacher_forced(prompt, p[0]) / temperature
        # the kept set, computed independently: top-k, then the smallest top set with mass >= top_p
        kept = torch.zeros_like(scaled, dtype=torch.bool)
        for t in range(len(tokens)):
            order = scaled[t].argsort(descending=True)
            k = top_k if top_k > 0 else scaled.shape[-1]
            probs = torch.softmax(scaled[t, order[:k]], -1)
            n = int((probs.cumsum(-1) - probs < top_p).sum())
            kept[t, order[:n]] = True
        assert kept.gather(1, tokens[:, None]).all(), "sampled a token top-k/top-p removed"
        renorm = torch.log_softmax(scaled.masked_fill(~kept, float("-inf")), -1).gather(1, tokens[:, None]).squeeze(1)
        whole = torch.log_softmax(scaled, -1).gather(1, tokens[:, None]).squeeze(1)
        unscaled = torch.log_softmax(scaled * temperature, -1).gather(1, tokens[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(p[1]), renorm, atol=TOL, rtol=0)
        assert torch.allclose(torch.tensor(f[1]), whole, atol=TOL, rtol=0)
        assert torch.allclose(torch.tensor(r[1]), unscaled, atol=TOL, rtol=0)


def test_batched_equals_one_at_a_time_greedy(model):
    spec = SamplingSpec(max_tokens=14, temperature=0.0, ignore_eos=True)
    together = run(make(model), PROMPTS, spec)
    for prompt, (tokens, log_probs, _) in zip(PROMPTS, together):
        alone_tokens, alone_lp, _ = run(make(model), [prompt], spec)[0]
        assert alone_tokens == tokens
        assert torch.allclose(torch.tensor(alone_lp), torch.tensor(log_probs), atol=TOL, rtol=0)


def test_rows_with_different_lengths_and_params_in_one_cohort(model, teacher_forced):
    specs = [SamplingSpec(max_tokens=3, temperature=0.0, ignore_eos=True),
             SamplingSpec(max_tokens=9, temperature=0.7, ignore_eos=True, seed=1),
             SamplingSpec(max_tokens=1, temperature=1.0, ignore_eos=True, seed=2),
             SamplingSpec(max_tokens=6, temperature=1.3, ignore_eos=True, seed=3, logprobs=False)]
    results = run(make(model), PROMPTS, specs)
    assert [len(r[0]) for r in results] == [3, 9, 1, 6]
    assert results[3][1] == []
    for prompt, spec, (tokens, log_probs, _) in zip(PROMPTS[:3], specs, results):
        t = spec.temperature if spec.temperature > 0 else 1.0
        expected = torch.log_softmax(teacher_forced(prompt, tokens) / t, -1).gather(1, torch.tensor(tokens)[:, None])
        assert torch.allclose(torch.tensor(log_probs), expected.squeeze(1), atol=TOL, rtol=0)


def test_seed_gives_the_same_tokens_in_any_batch(model):
    spec = SamplingSpec(max_tokens=10, temperature=1.0, ignore_eos=True, seed=42)
    alone = run(make(model, seed=1), [PROMPTS[1]], spec)[0][0]
    batched = run(make(model, seed=2), PROMPTS, [SamplingSpec(max_tokens=10, temperature=1.0, ignore_eos=True)] * 1
                  + [spec] + [SamplingSpec(max_tokens=10, temperature=1.0, ignore_eos=True)] * 2)[1][0]
    assert alone == batched


def test_eos_and_stop_tokens_stop_generation(model):
    # a greedy token that first appears after position 0 is made the EOS token: generation stops there
    for prompt in PROMPTS:
        free = run(make(model), [prompt], SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True))[0][0]
        stop_at = next((i for i in range(1, 12) if free[i] not in free[:i]), None)
        if stop_at is not None:
            break
    assert stop_at is not None, "every greedy continuation repeats its first token"
    eos = free[stop_at]
    tokens, log_probs, reason = run(make(model, eos=(eos,)), [prompt], SamplingSpec(max_tokens=12, temperature=0.0))[0]
    assert tokens == free[: stop_at + 1] and len(log_probs) == len(tokens) and reason == "completed"
    # ignore_eos keeps going; a stop token id of the request stops as well
    assert run(make(model, eos=(eos,)), [prompt], SamplingSpec(max_tokens=12, temperature=0.0,
                                                                ignore_eos=True))[0][0] == free
    tokens = run(make(model), [prompt], SamplingSpec(max_tokens=12, temperature=0.0, stop_token_ids=(eos,)))[0][0]
    assert tokens == free[: stop_at + 1]


def test_remove_aborts_rows_mid_generation(model):
    gen = make(model)
    spec = SamplingSpec(max_tokens=50, temperature=0.0, ignore_eos=True)
    cohort = gen.prefill([(i, p, spec) for i, p in enumerate(PROMPTS)])
    for _ in range(5):
        assert gen.step(cohort) == []
    removed = gen.remove(cohort, [1, 3])
    assert [(r.key, len(r.token_ids), r.stop_reason) for r in removed] == [(1, 5, "aborted"), (3, 5, "aborted")]
    while len(cohort):
        done = gen.step(cohort)
    full = run(make(model), PROMPTS, spec)
    assert {r.key: r.token_ids for r in done} == {0: full[0][0], 2: full[2][0]}  # the others were unaffected
    assert removed[0].token_ids == full[1][0][:5]


def test_resolve_sampling_max_tokens_and_validation():
    common = dict(response_length=16, prompt_length=32, max_model_len=60)
    assert resolve_sampling({}, 10, **common).max_tokens == 16  # min(16, 32 + 16 - 10)
    assert resolve_sampling({}, 40, **common).max_tokens == 8  # min(16, 48 - 40)
    assert resolve_sampling({"max_tokens": 5}, 10, **common).max_tokens == 5
    assert resolve_sampling({"max_new_tokens": 7}, 10, **common).max_tokens == 7
    assert resolve_sampling({"max_tokens": 500}, 10, **common).max_tokens == 50  # room left in max_model_len
    assert resolve_sampling({"max_tokens": 0}, 10, **common).max_tokens == 1
    spec = resolve_sampling({"temperature": 0, "top_k": 0, "top_p": 1.0, "logprobs": False, "repetition_penalty": 1.0},
                            3, **common)
    assert spec.greedy and spec.top_k == -1 and not spec.logprobs
    assert resolve_sampling({"logprobs": 0}, 3, **common).logprobs  # vLLM: 0 = the sampled token's log-prob
    assert not resolve_sampling({}, 3, **common).logprobs
    with pytest.raises(ValueError):
        resolve_sampling({}, 60, **common)  # no room at all
    with pytest.raises(ValueError):
        resolve_sampling({"top_p": 0.0}, 3, **common)
    with pytest.raises(NotImplementedError):
        resolve_sampling({"presence_penalty": 0.5}, 3, **common)


def test_load_weights_by_name(model, tiny_model_path, teacher_forced):
    other = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    gen = make(other)
    with torch.no_grad():
        new = {name: p + 0.01 * torch.randn_like(p) for name, p in model.named_parameters()}
    assert gen.load_weights(new.items()) == len(new)
    for name, p in other.named_parameters():
        assert torch.equal(p, new[name])
    with pytest.raises(KeyError):
        gen.load_weights([("no.such.weight", torch.zeros(1))])
    # scoring: teacher-forced log-probs at a temperature
    tokens = [4, 9, 33]
    expected = torch.log_softmax(teacher_forced(PROMPTS[0], tokens, model=other) / 0.5, -1)
    expected = expected.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(gen.score(PROMPTS[0], tokens, 0.5)), expected, atol=TOL, rtol=0)
