"""Do version stamps name the weights that generated a sample? An independent check from a finished run's files.

A run that saves a checkpoint at every version (and keeps them all) leaves, in each `global_step_<v>/`:
the replay buffer (`darl_replay.pt`: every stored sample's prompt and response token ids, the rollout's
log-probs and its stamps `min_global_steps` / `max_global_steps`) and the trainer's weights of version v
(`actor/model_world_size_<w>_rank_<r>.pt`); version 0 is the initial model. For every sample this module
recomputes the response's log-probs with a plain transformers forward (teacher forcing, fp32) under the weights
its stamp names and reports how far they are from what the rollout engine returned, and how far they are under
the other versions' weights (so that a test can show the check tells versions apart).

Version v's weights are the checkpoint at `global_step_<v>`: one-step-off stamps with the trainer step whose
update produced the weights (the sync before step v + 1), fully-async with verl's `current_param_version`, and
it saves at `global_step_<current_param_version>`. Both trainers save the actor when they sync it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recipe.darl.robustness.checkpoint_files import read_checked

STEP_DIR = re.compile(r"global_step_(\d+)$")


@dataclass
class Sample:
    uid: str
    index: int  # in its group
    prompt: list[int]
    response: list[int]
    mask: torch.Tensor  # [len(response)] bool
    rollout_log_probs: torch.Tensor  # [len(response)] float32
    vmin: int
    vmax: int


def checkpoints(root: Path) -> dict[int, Path]:
    """global_step_<v> directories under `root`, by v."""
    out = {}
    for path in Path(root).iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir():
            out[int(match.group(1))] = path
    return dict(sorted(out.items()))


def samples(root: Path) -> list[Sample]:
    """Every sample stored in any checkpoint's replay buffer under `root`, once (by group uid and index)."""
    seen: dict[tuple[str, int], Sample] = {}
    for path in checkpoints(root).values():
        buffer_file = path / "darl_replay.pt"
        if not buffer_file.exists():
            continue
        for g in read_checked(buffer_file)["replay"]["groups"]:
            lengths = [int(n) for n in g["lengths"]]
            starts = np.cumsum([0] + lengths)
            vmins, vmaxs = g["non_tensors"]["min_global_steps"], g["non_tensors"]["max_global_steps"]
            for i, n in enumerate(lengths):
                key = (g["uid"], i)
                if key in seen or n == 0:
                    continue
                lo, hi = starts[i], starts[i] + n
                seen[key] = Sample(uid=g["uid"], index=i, prompt=g["prompt_ids"].tolist(),
                                   response=g["response_ids"][lo:hi].tolist(), mask=g["response_mask"][lo:hi].bool(),
                                   rollout_log_probs=g["rollout_log_probs"][lo:hi].float(),
                                   vmin=int(vmins[i]), vmax=int(vmaxs[i]))
    return list(seen.values())


def load_model(model_path: str):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()


def checkpoint_weights(root: Path, model_path: str, step: int) -> dict[str, torch.Tensor]:
    """The trainer's weights saved at global_step_<step> (its actor's shards, FSDP2 splits dim 0 as torch.chunk does,
    so the local shards concatenated in rank order are the whole tensor); step 0: the initial model."""
    if step == 0:
        from safetensors.torch import load_file

        return load_file(str(Path(model_path) / "model.safetensors"))
    actor = Path(root) / f"global_step_{step}" / "actor"
    files = sorted(actor.glob("model_world_size_*_rank_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[-1]))
    shards = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    return {k: torch.cat([s[k].to_local() if hasattr(s[k], "to_local") else s[k] for s in shards]).float()
            for k in shards[0]}


@torch.no_grad()
def teacher_forced(model, sample: Sample, temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([sample.prompt + sample.response])
    logits = model(input_ids=ids).logits[0, len(sample.prompt) - 1:-1].float()
    log_probs = torch.log_softmax(logits / temperature, -1)
    return log_probs.gather(1, torch.tensor(sample.response)[:, None]).squeeze(1)


def stamp_errors(root: Path, model_path: str, weights_of, temperature: float = 1.0) -> dict:
    """For every stored sample: |rollout log-prob - teacher-forced log-prob| per token under every saved weights.

    weights_of(stamp) -> the checkpoint step whose weights the stamp names (0: the initial model); it is where
    the trainers differ (see the module docstring). Returns {"samples", "steps" (the weights compared, 0 =
    initial), "err": {step: [per-sample tensor of per-token errors]}, "claimed": [per-sample list of the steps
    its stamps name, in version order], "missing": samples whose named weights were not saved}."""
    root = Path(root)
    steps = [0] + list(checkpoints(root))
    all_samples = samples(root)
    claimed = [[weights_of(v) for v in range(s.vmin, s.vmax + 1)] for s in all_samples]
    kept = [i for i, c in enumerate(claimed) if all(step in steps for step in c)]
    model = load_model(model_path)
    err: dict[int, list[torch.Tensor]] = {}
    for step in steps:
        model.load_state_dict(checkpoint_weights(root, model_path, step), strict=True)
        err[step] = [(teacher_forced(model, all_samples[i], temperature) - all_samples[i].rollout_log_probs).abs()
                     for i in kept]
    return {"samples": [all_samples[i] for i in kept], "steps": steps, "err": err,
            "claimed": [claimed[i] for i in kept], "missing": len(all_samples) - len(kept)}


def sample_error(errors: dict, i: int, step: int) -> float:
    """Largest error over sample i's masked tokens under the weights of `step`."""
    return float(errors["err"][step][i][errors["samples"][i].mask].max())


def consistent(errors: dict, i: int, tol: float) -> bool:
    """Sample i's tokens were generated by the weights its stamps name, in order: every masked token's rollout
    log-prob is reproduced within tol by one of the claimed weights, choosable so that the versions never go back
    along the response, the first token by the behavior version's (vmin) and, when the sample spans syncs
    (a partial rollout), the last by vmax's."""
    s, claimed = errors["samples"][i], errors["claimed"][i]
    tokens = torch.nonzero(s.mask).flatten().tolist()
    # per token, the positions in `claimed` (version order) whose weights reproduce it
    allowed = [[k for k, step in enumerate(claimed) if float(errors["err"][step][i][t]) <= tol] for t in tokens]
    if not allowed or 0 not in allowed[0] or len(claimed) - 1 not in allowed[-1]:
        return False
    current = 0
    for ks in allowed:  # stay on the earliest version still possible
        later = [k for k in ks if k >= current]
        if not later:
            return False
        current = min(later)
    return True
