"""Builds a built-in example into a cache directory on first use: tiny model, warm-start, parquet.

Two examples: `arithmetic` (sums, a 0.5M-parameter model; its scarce regime and the long-tail model too) and
`chains` (`--task chains`: chains of additions and subtractions worked line by line, a 2.3M-parameter model,
responses up to 64 tokens). Each one's warm-started weights ship in `weights/` with their sha256, since the warm-start
is not deterministic across CPUs; `--regenerate` runs it instead, `--export DIR` writes a shippable copy. A directory
whose `example.json` matches the settings is reused; concurrent builders lock, build privately and rename.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Optional

from ..data.prepare import write_parquet
from . import arithmetic, chains
from .arithmetic import is_hard, make_problems, records

DEFAULT_CACHE = Path(os.environ.get("DARL_CACHE", Path.home() / ".cache" / "darl"))
SHIPPED = Path(__file__).with_name("weights")
LAYOUT = 4  # 2: scarce_train/scarce_val parquet files; 3: longtail_model/; 4: scarce_val the study's 500; an older
# cache directory is rebuilt
# the held-out hard problems scarce_val.parquet holds: the same 500 the controlled-staleness study scores, so an
# accuracy through the trainers and one in the study are on one scale
SCARCE_VAL_SIZE = 500
# a model folder's files that ship, besides its weights (saved in shards: warm_start.SHARD_SIZE)
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def model_files(folder: Path) -> list[str]:
    """MODEL_FILES and the weights as saved (one `model.safetensors`, or its shards and their index)."""
    return [*MODEL_FILES, *sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("model")
                                  and p.name.endswith((".safetensors", ".safetensors.index.json")))]


@dataclass(frozen=True)
class ExampleSettings:
    TASK: ClassVar[str] = "arithmetic"
    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 2
    train_prompts: int = 2048
    val_prompts: int = 256
    sft_problems: int = 20000
    sft_target: float = 0.25
    max_response_tokens: int = 32  # greedy evaluation length; the RL run uses the same


@dataclass(frozen=True)
class ChainsSettings(ExampleSettings):
    """The chains example (`chains.py`): 4.4x the arithmetic model's parameters (hidden 272, 2 layers), twice its
    response length."""

    TASK: ClassVar[str] = "chains"
    hidden_size: int = 272
    max_response_tokens: int = chains.MAX_RESPONSE_TOKENS


SETTINGS = {"arithmetic": ExampleSettings(), "chains": ChainsSettings()}


@dataclass
class Example:
    root: str
    model: str
    train_files: str
    val_files: str
    warm_start_accuracy: float


def problem_splits(settings: ExampleSettings = ExampleSettings(), val_size: Optional[int] = None,
                   scarce_pool: int = 256) -> dict[str, list[tuple[int, int]]]:
    """The example's disjoint problem sets: sft, train, val; heldout (`val_size` others, for studies);
    scarce_train (train's first `scarce_pool` hard problems) and scarce_val (`val_size` other hard ones)."""
    val_size = settings.val_prompts if val_size is None else val_size
    pool = make_problems(settings.sft_problems + settings.train_prompts + settings.val_prompts, settings.seed)
    val = pool[:settings.val_prompts]
    train = pool[settings.val_prompts:settings.val_prompts + settings.train_prompts]
    used = set(pool)
    heldout = [p for p in make_problems(val_size + len(used), 10_007) if p not in used][:val_size]
    hard = [p for p in make_problems(6 * val_size + len(used), 10_009) if p not in used and is_hard(*p)]
    scarce_train = [p for p in train if is_hard(*p)][:scarce_pool]
    if len(hard) < val_size or len(scarce_train) < scarce_pool:
        raise ValueError(f"problem_splits: not enough hard problems for val_size={val_size}, scarce_pool={scarce_pool}")
    return {"sft": pool[settings.val_prompts + settings.train_prompts:], "train": train, "val": val,
            "heldout": heldout, "scarce_train": scarce_train, "scarce_val": hard[:val_size]}


def chain_splits(settings: ExampleSettings = ChainsSettings(), val_size: int = 500) -> dict[str, list[tuple[int, ...]]]:
    """The chains example's disjoint problem sets: sft, train, val, and heldout (`val_size` others, for studies)."""
    total = settings.sft_problems + settings.train_prompts + settings.val_prompts
    pool = chains.make_problems(total + val_size, settings.seed)
    val, train = pool[:settings.val_prompts], pool[settings.val_prompts:settings.val_prompts + settings.train_prompts]
    return {"val": val, "train": train, "sft": pool[settings.val_prompts + settings.train_prompts:total],
            "heldout": pool[total:]}


def _name(settings: ExampleSettings) -> str:
    return f"{settings.TASK}-s{settings.seed}-h{settings.hidden_size}"


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):  # 1 MiB at a time: data and weight files can be large
            h.update(block)
    return h.hexdigest()


def shipped_weights(settings: ExampleSettings) -> Optional[Path]:
    """The packaged warm-started model for `settings`, or None when none ships for them."""
    folder = SHIPPED / _name(settings)
    meta = folder / "example.json"
    if not meta.exists() or json.loads(meta.read_text()).get("settings") != asdict(settings):
        return None
    return folder


def _copy_shipped(folder: Path, model_dir: Path) -> dict:
    """Copies the shipped model files, checking each against its recorded sha256."""
    meta = json.loads((folder / "example.json").read_text())
    model_dir.mkdir(parents=True)
    for name, digest in meta["sha256"].items():
        shutil.copyfile(folder / name, model_dir / name)
        got = sha256(model_dir / name)
        if got != digest:
            raise RuntimeError(f"shipped example weights {folder / name}: sha256 {got} does not match the recorded "
                               f"{digest} (a damaged checkout?); rebuild them with `python -m recipe.darl.example.build "
                               f"--regenerate --export {SHIPPED}`")
    return meta


def _ready(root: Path, settings: ExampleSettings) -> Optional[Example]:
    """The example built in `root` for `settings` and this LAYOUT, or None."""
    meta = json.loads((root / "example.json").read_text()) if (root / "example.json").exists() else {}
    if meta.get("settings") != asdict(settings) or meta.get("layout") != LAYOUT:
        return None
    return Example(str(root), str(root / "model"), str(root / "train.parquet"), str(root / "val.parquet"),
                   meta["warm_start"]["accuracy"])


def build_example(cache: Path = DEFAULT_CACHE, settings: ExampleSettings = ExampleSettings(), log=print,
                  regenerate: bool = False) -> Example:
    """The example's directory, built on first use (from the shipped weights unless `regenerate`)."""
    cache = Path(cache)
    root = cache / (_name(settings) + ("-regenerated" if regenerate else ""))
    if (ready := _ready(root, settings)) is not None:
        return ready
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits here, then finds the first one's result
        if _ready(root, settings) is None:
            tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{root.name}.tmp-"))
            try:
                _build_into(tmp, settings, log, regenerate)
                if root.exists():  # a stale build of other settings: move it aside, then replace it
                    stale = Path(tempfile.mkdtemp(dir=cache, prefix=f".{root.name}.old-"))
                    os.rename(root, stale / "old")
                    shutil.rmtree(stale)
                os.rename(tmp, root)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return _ready(root, settings)


def _build_into(root: Path, settings: ExampleSettings, log, regenerate: bool) -> None:
    # here, not at the top: a launch script's `--paths-only` of a built example needs no torch (seconds at start-up)
    from .tiny_model import build_tiny_model
    from .warm_start import warm_start

    if settings.TASK == "chains":
        task, splits = chains, chain_splits(settings)
        for name, split in (("train", "train"), ("val", "test")):
            write_parquet(chains.records(splits[name], split), root / f"{name}.parquet")
    else:
        task, splits = arithmetic, problem_splits(settings)
        # scarce_*: the scarce regime (docs/evidence.md), a fixed pool of hard problems, scored on the study's problems
        splits["scarce_val"] = problem_splits(settings, val_size=SCARCE_VAL_SIZE)["scarce_val"]
        for name, split in (("train", "train"), ("val", "test"), ("scarce_train", "train"), ("scarce_val", "test")):
            write_parquet(records(splits[name], split), root / f"{name}.parquet")
        # the long-tail example (longtail.py): the tiny model untrained, deterministic, built in a second
        build_tiny_model(root / "longtail_model", seed=settings.seed, hidden_size=settings.hidden_size,
                         num_layers=settings.num_layers)

    shipped = None if regenerate else shipped_weights(settings)
    if shipped is not None:
        meta = _copy_shipped(shipped, root / "model")
        result = meta["warm_start"]
        log(f"example model: the shipped warm-started weights ({shipped.name}, sha256 checked; warm-start greedy "
            f"accuracy {result['accuracy']:.3f} after {result['steps']} steps when they were built)")
        source = {"weights": "shipped", "sha256": meta["sha256"]}
    else:
        log(f"building the tiny model (hidden {settings.hidden_size}, {settings.num_layers} layers) in {root / 'model'}")
        build_tiny_model(root / "model", seed=settings.seed, hidden_size=settings.hidden_size,
                         num_layers=settings.num_layers)
        warm = warm_start(str(root / "model"), splits["sft"], splits["val"][:128], target=settings.sft_target,
                          seed=settings.seed, max_new_tokens=settings.max_response_tokens, log=log, task=task)
        log(f"warm-start: greedy accuracy {warm.accuracy:.3f} after {warm.steps} steps ({warm.seconds:.0f} s)")
        result = asdict(warm)
        source = {"weights": "warm-started here"}
    (root / "example.json").write_text(json.dumps({"settings": asdict(settings), "layout": LAYOUT, "warm_start": result, **source},
                                                  indent=2))


def export_weights(example: Example, settings: ExampleSettings, out: Path = SHIPPED) -> Path:
    """Writes the example's model files and `example.json` (settings, warm-start, sha256) as a shippable copy."""
    folder = Path(out) / _name(settings)
    folder.mkdir(parents=True, exist_ok=True)
    meta = json.loads((Path(example.root) / "example.json").read_text())
    digests = {}
    for name in model_files(example.model):
        shutil.copyfile(Path(example.model) / name, folder / name)
        digests[name] = sha256(folder / name)
    (folder / "example.json").write_text(json.dumps({"settings": meta["settings"], "warm_start": meta["warm_start"],
                                                     "sha256": digests}, indent=2) + "\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths-only", action="store_true", help="print 'model train val' on one line (for scripts)")
    parser.add_argument("--task", choices=["arithmetic", "scarce", "longtail", "chains"], default="arithmetic",
                        help="which model and data --paths-only prints: the example's, the scarce regime's (hard sums, "
                             "fixed pool), the long-tail example's (the untrained tiny model, longtail.py) or the "
                             "chains example's (its own model and data)")
    parser.add_argument("--regenerate", action="store_true", help="warm-start here instead of using the shipped weights")
    parser.add_argument("--export", type=Path, default=None, help="write the built model as shippable weights into DIR")
    args = parser.parse_args()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.paths_only else print
    settings = (ChainsSettings if args.task == "chains" else ExampleSettings)(seed=args.seed)
    example = build_example(args.cache, settings, log=log, regenerate=args.regenerate)
    if args.export is not None:
        log(f"exported to {export_weights(example, settings, args.export)}")
    if args.paths_only:
        root = Path(example.root)
        paths = {"arithmetic": (example.model, example.train_files, example.val_files),
                 "scarce": (example.model, root / "scarce_train.parquet", root / "scarce_val.parquet"),
                 "longtail": (root / "longtail_model", example.train_files, example.val_files),
                 "chains": (example.model, example.train_files, example.val_files)}
        print(*paths[args.task])
    else:
        print(json.dumps(asdict(example), indent=2))


if __name__ == "__main__":
    main()
