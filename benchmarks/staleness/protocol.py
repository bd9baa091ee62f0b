"""The rules of docs/evidence/protocol.md as code: choosing the preset on development seeds, the held-out headline.

    python -m benchmarks.staleness.protocol choose runs/protocol/scarce/dev          # the preset and the alternative
    python -m benchmarks.staleness.protocol headline runs/protocol/scarce/heldout --preset darl --alternative equal_update
    python -m benchmarks.staleness.protocol pipeline docs/evidence/protocol/scarce/pipeline/results.jsonl.gz \\
        --preset darl_tokens_e2 --alternative decoupled_prompt_e2                   # the same through verl's trainers
    python -m benchmarks.staleness.protocol replay-heldout runs/protocol/scarce/replay_heldout  # section 5: replay on/off
    python -m benchmarks.staleness.protocol archive runs/protocol docs/evidence/protocol   # raw runs into the repository
    python -m benchmarks.staleness.protocol restore docs/evidence/protocol runs/protocol   # and back, to resume

`choose` scores each configuration by the mean over s in {4, 8} of its mean final accuracy over the development
seeds and picks the best D-ARL configuration (the preset) and the best simple alternative. `headline` pairs the
preset with decoupled PPO and with the alternative at s = 4 and 8 over the held-out seeds (paired t test), adjusts
the four p-values with Holm's method and gives each comparison its verdict; secondary rows follow, unadjusted; then
each configuration's accuracy at equal generated samples, gradient steps and wall time (`two_axes`), also as
figures `two_axes_s4.png`, `two_axes_s8.png` beside the table (`two_axes_figure`). `pipeline` does the same for the
pipeline stage's launches through verl's one-step-off and fully-async trainers (one cell per trainer).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from benchmarks.staleness import attempts
from benchmarks.staleness.paired import detectable_effect, holm, mean_std, paired, seeds_for_power
from benchmarks.staleness.provenance import same_origin
from benchmarks.staleness.run_study import METHODS, load_results, run_key, samples_to_reach, study_results

DEV_SEEDS = tuple(range(8))
HELDOUT_SEEDS = (1344, 1808, 2321, 4368, 5458, 6024, 6336, 6750, 7613, 8324, 9586, 9637)
STALENESS = (4, 8)
# what the held-out stage runs besides the preset and the alternative; gates_only (the preset's controls without
# replay) gives replay's own share on held-out seeds, a secondary comparison
HELDOUT_BASELINES = ("sync", "naive", "decoupled", "equal_update", "gates_only")
DARL_CONFIGS = ("darl", "darl_no_prompt", "darl_k1", "darl_own", "darl_tokens", "darl_newest")
DARL_CANDIDATES = DARL_CONFIGS + tuple(f"{c}_e2" for c in DARL_CONFIGS)
SIMPLE_CANDIDATES = ("equal_update", "icepop", "uniform_replay", "uniform_replay_e2", "decoupled_prompt", "decoupled_prompt_e2")
# everything the development stage runs (docs/evidence/protocol.md, section 2), the cheapest first
DEV_CONFIGS = ("sync", "naive", "decoupled", "equal_update", "icepop", "gates_only", "uniform_replay", "decoupled_prompt",
               *DARL_CONFIGS, "uniform_replay_e2", "decoupled_prompt_e2", *(f"{c}_e2" for c in DARL_CONFIGS))
ALPHA = 0.05
# replay's own share (docs/evidence/protocol.md, section 5): the preset, replay off, per-prompt replay alone; the
# development seeds were drawn at random from 10000-99999 before any of their runs
REPLAY_CONFIGS = ("darl_tokens_e2", "replay_off_e2", "prompt_replay_only_e2")
REPLAY_DEV_SEEDS = (13404, 14286, 36273, 56026, 70131, 90538)
# its held-out seeds, as many as the power calculation on the development seeds asked for (60, the cap), drawn at
# random from 100000-999999 after the development runs and before any held-out run
REPLAY_HELDOUT_SEEDS = (
    100397, 112274, 114496, 121081, 133336, 136167, 145276, 162693, 174968, 195652, 214858, 248012, 270442,
    300549, 309328, 332690, 373036, 391825, 396522, 405884, 406533, 411836, 421693, 427952, 473272, 524440,
    530200, 537227, 543232, 584378, 589480, 591226, 596163, 604112, 616364, 618911, 631730, 632279, 633224,
    634706, 720145, 725267, 743911, 758453, 769245, 783442, 797557, 799017, 824746, 824758, 840735, 886289,
    897867, 923856, 960151, 964495, 991534, 991881, 992482, 998538,
)


def finals_by_cell(results: Iterable[dict[str, Any]], seeds: Iterable[int]) -> dict[tuple[int, str], dict[int, dict]]:
    keep = set(seeds)
    out: dict[tuple[int, str], dict[int, dict]] = {}
    for r in results:
        if r["seed"] in keep:
            out.setdefault((r["staleness"], r["method_name"]), {})[r["seed"]] = r
    return out


def complete_seeds(cells: dict[tuple[int, str], dict[int, dict]], seeds: Iterable[int],
                   keys: Iterable[tuple[Any, str]]) -> list[int]:
    """The seeds of `seeds` with a run in every cell of `keys` ((staleness or threshold, configuration) pairs)."""
    keys = list(keys)
    return [x for x in seeds if all(x in cells.get(k, {}) for k in keys)]


def score(results: list[dict[str, Any]], name: str, seeds: Iterable[int] = DEV_SEEDS,
          stalenesses: Iterable[int] = STALENESS) -> float | None:
    """Mean over s of the mean final accuracy over `seeds`; None unless every s has every seed."""
    seeds, cells = tuple(seeds), finals_by_cell(results, seeds)
    means = []
    for s in stalenesses:
        runs = cells.get((s, name), {})
        if set(runs) != set(seeds):
            return None
        means.append(statistics.fmean(r["final_accuracy"] for r in runs.values()))
    return statistics.fmean(means)


def passes(name: str) -> int:
    """Optimizer passes over each batch the configuration makes (run_study's `epochs`)."""
    return int(METHODS[name].get("epochs", 1)) if name in METHODS else 1


def choose(results: list[dict[str, Any]], candidates: Iterable[str], seeds: Iterable[int] = DEV_SEEDS) -> str | None:
    """The candidate with the highest score (ties: fewer passes, then the one listed first); None while any candidate
    is incomplete."""
    scores = {c: score(results, c, seeds) for c in candidates}
    if not scores or any(v is None for v in scores.values()):
        return None
    best = max(scores.values())
    return min((c for c, v in scores.items() if v == best), key=passes)  # min keeps the first of equals


def score_table(results: list[dict[str, Any]], names: Iterable[str], seeds: Iterable[int] = DEV_SEEDS) -> str:
    seeds = tuple(seeds)
    cells = finals_by_cell(results, seeds)
    lines = ["| configuration | " + " | ".join(f"s = {s} final (seeds)" for s in STALENESS) + " | score |",
             "|---|" + "---|" * (len(STALENESS) + 1)]
    for name in names:
        parts = []
        for s in STALENESS:
            runs = [r["final_accuracy"] for r in cells.get((0 if name == "sync" else s, name), {}).values()]
            parts.append(f"{mean_std(runs)} ({len(runs)})" if runs else "-")
        value = score(results, name, seeds, (0,) if name == "sync" else STALENESS)
        lines.append(f"| {name} | " + " | ".join(parts) + f" | {'-' if value is None else f'{value:.3f}'} |")
    return "\n".join(lines) + "\n"


def development_report(results: list[dict[str, Any]]) -> str:
    """The development stage so far: how many of its runs, each configuration's score, and the choice (once every
    candidate has all its runs)."""
    preset, alternative = choose(results, DARL_CANDIDATES), choose(results, SIMPLE_CANDIDATES)
    planned = ((len(DEV_CONFIGS) - 1) * len(STALENESS) + 1) * len(DEV_SEEDS)  # sync runs at s = 0 only
    runs = {(r["method_name"], r["staleness"], r["seed"]): r.get("provenance") or {}
            for r in results if r["seed"] in DEV_SEEDS}
    origins = Counter(f"{(p.get('commit') or '')[:7]} on {p.get('cpu') or 'an unrecorded CPU'}" for p in runs.values())
    return (f"{len(runs)} of {planned} development runs "
            f"({'; '.join(f'{n} from {where}' for where, n in sorted(origins.items()))}).\n\n"
            + score_table(results, [n for n in DEV_CONFIGS if any(r["method_name"] == n for r in results)])
            + f"\npreset: {preset or 'not yet (a candidate lacks runs)'}\n"
            + f"alternative: {alternative or 'not yet (a candidate lacks runs)'}\n")


def paired_row(cells, s: int, a: str, b: str) -> dict[str, Any]:
    ra, rb = cells.get((s, a), {}), cells.get((0 if b == "sync" else s, b), {})
    seeds = sorted(set(ra) & set(rb))
    diff = paired({x: ra[x]["final_accuracy"] for x in seeds}, {x: rb[x]["final_accuracy"] for x in seeds})
    side = sum(same_origin(ra[x].get("provenance"), rb[x].get("provenance")) for x in seeds)
    return {"s": s, "a": a, "b": b, "diff": diff, "side_by_side": side}


def holm_verdicts(family: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each comparison's Holm-adjusted p-value across the family and its verdict: supported (adjusted p < ALPHA,
    mean above zero), refuted (adjusted p < ALPHA, mean below zero) or not separated."""
    for row, adj in zip(family, holm([r["diff"].p if r["diff"].n > 1 else 1.0 for r in family])):
        row["p_holm"] = adj
        if row["diff"].n < 2 or adj >= ALPHA:
            row["verdict"] = "not separated"
        else:
            row["verdict"] = "supported" if row["diff"].mean > 0 else "refuted"
    return family


def headline(results: list[dict[str, Any]], preset: str, alternative: str,
             seeds: Iterable[int] = HELDOUT_SEEDS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The four Holm-adjusted comparisons, and the secondary rows (preset minus naive, equal_update, gates_only and
    sync)."""
    cells = finals_by_cell(results, seeds)
    family = holm_verdicts([paired_row(cells, s, preset, b) for b in ("decoupled", alternative) for s in STALENESS])
    secondary = [paired_row(cells, s, preset, b) for b in HELDOUT_BASELINES if b not in ("decoupled", alternative)
                 for s in STALENESS]
    return family, [r for r in secondary if r["diff"].n > 0]


def headline_table(family: list[dict[str, Any]], secondary: list[dict[str, Any]], first: str = "s") -> str:
    """The family's rows with their Holm verdicts, then the secondary rows; `first` names the cell's column (s, or
    trainer for the pipeline stage)."""
    lines = [f"| {first} | comparison | paired seeds (side by side) | difference, points [95% interval], seeds above | "
             "p | p, Holm | verdict |", "|---|---|---|---|---|---|---|"]
    for r in family:
        lines.append(f"| {r[first]} | {r['a']} - {r['b']} | {r['diff'].n} ({r['side_by_side']}) | "
                     f"{r['diff'].points()} | {r['diff'].p:.3g} | {r['p_holm']:.3g} | {r['verdict']} |")
    for r in secondary:
        lines.append(f"| {r[first]} | {r['a']} - {r['b']} (secondary) | {r['diff'].n} ({r['side_by_side']}) | "
                     f"{r['diff'].points()} | {r['diff'].p:.3g} | - | - |")
    return "\n".join(lines) + "\n"


def heldout_report(results: list[dict[str, Any]], preset: str, alternative: str) -> str:
    """What `protocol headline` prints and docs/evidence.md holds: the headline family with its secondary rows, then
    the secondary figures at s = 4 and 8."""
    names = dict.fromkeys((*HELDOUT_BASELINES, preset, alternative))
    return (headline_table(*headline(results, preset, alternative)) + "\n"
            + "\n".join(two_axes(results, names, s, HELDOUT_SEEDS) for s in STALENESS))


# ---- the pipeline stage (protocol.md, section 4): the held-out seeds through the CPU launch scripts ----------------

PIPELINE_TRAINERS = ("one_step_off", "fully_async")
PIPELINE_STEPS = 50


def replay_family(results: list[dict[str, Any]], seeds: Iterable[int]) -> list[dict[str, Any]]:
    """Section 5's four comparisons (all of replay, per-prompt replay alone; s = 4 and 8) over `seeds`, each paired
    over the seeds both sides have, with Holm's correction across them."""
    cells = finals_by_cell(results, seeds)
    preset, off, prompt_only = REPLAY_CONFIGS
    return holm_verdicts([paired_row(cells, s, a, off) for a in (preset, prompt_only) for s in STALENESS])


def replay_power(results: list[dict[str, Any]], effect: float = 0.03) -> str:
    """Section 5's development block: the four differences on its development seeds, their largest standard
    deviation, and the held-out seeds that give 80% power for `effect` (accuracy, 0.03 = 3 points)."""
    family = replay_family(results, REPLAY_DEV_SEEDS)
    lines = ["| s | comparison | development seeds | difference, points [95% interval] | sd, points |", "|---|---|---|---|---|"]
    sds = []
    for row in family:
        cells = finals_by_cell(results, REPLAY_DEV_SEEDS)
        ra, rb = cells.get((row["s"], row["a"]), {}), cells.get((row["s"], row["b"]), {})
        diffs = [ra[x]["final_accuracy"] - rb[x]["final_accuracy"] for x in sorted(set(ra) & set(rb))]
        sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        sds.append(sd)
        lines.append(f"| {row['s']} | {row['a']} - {row['b']} | {row['diff'].n} | {row['diff'].points()} | "
                     f"{100 * sd:.1f} |")
    complete = all(row["diff"].n == len(REPLAY_DEV_SEEDS) for row in family)
    if not complete:
        return "\n".join(lines) + "\n\nheld-out seeds: not yet (a development run is missing)\n"
    sd = max(sds)
    n = seeds_for_power(sd, effect)
    text = "\n".join(lines) + f"\n\nlargest sd {100 * sd:.1f} points: held-out seeds {n}"
    if n == seeds_for_power(sd, effect, high=10**6):
        return text + "\n"
    return text + f" (the cap; 80% power at {100 * detectable_effect(sd, n):.1f} points)\n"


def replay_heldout_report(results: list[dict[str, Any]]) -> str:
    """Section 5's held-out table with its Holm verdicts and what follows from it, once every held-out seed has its
    six runs (three configurations at s = 4 and 8); before that, only how many seeds have them."""
    cells = finals_by_cell(results, REPLAY_HELDOUT_SEEDS)
    whole = complete_seeds(cells, REPLAY_HELDOUT_SEEDS, [(s, c) for c in REPLAY_CONFIGS for s in STALENESS])
    head = f"{len(whole)} of {len(REPLAY_HELDOUT_SEEDS)} held-out seeds have their six runs"
    if len(whole) < len(REPLAY_HELDOUT_SEEDS):  # no interim table: the family is read once, whole
        return head + "; the table follows once all have them.\n"
    family = replay_family(results, REPLAY_HELDOUT_SEEDS)
    preset, off, _ = REPLAY_CONFIGS
    if any(r["verdict"] == "supported" for r in family if r["a"] == preset):
        follows = f"replay separates from the preset's token controls: the preset stays {preset}"
    else:
        follows = (f"replay does not separate from the preset's token controls: the preset becomes {off}, "
                   "replay one flag away (replay.k=4 replay.prompt_replay=16)")
    return f"{head}.\n\n{headline_table(family, [])}\n{follows}\n"


def pipeline_launches(preset: str, alternative: str) -> list[tuple[str, str]]:
    """(trainer, configuration) of one held-out seed in the pipeline stage; sync runs through fully-async only."""
    return [(t, c) for t in PIPELINE_TRAINERS for c in ("sync", "decoupled", preset, alternative)
            if t == "fully_async" or c != "sync"]


def _finished(run: dict[str, Any]) -> bool:
    return any(r.get("step") == PIPELINE_STEPS for r in run.get("records", []))


def whole_seeds(runs: list[dict[str, Any]], preset: str, alternative: str) -> list[int]:
    """The held-out seeds whose every launch of the stage finished, in protocol order."""
    want = set(pipeline_launches(preset, alternative))
    done: dict[int, set] = {}
    for run in runs:
        if _finished(run):
            done.setdefault(run["seed"], set()).add((run["trainer"], run["config"]))
    return [s for s in HELDOUT_SEEDS if done.get(s, set()) >= want]


def pipeline_archive(out: Path, folder: Path, preset: str, alternative: str) -> list[int]:
    """Adds OUT's whole seeds (every launch of the seed finished; a seed in flight is left out) to FOLDER's archive
    (results.jsonl.gz); returns the archived seeds. Prints no result: the tables wait for every seed."""
    from benchmarks.staleness.pipeline_report import archive as write, load_runs

    packed = folder / "results.jsonl.gz"
    kept = {(r["trainer"], r["config"], r["seed"]): r for r in (load_runs(packed) if packed.exists() else [])}
    new = load_runs(out)
    want, seeds = set(pipeline_launches(preset, alternative)), set(whole_seeds(new, preset, alternative))
    for run in new:
        if run["seed"] in seeds and (run["trainer"], run["config"]) in want:
            kept.setdefault((run["trainer"], run["config"], run["seed"]), run)
    write(list(kept.values()), folder)
    return whole_seeds(list(kept.values()), preset, alternative)


def pipeline_progress(runs: list[dict[str, Any]], preset: str, alternative: str) -> str:
    """The stage's progress line (`pipeline-archive` prints it): whole seeds archived, and where they ran."""
    seeds = whole_seeds(runs, preset, alternative)
    per_seed = len(pipeline_launches(preset, alternative))
    where = sorted({(r.get("provenance") or {}).get("commit", "?")[:7] for r in runs if r["seed"] in seeds})
    text = (f"Archived: {len(seeds)} of {len(HELDOUT_SEEDS)} held-out seeds ({len(seeds) * per_seed} of "
            f"{len(HELDOUT_SEEDS) * per_seed} launches)")
    if seeds:
        noun = "seed" if len(seeds) == 1 else "seeds"
        text += f", {noun} {', '.join(map(str, seeds))}, from commit {', '.join(where)}"
    return text + ". Tables: `protocol pipeline` once every seed has run."


# the staleness each trainer's launches train at: one-step-off generates with the weights one step behind; the
# fully-async launches run at staleness_threshold 4 (sync: 0)
PIPELINE_STALENESS = {"one_step_off": 1, "fully_async": 4}


def updates_per_step(config: dict[str, Any]) -> int:
    """Optimizer updates a trainer step makes, from a launch's resolved config: passes (ppo_epochs) x mini-batches
    (prompts a step / ppo_mini_batch_size)."""
    from benchmarks.staleness.pipeline_report import prompts_per_step

    actor = config["actor_rollout_ref"]["actor"]
    return int(actor["ppo_epochs"]) * prompts_per_step(config) // int(actor["ppo_mini_batch_size"])


def pipeline_results(runs: list[dict[str, Any]], trainer: str) -> list[dict[str, Any]]:
    """`trainer`'s runs of the stage in the harness's result shape, so that the held-out stage's comparisons and
    `two_axes` read them: staleness from PIPELINE_STALENESS, evaluations on generated samples and wall time
    (pipeline_report.as_result), gradient steps from the resolved config, provenance only where every launch of the
    run ran from one clean commit on one machine."""
    from benchmarks.staleness.pipeline_report import as_result, origin

    out = []
    for run in runs:
        if run["trainer"] != trainer:
            continue
        r = as_result(run, 0)
        updates = updates_per_step(run["resolved_config"])
        out.append({"seed": run["seed"], "method_name": run["config"],
                    "staleness": 0 if run["config"] == "sync" else PIPELINE_STALENESS[trainer],
                    "final_accuracy": r["final_accuracy"], "step_time_mean": r["step_time"], "evals": r["evals"],
                    "steps": [{"step": k, "updates": updates} for k in range(1, PIPELINE_STEPS + 1)],
                    "provenance": origin(run)})
    return out


def pipeline_trainers(runs: list[dict[str, Any]], preset: str, alternative: str):
    """For each trainer of the stage: (trainer, its configurations, its runs as `pipeline_results` gives them)."""
    for trainer in PIPELINE_TRAINERS:
        names = [c for t, c in pipeline_launches(preset, alternative) if t == trainer]
        yield trainer, names, pipeline_results(runs, trainer)


def pipeline_headline(runs: list[dict[str, Any]], preset: str, alternative: str,
                      seeds: Iterable[int] = HELDOUT_SEEDS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The held-out family through verl's trainers: the preset minus decoupled PPO and minus the alternative under
    each trainer (four comparisons, Holm's correction across them); secondary rows: under fully-async, the preset,
    decoupled PPO and the alternative each minus on-policy training (what staleness costs through the trainer)."""
    family, secondary = [], []
    for trainer, _, results in pipeline_trainers(runs, preset, alternative):
        cells = finals_by_cell(results, seeds)
        s = PIPELINE_STALENESS[trainer]
        family += [{**paired_row(cells, s, preset, b), "trainer": trainer} for b in ("decoupled", alternative)]
        if trainer == "fully_async":
            secondary += [{**paired_row(cells, s, a, "sync"), "trainer": trainer} for a in (preset, "decoupled", alternative)]
    family = sorted(family, key=lambda r: r["b"] != "decoupled")  # against decoupled PPO first, as the harness's
    return holm_verdicts(family), [r for r in secondary if r["diff"].n > 0]


def pipeline_stage_report(runs: list[dict[str, Any]], preset: str, alternative: str) -> str:
    """What `protocol pipeline` prints and docs/evidence.md holds: the family with its secondary rows, then each
    trainer's secondary figures (`two_axes`)."""
    text = headline_table(*pipeline_headline(runs, preset, alternative), first="trainer")
    for trainer, names, results in pipeline_trainers(runs, preset, alternative):
        table = two_axes(results, names, PIPELINE_STALENESS[trainer], HELDOUT_SEEDS)
        text += "\n" + table.replace(f"| s = {PIPELINE_STALENESS[trainer]}", f"| {trainer}")
    return text


AXES = ("samples", "updates", "wall")  # generated samples, gradient steps (optimizer updates), wall seconds


def curve(run: dict[str, Any], axis: str) -> tuple[list[float], list[float]]:
    """(x, accuracy) at the run's evaluations; x on `axis` (updates: those done before the evaluation's step)."""
    if axis == "updates":
        done = [sum(s.get("updates", 0) for s in run["steps"] if s["step"] < e["step"]) for e in run["evals"]]  # skipped: 0
        return [float(x) for x in done], [e["accuracy"] for e in run["evals"]]
    return [float(e[axis]) for e in run["evals"]], [e["accuracy"] for e in run["evals"]]


def accuracy_at(run: dict[str, Any], axis: str, x: float) -> float:
    """Accuracy at `x` on `axis`, linear between the two evaluations around it (the last one past its end)."""
    xs, ys = curve(run, axis)
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (max(x, x0) - x0) / (x1 - x0)
    return ys[-1]


FRACTIONS = (0.25, 0.5, 1.0)  # of the shortest run on each axis (docs/evidence/protocol.md, section 3)


def two_axes(results: list[dict[str, Any]], names: Iterable[str], s: int, seeds: Iterable[int]) -> str:
    """The secondary figures of the configurations `names` at staleness `s` (sync at 0), mean +- std over `seeds`:
    final accuracy, median step time relative to decoupled PPO's, generated samples to reach decoupled PPO's mean
    final accuracy (none where that final is not above decoupled PPO's mean first evaluation); then accuracy at
    equal generated samples, gradient steps and wall time, at 25%, 50% and 100% of the least any run of the table
    reached on that axis."""
    cells = finals_by_cell(results, seeds)
    rows = {n: list(cells.get((0 if n == "sync" else s, n), {}).values()) for n in names}
    rows = {n: runs for n, runs in rows.items() if runs}
    ref = rows.get("decoupled")
    ref_step = statistics.median(r["step_time_mean"] for r in ref) if ref else None
    ref_final = statistics.fmean(r["final_accuracy"] for r in ref) if ref else None
    # where decoupled PPO ends at or below where it started, every run "reaches" its final at step 0: no figure
    if ref and ref_final <= statistics.fmean(r["evals"][0]["accuracy"] for r in ref):
        ref_final = None
    reach_head = ("samples to decoupled's final (runs reaching it)" if ref_final is not None
                  else "samples to decoupled's final (none: it ends at or below its start)")
    lines = [f"| s = {s} | runs | final | step time / decoupled's | {reach_head} |", "|---|---|---|---|---|"]
    for n, runs in rows.items():
        step = f"{statistics.median(r['step_time_mean'] for r in runs) / ref_step:.2f}x" if ref_step else "-"
        cell = "-"
        if ref_final is not None:
            hit = [x for x in (samples_to_reach(r["evals"], ref_final) for r in runs) if x is not None]
            cell = f"{f'{statistics.fmean(hit):.0f}' if hit else '-'} ({len(hit)})"
        lines.append(f"| {n} | {len(runs)} | {mean_std([r['final_accuracy'] for r in runs])} | {step} | {cell} |")
    for axis in AXES:
        end = min(curve(r, axis)[0][-1] for runs in rows.values() for r in runs)
        what, unit = {"samples": ("samples", "samples"), "updates": ("gradient steps", "gradient steps"),
                      "wall": ("wall time", "s")}[axis]
        lines += ["", f"| s = {s}, equal {what} | " + " | ".join(f"at {f * end:.0f} {unit}" for f in FRACTIONS) + " |",
                  "|---|" + "---|" * len(FRACTIONS)]
        for n, runs in rows.items():
            lines.append(f"| {n} | " + " | ".join(mean_std([accuracy_at(r, axis, f * end) for r in runs])
                                                  for f in FRACTIONS) + " |")
    return "\n".join(lines) + "\n"


def two_axes_figure(results: list[dict[str, Any]], names: Iterable[str], s: int, seeds: Iterable[int],
                    out: Path, label: str | None = None) -> Path:
    """`two_axes_{label}.png` (label: `s{s}` unless given): accuracy against generated samples, gradient steps and
    wall time (three panels), each configuration's mean over `seeds` with +- one std, each run's curve interpolated
    onto a common grid up to the least any run reached on that axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = finals_by_cell(results, seeds)
    rows = {n: list(cells.get((0 if n == "sync" else s, n), {}).values()) for n in names}
    rows = {n: runs for n, runs in rows.items() if runs}
    fig, axes = plt.subplots(1, len(AXES), figsize=(5 * len(AXES), 3.8), sharey=True)
    for ax, axis in zip(axes, AXES):
        end = min(curve(r, axis)[0][-1] for runs in rows.values() for r in runs)
        grid = np.linspace(0.0, end, 26)
        for n, runs in rows.items():
            y = np.array([[accuracy_at(r, axis, x) for x in grid] for r in runs])
            (line,) = ax.plot(grid, y.mean(0), label=f"{n} ({len(runs)})", lw=2.2 if n.startswith("darl") else 1.4)
            ax.fill_between(grid, y.mean(0) - y.std(0), y.mean(0) + y.std(0), alpha=0.12, color=line.get_color())
        ax.set_xlabel({"samples": "generated samples", "updates": "gradient steps", "wall": "wall time (s)"}[axis])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy accuracy")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"{label or f's = {s}'}: accuracy at equal samples, gradient steps and wall time (mean +- std over seeds)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"two_axes_{label or f's{s}'}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _studies(root: Path, name: str) -> list[Path]:
    """root/**/name outside `pipeline`, `replay_pipeline` and `threshold_*` folders (the runs of the stages through
    the launch scripts are verl logs, archived by pipeline_report and threshold_sweep)."""
    return [p for p in sorted(root.rglob(name)) if not any(
        part.endswith("pipeline") or part.startswith("threshold_") for part in p.relative_to(root).parts)]


def archive(out: Path, folder: Path) -> list[Path]:
    """Every OUT/**/results.jsonl as FOLDER/**/results.jsonl.gz (the study's raw runs, kept in the repository), and
    every attempts.jsonl (each run's start, finish or failure) as attempts.jsonl.gz."""
    import gzip

    written = []
    for source in _studies(out, "results.jsonl"):
        target = folder / source.relative_to(out).with_suffix(".jsonl.gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.compress(source.read_bytes(), mtime=0))
        written.append(target)
    return written + [attempts.pack(source, folder / source.relative_to(out).with_suffix(".jsonl.gz"),
                                    load_results(source.with_name("results.jsonl")))
                      for source in _studies(out, attempts.NAME)]


def restore(folder: Path, out: Path) -> list[Path]:
    """The archived runs OUT lacks appended to OUT's results, so that a study on a new machine resumes (a run is
    one method, staleness, seed and setting: run_study's key)."""
    import gzip

    written = []
    for packed in _studies(folder, attempts.NAME + ".gz"):  # attempts: every archived line OUT's file lacks
        target = out / packed.relative_to(folder).with_suffix("")
        if attempts.unpack(packed, target):
            written.append(target)
    for packed in _studies(folder, "results.jsonl.gz"):
        target = out / packed.relative_to(folder).with_suffix("")
        have = {_key(r) for r in load_results(target)} if target.exists() else set()
        lines = [line for line in gzip.decompress(packed.read_bytes()).decode().splitlines()
                 if line.strip() and _key(json.loads(line)) not in have]
        if lines:
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a") as f:
                f.write("".join(line + "\n" for line in lines))
            written.append(target)
    return written


def _key(result: dict[str, Any]) -> str:
    return run_key(result["method_name"], result["staleness"], result["seed"], result.get("common", {}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("choose", help="the preset and the strongest simple alternative, from development runs")
    c.add_argument("study", type=Path)
    c.add_argument("--out", type=Path)
    h = sub.add_parser("headline", help="the held-out headline with Holm's correction")
    h.add_argument("study", type=Path)
    h.add_argument("--preset", required=True)
    h.add_argument("--alternative", required=True)
    h.add_argument("--out", type=Path)
    pp = sub.add_parser("pipeline", help="the pipeline stage's family with Holm's correction, from its archive")
    pp.add_argument("archive", type=Path, help="the stage's results.jsonl.gz")
    pp.add_argument("--preset", required=True)
    pp.add_argument("--alternative", required=True)
    pp.add_argument("--out", type=Path)
    pa = sub.add_parser("pipeline-archive", help="OUT's whole seeds of the pipeline stage into FOLDER's archive")
    pa.add_argument("src", type=Path)
    pa.add_argument("dst", type=Path)
    pa.add_argument("--preset", required=True)
    pa.add_argument("--alternative", required=True)
    rp = sub.add_parser("replay-power", help="section 5's development differences and the held-out seeds they need")
    rp.add_argument("study", type=Path)
    rp.add_argument("--out", type=Path)
    rh = sub.add_parser("replay-heldout", help="section 5's held-out family with Holm's correction and what follows")
    rh.add_argument("study", type=Path)
    rh.add_argument("--out", type=Path)
    for name, helptext in (("archive", "OUT's raw runs into FOLDER as .jsonl.gz"),
                           ("restore", "FOLDER's archived runs into OUT where it has none")):
        a = sub.add_parser(name, help=helptext)
        a.add_argument("src", type=Path)
        a.add_argument("dst", type=Path)
    args = p.parse_args(argv)
    if args.command in ("archive", "restore"):
        for path in (archive if args.command == "archive" else restore)(args.src, args.dst):
            print(path)
        return 0
    if args.command == "pipeline-archive":
        from benchmarks.staleness.pipeline_report import load_runs

        pipeline_archive(args.src, args.dst, args.preset, args.alternative)
        print(pipeline_progress(load_runs(args.dst / "results.jsonl.gz"), args.preset, args.alternative))
        return 0
    if args.command == "pipeline":
        from benchmarks.staleness.pipeline_report import load_runs

        runs = load_runs(args.archive)
        text = pipeline_stage_report(runs, args.preset, args.alternative)
        for trainer, names, results in pipeline_trainers(runs, args.preset, args.alternative):  # as figures too
            two_axes_figure(results, names, PIPELINE_STALENESS[trainer], HELDOUT_SEEDS,
                            args.out.parent if args.out else args.archive.parent, label=trainer)
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0
    results = study_results(args.study)
    if args.command == "choose":
        text = development_report(results)
    elif args.command == "replay-power":
        text = replay_power(results)
    elif args.command == "replay-heldout":
        text = replay_heldout_report(results)
    else:
        text = heldout_report(results, args.preset, args.alternative)
        names = dict.fromkeys((*HELDOUT_BASELINES, args.preset, args.alternative))
        for s in STALENESS:  # the same comparison as figures, beside the table
            two_axes_figure(results, names, s, HELDOUT_SEEDS, args.out.parent if args.out else args.study)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
