"""Time verl's log-prob functions on one micro-batch of logits: its fallback without flash-attn vs log_softmax.

Without flash-attn, verl's `logprobs_from_logits` (verl/utils/torch_functional.py) calls
`logprobs_from_logits_v2`, which loops over rows to bound memory: one logsumexp per token. This times
forward + backward of that and of `logprobs_from_logits_naive` (one log_softmax + gather) on [--tokens, --vocab]
random logits, in bf16 and fp32 (docs/performance.md, "Measured on an H100").

    python benchmarks/bench_logprobs.py            # on a GPU: 8192 tokens x Qwen3's 151,936-token vocabulary
    python benchmarks/bench_logprobs.py --device cpu --tokens 64 --vocab 1000
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from verl.utils.torch_functional import logprobs_from_logits_naive, logprobs_from_logits_v2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes after one warm-up; the minimum is kept")
    args = parser.parse_args()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    result = {}
    for dtype in (torch.bfloat16, torch.float32):
        for name, fn in (("v2_row_loop", logprobs_from_logits_v2), ("naive", logprobs_from_logits_naive)):
            logits = torch.randn(args.tokens, args.vocab, device=args.device, dtype=dtype, requires_grad=True)
            labels = torch.randint(0, args.vocab, (args.tokens,), device=args.device)
            times = []
            for _ in range(args.repeats + 1):
                sync()
                start = time.perf_counter()
                fn(logits, labels).sum().backward()
                sync()
                times.append(time.perf_counter() - start)
                logits.grad = None
            result[f"{str(dtype).removeprefix('torch.')}/{name}"] = min(times[1:])
            print(f"{dtype} {name}: forward + backward {min(times[1:]):.4f} s for {args.tokens} tokens", flush=True)
            del logits
    print(json.dumps({"tokens": args.tokens, "vocab": args.vocab, "device": args.device, "seconds": result}))


if __name__ == "__main__":
    main()
