"""Bad rows refused before Ray, each named by file, row and field (recipe/darl/checks/data_check.py)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from recipe.darl.data.prepare import write_parquet
from recipe.darl.example.arithmetic import make_problems, records
from recipe.darl.checks.data_check import data_problems

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CharTokenizer:
    """A template of 3 characters around the joined message contents; one token per character."""

    def apply_chat_template(self, conversations, add_generation_prompt=True, tokenize=False, **kw):
        assert not tokenize and add_generation_prompt
        return ["<" + "".join(m["content"] for m in conv) + ">:" for conv in conversations]

    def __call__(self, texts, add_special_tokens=True):
        assert not add_special_tokens
        return {"input_ids": [list(t) for t in texts]}


def _cfg(train, val, **data):
    return OmegaConf.create({"data": {"train_files": str(train), "val_files": str(val), "prompt_key": "prompt",
                                      "max_prompt_length": 64, "filter_overlong_prompts": False, **data},
                             "actor_rollout_ref": {"model": {"path": "/nonexistent"}}, "faults": {"check_data": True}})


@pytest.fixture
def rows():
    return records(make_problems(12, seed=3), "train")


def test_clean_data_has_no_problem(tmp_path, rows):
    train = write_parquet(rows, tmp_path / "train.parquet")
    longest = max(3 + len(r["prompt"][0]["content"]) for r in rows)
    assert data_problems(_cfg(train, train, max_prompt_length=longest), lambda cfg: CharTokenizer()) == ([], [])


def test_each_bad_row_is_named_by_file_row_and_field(tmp_path, rows):
    bad = copy.deepcopy(rows)
    bad[2]["reward_model"] = {"style": "rule"}  # no ground_truth
    bad[5]["reward_model"]["ground_truth"] = "  "
    bad[7]["prompt"] = [{"role": "user", "content": ""}]
    bad[8]["prompt"] = []
    bad[10]["prompt"] = [{"role": "user", "content": "x" * 100}]  # 103 "tokens" > 64
    train = write_parquet(bad, tmp_path / "train.parquet")
    val = write_parquet(rows, tmp_path / "val.parquet")
    problems, lines = data_problems(_cfg(train, val), lambda cfg: CharTokenizer())
    assert problems == [
        f"data.train_files: {train}: field 'prompt' is empty in rows 7, 8 (of 12)",
        f"data.train_files: {train}: field 'reward_model.ground_truth' is missing or empty in rows 2, 5 (of 12)",
        f"data.train_files: {train}: field 'prompt' is longer than data.max_prompt_length=64 tokens (up to 103) in "
        "row 10 (of 12); verl would cut the prompts' beginning. Set data.filter_overlong_prompts=true to drop them, "
        "or raise data.max_prompt_length",
    ]
    assert lines == []


def test_long_prompts_are_verls_to_drop_when_the_filter_is_on(tmp_path, rows):
    rows[0]["prompt"] = [{"role": "user", "content": "x" * 100}]
    train = write_parquet(rows, tmp_path / "train.parquet")

    def no_tokenizer(cfg):
        raise AssertionError("not needed")

    assert data_problems(_cfg(train, train, filter_overlong_prompts=True), no_tokenizer) == ([], [])


def test_missing_columns_and_many_rows(tmp_path, rows):
    import pandas as pd

    path = tmp_path / "plain.parquet"
    pd.DataFrame({"question": ["a"] * 3}).to_parquet(path)
    problems, _ = data_problems(_cfg(path, path, filter_overlong_prompts=True))
    assert f"data.train_files: {path} has no column 'prompt' (data.prompt_key)" in problems
    assert any("has no column 'reward_model'" in p for p in problems)
    for r in rows:
        r["reward_model"]["ground_truth"] = None
    train = write_parquet(rows, tmp_path / "train.parquet")
    problems, _ = data_problems(_cfg(train, train, filter_overlong_prompts=True))
    assert problems[0].endswith("field 'reward_model.ground_truth' is missing or empty in rows 0, 1, 2, 3, 4 and 7 more (of 12)")


def test_the_check_can_be_switched_off_and_skips_what_it_cannot_read(tmp_path, rows):
    empty = tmp_path / "empty.parquet"
    empty.touch()
    problems, lines = data_problems(_cfg(empty, empty))
    assert problems == [] and "not checked: it cannot be read as parquet" in lines[0]
    bad = write_parquet([{**rows[0], "prompt": []}], tmp_path / "bad.parquet")
    cfg = _cfg(bad, bad)
    cfg.faults.check_data = False
    assert data_problems(cfg) == ([], [])


def test_the_real_tokenizer_counts_the_chat_template(tmp_path, rows):
    """The example's tokenizer through `load_tokenizer`: a prompt of n characters is more than n tokens with the
    template, so a max_prompt_length equal to the content length is exceeded."""
    from recipe.darl.example.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0, hidden_size=64)
    train = write_parquet(rows[:3], tmp_path / "train.parquet")
    cfg = _cfg(train, train, max_prompt_length=len(rows[0]["prompt"][0]["content"]))
    cfg.actor_rollout_ref.model.path = str(model)
    problems, _ = data_problems(cfg)
    assert len(problems) == 2 and "is longer than data.max_prompt_length" in problems[0]  # train and val


def test_the_entry_point_refuses_bad_data_before_ray(tmp_path, rows):
    """main_one_step_off's dry run (no Ray): the data problem is in the ConfigError, with the row and field."""
    from recipe.darl.example.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0, hidden_size=64)
    rows[4]["reward_model"] = {"style": "rule"}
    train = write_parquet(rows, tmp_path / "train.parquet")
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", DARL_DRY_RUN="1", VERL_PLATFORM="cpu")
    done = subprocess.run(
        [sys.executable, "-m", "recipe.darl.main_one_step_off", "actor_rollout_ref.rollout.name=hf", f"actor_rollout_ref.model.path={model}",
         f"data.train_files={train}", f"data.val_files={train}", "trainer.device=cpu", "trainer.logger=[console]"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"field 'reward_model.ground_truth' is missing or empty in row 4 (of 12)" in done.stderr
    assert "Started a local Ray instance" not in done.stdout + done.stderr
