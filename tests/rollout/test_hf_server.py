"""The hf rollout server (tests/hf_rollout/hf_server.py) driven in process under asyncio, without Ray.

The same class runs as the Ray actor; here its async methods are awaited directly: batching of concurrent
requests, abort, the admission gate, version stamps, weight loading, EOS from the tokenizer.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from hf_rollout.hf_server import HFRolloutServer

PROMPT = [5, 17, 40, 9, 61, 22]
TOL = 1e-5


_LOOP = asyncio.new_event_loop()  # one loop for the module, as a Ray actor has one for its life
_SERVERS = []


def arun(coro):
    return _LOOP.run_until_complete(coro)


def make_server(path, **overrides):
    from verl.workers.config import HFModelConfig, RolloutConfig

    options = dict(name="hf", tensor_model_parallel_size=1, prompt_length=24, response_length=12, dtype="float32",
                   load_format="auto", calculate_log_probs=True)
    options.update(overrides)
    server = HFRolloutServer(RolloutConfig(**options), HFModelConfig(path=path), replica_rank=0)
    _SERVERS.append(server)
    return server


@pytest.fixture(scope="module", autouse=True)
def _shutdown_servers():
    yield
    for server in _SERVERS:
        arun(server.shutdown())
    _LOOP.close()


@pytest.fixture(scope="module")
def server(tiny_model_path):
    torch.set_num_threads(1)
    return make_server(tiny_model_path)


def test_ready_reports_config(server):
    info = arun(server.ready())
    assert info["dtype"] == "torch.float32" and info["eos_token_ids"] == [2]  # <|im_end|>
    assert info["logprobs_mode"] == "processed_logprobs" and info["global_steps"] is None


def test_concurrent_requests_are_batched_and_equal_sequential(server, teacher_forced):
    prompts = [PROMPT[: 2 + i] + [70 + i] for i in range(6)]
    greedy = {"temperature": 0.0, "logprobs": True, "ignore_eos": True}

    async def go():
        before = dict(server.stats)
        together = await asyncio.gather(*[server.generate(p, dict(greedy), f"c{i}") for i, p in enumerate(prompts)])
        cohorts = server.stats["cohorts"] - before["cohorts"]
        alone = [await server.generate(p, dict(greedy), f"s{i}") for i, p in enumerate(prompts)]
        return together, alone, cohorts, server.stats["max_cohort_size"]

    together, alone, cohorts, largest = arun(go())
    assert cohorts == 1 and largest == len(prompts)  # all six in one batch
    for prompt, a, b in zip(prompts, together, alone):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 12  # response_length
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=TOL, rtol=0)
        logits = teacher_forced(prompt, a.token_ids)
        assert a.token_ids == logits.argmax(-1).tolist()
        assert a.stop_reason == "completed"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_teacher_forced(server, teacher_forced, temperature):
    async def go():
        return await asyncio.gather(*[server.generate(PROMPT[: 3 + i], {"temperature": temperature, "logprobs": True,
                                                                         "ignore_eos": True}, f"t{i}")
                                      for i in range(3)])

    for i, out in enumerate(arun(go())):
        logits = teacher_forced(PROMPT[: 3 + i], out.token_ids) / temperature
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=TOL, rtol=0)


def test_max_tokens_default_and_explicit(server):
    long_prompt = list(range(4, 24))  # 20 tokens: room for prompt_length + response_length - 20 = 16 > 12
    longer = list(range(4, 34))  # 30 tokens: 24 + 12 - 30 = 6
    greedy = {"temperature": 0.0, "ignore_eos": True}

    async def go():
        return await asyncio.gather(server.generate(long_prompt, dict(greedy), "a"),
                                    server.generate(longer, dict(greedy), "b"),
                                    server.generate(PROMPT, {**greedy, "max_tokens": 3}, "c"),
                                    server.generate(PROMPT, {**greedy, "logprobs": False}, "d"))

    a, b, c, d = arun(go())
    assert (len(a.token_ids), len(b.token_ids), len(c.token_ids)) == (12, 6, 3)
    assert a.log_probs is None and d.log_probs is None  # log-probs only when asked for (calculate_log_probs)
    assert c.log_probs is None


def test_eos_from_the_tokenizer_stops(tiny_model_path):
    """<|im_end|> (id 2, the tokenizer's and generation config's EOS) ends a response, EOS included."""
    server = make_server(tiny_model_path)
    greedy = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 12}
    free = arun(server.generate(PROMPT, dict(greedy), "free")).token_ids
    # copy the lm_head row of a token greedy picks first at step k > 0 into EOS's row: the logits tie, and
    # argmax takes the lower id, so greedy decoding now emits EOS at step k
    k = next(i for i in range(1, 12) if free[i] not in free[:i] and free[i] > 2 and 2 not in free[: i + 1])
    head = server.generator.model.lm_head.weight.detach().clone()
    head[2] = head[free[k]]

    async def go():
        await server.begin_weight_update()
        await server.load_weights([("lm_head.weight", head)])
        await server.finish_weight_update(global_steps=7)
        eos = await server.generate(PROMPT, {"temperature": 0.0, "logprobs": True}, "e")
        ignored = await server.generate(PROMPT, dict(greedy), "i")
        return eos, ignored

    eos, ignored = arun(go())
    assert eos.token_ids == free[:k] + [2] and eos.stop_reason == "completed" and len(eos.log_probs) == k + 1
    assert eos.extra_fields["global_steps"] == 7
    assert len(ignored.token_ids) == 12 and ignored.token_ids[k] == 2


def test_abort_returns_partial_output_and_gates_new_requests(tiny_model_path):
    server = make_server(tiny_model_path, response_length=3000, prompt_length=16)

    async def go():
        running = [asyncio.create_task(server.generate(PROMPT, {"temperature": 1.0, "logprobs": True,
                                                                 "ignore_eos": True}, f"long{i}"))
                   for i in range(2)]
        while server.stats["cohorts"] == 0 or not server._cohorts or len(server._cohorts[0][0].rows[0].tokens) < 5:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        info = await server.abort_all_requests()
        abort_s = time.monotonic() - started
        outs = await asyncio.gather(*running)

        # gate closed: a new request waits until resume_generation
        parked = asyncio.create_task(server.generate(PROMPT, {"temperature": 0.0, "max_tokens": 2}, "parked"))
        await asyncio.sleep(0.2)
        was_parked = not parked.done()
        await server.resume_generation()
        after = await parked

        # reject_request=True: arrivals behind the closed gate come back at once as aborted
        await server.abort_all_requests(reject_request=True)
        rejected = await asyncio.wait_for(server.generate(PROMPT, {"max_tokens": 2}, "rej"), timeout=5)
        await server.resume_generation()
        return info, abort_s, outs, was_parked, after, rejected

    info, abort_s, outs, was_parked, after, rejected = arun(go())
    assert info["aborted_count"] == 2 and sorted(info["request_ids"]) == ["long0", "long1"]
    assert abort_s < 5
    for out in outs:
        assert out.stop_reason == "aborted"
        assert 5 <= len(out.token_ids) < 3000 and len(out.log_probs) == len(out.token_ids)
    assert was_parked and after.stop_reason == "completed" and len(after.token_ids) == 2
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []


def test_abort_one_request(tiny_model_path):
    server = make_server(tiny_model_path, response_length=2000, prompt_length=16)

    async def go():
        long = asyncio.create_task(server.generate(PROMPT, {"ignore_eos": True}, "long"))
        short = asyncio.create_task(server.generate(PROMPT, {"ignore_eos": True, "max_tokens": 20}, "short"))
        await asyncio.sleep(0.3)
        result = await server.abort_request("long")
        return result, await long, await short

    result, long, short = arun(go())
    assert result["aborted"] and long.stop_reason == "aborted" and len(long.token_ids) < 2000
    assert short.stop_reason == "completed" and len(short.token_ids) == 20


def test_control_calls_and_version_stamps(server):
    async def go():
        for call in (server.wake_up(), server.sleep(), server.clear_kv_cache(), server.release_kv_cache(),
                     server.resume_kv_cache(), server.start_profile(), server.stop_profile(),
                     server.resume_generation()):
            assert await call is None
        await server.set_global_steps(3)
        out = await server.generate(PROMPT, {"max_tokens": 2}, "v")
        info = await server.abort_all_requests()  # nothing running
        await server.resume_generation()
        return out, info

    out, info = arun(go())
    assert out.extra_fields == {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3}
    assert info == {"aborted_count": 0, "request_ids": []}


def test_dummy_load_format_and_engine_kwargs(tiny_model_path, reference_model):
    server = make_server(tiny_model_path, load_format="dummy", engine_kwargs={"hf": {"batch_wait_ms": 1.0}})
    # random weights until the first sync; loading the real ones makes it equal to the checkpoint
    assert not torch.equal(server.generator.model.lm_head.weight, reference_model.lm_head.weight)
    arun(server.load_weights(list(reference_model.state_dict().items())))
    arun(server.finish_weight_update(global_steps=1))
    for name, p in server.generator.model.state_dict().items():
        assert torch.equal(p, reference_model.state_dict()[name]), name
    with pytest.raises(ValueError):
        make_server(tiny_model_path, engine_kwargs={"hf": {"no_such_option": 1}})
