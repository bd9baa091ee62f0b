"""The controlled-staleness harness: a few steps of each method on an untrained tiny model.

A dense reward (share of digit characters in the response) gives every group a non-zero advantage,
so the updates are real even though the model is untrained.
"""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from benchmarks.staleness.harness import Harness, HarnessConfig
from benchmarks.staleness.run_study import METHODS, cell_staleness, report
from benchmarks.staleness.targets import headline, table

REPO = Path(__file__).resolve().parents[2]

# the first design (chi2-ranked selection), still reachable through replay.* keys
# uniform replay with a fixed budget: buffered groups compete with fresh ones every step
UNIFORM = {"order": "newest", "ratio": False, "m2_budget": False, "behavior_clip": False, "max_reuse": False}

STEPS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from recipe.darl.example.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("staleness") / "model", seed=0, hidden_size=64)


def make(model_dir, method, staleness, seed=0, **overrides):
    settings = dict(method=method, staleness=staleness, seed=seed, steps=STEPS, prompts_per_step=4, n=4,
                    max_response_tokens=8, reward="digits", val_size=8, eval_every=2, lr=1e-3, warmup=1,
                    model_dir=str(model_dir))
    settings.update(overrides)
    return Harness(HarnessConfig(**settings))


def run_steps(harness, steps=STEPS):
    return [harness.step() for _ in range(steps)]


def weights(harness):
    return {k: v.clone() for k, v in harness.model.state_dict().items()}


def same_weights(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["naive", "decoupled", "icepop", "darl"])
def test_methods_run_with_finite_losses(model_dir, method):
    h = make(model_dir, method, staleness=2)
    start = weights(h)
    history = run_steps(h)
    trained = [m for m in history if not m["skipped"]]
    assert trained, "no step trained"
    for m in trained:
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
        assert 0.0 <= m["clip_fraction"] <= 1.0
    assert [m["fresh_version"] for m in history] == [0, 0, 0, 1]  # version t - s, from 0 in the first s steps
    assert history[-1]["samples"] == STEPS * 4 * 4
    assert not same_weights(start, weights(h))


def test_staleness_zero_makes_naive_and_decoupled_identical(model_dir):
    naive, decoupled = make(model_dir, "naive", 0), make(model_dir, "decoupled", 0)
    a, b = run_steps(naive), run_steps(decoupled)
    assert [m["loss"] for m in a] == [m["loss"] for m in b]
    assert [m["grad_norm"] for m in a] == [m["grad_norm"] for m in b]
    assert all(m["chi2_trained"] == 0.0 for m in b)
    assert same_weights(weights(naive), weights(decoupled))


def test_staleness_makes_naive_and_decoupled_differ(model_dir):
    naive, decoupled = make(model_dir, "naive", 1), make(model_dir, "decoupled", 1)
    a, b = run_steps(naive), run_steps(decoupled)
    # step 0 samples version 0 = the current weights: still on-policy and identical
    assert a[0]["loss"] == b[0]["loss"]
    assert [m["loss"] for m in a[1:]] != [m["loss"] for m in b[1:]]
    assert b[-1]["chi2_trained"] > 0.0
    assert not same_weights(weights(naive), weights(decoupled))


def test_darl_buffer_spans_versions(model_dir):
    h = make(model_dir, "darl", 1, **UNIFORM)
    history = run_steps(h)
    buffer = h.replay.buffer
    assert len({g.version for g in buffer.groups}) > 1
    assert history[-1]["buffer_versions"] > 1
    assert history[-1]["candidates"] > 4  # buffered groups compete with the fresh ones
    # pi_old of each step is recorded in the trained groups, as the trainer does
    assert any(len(g.recorded) >= 1 for g in buffer.groups)


def test_pmis_mixes_versions_only_while_staleness_is_below_k(model_dir):
    """A group of version v is rescored at versions >= v + s; the batch's behavior versions are <= t - s.
    With s >= k no recorded version is a behavior version, so pmis has nothing to mix (DESIGN R2).
    A small lr keeps the drift small enough that selection takes replayed groups beside fresh ones."""
    mixed = run_steps(make(model_dir, "darl", 1, lr=1e-5), 6)
    assert any(m["trained_versions"] > 1 and m["pmis_mixed_fraction"] > 0 for m in mixed if not m["skipped"])
    inert = [m for m in run_steps(make(model_dir, "darl", 2, k=2, lr=1e-5), 6) if not m["skipped"]]
    assert any(m["trained_versions"] > 1 for m in inert)
    assert all(m["pmis_mixed_fraction"] == 0.0 for m in inert)


def test_study_names_resolve(model_dir):
    for name, overrides in METHODS.items():
        cfg = HarnessConfig(**{k: v for k, v in overrides.items() if k != "staleness"}, model_dir=str(model_dir))
        assert cfg.method in ("naive", "decoupled", "icepop", "darl"), name
        if name.endswith("_e2") and name[:-3] in METHODS:  # two passes of the configuration without the suffix
            assert cfg.epochs == 2 and {**METHODS[name[:-3]], "epochs": 2} == overrides, name
    assert HarnessConfig(method="darl").replay_config().resolved("order") == "least_reused"
    with pytest.raises(ValueError, match="replay.order"):
        HarnessConfig(method="darl", order="chi2")  # a retired design
    assert HarnessConfig(method="darl", pmis=False).replay_config().resolved("ratio") is None
    assert cell_staleness("sync", 8) == 0 and cell_staleness("darl", 8) == 8
    assert cell_staleness("darl_chi2", 8) == 8  # an archived name runs nowhere but still has a cell
    with pytest.raises(ValueError):
        HarnessConfig(method="darl", k=0)
    # uniform replay, and with its fixed budget made explicit, both train
    for overrides in ({"pmis": False}, UNIFORM):
        history = run_steps(make(model_dir, "darl", staleness=1, **overrides), 3)
        assert all(math.isfinite(m["loss"]) for m in history if not m["skipped"])


def test_the_study_runs_the_preset_the_trainers_resolve_under_darl():
    """What the study measures as the preset (`darl_tokens_e2`) is what the `_pmis_sg` scripts run: every key of it
    resolved equals what `replay.enable=true` resolves to, and its two passes are the scripts' ppo_epochs. `darl`, the
    preset before the held-out stage, differs in its source weights only; `darl_no_prompt` differs from `darl` in the
    per-prompt store only, and `gates_only` keeps the store off as the pipeline's gates_only does."""
    import re

    from recipe.darl.config import presets
    from recipe.darl.core.config import PRESET, ReplayConfig

    def resolved(rc: ReplayConfig) -> dict:
        out = {f.name: rc.resolved(f.name) if f.name in PRESET else getattr(rc, f.name) for f in dataclasses.fields(rc)}
        return {**out, "behavior_weight": rc.resolved_behavior_weight, "source_weight": rc.resolved_source_weight}

    preset = resolved(ReplayConfig(enable=True))
    assert preset["prompt_replay"] == 16 and preset["source_weight"] == "tokens"
    assert resolved(HarnessConfig(**METHODS["darl_tokens_e2"]).replay_config()) == preset
    # the `_pmis_sg` scripts run the preset's file, whose two passes the harness reads
    assert METHODS[presets.DEFAULT] == METHODS["darl_tokens_e2"] and METHODS["darl_tokens_e2"]["epochs"] == 2
    assert re.search(r"pmis_sg\) DARL_PRESET=darl_tokens_e2 ", (REPO / "shells" / "configuration.sh").read_text())
    earlier = resolved(HarnessConfig(**METHODS["darl"]).replay_config())
    assert {k for k in preset if preset[k] != earlier[k]} == {"source_weight"} and earlier["source_weight"] == "ess"
    group_preset = resolved(HarnessConfig(**METHODS["darl_no_prompt"]).replay_config())
    assert {k for k in earlier if earlier[k] != group_preset[k]} == {"prompt_replay"}
    assert group_preset["prompt_replay"] is None
    assert resolved(HarnessConfig(**METHODS["gates_only"]).replay_config())["prompt_replay"] is None


def test_equal_update_doubles_the_updates_and_the_preset_reports_its_controls(model_dir):
    once = run_steps(make(model_dir, "decoupled", 1, minibatches=2), 2)
    twice = run_steps(make(model_dir, "decoupled", 1, minibatches=2, epochs=2), 2)
    assert [m["updates"] for m in once] == [2, 2] and [m["updates"] for m in twice] == [4, 4]
    preset = run_steps(make(model_dir, "darl", 2, lr=3e-3), STEPS)
    trained = [m for m in preset if not m["skipped"]]
    assert all(0.0 <= m["m2_gated_fraction"] <= 1.0 and 0.0 <= m["behavior_clip_fraction"] <= 1.0 for m in trained)
    assert any(m["behavior_clip_fraction"] > 0 for m in trained)  # lr 3e-3 at s = 2 moves pi_theta past 1.2 mu


def _fake(method, s, seed, final, wall_steps=(1.0,), evals=None):
    evals = evals or [{"accuracy": 0.35, "samples": 0}, {"accuracy": final, "samples": 100}]
    return {"method_name": method, "staleness": s, "seed": seed, "final_accuracy": final, "evals": evals,
            "samples": 100, "steps": [{"time_gen": t, "time_train": 0.0} for t in wall_steps]}


def test_icepop_zeroes_exactly_the_tokens_outside_its_bounds_by_hand():
    """rho = pi_old / mu per token: 0.4 and 6.0 fall outside [0.5, 5] (weight 0), 0.5, 1, 4.9 and 5 stay; padding stays 0."""
    from benchmarks.staleness.harness import icepop_coef

    rho = torch.tensor([[0.4, 0.5, 1.0, 4.9], [5.0, 6.0, 1.0, 1.0]])
    rollout = torch.full_like(rho, -1.0)
    old = rollout + rho.log()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool()
    coef = torch.full_like(rho, 0.25)
    out = icepop_coef(coef, old, rollout, mask, 0.5, 5.0)
    assert out.tolist() == [[0.0, 0.25, 0.25, 0.25], [0.25, 0.0, 0.25, 0.0]]


def test_headline_by_hand():
    """Paired finals: the preset minus decoupled over seeds 0-2 is +0.10, +0.02, +0.06 (mean 0.06, sd 0.04,
    t_0.975,2 = 4.303: half-width 4.303 x 0.04 / sqrt 3 = 0.0994); sync (s = 0) pairs with s = 4; a baseline
    with a seed the preset lacks pairs on the shared seeds only."""
    runs = [_fake("darl", 4, 0, 0.50), _fake("darl", 4, 1, 0.42), _fake("darl", 4, 2, 0.46),
            _fake("decoupled", 4, 0, 0.40), _fake("decoupled", 4, 1, 0.40), _fake("decoupled", 4, 2, 0.40),
            _fake("decoupled", 4, 3, 0.90), _fake("sync", 0, 0, 0.60), _fake("sync", 0, 1, 0.60),
            _fake("naive", 4, 0, 0.20), _fake("naive", 4, 1, 0.21), _fake("naive", 4, 2, 0.19)]
    rows = {r["baseline"]: r for r in headline(runs)}
    dec = rows["decoupled"]["diff"]
    assert dec.n == 3 and dec.above == 3
    assert dec.mean == pytest.approx(0.06) and dec.low == pytest.approx(0.06 - 0.0994, abs=1e-4)
    assert rows["decoupled"]["verdict"] == "within noise"
    assert rows["naive"]["verdict"] == "met" and rows["naive"]["diff"].points() == "+26.0 [+14.6, +37.4], 3 of 3 above"
    assert rows["sync"]["diff"].n == 2 and rows["sync"]["verdict"] == "missed"
    assert "gates_only" not in rows and set(rows) == {"decoupled", "naive", "sync"}
    text = table(headline(runs))
    assert "| 4 | decoupled | 3 | 0.460 ± 0.040 | 0.400 ± 0.000 |" in text and "**no** (missed)" in text


def test_deterministic_for_a_fixed_seed(model_dir):
    a, b = make(model_dir, "darl", 1), make(model_dir, "darl", 1)
    ha, hb = run_steps(a), run_steps(b)
    strip = lambda hs: [{k: v for k, v in m.items() if not k.startswith("time") and k != "wall"} for m in hs]
    assert strip(ha) == strip(hb)
    assert same_weights(weights(a), weights(b))
    c = make(model_dir, "darl", 1, seed=1)
    assert strip(run_steps(c)) != strip(ha)


def test_run_and_report(model_dir, tmp_path):
    result = make(model_dir, "darl", 1).run()
    assert [e["step"] for e in result["evals"]] == [0, 2, 4]
    assert [e["samples"] for e in result["evals"]] == [0, 32, 64]
    result.update(method_name="darl", staleness=1, seed=0)
    naive = make(model_dir, "naive", 1).run()
    naive.update(method_name="naive", staleness=1, seed=0)
    uniform = make(model_dir, "darl", 1, pmis=False).run()
    uniform.update(method_name="darl_chi2_replay_uniform", staleness=1, seed=0)  # an archived name is reported too
    table = report([result, naive, uniform], tmp_path)
    assert "| 1 | darl |" in table and "| 1 | naive |" in table and "| 1 | darl_chi2_replay_uniform |" in table
    assert (tmp_path / "summary.md").exists()
    for png in ("accuracy_vs_samples_s1", "accuracy_vs_wall_s1", "ablations_s1", "replay_s1", "final_vs_staleness"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000, png


def _hand_run(method: str, seed: int, accs: list[float]) -> dict:
    """A study record with evaluations every 100 samples and 1 s steps."""
    evals = [{"step": i, "samples": 100 * i, "wall": float(i), "accuracy": a} for i, a in enumerate(accs)]
    return {"method_name": method, "staleness": 4, "seed": seed, "evals": evals, "initial_accuracy": accs[0],
            "final_accuracy": accs[-1], "best_accuracy": max(accs),
            "steps": [{"time_gen": 0.5, "time_train": 0.5}] * 4}


def test_samples_to_decoupled_final_by_hand(tmp_path):
    # seed 0: decoupled ends at 0.4 from 0.2; darl reaches 0.4 at 100 samples, equal_update at 300, naive never.
    # seed 1: decoupled ends at its start, 0.2: every run would "reach" it at step 0, so no figure
    runs = [_hand_run("decoupled", 0, [0.2, 0.3, 0.3, 0.4]), _hand_run("darl", 0, [0.2, 0.45, 0.5, 0.5]),
            _hand_run("equal_update", 0, [0.2, 0.3, 0.35, 0.4]), _hand_run("naive", 0, [0.2, 0.1, 0.1, 0.1]),
            _hand_run("decoupled", 1, [0.2, 0.3, 0.1, 0.2]), _hand_run("darl", 1, [0.2, 0.3, 0.4, 0.4])]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in report(runs, tmp_path).splitlines() if line.startswith("| 4 |") and "±" in line}
    assert rows["darl"][6] == "100 ± 0"  # seed 1 has no target: one run of one reaches it, so no "(1/2)"
    assert rows["equal_update"][6] == "300 ± 0" and rows["naive"][6] == "not reached"
    only_seed1 = report([r for r in runs if r["seed"] == 1], tmp_path)
    row = next(line for line in only_seed1.splitlines() if line.startswith("| 4 | darl |"))
    assert "- (decoupled ends at or below its start)" in row


def _all_wrong_from(h, step: int) -> None:
    """Every response of steps >= `step` scores 0: their groups have no advantage, so a returning prompt's history
    group trains in each one's place."""
    score = h._score
    h._score = lambda text, problem: score(text, problem) if h.version < step else 0.0


def _prompt_replay_runs(model_dir, key: str, values: tuple, steps: int):
    """`steps` steps of per-prompt replay on a pool of 8 (every prompt back at step 2, all wrong from then on) for
    each value of `key`; returns {value: step metrics} and the last harness."""
    runs = {}
    for value in values:
        h = make(model_dir, "darl", staleness=1, task="scarce", pool_size=8, prompt_replay=8, warmup=0, **{key: value})
        _all_wrong_from(h, 2)
        runs[value] = run_steps(h, steps)
    return runs, h


def test_scarce_task_with_prompt_replay_trains_history_groups_of_returning_prompts(model_dir):
    h = make(model_dir, "darl", staleness=1, task="scarce", pool_size=8, prompt_replay=8, warmup=0, steps=6)
    assert len(h.train_problems) == 8
    from recipe.darl.example.arithmetic import is_hard
    assert all(is_hard(a, b) for a, b in h.train_problems + h.val_problems)
    _all_wrong_from(h, 2)
    # pool of 8, 4 prompts a step: every prompt comes back at step 2 with its 4 responses of pass one stored
    history = run_steps(h, 4)
    assert [m["history_groups"] for m in history][:2] == [0, 0]
    assert all(m["dropped_zero_adv"] == 4 for m in history[2:])  # every fresh group of steps 2-3 is all wrong
    built = h.replay.buffer.prompts.totals["history_groups"]
    # one history group per returning prompt, in place of its dropped group; those with equal rewards are dropped
    assert built == 8 and 6 <= sum(m["history_groups"] for m in history) <= 8
    # trained history groups hold pass one's responses: older than the staleness s = 1 of a fresh group
    assert all(m["trained_staleness"] > 1 for m in history[2:] if m["history_groups"] and not m["skipped"])
    # two visits of 4 responses for each of the 8 prompts, cap 8 per prompt: all kept
    assert h.replay.buffer.stats()["history_responses"] == 8 * 8 and h.replay.buffer.stats()["history_prompts"] == 8


def test_prompt_replay_max_age_drops_history_the_pool_no_longer_reaches(model_dir):
    # pool of 8, 4 prompts a step: a prompt is back 2 steps after its visit
    runs, h = _prompt_replay_runs(model_dir, "prompt_replay_max_age", (None, 2, 1), 4)
    assert h.config.name.endswith("prompt8age1")
    # max_age 2 keeps what a returning prompt needs: the same history groups and the same losses as no cap...
    assert [m["loss"] for m in runs[2]] == [m["loss"] for m in runs[None]]
    assert [m["history_groups"] for m in runs[2]] == [m["history_groups"] for m in runs[None]]
    assert sum(m["history_groups"] for m in runs[2]) >= 6
    # ...but holds only the last 2 steps' responses (2 x 4 prompts x 4), where no cap holds both visits of all 8
    assert [m["history_responses"] for m in runs[None]] == [16, 32, 48, 64]
    assert [m["history_responses"] for m in runs[2]] == [16, 32, 32, 32]
    # max_age 1: a prompt's responses are gone when it comes back, so no history group is ever built
    assert all(m["history_groups"] == 0 for m in runs[1]) and runs[1][-1]["history_responses"] == 16
    assert runs[1][-1]["history_bytes"] < runs[2][-1]["history_bytes"]
