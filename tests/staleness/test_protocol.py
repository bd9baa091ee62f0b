"""The evidence protocol's machinery: provenance, the testbed validation, the preset's choice and the Holm headline."""

import json
import re
from pathlib import Path

import pytest

from benchmarks.staleness import protocol
from benchmarks.staleness.paired import holm, paired, t975, t_two_sided_p
from benchmarks.staleness.provenance import provenance, same_origin
from benchmarks.staleness.run_study import METHODS, run_key
from benchmarks.staleness.validation import best_lr, by_lr, staleness_rows

REPO = Path(__file__).resolve().parents[2]
ORIGIN = {"commit": "a" * 40, "dirty": False, "host": "h1", "cpu": "c1", "boot": "b1", "date": "2026-01-01T00:00:00"}


def run(method, s, seed, final, lr=1e-4, origin=ORIGIN):
    return {"method_name": method, "staleness": s, "seed": seed, "final_accuracy": final, "best_accuracy": final,
            "initial_accuracy": 0.2, "common": {"lr": lr}, "provenance": dict(origin)}


def test_provenance_names_the_commit_the_host_and_a_clean_or_dirty_tree():
    p = provenance()
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
    assert p["cores"] >= 1 and p["host"] and p["cpu"] and p["date"].startswith("20")
    assert same_origin(ORIGIN, dict(ORIGIN))
    assert not same_origin(ORIGIN, {**ORIGIN, "host": "h2"}) and not same_origin(ORIGIN, {**ORIGIN, "commit": "b" * 40})
    assert not same_origin(ORIGIN, {**ORIGIN, "dirty": True}) and not same_origin(ORIGIN, None)  # archived: none
    # virtual machines share host names: another boot or another CPU is another machine
    assert not same_origin(ORIGIN, {**ORIGIN, "boot": "b2"}) and not same_origin(ORIGIN, {**ORIGIN, "cpu": "c2"})
    assert same_origin(ORIGIN, {**ORIGIN, "date": "2026-01-02T00:00:00"})  # one boot, two study processes
    # records from before boot ids: one study process (one `date`) or not side by side
    old = {k: v for k, v in ORIGIN.items() if k != "boot"}
    assert same_origin(old, dict(old)) and not same_origin(old, {**old, "date": "2026-01-02T00:00:00"})
    assert not same_origin(old, {**ORIGIN, "date": "2026-01-02T00:00:00"})
    boot = Path("/proc/sys/kernel/random/boot_id")
    assert p["boot"] == (boot.read_text().strip() if boot.exists() else None)


def test_t_p_values_and_holm_by_hand():
    for df in (1, 2, 5, 11, 30):  # the interval's quantile is where the two-sided p is 0.05
        assert t_two_sided_p(t975(df), df) == pytest.approx(0.05, abs=2e-4)
    assert t_two_sided_p(1.0, 10) == pytest.approx(0.34089, abs=1e-5)  # tables of Student's t
    assert t_two_sided_p(3.0, 4) == pytest.approx(0.03994, abs=1e-5)
    assert t_two_sided_p(0.0, 7) == 1.0
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    d = paired({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.4, 1: 0.4, 2: 0.4})  # diffs 0.1, 0.2, 0.3: t = 0.2 / (0.1 / sqrt 3)
    assert d.p == pytest.approx(t_two_sided_p(0.2 / (0.1 / 3 ** 0.5), 2))


def test_validation_picks_syncs_best_rate_and_asks_every_stale_interval_below_zero(tmp_path):
    rows = {1e-4: [run("sync", 0, x, 0.40 + 0.01 * x) for x in range(3)],
            2e-4: [run("sync", 0, x, 0.50 + 0.01 * x, 2e-4) for x in range(3)]
            + [run("decoupled", 4, x, 0.30 + 0.02 * x, 2e-4) for x in range(3)]
            + [run("naive", 4, x, 0.52 - 0.02 * x, 2e-4, {**ORIGIN, "host": "other"}) for x in range(3)]}
    for lr, runs in rows.items():
        folder = tmp_path / f"lr{lr:g}"
        folder.mkdir()
        (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    runs = by_lr(tmp_path)
    assert best_lr(runs) == 2e-4
    cells = {r["method"]: r for r in staleness_rows(runs[2e-4])}
    assert cells["decoupled"]["hurts"] and cells["decoupled"]["side_by_side"] == 3  # -20, -19, -18 points
    assert not cells["naive"]["hurts"] and cells["naive"]["side_by_side"] == 0  # +2, 0, -2: within noise; other host


def test_the_study_goes_on_only_in_a_validated_regime(tmp_path):
    """protocol.sh runs the development stage only where every baseline at s = 4 and 8 ends below sync over 8
    paired seeds (`validation --check`): a missing cell, too few seeds or one interval reaching zero stop it."""
    from benchmarks.staleness.validation import validated

    def write(runs):
        folder = tmp_path / "lr0.0002"
        folder.mkdir(exist_ok=True)
        (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))

    sync = [run("sync", 0, x, 0.50 + 0.01 * x, 2e-4) for x in range(8)]
    stale = [run(m, s, x, 0.30 + 0.01 * x, 2e-4) for m in ("decoupled", "naive") for s in (4, 8) for x in range(8)]
    write(sync + stale)
    assert validated(tmp_path)
    write(sync + stale[:-1])  # naive at s = 8 has 7 seeds
    assert not validated(tmp_path)
    write(sync + [r for r in stale if r["staleness"] == 4])  # s = 8 not run
    assert not validated(tmp_path)
    write(sync + stale[:-1] + [run("naive", 8, 7, 0.90, 2e-4)])  # one seed far above sync: the interval reaches 0
    assert not validated(tmp_path)


def test_the_preset_is_chosen_by_the_development_score_and_ties_go_to_fewer_passes_then_first():
    seeds = (0, 1)
    results = [run(m, s, x, f) for s in (4, 8) for x in seeds for m, f in
               (("darl", 0.5), ("darl_no_prompt", 0.6 if s == 4 else 0.45), ("darl_e2", 0.55))]
    # scores: darl 0.5, darl_no_prompt 0.525, darl_e2 0.55
    assert protocol.choose(results, ("darl", "darl_no_prompt", "darl_e2"), seeds) == "darl_e2"
    assert protocol.choose(results, ("darl_no_prompt", "darl"), seeds) == "darl_no_prompt"
    results += [run("darl_k1", 4, 0, 0.9)]  # incomplete: no choice yet
    assert protocol.choose(results, ("darl", "darl_k1"), seeds) is None
    tie = [run(m, s, x, 0.5) for s in (4, 8) for x in seeds for m in ("a", "b")]
    assert protocol.choose(tie, ("b", "a"), seeds) == "b"
    # equal_update (two passes) is listed before icepop (one): a tie goes to icepop, then to the first listed
    tie = [run(m, s, x, 0.5) for s in (4, 8) for x in seeds for m in ("equal_update", "icepop", "uniform_replay")]
    assert protocol.passes("equal_update") == 2 and protocol.passes("icepop") == 1
    assert protocol.choose(tie, ("equal_update", "icepop", "uniform_replay"), seeds) == "icepop"


def test_the_development_report_counts_sync_once_per_seed():
    """The stage plans (21 configurations x 2 staleness + sync at s = 0) x 8 seeds; a run counted once."""
    results = [run("sync", 0, 0, 0.5), run("sync", 0, 1, 0.5), run("darl", 4, 0, 0.4), run("darl", 4, 0, 0.4),
               run("darl", 8, 0, 0.3), run("darl", 4, 99, 0.3)]  # a repeated record and a seed outside 0-7
    report = protocol.development_report(results)
    assert report.startswith(f"4 of 344 development runs (4 from {'a' * 7} on c1).")  # where they ran, per CPU
    assert "| darl | 0.400 (1) | 0.300 (1) | - |" in report  # a score only once all 8 seeds ran
    assert "preset: not yet" in report


def test_the_headline_is_four_comparisons_with_holm():
    seeds = tuple(range(6))
    results = []
    for s in (4, 8):
        for x in seeds:
            results += [run("darl", s, x, 0.60 + 0.01 * x), run("decoupled", s, x, 0.40 + 0.012 * x),
                        run("equal_update", s, x, 0.60 + 0.01 * x + (0.02 if x % 2 else -0.02)),
                        run("naive", s, x, 0.2), run("gates_only", s, x, 0.5)]
    results += [run("sync", 0, x, 0.55) for x in seeds]
    family, secondary = protocol.headline(results, "darl", "equal_update", seeds)
    assert [(r["s"], r["b"]) for r in family] == [(4, "decoupled"), (8, "decoupled"), (4, "equal_update"),
                                                  (8, "equal_update")]
    assert [r["verdict"] for r in family] == ["supported", "supported", "not separated", "not separated"]
    assert all(r["p_holm"] >= r["diff"].p for r in family)
    # equal_update is the alternative: in the family, not among the secondary rows
    assert [(r["s"], r["b"]) for r in secondary] == [(s, b) for b in ("sync", "naive", "gates_only") for s in (4, 8)]
    assert secondary[4]["diff"].mean == pytest.approx(0.60 + 0.025 - 0.5)  # darl minus gates_only, mean over seeds
    assert "p, Holm" in protocol.headline_table(family, secondary)


def test_the_protocol_file_and_the_code_agree():
    text = (REPO / "docs" / "evidence" / "protocol.md").read_text()
    assert " ".join(map(str, protocol.HELDOUT_SEEDS)) in text
    assert len(set(protocol.HELDOUT_SEEDS)) >= 12 and all(1000 <= x <= 9999 for x in protocol.HELDOUT_SEEDS)
    assert not set(protocol.HELDOUT_SEEDS) & set(protocol.DEV_SEEDS)
    for name in (*protocol.DEV_CONFIGS, *protocol.DARL_CANDIDATES, *protocol.SIMPLE_CANDIDATES):
        assert name in METHODS, name
        assert f"`{name.removesuffix('_e2')}" in text, name  # every configuration is described there


def test_archive_and_restore_keep_every_run(tmp_path):
    out = tmp_path / "runs"
    (out / "validation" / "scarce" / "lr0.0002").mkdir(parents=True)
    (out / "scarce" / "dev").mkdir(parents=True)
    one = out / "validation" / "scarce" / "lr0.0002" / "results.jsonl"
    one.write_text(json.dumps(run("sync", 0, 0, 0.5)) + "\n")
    (out / "scarce" / "dev" / "results.jsonl").write_text(json.dumps(run("darl", 4, 1, 0.6)) + "\n")
    written = protocol.archive(out, tmp_path / "archive")
    assert sorted(p.relative_to(tmp_path / "archive").as_posix() for p in written) == [
        "scarce/dev/results.jsonl.gz", "validation/scarce/lr0.0002/results.jsonl.gz"]
    fresh = tmp_path / "fresh"
    assert len(protocol.restore(tmp_path / "archive", fresh)) == 2
    assert (fresh / "validation" / "scarce" / "lr0.0002" / "results.jsonl").read_text() == one.read_text()
    assert protocol.restore(tmp_path / "archive", fresh) == []  # runs already there are never overwritten
    # a machine that holds some runs of its own gets the archived runs it lacks, each once
    dev = fresh / "scarce" / "dev" / "results.jsonl"
    dev.write_text(json.dumps(run("naive", 4, 1, 0.3)) + "\n")
    assert protocol.restore(tmp_path / "archive", fresh) == [dev]
    assert protocol.restore(tmp_path / "archive", fresh) == []
    assert sorted(r["method_name"] for r in protocol.load_results(dev)) == ["darl", "naive"]
    # the pipeline stage's runs are verl logs, archived by pipeline_report: never touched here
    (out / "scarce" / "pipeline").mkdir()
    (out / "scarce" / "pipeline" / "results.jsonl").write_text("{}\n")
    (out / "scarce" / "replay_pipeline" / "t4").mkdir(parents=True)  # and section 5's leg through fully-async
    (out / "scarce" / "replay_pipeline" / "t4" / "results.jsonl").write_text("{}\n")
    assert all(not part.endswith("pipeline") for p in protocol.archive(out, tmp_path / "archive") for part in p.parts)
    # so are the threshold sweep's (threshold_sweep archives them): a restore from an archive holding both works
    packed = tmp_path / "archive" / "scarce" / "threshold_dev" / "t1"
    packed.mkdir(parents=True)
    import gzip

    (packed / "results.jsonl.gz").write_bytes(gzip.compress(b'{"trainer": "fully_async", "records": []}\n'))
    assert protocol.restore(tmp_path / "archive", tmp_path / "third")
    assert not (tmp_path / "third" / "scarce" / "threshold_dev").exists()


def test_every_attempt_is_recorded_and_archived(tmp_path, monkeypatch):
    """run_one writes a start, and a failure when the run raises; save writes a finish. The summary counts a start
    with neither as interrupted, and a run started twice; archive and restore keep the attempts."""
    import benchmarks.staleness.harness as harness
    from benchmarks.staleness.attempts import summary
    from benchmarks.staleness.run_study import record_attempt, run_one

    out = tmp_path / "runs" / "scarce" / "replay_heldout"
    out.mkdir(parents=True)
    common = {"steps": 2, "task": "scarce"}
    spec = {"method_name": "decoupled", "staleness": 4, "seed": 7, "common": common,
            "attempts": str(out / "attempts.jsonl"), "origin": ORIGIN}

    def broken(config, log):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(harness, "run", broken)
    with pytest.raises(RuntimeError):
        run_one(spec)
    record_attempt({**spec, "seed": 8}, "started")  # killed: no finish, no failure
    record_attempt(spec, "started")
    record_attempt(spec, "finished")  # the retry that finished
    events = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["started", "failed", "started", "started", "finished"]
    assert events[0]["provenance"] == ORIGIN and "out of memory" in events[1]["error"]
    assert summary(out / "attempts.jsonl") == (
        "attempts: 3 started, 1 finished, 1 failed, 1 interrupted or running; 1 run(s) started more than once")
    (out / "results.jsonl").write_text(json.dumps(run("decoupled", 4, 7, 0.4)) + "\n")
    written = protocol.archive(tmp_path / "runs", tmp_path / "archive")
    assert sorted(p.name for p in written) == ["attempts.jsonl.gz", "results.jsonl.gz"]
    fresh = tmp_path / "fresh"
    protocol.restore(tmp_path / "archive", fresh)
    assert (fresh / "scarce" / "replay_heldout" / "attempts.jsonl").read_text() == (out / "attempts.jsonl").read_text()
    assert protocol.restore(tmp_path / "archive", fresh) == []  # lines already there are not added twice


def test_the_study_runs_a_seed_at_every_staleness_before_the_next_seed():
    from benchmarks.staleness.run_study import planned_runs

    common = {"lr": 2e-4}
    done = {run_key("naive", 4, 1, common)}
    plan = [(r["seed"], r["staleness"], r["method_name"])
            for r in planned_runs(["sync", "naive"], [4, 8], [1, 2], common, done)]
    # sync runs at s = 0 once per seed; naive s = 4 seed 1 is done
    assert plan == [(1, 0, "sync"), (1, 8, "naive"), (2, 0, "sync"), (2, 4, "naive"), (2, 8, "naive")]


def test_accuracy_at_equal_samples_gradient_steps_and_wall_time_by_hand(tmp_path):
    """Two runs, evaluated at steps 0, 10 and 20: `two` makes two updates a step and runs slower. At 20 gradient
    steps (the fewer of their ends: 20 vs 40) `one` has finished (0.6) and `two` is halfway (step 10: 0.5); at 100 s
    (`one`'s end) `two`, whose evaluations are at 0, 80 and 160 s, sits between 0.5 and 0.7: 0.5 + 0.2 x 20 / 80."""
    def curve_run(name, per_step, walls, accs):
        r = run(name, 4, 0, accs[-1])
        r["evals"] = [{"step": 10 * i, "samples": 2560 * i, "wall": w, "accuracy": a}
                      for i, (w, a) in enumerate(zip(walls, accs))]
        r["steps"] = [{"step": t, "updates": per_step} for t in range(20)]
        return r

    one = curve_run("decoupled", 1, [0.0, 50.0, 100.0], [0.2, 0.4, 0.6])
    two = curve_run("equal_update", 2, [0.0, 80.0, 160.0], [0.2, 0.5, 0.7])
    assert protocol.curve(two, "updates") == ([0.0, 20.0, 40.0], [0.2, 0.5, 0.7])
    skipped = {**two, "steps": [{"step": 0, "skipped": True}] + two["steps"][1:]}  # a skipped step has no updates
    assert protocol.curve(skipped, "updates")[0] == [0.0, 18.0, 38.0]
    assert protocol.accuracy_at(one, "updates", 20) == 0.6 and protocol.accuracy_at(two, "updates", 20) == 0.5
    assert protocol.accuracy_at(two, "wall", 100) == pytest.approx(0.55)
    one["step_time_mean"], two["step_time_mean"] = 5.0, 8.0
    table = protocol.two_axes([one, two], ["decoupled", "equal_update"], 4, [0])
    # equal_update reaches decoupled's final 0.6 at its third evaluation (5120 samples); its steps take 1.6x as long
    assert "| equal_update | 1 | 0.700 | 1.60x | 5120 (1) |" in table  # (one seed: no spread)
    assert "| s = 4, equal gradient steps | at 5 gradient steps | at 10 gradient steps | at 20 gradient steps |" in table
    assert "| equal_update | 0.350 | 0.500 | 0.700 |" in table  # samples: 1280 (halfway to step 10), 2560, 5120
    assert "| equal_update | 0.275 | 0.350 | 0.500 |" in table  # gradient steps: 5, 10, 20
    assert "| s = 4, equal wall time | at 25 s | at 50 s | at 100 s |" in table
    # decoupled PPO ending below its start (0.2 -> 0.1): every run would "reach" it at step 0, so the column is empty
    fell = {**one, "final_accuracy": 0.1, "evals": [{**e, "accuracy": a} for e, a in zip(one["evals"], [0.2, 0.15, 0.1])]}
    table = protocol.two_axes([fell, two], ["decoupled", "equal_update"], 4, [0])
    assert "| s = 4 | runs | final | step time / decoupled's | samples to decoupled's final (none: it ends at or below " \
        "its start) |" in table
    assert "| equal_update | 1 | 0.700 | 1.60x | - |" in table
    # the same comparison as a figure: three panels, one curve per configuration
    import matplotlib.image

    path = protocol.two_axes_figure([one, two], ["decoupled", "equal_update"], 4, [0], tmp_path)
    assert path == tmp_path / "two_axes_s4.png" and matplotlib.image.imread(path).shape[1] > 3 * 300


def _pipeline_run(out: Path, trainer: str, config: str, seed: int, last_step: int, commit: str = "c" * 40) -> None:
    folder = out / trainer / f"seed{seed}" / config
    (folder / "checkpoints").mkdir(parents=True)
    records = [{"step": s, "data": {"val-core/arith/acc/mean@1": 0.2}} for s in range(0, last_step + 1, 10)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    launch = {"provenance": {**ORIGIN, "commit": commit}, "versions": {}, "config": {}}
    (folder / "checkpoints" / "launches.jsonl").write_text(json.dumps(launch) + "\n")


def test_the_pipeline_stage_archives_whole_seeds_only(tmp_path):
    """A seed counts once its seven launches finished (step 50); a seed in flight and a run of another configuration
    stay out of the archive; a later archive adds seeds and keeps the earlier ones."""
    preset, alt = "darl_tokens_e2", "decoupled_prompt_e2"
    launches = protocol.pipeline_launches(preset, alt)
    assert len(launches) == 7 and ("one_step_off", "sync") not in launches and ("fully_async", "sync") in launches
    stage = (REPO / "benchmarks" / "staleness" / "protocol.sh").read_text().split('STAGE" == pipeline')[1]
    assert f"STEPS={protocol.PIPELINE_STEPS} " in stage  # a finished launch is one that logged the stage's last step
    out, folder = tmp_path / "runs", tmp_path / "archive"
    first, second = protocol.HELDOUT_SEEDS[:2]
    for trainer, config in launches:
        _pipeline_run(out, trainer, config, first, 50)
    _pipeline_run(out, "one_step_off", "equal_update", first, 50)  # not a configuration of the stage
    for trainer, config in launches[:-1]:
        _pipeline_run(out, trainer, config, second, 50)
    _pipeline_run(out, *launches[-1], second, 30)  # stopped at step 30
    assert protocol.pipeline_archive(out, folder, preset, alt) == [first]
    from benchmarks.staleness.pipeline_report import load_runs

    archived = load_runs(folder / "results.jsonl.gz")
    assert sorted((r["trainer"], r["config"]) for r in archived) == sorted(launches)
    assert {r["seed"] for r in archived} == {first}
    text = protocol.pipeline_progress(archived, preset, alt)
    assert text == (f"Archived: 1 of 12 held-out seeds (7 of 84 launches), seed {first}, from commit ccccccc. "
                    "Tables: `protocol pipeline` once every seed has run.")
    # the second seed finishes on another machine's run folder: the archive now holds both
    later = tmp_path / "later"
    _pipeline_run(later, *launches[-1], second, 50, commit="d" * 40)
    for trainer, config in launches[:-1]:
        _pipeline_run(later, trainer, config, second, 50, commit="d" * 40)
    assert protocol.pipeline_archive(later, folder, preset, alt) == [first, second]
    assert len(load_runs(folder / "results.jsonl.gz")) == 14
    assert protocol.pipeline_progress([], preset, alt).startswith("Archived: 0 of 12 held-out seeds (0 of 84 launches).")


def _loaded_run(trainer: str, config: str, seed: int, final: float, epochs: int = 1, origin=ORIGIN) -> dict:
    """A pipeline run as load_runs returns it: evaluations at steps 0 and 50 (start 0.2), 2 s a step, one launch."""
    from recipe.darl.example.arithmetic import VAL_KEY

    one_step_off = trainer == "one_step_off"
    cfg = {"data": {"train_batch_size": 32 if one_step_off else 0}, "async_training": {"require_batches": 2},
           "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 16, "ppo_epochs": epochs}, "rollout": {"n": 8}}}
    records = [{"step": 0, "data": {VAL_KEY: 0.2}}]
    records += [{"step": k, "data": {"timing_s/step": 2.0 * epochs}} for k in range(1, 50)]
    records += [{"step": 50, "data": {"timing_s/step": 2.0 * epochs, VAL_KEY: final}}]
    return {"trainer": trainer, "config": config, "seed": seed, "records": records, "resolved_config": cfg,
            "launches": [{"provenance": dict(origin), "versions": {}}], "provenance": dict(origin)}


def test_the_pipeline_family_is_four_comparisons_with_holm_and_its_gradient_steps_come_from_the_config():
    preset, alt = "darl_tokens_e2", "decoupled_prompt_e2"
    seeds = protocol.HELDOUT_SEEDS[:6]
    runs = []
    for i, x in enumerate(seeds):
        for t in protocol.PIPELINE_TRAINERS:
            gap = 0.20 if t == "fully_async" else (0.02 if i % 2 else -0.02)  # separated / not separated
            runs += [_loaded_run(t, "decoupled", x, 0.25 + 0.01 * i), _loaded_run(t, preset, x, 0.25 + 0.01 * i + gap, 2),
                     _loaded_run(t, alt, x, 0.25 + 0.01 * i + gap / 2, 2)]
        other = {**ORIGIN, "boot": "b2"} if i == 0 else ORIGIN  # seed 0's sync ran after a reboot: not side by side
        runs.append(_loaded_run("fully_async", "sync", x, 0.50, origin=other))
    # verl's one-step-off step: 32 prompts in mini-batches of 16, two passes; fully-async: require_batches of 16
    assert protocol.updates_per_step(runs[1]["resolved_config"]) == 4
    assert protocol.updates_per_step(runs[3]["resolved_config"]) == 2
    family, secondary = protocol.pipeline_headline(runs, preset, alt, seeds)
    assert [(r["trainer"], r["b"]) for r in family] == [("one_step_off", "decoupled"), ("fully_async", "decoupled"),
                                                        ("one_step_off", alt), ("fully_async", alt)]
    assert [r["verdict"] for r in family] == ["not separated", "supported", "not separated", "supported"]
    assert family[1]["diff"].mean == pytest.approx(0.20) and family[3]["diff"].mean == pytest.approx(0.10)
    assert all(r["p_holm"] >= r["diff"].p and r["side_by_side"] == 6 for r in family)
    assert [(r["trainer"], r["a"], r["b"]) for r in secondary] == [("fully_async", c, "sync")
                                                                    for c in (preset, "decoupled", alt)]
    assert secondary[1]["side_by_side"] == 5 and secondary[1]["diff"].mean == pytest.approx(0.25 + 0.025 - 0.50)
    report = protocol.pipeline_stage_report(runs, preset, alt)
    assert report.startswith("| trainer | comparison |") and "\n| fully_async | runs |" in report and "\n| sync | 6 | " in report
    # equal gradient steps: the preset's 4 updates a step against decoupled PPO's 2 (one-step-off). A run's last
    # evaluation (step 50) comes after 49 steps' updates: 98 for decoupled PPO, the shortest, 196 for the preset,
    # which at 98 updates is halfway from its start (0.2) to its final accuracy
    assert "| one_step_off, equal gradient steps | at 24 gradient steps | at 49 gradient steps | at 98 gradient steps |" in report
    section = report.split("one_step_off, equal gradient steps")[1].split("\n\n")[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| {preset} |"))
    finals = [0.25 + 0.01 * i + (0.02 if i % 2 else -0.02) for i in range(6)]
    assert row.split(" | ")[3].startswith(f"{sum(0.2 + (f - 0.2) / 2 for f in finals) / 6:.3f} ±"), row


def test_replay_power_by_hand():
    """Section 5: differences of 0, 2, 4, 6, 8, 10 points on the six development seeds in each comparison: mean 5,
    sd sqrt(70 / 5) = 3.742 points; n = ceil((2.80158 x 3.742 / 3)^2 + 1.921) = ceil(14.13) = 15 held-out seeds."""
    from benchmarks.staleness.protocol import REPLAY_CONFIGS, REPLAY_DEV_SEEDS, replay_power

    preset, off, prompt_only = REPLAY_CONFIGS
    runs = []
    for i, seed in enumerate(REPLAY_DEV_SEEDS):
        for s in (4, 8):
            runs.append({"method_name": off, "staleness": s, "seed": seed, "final_accuracy": 0.3})
            for name in (preset, prompt_only):
                runs.append({"method_name": name, "staleness": s, "seed": seed, "final_accuracy": 0.3 + 0.02 * i})
    text = replay_power(runs)
    assert text.count("| +5.0 [") == 4 and text.count("| 3.7 |") == 4
    assert "largest sd 3.7 points: held-out seeds 15\n" in text
    assert "not yet" in replay_power(runs[:-1])


def test_replay_heldout_report_waits_for_whole_seeds_then_says_what_follows():
    """Section 5's held-out table: nothing but a count until all 60 seeds have their six runs. With the preset 4 or 6
    points (alternating) above replay off and per-prompt replay 1 point above or below it, the preset's rows read
    +5.0 and are supported and the preset stays; with the preset also 1 point above or below, nothing separates and
    the preset becomes replay_off_e2."""
    from benchmarks.staleness.protocol import REPLAY_CONFIGS, REPLAY_HELDOUT_SEEDS, replay_heldout_report

    preset, off, prompt_only = REPLAY_CONFIGS

    def runs(preset_gain):
        out = []
        for i, seed in enumerate(REPLAY_HELDOUT_SEEDS):
            sign = 1 if i % 2 else -1
            for s in (4, 8):
                out += [run(off, s, seed, 0.3), run(prompt_only, s, seed, 0.3 + 0.01 * sign),
                        run(preset, s, seed, 0.3 + preset_gain + 0.01 * sign)]
        return out

    gain = runs(0.05)
    text = replay_heldout_report(gain)
    assert text.startswith("60 of 60 held-out seeds have their six runs.")
    rows = [line for line in text.splitlines() if line.startswith(("| 4 |", "| 8 |"))]
    assert len(rows) == 4 and all("| 60 (60) |" in r for r in rows)
    assert [r.split(" | ")[-1] for r in rows] == ["supported |", "supported |", "not separated |", "not separated |"]
    assert all("| +5.0 [" in r for r in rows[:2]) and all("| +0.0 [" in r for r in rows[2:])
    assert text.endswith(f"the preset stays {preset}\n")
    assert text.rstrip().endswith(preset) and "becomes" not in text
    assert f"the preset becomes {off}" in replay_heldout_report(runs(0.0))
    partial = replay_heldout_report(gain[:-1])  # the last seed lacks one run: no table yet
    assert partial == "59 of 60 held-out seeds have their six runs; the table follows once all have them.\n"


def test_a_finished_attempt_without_provenance_takes_its_result_records(tmp_path):
    """A finished line written without provenance is archived with its run's result record's provenance."""
    out = tmp_path / "runs" / "scarce" / "study"
    out.mkdir(parents=True)
    rec = run("darl", 4, 1, 0.6)
    (out / "results.jsonl").write_text(json.dumps(rec) + "\n")
    line = {"event": "finished", "method_name": "darl", "staleness": 4, "seed": 1, "common": rec["common"], "time": "t"}
    (out / "attempts.jsonl").write_text(json.dumps(line) + "\n")
    protocol.archive(tmp_path / "runs", tmp_path / "archive")
    import gzip

    packed = tmp_path / "archive" / "scarce" / "study" / "attempts.jsonl.gz"
    assert json.loads(gzip.decompress(packed.read_bytes()))["provenance"] == ORIGIN


def test_an_event_archived_and_restored_counts_once(tmp_path):
    """A finish written without provenance, archived (which adds it) and restored into the same file, is one event:
    the archive holds it once, a restore appends nothing, and the summary counts one start and one finish."""
    import gzip

    from benchmarks.staleness.attempts import summary

    out = tmp_path / "runs" / "scarce" / "study"
    out.mkdir(parents=True)
    rec = run("darl", 4, 1, 0.6)
    (out / "results.jsonl").write_text(json.dumps(rec) + "\n")
    run_id = {"method_name": "darl", "staleness": 4, "seed": 1, "common": rec["common"]}
    bare = json.dumps({"event": "finished", **run_id, "time": "t1"})
    (out / "attempts.jsonl").write_text(json.dumps({"event": "started", **run_id, "time": "t0"}) + "\n" + bare + "\n")
    protocol.archive(tmp_path / "runs", tmp_path / "archive")
    protocol.restore(tmp_path / "archive", tmp_path / "runs")  # the archive's copy of the finish carries provenance
    packed = tmp_path / "archive" / "scarce" / "study" / "attempts.jsonl.gz"
    assert len(gzip.decompress(packed.read_bytes()).decode().splitlines()) == 2
    assert len((out / "attempts.jsonl").read_text().splitlines()) == 2
    (out / "attempts.jsonl").write_text((out / "attempts.jsonl").read_text() + gzip.decompress(
        packed.read_bytes()).decode().splitlines()[1] + "\n")  # both copies of the finish in one file
    assert summary(out / "attempts.jsonl") == (
        "attempts: 1 started, 1 finished, 0 failed, 0 interrupted or running; 0 run(s) started more than once")
    protocol.archive(tmp_path / "runs", tmp_path / "archive")
    lines = gzip.decompress(packed.read_bytes()).decode().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["provenance"] == ORIGIN


@pytest.mark.parametrize("module, argv", [
    ("protocol", ["replay-heldout"]), ("chains_study", ["dev"]), ("targets", []), ("reproduce", [])])
def test_a_report_on_a_folder_without_results_names_the_folder(tmp_path, module, argv):
    """A report pointed at a folder that is not a study's (the archive's root, say) stops naming it, instead of
    printing "0 of N seeds" as if no run had finished."""
    import importlib

    main = importlib.import_module(f"benchmarks.staleness.{module}").main
    extra = ["sync:0:0"] if module == "reproduce" else []
    with pytest.raises(SystemExit, match=re.escape(str(tmp_path)) + ": no results.jsonl"):
        main([*argv, str(tmp_path), *extra])
