"""The studies' progress table: finished runs counted once each, only where they belong to a stage's plan."""

import json

from benchmarks.staleness import chains_study as chains
from benchmarks.staleness import progress, protocol


def write(path, runs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))


def result(name, s, seed, lr=2e-4):
    return {"method_name": name, "staleness": s, "seed": seed, "final_accuracy": 0.3, "common": {"lr": lr}}


def test_runs_count_once_and_only_in_their_stages_plan(tmp_path):
    held = protocol.REPLAY_HELDOUT_SEEDS[0]
    write(tmp_path / "scarce/replay_heldout/results.jsonl", [
        result("darl_tokens_e2", 4, held), result("darl_tokens_e2", 4, held),  # a repeat: one run
        result("replay_off_e2", 8, held), result("decoupled", 4, held),       # decoupled PPO is not section 5's
        result("replay_off_e2", 8, 12345)])                                     # nor is a development seed
    write(tmp_path / "validation/chains/lr3e-05/results.jsonl", [result("sync", 0, 0, 3e-5), result("sync", 0, 1, 3e-5)])
    write(tmp_path / "chains/dev/results.jsonl", [result("sync", 0, chains.DEV_SEEDS[0]), result("sync", 4, 1)])
    write(tmp_path / "chains/heldout/results.jsonl", [result("decoupled", 4, chains.HELDOUT_SEEDS[0]),
                                                      result("decoupled", 4, 7)])
    rows = progress.rows(tmp_path)
    assert [done for _, done, _ in rows] == [2, 0, 0, 2, 1, 1]
    # by hand: 60 seeds x 3 configurations x s = 4, 8; 60 seeds x 3 configurations at one threshold; 12 seeds x 3
    # configurations x 4 thresholds; sync at 3 rates x 3 seeds, then sync + 2 x (decoupled, naive) on 8 seeds less
    # the 3 sync runs done at the best rate; 4 seeds x (sync + 8 configurations x 2); 12 seeds x (sync + 4 x 2)
    assert [planned for _, _, planned in rows] == [360, 180, 144, 3 * 3 + 8 * 5 - 3, 4 * (1 + 8 * 2), 12 * 9]
    assert progress.table(tmp_path).splitlines()[2] == f"| {rows[0][0]} | 2 | 360 |"


def test_a_whole_chains_validation_without_harm_ends_section_7(tmp_path):
    """protocol.md, section 7: once every validation run is in and staleness does not hurt in every cell, the
    development and held-out stages are listed as not run; while one stale run is missing, or where staleness hurts,
    they stay planned."""
    lr = 3e-5
    runs = [result("sync", 0, seed, rate) for rate in chains.LRS for seed in chains.SYNC_SEEDS]
    runs += [result("sync", 0, seed, lr) for seed in chains.STALE_SEEDS if seed not in chains.SYNC_SEEDS]
    # stale runs level with sync, one seed in two a point above: no interval lies below zero
    stale = [dict(result(m, s, seed, lr), final_accuracy=0.3 + 0.01 * (seed % 2))
             for m in ("decoupled", "naive") for s in protocol.STALENESS for seed in chains.STALE_SEEDS]
    write(tmp_path / "validation/chains/lr3e-05/results.jsonl", runs + stale[:-1])
    assert [row[0] for row in progress.rows(tmp_path)][-2:] == [
        "section 7, chains testbed: development runs", "section 7, chains testbed: held-out runs"]
    hurt = [dict(r, final_accuracy=0.2 + 0.01 * (r["seed"] % 2)) for r in stale]
    write(tmp_path / "validation/chains/lr3e-05/results.jsonl", runs + hurt)
    assert progress.rows(tmp_path)[-1][0] == "section 7, chains testbed: held-out runs"
    write(tmp_path / "validation/chains/lr3e-05/results.jsonl", runs + stale)
    rows = progress.rows(tmp_path)
    assert rows[-2][1:] == (len(runs + stale), len(runs + stale))
    assert rows[-1] == ("section 7, chains testbed: development and held-out runs (not run: staleness does not hurt "
                        "there)", 0, 0)
