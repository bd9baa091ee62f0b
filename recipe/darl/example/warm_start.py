"""Supervised warm-start of a tiny model on an example task, so RL starts neither hopeless nor perfect.
Accuracy jumps suddenly after a few hundred steps, so training stops once greedy accuracy reaches `target`.

A task is a module with `prompt_text(*problem)`, `solution_text(*problem)` and `answer(*problem)`: `arithmetic`
(the default) or `chains`; both are scored by `arithmetic.compute_score`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType

import torch
from torch.nn.utils.rnn import pad_sequence

from . import arithmetic
from .arithmetic import compute_score

SHARD_SIZE = "4MB"  # weights saved in shards this small: the shipped copies stay small repository files


@dataclass
class WarmStartResult:
    accuracy: float  # greedy accuracy on the evaluation problems when training stopped
    steps: int
    seconds: float


def encode_prompts(tokenizer, problems: list[tuple[int, ...]], task: ModuleType = arithmetic) -> list[list[int]]:
    out = []
    for problem in problems:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": task.prompt_text(*problem)}],
                                                add_generation_prompt=True, tokenize=True)
        # transformers 5 may return a BatchEncoding from apply_chat_template(tokenize=True)
        out.append(list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded))
    return out


@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems: list[tuple[int, ...]], max_new_tokens: int = 32, batch_size: int = 256,
                    task: ModuleType = arithmetic) -> float:
    """Share of `problems` whose greedy response earns reward 1."""
    model.eval()
    correct = 0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        prompts = encode_prompts(tokenizer, chunk, task)
        inputs = tokenizer.pad({"input_ids": prompts}, padding=True, padding_side="left", return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        correct += sum(compute_score("", t, str(task.answer(*p))) for t, p in zip(texts, chunk))
    model.train()
    return correct / len(problems)


def warm_start(
    model_dir: str, train_problems: list[tuple[int, ...]], eval_problems: list[tuple[int, ...]], target: float = 0.25,
    lr: float = 1e-3, batch_size: int = 64, eval_every: int = 25, max_steps: int = 3000, seed: int = 0,
    max_new_tokens: int = 32, log=print, task: ModuleType = arithmetic,
) -> WarmStartResult:
    """Teacher-forced training on prompt -> `solution_text`, saved back into `model_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    prompts = encode_prompts(tokenizer, train_problems, task)
    answers = [tokenizer(task.solution_text(*p) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
               for p in train_problems]
    generator = torch.Generator().manual_seed(seed)
    start, accuracy, step = time.perf_counter(), 0.0, 0
    for step in range(1, max_steps + 1):
        rows = torch.randint(0, len(prompts), (batch_size,), generator=generator).tolist()
        ids = pad_sequence([torch.tensor(prompts[r] + answers[r]) for r in rows], batch_first=True,
                           padding_value=tokenizer.pad_token_id)
        mask = pad_sequence([torch.ones(len(prompts[r]) + len(answers[r]), dtype=torch.long) for r in rows],
                            batch_first=True)
        labels = pad_sequence([torch.tensor([-100] * len(prompts[r]) + answers[r]) for r in rows], batch_first=True,
                              padding_value=-100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % eval_every == 0:
            accuracy = greedy_accuracy(model, tokenizer, eval_problems, max_new_tokens=max_new_tokens, task=task)
            log(f"warm-start step {step}: loss {loss.item():.3f}, greedy accuracy {accuracy:.3f}")
            if accuracy >= target:
                break
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size=SHARD_SIZE)
    return WarmStartResult(accuracy=accuracy, steps=step, seconds=time.perf_counter() - start)
