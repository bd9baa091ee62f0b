"""The built-in example task: verifier, determinism, disjoint splits, and verl's dataset reading the parquet."""

import pytest
from omegaconf import OmegaConf

from recipe.darl.data.prepare import write_parquet
from recipe.darl.example.arithmetic import compute_score, make_problems, records, solution_text
from recipe.darl.example.tiny_model import build_tiny_model


@pytest.mark.parametrize(
    "response,expected",
    [
        (solution_text(47, 385), 1.0),
        ("47+385=432 \\boxed{431}", 0.0),
        ("the answer is 432", 0.0),  # no box
        ("\\boxed{43", 0.0),  # unclosed
        ("\\boxed{}", 0.0),
        ("\\boxed{4x2}", 0.0),
        ("\\boxed{100} then \\boxed{432}", 1.0),  # the last box counts
    ],
)
def test_verifier(response, expected):
    assert compute_score("darl/arithmetic", response, "432") == expected


def test_problems_are_deterministic_and_distinct():
    a, b = make_problems(500, seed=3), make_problems(500, seed=3)
    assert a == b and len(set(a)) == 500
    assert all(10 <= x <= 999 and 10 <= y <= 999 for x, y in a)
    assert make_problems(500, seed=4) != a


def test_parquet_loads_in_verl_rl_dataset(tmp_path):
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    model = build_tiny_model(tmp_path / "model")
    path = write_parquet(records(make_problems(8, seed=0), "train"), tmp_path / "train.parquet")
    tokenizer = hf_tokenizer(model)
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 64, "truncation": "error",
                               "filter_overlong_prompts": False, "return_raw_chat": False})
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config)
    assert len(dataset) == 8
    item = dataset[0]
    a, b = item["extra_info"]["a"], item["extra_info"]["b"]
    assert item["reward_model"]["ground_truth"] == str(a + b)
    # the agent loop applies the chat template to raw_prompt; the character tokenizer round-trips it
    text = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
    assert text == f"<|im_start|>user\nAdd. Answer in \\boxed{{}}.\n{a}+{b}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
