"""The second testbed (docs/evidence/protocol.md, section 7): the protocol's stages on the chains example.

    TASK=chains ... bash benchmarks/staleness/chains.sh OUT               # STAGE=validation, dev or heldout
    python -m benchmarks.staleness.chains_study dev OUT/chains/dev        # the development scores and the choice
    python -m benchmarks.staleness.chains_study heldout OUT/chains/heldout --preset P --alternative A

Every constant here was fixed in a commit before the first run it governs; the seeds were drawn at random (development
from 10000-99999, held-out from 100000-999999).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.staleness import protocol
from benchmarks.staleness.run_study import study_results

# stage 1, the validation (validate.sh): sync at each rate over SYNC_SEEDS, then at sync's best rate decoupled PPO and
# naive async at s = 4 and 8 beside sync over STALE_SEEDS
LRS = (3e-5, 1e-4, 3e-4)
SYNC_SEEDS = (0, 1, 2)
STALE_SEEDS = tuple(range(8))  # validation.validated asks 8 paired seeds, as section 1
# stage 2, the development stage: the first testbed's preset and its two runners-up among D-ARL's variants, and the
# simple alternatives that stayed in the running there (decoupled_prompt_e2 was its strongest)
DEV_SEEDS = (18300, 36989, 43290, 89532)
DARL_CANDIDATES = ("darl_tokens_e2", "darl_own_e2", "darl_e2")
SIMPLE_CANDIDATES = ("equal_update", "icepop", "uniform_replay_e2", "decoupled_prompt_e2")
DEV_CONFIGS = ("sync", "decoupled", *SIMPLE_CANDIDATES, *DARL_CANDIDATES)
# stage 3, held out: the chosen preset and alternative, decoupled PPO, replay off and sync
HELDOUT_SEEDS = (102084, 355091, 463800, 472041, 473796, 484112, 583147, 697861, 702275, 818079, 947197, 957788)
REPLAY_OFF = "replay_off_e2"
HELDOUT_BASELINES = ("sync", "decoupled", REPLAY_OFF)


def development_report(results: list[dict[str, Any]]) -> str:
    """The development scores over DEV_SEEDS (the protocol's score: mean final accuracy over s = 4 and 8) and the
    choice, once every candidate has all its runs."""
    preset = protocol.choose(results, DARL_CANDIDATES, DEV_SEEDS)
    alternative = protocol.choose(results, SIMPLE_CANDIDATES, DEV_SEEDS)
    planned = ((len(DEV_CONFIGS) - 1) * len(protocol.STALENESS) + 1) * len(DEV_SEEDS)  # sync at s = 0 only
    done = {(r["method_name"], r["staleness"], r["seed"]) for r in results if r["seed"] in DEV_SEEDS}
    names = [n for n in DEV_CONFIGS if any(r["method_name"] == n for r in results)]
    return (f"{len(done)} of {planned} development runs.\n\n" + protocol.score_table(results, names, DEV_SEEDS)
            + f"\npreset: {preset or 'not yet (a candidate lacks runs)'}\n"
            + f"alternative: {alternative or 'not yet (a candidate lacks runs)'}\n")


def heldout_family(results: list[dict[str, Any]], preset: str, alternative: str) -> tuple[list, list]:
    """The six comparisons with Holm's correction across them (the preset minus decoupled PPO, the alternative and
    replay off, each at s = 4 and 8), and the preset minus sync as a secondary row."""
    cells = protocol.finals_by_cell(results, HELDOUT_SEEDS)
    family = protocol.holm_verdicts([protocol.paired_row(cells, s, preset, b) for b in ("decoupled", alternative, REPLAY_OFF)
                                 for s in protocol.STALENESS])
    secondary = [protocol.paired_row(cells, s, preset, "sync") for s in protocol.STALENESS]
    return family, [r for r in secondary if r["diff"].n > 0]


def heldout_report(results: list[dict[str, Any]], preset: str, alternative: str) -> str:
    """The held-out family's table and the secondary figures, once every seed has its nine runs (sync at s = 0, the
    other four at s = 4 and 8); before that, only how many seeds have them."""
    names = dict.fromkeys((*HELDOUT_BASELINES, preset, alternative))
    keys = [(0, "sync")] + [(s, n) for n in names if n != "sync" for s in protocol.STALENESS]
    whole = protocol.complete_seeds(protocol.finals_by_cell(results, HELDOUT_SEEDS), HELDOUT_SEEDS, keys)
    head = f"{len(whole)} of {len(HELDOUT_SEEDS)} held-out seeds have their {len(keys)} runs"
    if len(whole) < len(HELDOUT_SEEDS):  # no interim table: the family is read once, whole
        return head + "; the table follows once all have them.\n"
    return (f"{head}.\n\n" + protocol.headline_table(*heldout_family(results, preset, alternative)) + "\n"
            + "\n".join(protocol.two_axes(results, names, s, HELDOUT_SEEDS) for s in protocol.STALENESS))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dev", help="the development scores and the choice")
    d.add_argument("study", type=Path)
    h = sub.add_parser("heldout", help="the held-out family with Holm's correction")
    h.add_argument("study", type=Path)
    h.add_argument("--preset", required=True)
    h.add_argument("--alternative", required=True)
    for q in (d, h):
        q.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    results = study_results(args.study)
    text = development_report(results) if args.command == "dev" else \
        heldout_report(results, args.preset, args.alternative)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
