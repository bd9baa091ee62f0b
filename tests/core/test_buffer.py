"""Replay buffer: packing round trip, warmup, zero-advantage filter, and hypothesis properties of whole runs."""

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.darl.core import ReplayConfig, Group, ReplayBuffer, gather_recorded
from recipe.darl.core.packing import pack_rows, unpack_rows

WIDTH = 6


def make_group(uid: str, version: int, n: int = 3, rewards=None, seed: int = 0) -> Group:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, WIDTH + 1, (n,), generator=g)
    cols = torch.arange(WIDTH)
    valid = cols < lengths.unsqueeze(1)
    responses = torch.where(valid, torch.randint(1, 100, (n, WIDTH), generator=g), 0)
    log_probs = torch.where(valid, -torch.rand(n, WIDTH, generator=g), 0.0)
    prompt = torch.tensor([0, 0, 11, 12, 13])  # left-padded, 3 real tokens
    rewards = torch.tensor(rewards if rewards is not None else [float(i % 2) for i in range(n)])
    return Group.from_padded(uid, version, prompt, 3, responses, lengths, valid, log_probs, rewards,
                             {"data_source": np.array(["toy"] * n, dtype=object)})


def test_pack_unpack_round_trip_both_paddings():
    lengths = torch.tensor([2, 0, 4])
    padded = torch.tensor([[1, 2, 0, 0], [0, 0, 0, 0], [5, 6, 7, 8]])
    flat = pack_rows(padded, lengths)
    assert flat.tolist() == [1, 2, 5, 6, 7, 8]
    assert torch.equal(unpack_rows(flat, lengths, 4), padded)
    left = torch.tensor([[0, 0, 1, 2], [0, 0, 0, 0], [5, 6, 7, 8]])
    assert torch.equal(unpack_rows(pack_rows(left, lengths, left_padded=True), lengths, 4, left_padded=True), left)
    with pytest.raises(ValueError, match="width"):
        unpack_rows(flat, lengths, 3)


def test_group_round_trip_and_compact_storage():
    group = make_group("a", 3, n=4)
    assert group.prompt_ids.tolist() == [11, 12, 13]
    assert group.response_ids.dtype == torch.int32 and group.rollout_log_probs.dtype == torch.float32
    ids = group.padded("response_ids", WIDTH)
    assert ids.shape == (4, WIDTH) and torch.equal(pack_rows(ids, group.lengths), group.response_ids)
    group.record(4, group.padded("rollout_log_probs", WIDTH) - 1.0)
    assert torch.allclose(group.recorded[4], group.rollout_log_probs - 1.0)
    # 4 + 1 + 4 bytes per response token, plus 4 for the recorded version
    fixed = group.prompt_ids.numel() * 4 + group.n * 8
    assert group.nbytes() == fixed + group.num_tokens * (9 + 4)
    with pytest.raises(ValueError, match="rewards"):
        Group.from_padded("b", 1, torch.zeros(2), 2, torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3),
                          torch.zeros(2, 3), torch.zeros(3))


def test_gather_recorded_pads_known_versions():
    a, b = make_group("a", 1, n=2, seed=1), make_group("b", 2, n=2, seed=2)
    a.record(2, a.rollout_log_probs - 0.5)
    out = gather_recorded([a, b], WIDTH)
    known, lp = out[2]
    assert known.tolist() == [True, True, False, False]
    assert torch.equal(lp[:2], a.padded("rollout_log_probs", WIDTH) - 0.5 * a.padded("response_mask", WIDTH))


def test_warmup_trains_on_fresh_only_while_the_buffer_fills():
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=4, warmup=2))
    for step in range(1, 4):
        fresh = [make_group(f"{step}-{i}", step - 1, seed=step * 10 + i) for i in range(2)]
        cands = buf.begin_step(fresh, step)
        assert cands.warmup == (step <= 2)
        expected = 2 if step <= 2 else 6  # after warmup: the 4 buffered groups join
        assert len(cands.candidates) == expected
        buf.end_step(cands, trained=cands.candidates)
    assert len(buf) == 6 and buf.steps_done == 3


def test_zero_advantage_groups_are_dropped_and_counted():
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=2))
    fresh = [make_group("same", 0, rewards=[1.0, 1.0, 1.0]), make_group("mixed", 0, rewards=[0.0, 1.0, 1.0])]
    cands = buf.begin_step(fresh, 1)
    assert [g.uid for g in cands.candidates] == ["mixed"] and cands.dropped_zero_adv == 1
    buf.end_step(cands, [])
    assert buf.totals["dropped_zero_adv"] == 1 and [g.uid for g in buf.groups] == ["mixed"]
    keep_all = ReplayBuffer(ReplayConfig(pmis=False, k=2, filter_zero_adv=False))
    assert len(keep_all.begin_step(fresh, 1).candidates) == 2


def test_k1_means_no_replay():
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=1, warmup=0))
    for step in range(1, 4):
        cands = buf.begin_step([make_group(f"{step}", step - 1)], step)
        assert [g.version for g in cands.candidates] == [step - 1]
        buf.end_step(cands, [])


step_plan = st.lists(
    st.tuples(
        st.integers(0, 2),  # version lag of the fresh batch
        st.integers(0, 4),  # fresh groups
        st.lists(st.booleans(), min_size=6, max_size=6),  # which candidates train (cycled)
        st.booleans(),  # all-equal rewards in the first fresh group
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    plan=step_plan,
    k=st.integers(1, 4),
    warmup=st.integers(0, 3),
    max_reuse=st.one_of(st.none(), st.integers(1, 3)),
    max_groups=st.one_of(st.none(), st.integers(1, 8)),
    roundtrip_at=st.integers(0, 12),
)
def test_buffer_invariants_over_random_runs(plan, k, warmup, max_reuse, max_groups, roundtrip_at, state_equal):
    buf = ReplayBuffer(ReplayConfig(pmis=False, k=k, warmup=warmup, max_reuse=max_reuse, max_groups=max_groups))
    originals: dict[str, torch.Tensor] = {}
    seen_versions: list[int] = []
    for step, (lag, count, train_mask, zero_first) in enumerate(plan, start=1):
        version = max(step - 1 - lag, max(seen_versions, default=0))  # versions never go back
        fresh = []
        for i in range(count):
            rewards = [1.0, 1.0, 1.0] if (zero_first and i == 0) else None
            group = make_group(f"{step}-{i}", version, rewards=rewards, seed=step * 100 + i)
            originals[group.uid] = group.response_ids.clone()
            fresh.append(group)
        if count:  # a version is seen when a batch of it arrives
            seen_versions.append(version)
        window = sorted(set(seen_versions))[-k:]

        cands = buf.begin_step(fresh, step)
        assert cands.window == window
        assert all(g.version in window for g in cands.candidates)
        assert not any(g.zero_advantage for g in cands.candidates)
        if cands.warmup:
            assert all(g.arrival_step == step for g in cands.candidates)
        for g in cands.candidates:
            g.record(step, g.rollout_log_probs - 0.1)
        trained = [g for i, g in enumerate(cands.candidates) if train_mask[i % 6]]
        before = {id(g) for g in buf.groups} | {id(g) for g in cands.fresh}
        survivors = [g for g in buf.groups + cands.fresh
                     if g.version in window and (max_reuse is None or g.times_trained + (g in trained) < max_reuse)]

        stats = buf.end_step(cands, trained)

        kept = {id(g) for g in buf.groups}
        assert kept <= before
        assert all(g.version in window for g in buf.groups)  # nothing outside the window
        if max_groups is not None:
            assert len(buf) <= max_groups
        if max_reuse is not None:
            assert all(g.times_trained < max_reuse for g in buf.groups)
        capped = [g for g in survivors if id(g) not in kept]
        assert stats.max_groups == len(capped)
        if capped and buf.groups:  # the cap evicts oldest first
            assert max((g.version, g.seq) for g in capped) < min((g.version, g.seq) for g in buf.groups)
        for g in buf.groups:  # never split, never altered
            assert g.n == 3 and int(g.lengths.sum()) == g.num_tokens
            assert torch.equal(g.response_ids, originals[g.uid])
            assert all(j >= window[0] for j in g.recorded)
        assert [g.seq for g in buf.groups] == sorted(g.seq for g in buf.groups)

        if step == roundtrip_at:
            blob = io.BytesIO()
            torch.save(buf.state_dict(), blob)
            blob.seek(0)
            restored = ReplayBuffer(ReplayConfig(pmis=False, k=k, warmup=warmup, max_reuse=max_reuse, max_groups=max_groups))
            restored.load_state_dict(torch.load(blob, weights_only=False))
            assert state_equal(restored.state_dict(), buf.state_dict())
            buf = restored
