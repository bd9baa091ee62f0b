"""Score a checkpoint on any subset of the six benchmarks.

    python -m recipe.darl.eval --model CKPT --benchmarks gsm8k,math500,aime24,humaneval \\
        --data-dir ~/data --k 8 --temperature 0.6 --top-p 0.95 --out results/my_run

CKPT is a Hugging Face folder or a verl checkpoint, merged first (`resolve_model`). Per benchmark, scored with the
training reward: pass@1 (greedy), avg@k (mean correctness of k samples) and pass@k (at least one of k correct).
Backends, checkpoints and outputs: docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from .example.build import sha256

# benchmark name (data: <--data-dir>/<name>/test.parquet) -> shown name
BENCHMARKS = {"gsm8k": "GSM8K", "math": "MATH (LightEval)", "math500": "MATH-500", "aime24": "AIME24",
              "livecodebench": "LiveCodeBench", "humaneval": "HumanEval"}
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


@dataclass
class Sampling:
    k: int = 4
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 2048
    max_prompt_length: int = 2048
    greedy: bool = True
    seed: int = 0
    enable_thinking: bool = False


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(any(folder.glob(p)) for p in WEIGHT_PATTERNS)


def resolve_model(path: str, merged_dir: Optional[str] = None, python: str = sys.executable) -> tuple[str, str]:
    """(a Hugging Face folder to load, what `path` was: "hf" | "verl-fsdp"), merging a verl checkpoint if needed."""
    p = Path(os.path.expanduser(path))
    if not p.exists():
        return path, "hf"  # a hub id; transformers / vLLM resolve it
    if _has_weights(p):
        return str(p), "hf"
    tracker = p / "latest_checkpointed_iteration.txt"
    if tracker.exists():
        p = p / f"global_step_{int(tracker.read_text().strip())}"
    if (p / "actor").is_dir():
        p = p / "actor"
    if not (p / "fsdp_config.json").exists():
        raise SystemExit(f"{path}: neither a Hugging Face model folder (config.json + weights) nor a verl FSDP checkpoint "
                         f"(fsdp_config.json + model_world_size_*_rank_*.pt)")
    if _has_weights(p / "huggingface"):  # saved with checkpoint.save_contents including hf_model
        return str(p / "huggingface"), "verl-fsdp"
    target = Path(os.path.expanduser(merged_dir)) if merged_dir else p / "huggingface_merged"
    if not _has_weights(target):
        cmd = [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(p), "--target_dir", str(target)]
        print("merging the verl checkpoint:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return str(target), "verl-fsdp"


class TransformersBackend:
    name = "transformers"

    def __init__(self, model_dir: str, tokenizer, batch_size: int = 8, dtype: str = "auto"):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        auto = torch.bfloat16 if self.device == "cuda" else torch.float32
        torch_dtype = auto if dtype == "auto" else getattr(torch, dtype)  # float32 | bfloat16 | float16
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> list[list[str]]:
        torch = self.torch
        tok = self.tokenizer
        if tok.pad_token_id is None:  # left padding with eos, as generate does without a pad token
            tok.pad_token = tok.eos_token
        greedy = temperature <= 0
        out: list[list[str]] = []
        torch.manual_seed(seed)
        for start in range(0, len(prompt_ids), self.batch_size):
            chunk = prompt_ids[start : start + self.batch_size]
            inputs = tok.pad({"input_ids": chunk}, padding=True, padding_side="left", return_tensors="pt")
            kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, num_return_sequences=n, do_sample=not greedy)
            if not greedy:
                kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
            with torch.no_grad():
                seqs = self.model.generate(**inputs.to(self.device), **kwargs)
            texts = tok.batch_decode(seqs[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
            out += [texts[i * n : (i + 1) * n] for i in range(len(chunk))]
        return out


class VLLMBackend:
    name = "vllm"

    def __init__(self, model_dir: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85,
                 max_model_len: Optional[int] = None, seed: int = 0):
        from vllm import LLM

        self.llm = LLM(model=model_dir, tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, seed=seed)

    def generate(self, prompt_ids: list[list[int]], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> list[list[str]]:
        from vllm import SamplingParams

        greedy = temperature <= 0
        params = SamplingParams(n=n, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                                max_tokens=max_new_tokens, seed=seed)
        results = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params)
        return [[o.text for o in r.outputs] for r in results]


def make_backend(choice: str, model_dir: str, tokenizer, args) -> object:
    if choice == "auto":
        import importlib.util

        import torch

        choice = "vllm" if importlib.util.find_spec("vllm") and torch.cuda.is_available() else "transformers"
    if choice == "vllm":
        return VLLMBackend(model_dir, args.tensor_parallel_size, args.gpu_memory_utilization,
                           args.max_prompt_length + args.max_new_tokens, args.seed)
    return TransformersBackend(model_dir, tokenizer, batch_size=args.batch_size, dtype=args.dtype)


def load_problems(path: str, limit: Optional[int] = None) -> list[dict]:
    import pandas as pd

    rows = pd.read_parquet(path).to_dict(orient="records")
    return rows[:limit] if limit else rows


def encode_prompts(tokenizer, problems: list[dict], sampling: Sampling) -> list[list[int]]:
    ids = []
    for p in problems:
        messages = [dict(m) for m in p["prompt"]]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             enable_thinking=sampling.enable_thinking)
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.append(tokens[-sampling.max_prompt_length:])  # keep the end (the question and the generation prompt)
    return ids


def score_all(problems: list[dict], responses: list[list[str]], workers: int) -> list[list[float]]:
    """Scores every response with the training reward, in threads (code tests run in child processes)."""
    from .rewards import compute_score

    def one(p: dict, text: str) -> float:
        extra_info = dict(p.get("extra_info") or {})
        return float(compute_score(p["data_source"], text, p["reward_model"]["ground_truth"], extra_info))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [[pool.submit(one, p, text) for text in texts] for p, texts in zip(problems, responses)]
    return [[f.result() for f in fs] for fs in futures]


def summarize(greedy: Optional[list[list[float]]], sampled: list[list[float]], k: int) -> dict:
    n = len(sampled)
    result = {"n": n,
              f"avg@{k}": sum(sum(s) / len(s) for s in sampled) / n if n else 0.0,
              f"pass@{k}": sum(1.0 for s in sampled if max(s) > 0) / n if n else 0.0}
    result["pass@1"] = (sum(s[0] for s in greedy) / n if n else 0.0) if greedy is not None else None
    return result


def evaluate(model: str, benchmarks: Sequence[str], data_files: dict[str, str], out: str, sampling: Sampling, backend,
             tokenizer, limit: Optional[int] = None, score_workers: int = 4, model_info: Optional[dict] = None) -> dict:
    """Generates, scores and writes results.{md,csv,json} and generations.jsonl; returns the JSON record."""
    out_dir = Path(os.path.expanduser(out))
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "model": model_info or {"path": model},
        "backend": backend.name,
        "sampling": asdict(sampling),
        "limit": limit,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, "-m", "recipe.darl.eval"] + sys.argv[1:],
        "versions": _versions(),
        "benchmarks": {},
    }
    k = sampling.k
    with open(out_dir / "generations.jsonl", "w", encoding="utf-8") as gen_file:
        for name in benchmarks:
            t0 = time.time()
            problems = load_problems(data_files[name], limit)
            prompt_ids = encode_prompts(tokenizer, problems, sampling)
            greedy_scores = None
            if sampling.greedy:
                greedy_text = backend.generate(prompt_ids, 1, 0.0, 1.0, sampling.max_new_tokens, sampling.seed)
                greedy_scores = score_all(problems, greedy_text, score_workers)
                _dump(gen_file, name, "greedy", problems, greedy_text, greedy_scores)
            sampled_text = backend.generate(prompt_ids, k, sampling.temperature, sampling.top_p, sampling.max_new_tokens, sampling.seed)
            sampled_scores = score_all(problems, sampled_text, score_workers)
            _dump(gen_file, name, "sampled", problems, sampled_text, sampled_scores)
            scores = summarize(greedy_scores, sampled_scores, k)
            record["benchmarks"][name] = {"data_file": str(Path(data_files[name]).resolve()), "sha256": sha256(data_files[name]),
                                          "scores": scores, "seconds": round(time.time() - t0, 2)}
            print(f"{name}: {scores}", flush=True)
    per_benchmark = [b["scores"] for b in record["benchmarks"].values()]
    values = {key: [s[key] for s in per_benchmark if s[key] is not None] for key in ("pass@1", f"avg@{k}", f"pass@{k}")}
    record["mean"] = {key: sum(v) / len(v) if v else None for key, v in values.items()}
    (out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    _write_tables(out_dir, record, k)
    return record


def _dump(f, name, mode, problems, texts, scores):
    for i, (p, rs, ss) in enumerate(zip(problems, texts, scores)):
        for j, (r, s) in enumerate(zip(rs, ss)):
            f.write(json.dumps({"benchmark": name, "mode": mode, "problem": i, "sample": j,
                                "index": (p.get("extra_info") or {}).get("index", i), "score": s, "response": r}) + "\n")


def _fmt(v) -> str:
    return "" if v is None else f"{100 * v:.1f}"


def _write_tables(out_dir: Path, record: dict, k: int) -> None:
    keys = ["pass@1", f"avg@{k}", f"pass@{k}"]
    header = ["benchmark", "n"] + keys
    # (name, n, scores, the csv's data_file and sha256) per benchmark, then the mean
    rows = [(name, b["scores"]["n"], b["scores"], [b["data_file"], b["sha256"]])
            for name, b in record["benchmarks"].items()]
    rows.append(("mean", "", record["mean"], ["", ""]))
    s = record["sampling"]
    lines = [f"# Evaluation of `{record['model']['path']}`", "",
             f"backend {record['backend']}; pass@1 greedy; avg@{k} and pass@{k} from {k} samples at temperature "
             f"{s['temperature']}, top-p {s['top_p']}; at most {s['max_new_tokens']} new tokens; scores in %.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([BENCHMARKS.get(name, name), str(n)] + [_fmt(v[key]) for key in keys]) + " |"
              for name, n, v, _ in rows]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header + ["data_file", "sha256"])
        writer.writerows([name, n] + ["" if v[key] is None else f"{v[key]:.6f}" for key in keys] + files
                         for name, n, v, files in rows)


def _versions() -> dict:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "vllm", "verl", "math-verify", "darl"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return versions


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m recipe.darl.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face folder or hub id, or a verl checkpoint folder")
    parser.add_argument("--benchmarks", default="gsm8k,math500,aime24,humaneval",
                        help=f"comma-separated subset of {','.join(BENCHMARKS)} (or 'all')")
    parser.add_argument("--data-dir", default="~/data", help="folder with <benchmark>/test.parquet (recipe.darl.data.prepare)")
    parser.add_argument("--data-file", action="append", default=[], metavar="NAME=PATH", help="a benchmark's parquet, overriding --data-dir")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--k", type=int, default=4, help="samples per problem for avg@k and pass@k")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--max-new-tokens", type=int, default=2048)
    parser.add_argument("--max-prompt-length", type=int, default=2048)
    parser.add_argument("--no-greedy", action="store_true", help="skip the greedy pass (pass@1 left empty)")
    parser.add_argument("--enable-thinking", action="store_true", help="Qwen3 chat template with enable_thinking=True")
    parser.add_argument("--limit", type=int, help="first N problems of each benchmark (smoke tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["auto", "vllm", "transformers"], default="auto")
    parser.add_argument("--batch-size", type=int, default=8, help="transformers backend: prompts per generate call")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto", help="transformers backend")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM backend")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM backend")
    parser.add_argument("--score-workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--merged-dir", help="where to merge a verl checkpoint (default <actor>/huggingface_merged)")
    args = parser.parse_args(argv)
    if args.k < 1:
        parser.error("--k must be >= 1")
    return args


def data_files_for(benchmarks: Sequence[str], data_dir: str, overrides: Sequence[str]) -> dict[str, str]:
    files = {name: os.path.join(os.path.expanduser(data_dir), name, "test.parquet") for name in benchmarks}
    for item in overrides:
        name, _, path = item.partition("=")
        if name not in BENCHMARKS or not path:
            raise SystemExit(f"--data-file wants NAME=PATH with NAME in {','.join(BENCHMARKS)}, got {item!r}")
        files[name] = os.path.expanduser(path)
    missing = [f"{n}: {p}" for n, p in files.items() if n in benchmarks and not os.path.exists(p)]
    if missing:
        raise SystemExit("missing data files (prepare them with python -m recipe.darl.data.prepare):\n  " + "\n  ".join(missing))
    return {n: files[n] for n in benchmarks}


def main(argv=None) -> int:
    args = parse_args(argv)
    benchmarks = list(BENCHMARKS) if args.benchmarks == "all" else [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmarks {unknown}; choose from {','.join(BENCHMARKS)}")
    data_files = data_files_for(benchmarks, args.data_dir, args.data_file)
    model_dir, kind = resolve_model(args.model, args.merged_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampling = Sampling(k=args.k, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                        max_prompt_length=args.max_prompt_length, greedy=not args.no_greedy, seed=args.seed,
                        enable_thinking=args.enable_thinking)
    backend = make_backend(args.backend, model_dir, tokenizer, args)
    model_info = {"path": args.model, "resolved": model_dir, "kind": kind}
    record = evaluate(args.model, benchmarks, data_files, args.out, sampling, backend, tokenizer, limit=args.limit,
                      score_workers=args.score_workers, model_info=model_info)
    print((Path(os.path.expanduser(args.out)) / "results.md").read_text())
    return 0 if record["benchmarks"] else 1


if __name__ == "__main__":
    sys.exit(main())
