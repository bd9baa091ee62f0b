"""A continuous-batching rollout engine in a few lines, to answer "when does cutting the tail pay?" (docs/darts.md).

    python benchmarks/darts/simulator.py --validate docs/evidence/darts/rollout_cpu.json
    python benchmarks/darts/simulator.py --predict docs/evidence/darts/gpu/decode_cost_h100.json
    python benchmarks/darts/simulator.py --predict docs/evidence/darts/gpu/decode_cost_h100.json --prompts 32 \
        --workloads "heavy tail" --seeds 0 1 2 3           # a row per seed, and how often fixed beats adaptive

The engine: every request of a step is submitted at once and admitted first come, first served while fewer than
`max_num_seqs` run and the KV cache has room; each decode step emits one token for every running sequence and costs
`fixed + per_seq * b + per_ctx * (context tokens of the b running sequences)` milliseconds, and admitting requests
costs `prefill_per_token` per prompt token; when the cache is full the most recently admitted sequence is preempted
and recomputed later (vLLM's default). DARTS: a group of r requests keeps n; with L = 0 the rest are aborted once n
have finished, with L > 0 the group waits for all r. A step's generation time ends with its last kept response.

Which requests finish when depends only on the lengths, not on the constants, so a step's time is linear in them:
`--validate` fits them to the benchmark's base runs (benchmarks/darts/rollout_bench.py) and predicts every other
setting's time; `--predict` takes a GPU's measured costs (benchmarks/darts/decode_cost.py) and predicts Qwen3-1.7B
and 4B on GSM8K-like, MATH-like and long-reasoning lengths.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from recipe.darl.core.darts import allocate  # noqa: E402

N = 8


@dataclass
class Engine:
    fixed_ms: float = 0.0
    per_seq_ms: float = 0.0
    per_ctx_ms: float = 0.0
    prefill_per_token_ms: float = 0.0
    max_num_seqs: int = 1024
    kv_tokens: float = math.inf


def simulate(lengths: list[list[int]], r: list[int], keep_last: list[int], n: int, engine: Engine,
             prompt_len: int = 0) -> dict:
    """One rollout step: group g sends r[g] requests of lengths[g][:r[g]] tokens and keeps n of them.

    Returns the generation time (ms) and its four features (decode steps, sum over steps of running sequences, of
    their context tokens, tokens prefilled), tokens decoded and kept, and preemptions. A preempted request keeps its
    tokens and re-prefills prompt and tokens when readmitted (vLLM's recompute)."""
    groups = len(r)
    req_group = np.repeat(np.arange(groups), r)
    req_len = np.concatenate([np.asarray(lengths[g][: r[g]]) for g in range(groups)]).astype(np.int64)
    gen = np.zeros(len(req_len), dtype=np.int64)  # tokens generated so far (kept across a preemption)
    waiting = list(range(len(req_len)))[::-1]  # pop() from the end: first come, first served
    running = np.zeros(0, dtype=np.int64)  # request ids, in admission order
    finished: list[list[int]] = [[] for _ in range(groups)]  # finishing order per group
    done = np.zeros(groups, dtype=bool)
    f = {"steps": 0.0, "seq_steps": 0.0, "ctx_steps": 0.0, "prefill": 0.0}
    decoded = preempted = 0
    just_preempted = False
    while not done.all():
        kv = float((prompt_len + gen[running]).sum())
        admitted = []
        while waiting and not just_preempted and len(running) + len(admitted) < engine.max_num_seqs:
            need = prompt_len + gen[waiting[-1]] + 1
            if kv + need > engine.kv_tokens:
                break
            req = waiting.pop()
            admitted.append(req)
            kv += need - 1
            f["prefill"] += need - 1
        running = np.concatenate([running, np.asarray(admitted, dtype=np.int64)])
        if not len(running):
            raise RuntimeError("a request does not fit in the KV cache")
        b = len(running)
        left = int((req_len[running] - gen[running]).min())
        room = int((engine.kv_tokens - kv) // b) if engine.kv_tokens < math.inf else left
        if room < 1:  # preempt the most recent admission; it waits at the front of the queue
            waiting.append(int(running[-1]))
            running = running[:-1]
            preempted += 1
            just_preempted = True  # as vLLM's scheduler: nothing is admitted in a step that preempts
            continue
        just_preempted = False
        k = min(left, room)
        f["steps"] += k
        f["seq_steps"] += b * k
        f["ctx_steps"] += k * kv + b * k * (k + 1) / 2
        decoded += b * k
        gen[running] += k
        ends = gen[running] >= req_len[running]
        for req in running[ends]:
            finished[req_group[req]].append(int(req))
        ended_groups = set(req_group[running[ends]].tolist())
        running = running[~ends]
        for g in ended_groups:
            if done[g] or len(finished[g]) < n:
                continue
            if keep_last[g] == 0 or len(finished[g]) == r[g]:
                done[g] = True
                if keep_last[g] == 0:  # abort the rest of the group
                    running = running[req_group[running] != g]
                    waiting = [q for q in waiting if req_group[q] != g]
    kept = 0
    for g in range(groups):
        order = finished[g]
        chosen = order[: n - keep_last[g]] + (order[len(order) - keep_last[g]:] if keep_last[g] else [])
        kept += int(req_len[chosen].sum())
    ms = (engine.fixed_ms * f["steps"] + engine.per_seq_ms * f["seq_steps"] + engine.per_ctx_ms * f["ctx_steps"]
          + engine.prefill_per_token_ms * f["prefill"])
    return {"ms": ms, "features": f, "decoded": decoded, "kept": kept, "preempted": preempted}


# ------------------------------------------------------------------------------------------------ CPU validation


def validate(bench: dict, within: float = 0.15) -> str:
    """Fits the step constants to the base runs and predicts every run; a markdown table of measured and predicted,
    with the errors of the cells it was fitted on (in sample) and of the others (out of sample) stated apart."""
    runs = bench["runs"]
    sims = [simulate(run["lengths"], run["r"], run["L"], bench["n"], Engine()) for run in runs]
    names = ["steps", "seq_steps", "ctx_steps"]
    base = [i for i, run in enumerate(runs) if run["setting"] == "base"]
    x = np.array([[sims[i]["features"][k] for k in names] for i in base])
    y = np.array([1e3 * runs[i]["generation_s"] for i in base])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    engine = Engine(*coef.tolist())
    cells: dict = {}
    for run, sim in zip(runs, sims):
        predicted = sum(c * sim["features"][k] for c, k in zip(coef, names)) / 1e3
        cells.setdefault((run["dist"], run["setting"]), []).append((run["generation_s"], predicted, sim, run))
    lines = [f"fitted on the base runs: fixed {engine.fixed_ms:.3f} ms, per sequence {engine.per_seq_ms:.4f} ms, "
             f"per context token {engine.per_ctx_ms:.2e} ms per decode step", "",
             "| lengths | setting | sample | measured s | predicted s | error | speed-up over base (measured / "
             "predicted) | tokens decoded (measured / simulated) |", "|---|---|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {"in": [], "out of": []}
    medians = {key: (statistics.median(m for m, *_ in rows), statistics.median(p for _, p, *_ in rows))
               for key, rows in cells.items()}
    speedups = []  # (measured, predicted) generation speed-up over the same lengths' base
    for (dist, name), rows in cells.items():
        measured, predicted = medians[(dist, name)]
        error = predicted / measured - 1
        sample = "in" if name == "base" else "out of"
        errors[sample].append(error)
        base = medians[(dist, "base")]
        speedups.append((base[0] / measured, base[1] / predicted))
        tokens = (statistics.median(r["tokens_decoded"] for *_, r in rows),
                  statistics.median(s["decoded"] for _, _, s, _ in rows))
        lines.append(f"| {dist} | {name} | {sample} | {measured:.2f} | {predicted:.2f} | {100 * error:+.0f}% | "
                     f"{speedups[-1][0]:.2f}x / {speedups[-1][1]:.2f}x | {tokens[0]:.0f} / {tokens[1]:.0f} |")
    lines.append("")
    for sample, errs in errors.items():
        close = sum(abs(e) <= within for e in errs)
        lines.append(f"{sample} sample ({len(errs)} cells): within {100 * within:.0f}% in {close} of {len(errs)}, "
                     f"errors {100 * min(errs):+.0f}% to {100 * max(errs):+.0f}%, largest {100 * max(map(abs, errs)):.0f}%")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ GPU predictions

# response lengths (tokens): per prompt a log-normal scale around `median` (sigma_prompt), per response a log-normal
# draw around it (sigma), capped at `cap` (the launch scripts' max_response_length)
WORKLOADS = {
    "GSM8K-like": dict(median=250, sigma=0.5, sigma_prompt=0.4, cap=1024, prompt=200),
    "MATH-like": dict(median=700, sigma=0.7, sigma_prompt=0.6, cap=4096, prompt=250),
    "long reasoning": dict(median=3000, sigma=0.8, sigma_prompt=0.6, cap=16384, prompt=300),
    # as the CPU benchmark's heavy tail: per prompt a share (0-25%) of responses 8x longer than the rest
    "heavy tail": dict(median=400, sigma=0.5, sigma_prompt=0.4, cap=8192, prompt=250, long_share=0.25, long_factor=8),
}
# (parameters in billions, KV bytes per token) of Qwen3-1.7B and 4B in bf16: 2 x layers x kv heads x head dim x 2 bytes
MODELS = {"1.7b": (1.72, 2 * 28 * 8 * 128 * 2), "4b": (4.02, 2 * 36 * 8 * 128 * 2)}
SETTINGS = {"base": (False, 8, 0), "fixed r=12, L=0": (False, 12, 0), "fixed r=12, L=1": (False, 12, 1),
            "adaptive, L=0": (True, 12, 0), "released (adaptive, L=(16-r)//2)": (True, 12, None)}


def gpu_engine(cost: dict, model: str, gpu_gib: float, utilization: float = 0.85) -> Engine:
    """The measured decode-step fit of `model` with vLLM's KV cache: utilization x memory - weights - 4 GiB."""
    params, kv_bytes = MODELS[model]
    fit = cost["models"][model]["fit"]
    free = (utilization * gpu_gib - 2 * params - 4) * 2**30
    return Engine(fit["fixed_ms"], fit["per_seq_ms"], fit["per_ctx_token_ms"],
                  cost["models"][model]["prefill_ms_per_token"], max_num_seqs=1024, kv_tokens=free / kv_bytes)


def prompt_params(workload: dict, prompts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """What stays with a prompt from one step to the next: its length scale and its share of long responses."""
    params = {"scale": workload["median"] * np.exp(rng.normal(0, workload["sigma_prompt"], prompts))}
    if "long_share" in workload:
        params["share"] = rng.uniform(0, workload["long_share"], prompts)
    return params


def draw(workload: dict, params: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """[prompts, 2n] response lengths of one step for the prompts of `params` (fresh responses, same prompts)."""
    scale = params["scale"]
    lengths = scale[:, None] * np.exp(rng.normal(0, workload["sigma"], (len(scale), 2 * N)))
    if "share" in params:
        lengths = np.where(rng.random(lengths.shape) < params["share"][:, None], workload["long_factor"] * lengths, lengths)
    return np.clip(np.rint(lengths), 1, workload["cap"]).astype(int)


def steps_with_spread(workload: dict, prompts: int, steps: int, rng: np.random.Generator):
    """(lengths [prompts, 2n], spread [prompts]) per step, the same prompts every step. The spread stands in for the
    EMA: the sample std of the first n of the same prompts' previous draw (its 2n lengths in request order: what
    r = n would have kept, not the n a cut tail keeps), never of the draw it is paired with, and no EMA over steps."""
    params = prompt_params(workload, prompts, rng)
    earlier = draw(workload, params, rng)  # the prompts' previous visit
    for _ in range(steps):
        lengths = draw(workload, params, rng)
        yield lengths, earlier[:, :N].std(1, ddof=1)
        earlier = lengths


def predict_cells(cost: dict, prompts: int = 128, steps: int = 5, gpu_gib: float = 80.0, seed: int = 0,
                  workloads=tuple(WORKLOADS), models=tuple(MODELS)) -> list[dict]:
    """Per model and workload: plain generation's median step time (s) and each setting's speed-up over it (medians
    over `steps` steps of the same prompts; `seed` draws the prompts and their responses)."""
    cells = []
    for model in models:
        engine = gpu_engine(cost, model, gpu_gib)
        for wname in workloads:
            workload = WORKLOADS[wname]
            rng = np.random.default_rng(seed)
            times: dict[str, list[float]] = {s: [] for s in SETTINGS}
            for lengths, spread in steps_with_spread(workload, prompts, steps, rng):
                for sname, (adaptive, r, keep_last) in SETTINGS.items():
                    rs = allocate(spread.tolist(), N, 1.5, 10, 16) if adaptive else [r] * prompts
                    ls = [(16 - x) // 2 if keep_last is None else keep_last for x in rs]
                    times[sname].append(simulate(lengths.tolist(), rs, ls, N, engine, workload["prompt"])["ms"] / 1e3)
            base = statistics.median(times["base"])
            cells.append({"model": model, "workload": wname, "seed": seed, "base_s": base,
                          "speedup": {s: base / statistics.median(t) for s, t in times.items()}})
    return cells


def predict(cost: dict, prompts: int = 128, steps: int = 5, gpu_gib: float = 80.0, seeds=(0,),
            workloads=tuple(WORKLOADS), models=tuple(MODELS)) -> str:
    """The markdown table of `predict_cells`; with several seeds a row per seed, then per model and workload how
    often fixed r = 12 with L = 0 came out ahead of adaptive with L = 0."""
    many = len(seeds) > 1
    lines = [f"{prompts} prompts x n = {N} per step, vLLM's max_num_seqs 1024, KV cache 0.85 x {gpu_gib:.0f} GiB less "
             "weights and 4 GiB; medians over " f"{steps} steps" + (f"; seeds {', '.join(map(str, seeds))}" if many else ""),
             "", "| model | lengths | " + ("seed | " if many else "") + "base s | " + " | ".join(SETTINGS) + " |",
             "|---|---|---|" + ("---|" if many else "") + "---|" * len(SETTINGS)]
    cells = [c for seed in seeds for c in predict_cells(cost, prompts, steps, gpu_gib, seed, workloads, models)]
    cells.sort(key=lambda c: (list(MODELS).index(c["model"]), list(WORKLOADS).index(c["workload"]), c["seed"]))
    for c in cells:
        lines.append(f"| Qwen3-{c['model'].upper()} | {c['workload']} | " + (f"{c['seed']} | " if many else "")
                     + f"{c['base_s']:.1f} | " + " | ".join(f"{x:.2f}x" for x in c["speedup"].values()) + " |")
    if many:
        lines.append("")
        fixed, adaptive = "fixed r=12, L=0", "adaptive, L=0"
        for model in models:
            for wname in workloads:
                rows = [c["speedup"] for c in cells if c["model"] == model and c["workload"] == wname]
                ratios = [r[fixed] / r[adaptive] for r in rows]
                lines.append(f"Qwen3-{model.upper()}, {wname}: {fixed} ahead of {adaptive} in "
                             f"{sum(x > 1 for x in ratios)} of {len(ratios)} seeds; its speed-up over adaptive's "
                             f"median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}x-{max(ratios):.2f}x; "
                             f"{fixed} {min(r[fixed] for r in rows):.2f}x-{max(r[fixed] for r in rows):.2f}x, "
                             f"{adaptive} {min(r[adaptive] for r in rows):.2f}x-{max(r[adaptive] for r in rows):.2f}x")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--validate", type=Path, help="rollout_bench.py's JSON")
    ap.add_argument("--predict", type=Path, help="decode_cost.py's JSON (a GPU)")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--gpu-gib", type=float, default=80.0)
    ap.add_argument("--steps", type=int, default=5, help="--predict: steps per cell (the medians' sample)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="--predict: draws of prompts and responses")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="--predict: of " + ", ".join(WORKLOADS))
    ap.add_argument("--models", default=",".join(MODELS), help="--predict: of " + ", ".join(MODELS))
    args = ap.parse_args(argv)
    workloads, models = args.workloads.split(","), args.models.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS] + [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown workload(s) or model(s): {', '.join(unknown)}")
    if args.validate:
        print(validate(json.loads(args.validate.read_text())))
    if args.predict:
        print(predict(json.loads(args.predict.read_text()), args.prompts, args.steps, args.gpu_gib, args.seeds,
                      workloads, models))


if __name__ == "__main__":
    main()
