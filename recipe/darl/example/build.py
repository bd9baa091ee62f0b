"""Builds the built-in example into a cache directory on first use: tiny model, warm-start, parquet.

    python -m recipe.darl.example.build [--cache DIR] [--seed 0]

Deterministic from the seed. The directory holds `model/` (Hugging Face layout), `train.parquet`,
`val.parquet` and `example.json` (settings and the warm-start's result); a directory whose
`example.json` matches the settings is reused as is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .tiny_model import build_tiny_model
from .arithmetic import make_problems, records, write_parquet
from .warm_start import warm_start

DEFAULT_CACHE = Path(os.environ.get("DARL_CACHE", Path.home() / ".cache" / "darl"))


@dataclass(frozen=True)
class ExampleSettings:
    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 2
    train_prompts: int = 2048
    val_prompts: int = 256
    sft_problems: int = 20000
    sft_target: float = 0.25
    max_response_tokens: int = 32  # greedy evaluation length; the RL run uses the same


@dataclass
class Example:
    root: str
    model: str
    train_files: str
    val_files: str
    warm_start_accuracy: float


def build_example(cache: Path = DEFAULT_CACHE, settings: ExampleSettings = ExampleSettings(), log=print) -> Example:
    root = Path(cache) / f"arithmetic-s{settings.seed}-h{settings.hidden_size}"
    meta_file = root / "example.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if meta.get("settings") == asdict(settings):
            return Example(str(root), str(root / "model"), str(root / "train.parquet"), str(root / "val.parquet"),
                           meta["warm_start"]["accuracy"])
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)

    # disjoint problem sets: warm-start, RL train, validation
    pool = make_problems(settings.sft_problems + settings.train_prompts + settings.val_prompts, settings.seed)
    val = pool[:settings.val_prompts]
    train = pool[settings.val_prompts:settings.val_prompts + settings.train_prompts]
    sft = pool[settings.val_prompts + settings.train_prompts:]
    write_parquet(records(train, "train"), root / "train.parquet")
    write_parquet(records(val, "test"), root / "val.parquet")

    log(f"building the tiny model (hidden {settings.hidden_size}, {settings.num_layers} layers) in {root / 'model'}")
    build_tiny_model(root / "model", seed=settings.seed, hidden_size=settings.hidden_size, num_layers=settings.num_layers)
    result = warm_start(str(root / "model"), sft, val[:128], target=settings.sft_target, seed=settings.seed,
                        max_new_tokens=settings.max_response_tokens, log=log)
    log(f"warm-start: greedy accuracy {result.accuracy:.3f} after {result.steps} steps ({result.seconds:.0f} s)")
    meta_file.write_text(json.dumps({"settings": asdict(settings), "warm_start": asdict(result)}, indent=2))
    return Example(str(root), str(root / "model"), str(root / "train.parquet"), str(root / "val.parquet"), result.accuracy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths-only", action="store_true", help="print 'model train val' on one line (for scripts)")
    args = parser.parse_args()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.paths_only else print
    example = build_example(args.cache, ExampleSettings(seed=args.seed), log=log)
    if args.paths_only:
        print(example.model, example.train_files, example.val_files)
    else:
        print(json.dumps(asdict(example), indent=2))


if __name__ == "__main__":
    main()
