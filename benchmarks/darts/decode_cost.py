"""The cost of one decode step and of a prefill on a GPU, for the DARTS simulator's constants (docs/darts.md).

    python benchmarks/darts/decode_cost.py --out decode_cost.json [--models 1.7b,4b] [--quick]

A Qwen3-shaped decoder in plain torch (bf16, random weights: the timing does not depend on their values; layers,
widths, GQA heads, QK-norm and the tied 151,936-token head as in the Qwen3 model cards) with a contiguous KV cache.
One decode step (every live sequence emits one token: norms, QKV, attention over its context with
`scaled_dot_product_attention`, MLP, head, argmax) is captured in a CUDA graph, as vLLM does for decode, and replayed;
the median of the replays is the step time for `b` live sequences of `c` context tokens each. A prefill is one
causal forward over `t` prompt tokens. The fit `step = fixed + per_seq * b + per_ctx * b * c` gives the simulator's
three constants (benchmarks/darts/simulator.py). Without CUDA it runs eagerly on the CPU (a smoke test of the code,
not a measurement of an engine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

# (layers, hidden, intermediate, query heads, kv heads, head dim, vocab): Qwen3-1.7B and Qwen3-4B's config.json
SHAPES = {"1.7b": (28, 2048, 6144, 16, 8, 128, 151936), "4b": (36, 2560, 9728, 32, 8, 128, 151936),
          "tiny": (2, 64, 128, 4, 2, 16, 1000)}


class Decoder:
    """The weights of a Qwen3-shaped decoder and its decode step / prefill (no module machinery: one graph)."""

    def __init__(self, shape: tuple, device: str, dtype: torch.dtype) -> None:
        self.layers, h, inter, self.nq, self.nkv, self.hd, vocab = shape
        g = torch.Generator(device=device).manual_seed(0)

        def w(*size):
            return (torch.randn(*size, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

        self.w = [dict(qkv=w((self.nq + 2 * self.nkv) * self.hd, h), o=w(h, self.nq * self.hd),
                       gate_up=w(2 * inter, h), down=w(h, inter)) for _ in range(self.layers)]
        self.embed = w(vocab, h)  # tied: the head reads the same matrix
        self.device, self.dtype = device, dtype

    def _attn_block(self, x: torch.Tensor, layer: dict, attend) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = F.linear(F.rms_norm(x, x.shape[-1:]), layer["qkv"]).view(b, t, -1, self.hd)
        q, k, v = qkv.split([self.nq, self.nkv, self.nkv], dim=2)
        q, k = F.rms_norm(q, (self.hd,)), F.rms_norm(k, (self.hd,))  # Qwen3's QK-norm
        out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [b, heads, t, hd]
        x = x + F.linear(out.transpose(1, 2).reshape(b, t, -1), layer["o"])
        gate, up = F.linear(F.rms_norm(x, x.shape[-1:]), layer["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer["down"])

    def decode(self, tokens: torch.Tensor, cache: torch.Tensor, pos: int) -> torch.Tensor:
        """tokens [b]; cache [layers, 2, b, kv heads, c, head dim] holding pos tokens -> next tokens [b]."""
        x = F.embedding(tokens[:, None], self.embed)
        for i, layer in enumerate(self.w):
            def attend(q, k, v, i=i):
                cache[i, 0, :, :, pos:pos + 1] = k
                cache[i, 1, :, :, pos:pos + 1] = v
                return F.scaled_dot_product_attention(q, cache[i, 0, :, :, :pos + 1], cache[i, 1, :, :, :pos + 1],
                                                      enable_gqa=True)
            x = self._attn_block(x, layer, attend)
        return F.linear(F.rms_norm(x[:, -1], x.shape[-1:]), self.embed).argmax(-1)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [1, t] -> the next token after them (one causal forward; the cache write is left out)."""
        x = F.embedding(tokens, self.embed)
        for layer in self.w:
            x = self._attn_block(x, layer, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                            enable_gqa=True))
        return F.linear(F.rms_norm(x[:, -1], x.shape[-1:]), self.embed).argmax(-1)


def _median_ms(fn, repeats: int, cuda: bool) -> float:
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def decode_ms(model: Decoder, b: int, c: int, repeats: int) -> float:
    """Median milliseconds of one decode step for b sequences with c tokens of context each."""
    cuda = model.device == "cuda"
    cache = torch.zeros(model.layers, 2, b, model.nkv, c + 1, model.hd, device=model.device, dtype=model.dtype)
    tokens = torch.zeros(b, dtype=torch.long, device=model.device)
    if not cuda:
        return _median_ms(lambda: model.decode(tokens, cache, c), repeats, False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model.decode(tokens, cache, c)  # warm-up: kernels chosen before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.decode(tokens, cache, c)
    graph.replay()
    ms = _median_ms(graph.replay, repeats, True)
    del graph, cache
    torch.cuda.empty_cache()
    return ms


def fit(points: list[dict]) -> dict[str, float]:
    """Least squares of step_ms = fixed + per_seq * b + per_ctx * b * c over the measured points."""
    rows = torch.tensor([[1.0, p["b"], p["b"] * p["c"]] for p in points], dtype=torch.float64)
    y = torch.tensor([p["ms"] for p in points], dtype=torch.float64)
    coef = torch.linalg.lstsq(rows, y[:, None]).solution[:, 0].tolist()
    pred = rows @ torch.tensor(coef, dtype=torch.float64)
    return {"fixed_ms": coef[0], "per_seq_ms": coef[1], "per_ctx_token_ms": coef[2],
            "max_rel_error": float(((pred - y).abs() / y).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="1.7b,4b")
    ap.add_argument("--quick", action="store_true", help="a small grid (a smoke test)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    batches = [1, 4] if args.quick else [1, 8, 32, 64, 128, 256]
    contexts = [64, 256] if args.quick else [512, 2048, 8192]
    prompts = [64] if args.quick else [512, 2048, 8192]
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "dtype": str(dtype), "cuda_graphs": cuda, "models": {}}
    for name in args.models.split(","):
        model = Decoder(SHAPES[name], device, dtype)
        points = []
        for c in contexts:
            for b in batches:
                if b * c > 256 * 1024:  # larger KV caches would not fit beside a 4B model on an 80 GB card
                    continue
                with torch.no_grad():
                    points.append({"b": b, "c": c, "ms": decode_ms(model, b, c, args.repeats)})
                print(f"{name} decode b={b} c={c}: {points[-1]['ms']:.3f} ms", flush=True)
        prefill = []
        for t in prompts:
            tokens = torch.zeros(1, t, dtype=torch.long, device=device)
            with torch.no_grad():
                model.prefill(tokens)
                prefill.append({"tokens": t, "ms": _median_ms(lambda: model.prefill(tokens), 5, cuda)})
            print(f"{name} prefill t={t}: {prefill[-1]['ms']:.3f} ms", flush=True)
        result["models"][name] = {"decode": points, "prefill": prefill, "fit": fit(points),
                                  "prefill_ms_per_token": statistics.median(p["ms"] / p["tokens"] for p in prefill)}
        print(name, json.dumps(result["models"][name]["fit"]), flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
