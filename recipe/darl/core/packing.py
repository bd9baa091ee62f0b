"""Row layouts: ragged <-> padded per-response token rows (no Python loop over rows), and the optimizer mini-batch
of each row as verl splits a batch (`minibatch_index`)."""

from __future__ import annotations

import torch


def pack_rows(padded: torch.Tensor, lengths: torch.Tensor, left_padded: bool = False) -> torch.Tensor:
    """[sum(lengths)]: the first (left-padded: last) `lengths[i]` entries of each row of padded [n, W]."""
    if padded.dim() != 2 or lengths.shape != (padded.shape[0],):
        raise ValueError(f"pack_rows: padded must be [n, W] and lengths [n], got {tuple(padded.shape)} and {tuple(lengths.shape)}")
    width = padded.shape[1]
    cols = torch.arange(width, device=padded.device).unsqueeze(0)
    lengths = lengths.to(padded.device).unsqueeze(1)
    keep = cols >= width - lengths if left_padded else cols < lengths
    return padded[keep]


def unpack_rows(flat: torch.Tensor, lengths: torch.Tensor, width: int, pad_value: float | int = 0,
                left_padded: bool = False) -> torch.Tensor:
    """Inverse of `pack_rows`: [sum(lengths)] -> [n, width], padded with `pad_value`."""
    if lengths.numel() and int(lengths.max()) > width:
        raise ValueError(f"unpack_rows: a row of length {int(lengths.max())} does not fit width={width}")
    n = lengths.shape[0]
    out = torch.full((n, width), pad_value, dtype=flat.dtype, device=flat.device)
    cols = torch.arange(width, device=flat.device).unsqueeze(0)
    lengths = lengths.to(flat.device).unsqueeze(1)
    keep = cols >= width - lengths if left_padded else cols < lengths
    out[keep] = flat
    return out


def minibatch_index(num_samples: int, mini_batch_samples: int, dp_size: int) -> torch.Tensor:
    """[num_samples] optimizer mini-batch of each sample as verl splits an unshuffled batch: dp_size contiguous
    shards, each walked in mini-batches of mini_batch_samples / dp_size; m is every rank's m-th."""
    if num_samples % dp_size or mini_batch_samples % dp_size or num_samples % mini_batch_samples:
        raise ValueError(f"minibatch_index: {num_samples} samples, mini-batches of {mini_batch_samples}, dp {dp_size} do not divide")
    shard = num_samples // dp_size
    local = torch.arange(num_samples) % shard
    return local // (mini_batch_samples // dp_size)
