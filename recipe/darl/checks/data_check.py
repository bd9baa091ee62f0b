"""Rows the run would choke on, found before Ray starts, each named by file, row and field (docs/faults.md).

verl reads the data only after Ray, the workers and the rollout servers have started, and some bad rows fail later
still, in a reward worker. Checked in parquet files (`faults.check_data=false` skips it): rows without
`reward_model.ground_truth`, empty prompts, and, with `data.filter_overlong_prompts=false`, prompts longer than
`data.max_prompt_length` tokens, whose beginning verl 0.9.1 would silently cut. Rows are 0-based positions.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf

from ..core.config import as_list

SHOW = 5  # rows named per problem


def local_parquet(path) -> str | None:
    """`path` with `~` expanded when it names a local parquet file; None for a remote, missing or other file."""
    path = os.path.expanduser(str(path))
    return None if "://" in path or not path.endswith(".parquet") or not os.path.isfile(path) else path


def _messages(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    try:
        return [dict(m) if not isinstance(m, dict) else m for m in list(value)]
    except (TypeError, ValueError):
        return [value]


def _empty_prompt(value) -> bool:
    contents = [m.get("content") if isinstance(m, dict) else m for m in _messages(value)]
    return all(c is None or (isinstance(c, str) and not c.strip()) for c in contents)


def _ground_truth_problem(value) -> Optional[str]:
    try:
        truth = None if value is None else dict(value).get("ground_truth")  # parquet: null where a row lacks it
    except (TypeError, ValueError):
        return f"is unreadable (reward_model is {type(value).__name__})"
    return "is missing or empty" if truth is None or (isinstance(truth, str) and not truth.strip()) else None


def _rows(rows: list[int], total: int) -> str:
    shown = ", ".join(str(r) for r in rows[:SHOW])
    more = f" and {len(rows) - SHOW} more" if len(rows) > SHOW else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more} (of {total})"


def load_tokenizer(cfg: DictConfig):
    """The actor's tokenizer when the model path is a local folder (None otherwise: the length check is skipped)."""
    path = os.path.expanduser(str(cfg.actor_rollout_ref.model.get("path") or ""))
    if not os.path.isdir(path):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=bool(cfg.data.get("trust_remote_code", False)))


def prompt_lengths(tokenizer, conversations: list[list[dict]], template_kwargs: dict, chunk: int = 1024) -> list[int]:
    """Tokens of each prompt as the rollout sees it: the chat template with the generation prompt, rendered in
    batches, then tokenized without extra special tokens (verl's `maybe_filter_out_long_prompts`)."""
    kwargs = {k: v for k, v in template_kwargs.items() if k not in ("tokenize", "return_dict", "return_tensors")}
    out: list[int] = []
    for start in range(0, len(conversations), chunk):
        texts = tokenizer.apply_chat_template(conversations[start:start + chunk], add_generation_prompt=True,
                                              tokenize=False, **kwargs)
        out += [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return out


def data_problems(cfg: DictConfig, tokenizer_loader: Callable[[DictConfig], Any] = load_tokenizer) -> tuple[list[str], list[str]]:
    """(problems, lines to print) of `data.train_files` and `data.val_files`."""
    if not (cfg.get("faults") or {}).get("check_data", True):
        return [], []
    import pandas as pd

    data = cfg.data
    prompt_key = data.get("prompt_key", "prompt") or "prompt"
    max_len = int(data.get("max_prompt_length") or 0)
    check_length = max_len > 0 and not data.get("filter_overlong_prompts", True)
    template_kwargs = data.get("apply_chat_template_kwargs")
    template_kwargs = OmegaConf.to_container(template_kwargs, resolve=True) if template_kwargs else {}
    tokenizer, lines, problems = None, [], []
    for key in ("train_files", "val_files"):
        for path in filter(None, map(local_parquet, as_list(data.get(key)))):
            where = f"data.{key}: {path}"
            try:
                frame = pd.read_parquet(path)
            except Exception as e:  # noqa: BLE001 - verl reports it when it reads the file
                lines.append(f"[D-ARL] {where} not checked: it cannot be read as parquet ({type(e).__name__})")
                continue
            total = len(frame)
            prompts = frame[prompt_key] if prompt_key in frame.columns else None
            if prompts is None:
                problems.append(f"{where} has no column {prompt_key!r} (data.prompt_key)")
            elif empty := [i for i, v in enumerate(prompts) if _empty_prompt(v)]:
                problems.append(f"{where}: field {prompt_key!r} is empty in {_rows(empty, total)}")
            if "reward_model" not in frame.columns:
                problems.append(f"{where} has no column 'reward_model': verl's reward manager reads "
                                "reward_model.ground_truth for every sample")
            else:
                bad: dict[str, list[int]] = {}
                for i, v in enumerate(frame["reward_model"]):
                    if what := _ground_truth_problem(v):
                        bad.setdefault(what, []).append(i)
                problems += [f"{where}: field 'reward_model.ground_truth' {what} in {_rows(rows, total)}"
                             for what, rows in bad.items()]
            if check_length and prompts is not None and tokenizer is None:
                try:
                    tokenizer = tokenizer_loader(cfg)
                    if tokenizer is None:
                        lines.append("[D-ARL] prompt lengths not checked before Ray: the model path is not a local folder")
                except Exception as e:  # noqa: BLE001
                    lines.append(f"[D-ARL] prompt lengths not checked: the tokenizer did not load ({e})")
                check_length = tokenizer is not None
            if check_length and prompts is not None:
                rows = [i for i, v in enumerate(prompts) if not _empty_prompt(v)]
                lengths = prompt_lengths(tokenizer, [_messages(prompts.iloc[i]) for i in rows], template_kwargs)
                long_rows = [i for i, n in zip(rows, lengths) if n > max_len]
                if long_rows:
                    problems.append(
                        f"{where}: field {prompt_key!r} is longer than data.max_prompt_length={max_len} tokens (up to "
                        f"{max(lengths)}) in {_rows(long_rows, total)}; verl would cut the prompts' beginning. Set "
                        "data.filter_overlong_prompts=true to drop them, or raise data.max_prompt_length")
    return problems, lines
