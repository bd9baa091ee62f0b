"""Side by side on the built-in example: the "hf" rollout (transformers) and verl's "vllm" rollout on CPU.

    python tests/vllm/compare_backends.py [--steps 20] [--out runs/compare_backends]

For each backend, one after the other:
1. the one-step-off `_pmis_sg` CPU script on the example for `--steps` steps (validation at step 0 and at the end,
   no checkpoint), with the peak resident memory of the rollout processes sampled every second (hf: the server
   actor; vllm: verl's server actor, vLLM's engine core and its worker);
2. from verl's metrics: median step time, median generation time of a step's batch (`generate_async`: 16 prompts
   x 8 responses, in the background of the previous step's training), generation throughput (response tokens
   per second of `generate_async`), median weight-sync time; from the script's start to the rollout servers up
   (verl's task runner prints their addresses: Ray, the trainer worker's process and the rollout engine started,
   the engine's model loaded; the difference between the two backends is the engine's) and to the first step
   logged (plus the trainer's model, the first weight sync and the step-0 validation).

Prints a markdown table (docs/cpu.md, "hf or vLLM") and writes it with the raw numbers to <out>/compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from e2e_helpers import read_log  # noqa: E402  (verl's file logger, merged per step)

SCRIPT = REPO / "shells" / "cpu" / "one_step_off_grpo_tiny_arith_cpu_replay_4_pmis_sg.sh"
ROLLOUT_PROCESS = {"hf": re.compile(r"HFRolloutServer"),
                   "vllm": re.compile(r"vLLMHttpServer|EngineCore|VLLM|VllmWorker")}


class PeakRss(threading.Thread):
    """Samples the summed RSS of the processes whose command line matches `pattern` until stopped."""

    def __init__(self, pattern: re.Pattern):
        super().__init__(daemon=True)
        self.pattern, self.peak, self.stop = pattern, 0, threading.Event()

    def run(self):
        while not self.stop.wait(1.0):
            total = 0
            for p in psutil.process_iter(["cmdline", "memory_info"]):
                try:
                    cmd = " ".join(p.info["cmdline"] or [])
                    if self.pattern.search(cmd) and p.info["memory_info"] is not None:
                        total += p.info["memory_info"].rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.peak = max(self.peak, total)


def run_backend(backend: str, steps: int, out: Path) -> dict:
    out = out / backend
    env = dict(os.environ, ROLLOUT=backend, STEPS=str(steps), TEST_FREQ=str(steps), SAVE_FREQ="-1",
               RESUME_MODE="disable", OUT_DIR=str(out), EXPERIMENT_NAME=f"compare_{backend}", PYTHON=sys.executable)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    sampler = PeakRss(ROLLOUT_PROCESS[backend])
    sampler.start()
    start = time.time()
    marks = {}
    markers = {"servers_up_s": "LLMServerManager: [", "first_step_s": "step:1 - "}
    lines = []
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        lines.append(line)
        for key, marker in markers.items():
            if key not in marks and marker in line:
                marks[key] = round(time.time() - start, 1)
    code = proc.wait()
    total = time.time() - start
    sampler.stop.set()
    sampler.join()
    (out / "output.log").write_text("".join(lines))
    if code != 0:
        raise SystemExit(f"{backend}: the script failed ({code}); see {out / 'output.log'}")
    log = read_log(out / "metrics.jsonl")
    trained = sorted(s for s, m in log.items() if "timing_s/step" in m)

    def med(key):
        values = [log[s][key] for s in trained if key in log[s]]
        return statistics.median(values) if values else None

    tokens = [log[s]["response_length/mean"] * 16 * 8 / log[s]["timing_s/generate_async"] for s in trained
              if "timing_s/generate_async" in log[s] and "response_length/mean" in log[s]]
    val = [(s, m["val-core/darl/arithmetic/acc/mean@1"]) for s, m in sorted(log.items())
           if "val-core/darl/arithmetic/acc/mean@1" in m]
    return {"backend": backend, "steps": len(trained), "total_s": round(total, 1),
            **marks,
            "step_s": med("timing_s/step"), "generate_s": med("timing_s/generate_async"),
            "sync_s": med("timing_s/update_weights"), "gen_tokens_per_s": statistics.median(tokens) if tokens else None,
            "rollout_peak_rss_gib": round(sampler.peak / 2**30, 2), "val": val}


def table(rows: list[dict]) -> str:
    head = ("| rollout | start to servers up s | to step 1 s | median step s | median generation s (16 x 8) | "
            "generation tok/s | median sync s | rollout peak RSS GiB | total s (steps) | val acc (step) |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        val = ", ".join(f"{a:.3f} ({s})" for s, a in r["val"])
        lines.append(f"| {r['backend']} | {r.get('servers_up_s')} | {r.get('first_step_s')} | {r['step_s']:.2f} | "
                     f"{r['generate_s']:.2f} | "
                     f"{r['gen_tokens_per_s']:.0f} | {r['sync_s']:.2f} | {r['rollout_peak_rss_gib']} | "
                     f"{r['total_s']:.0f} ({r['steps']}) | {val} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "compare_backends")
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    args = parser.parse_args()
    rows = [run_backend(b, args.steps, args.out) for b in args.backends]
    text = table(rows)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps({"rows": rows, "table": text}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
