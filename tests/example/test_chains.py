"""The chains example (the second testbed): problems, worked solutions, the verifier, its splits, its shipped model
and the harness training on it."""

import itertools
import json

import pytest

from recipe.darl.example import build, chains
from recipe.darl.example.arithmetic import compute_score
from recipe.darl.example.build import ChainsSettings, ExampleSettings, chain_splits, sha256, shipped_weights


def test_a_worked_chain_by_hand():
    assert chains.expression(47, 385, -129, 64) == "47+385-129+64"
    assert chains.solution_text(47, 385, -129, 64) == "47+385=432\n432-129=303\n303+64=367\n\\boxed{367}"
    assert chains.prompt_text(47, 385, -129, 64).endswith("\n47+385-129+64")
    assert compute_score(chains.DATA_SOURCE, chains.solution_text(47, 385, -129, 64), "367") == 1.0
    # the right answer after a wrong line still scores 1 (the reward reads the box), a wrong box 0
    assert compute_score(chains.DATA_SOURCE, "47+385=431\n\\boxed{367}", "367") == 1.0
    assert compute_score(chains.DATA_SOURCE, "47+385=432\n432-129=303\n303+64=366\n\\boxed{366}", "367") == 0.0


def test_problems_are_deterministic_distinct_and_never_negative():
    problems = chains.make_problems(2000, seed=3)
    assert problems == chains.make_problems(2000, seed=3) != chains.make_problems(2000, seed=4)
    assert len(set(problems)) == 2000 and all(len(p) == chains.TERMS for p in problems)
    assert all(10 <= abs(t) <= 999 for p in problems for t in p) and all(p[0] > 0 for p in problems)
    assert all(0 <= total <= 9999 for p in problems for total in itertools.accumulate(p))
    assert 0.3 < sum(t < 0 for p in problems for t in p[1:]) / (3 * len(problems)) < 0.5  # subtractions happen


def test_every_solution_fits_the_response_length():
    """The longest worked solution of the example's problems, with the end-of-turn token, fits in
    MAX_RESPONSE_TOKENS of the character tokenizer: twice the arithmetic example's 32."""
    from recipe.darl.example.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    splits = chain_splits()
    longest = max((p for split in splits.values() for p in split), key=lambda p: len(chains.solution_text(*p)))
    ids = tokenizer(chains.solution_text(*longest) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    assert len(ids) <= chains.MAX_RESPONSE_TOKENS == 2 * ExampleSettings().max_response_tokens
    assert len(ids) > ExampleSettings().max_response_tokens  # it would not fit the arithmetic example's length


def test_splits_are_disjoint_and_the_training_set_is_read_once_in_a_run():
    splits = chain_splits(val_size=500)
    assert [len(splits[k]) for k in ("sft", "train", "val", "heldout")] == [20000, 2048, 256, 500]
    seen = [set(v) for v in splits.values()]
    assert sum(map(len, seen)) == len(set().union(*seen))
    assert 50 * 32 <= len(splits["train"])  # 50 steps of 32 prompts never revisit a prompt: a fresh-data task
    rows = chains.records(splits["val"][:3], "test")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [str(sum(p)) for p in splits["val"][:3]]


def test_the_shipped_model_is_four_times_the_arithmetic_one_and_matches_its_sha256():
    from transformers import AutoConfig

    folder, base = shipped_weights(ChainsSettings()), shipped_weights(ExampleSettings())
    assert folder is not None and folder.name == "chains-s0-h272"
    meta = json.loads((folder / "example.json").read_text())
    assert set(meta["sha256"]) == set(build.model_files(folder)) and "model.safetensors.index.json" in meta["sha256"]
    assert all((folder / name).stat().st_size < 5 * 2**20 for name in meta["sha256"])  # shards: small files
    assert all(sha256(folder / name) == digest for name, digest in meta["sha256"].items())
    assert meta["settings"]["max_response_tokens"] == 64 and 0.0 < meta["warm_start"]["accuracy"] < 1.0

    def parameters(cfg) -> int:
        h, L, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
        kv = cfg.num_key_value_heads * cfg.head_dim
        layer = 2 * h * h + 2 * h * kv + 3 * h * cfg.intermediate_size + 2 * h + 2 * cfg.head_dim
        return 2 * v * h + L * layer + h

    ratio = parameters(AutoConfig.from_pretrained(folder)) / parameters(AutoConfig.from_pretrained(base))
    assert ratio >= 4.0, ratio


@pytest.fixture(scope="module")
def chains_model(tmp_path_factory):
    return build.build_example(tmp_path_factory.mktemp("cache"), ChainsSettings(), log=lambda _: None)


def test_the_example_builds_from_the_shipped_weights(chains_model):
    root = build.Path(chains_model.root)
    assert json.loads((root / "example.json").read_text())["weights"] == "shipped"
    shipped = shipped_weights(ChainsSettings())
    assert all(sha256(root / "model" / name) == sha256(shipped / name) for name in build.model_files(shipped))
    import pyarrow.parquet as pq

    rows = pq.read_table(root / "val.parquet").to_pylist()
    assert rows[0]["data_source"] == chains.DATA_SOURCE and len(rows) == ChainsSettings().val_prompts


def test_the_harness_trains_on_chains_with_64_token_responses(chains_model):
    """Two steps of the preset on the chains task with the shipped model: responses up to 64 tokens, rewards from
    the verifier, and the warm-started model right on some samples (the testbed is neither hopeless nor solved)."""
    from benchmarks.staleness.harness import Harness, HarnessConfig, preset_overrides

    cfg = HarnessConfig(**{**preset_overrides("darl_tokens_e2"), "staleness": 1, "seed": 0, "steps": 2,
                           "prompts_per_step": 8, "minibatches": 2, "task": "chains", "val_size": 16,
                           "eval_every": 0, "model_dir": chains_model.model})
    assert cfg.max_response_tokens == 64
    h = Harness(cfg)
    assert h.train_problems == chain_splits()["train"] and h.val_problems == chain_splits(val_size=16)["heldout"]
    metrics = [h.step() for _ in range(2)]
    assert all(0.0 < m["reward_mean"] < 1.0 for m in metrics), metrics
    assert all(m["response_length"] > 32 for m in metrics), metrics  # mean tokens: longer than arithmetic's limit
