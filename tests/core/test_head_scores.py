"""Head scores (method "Head types"): hand-built attention patterns with known answers,
and the vectorised kernels against plain loops on random rows."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.core import head_scores as hs
from attngeom.errors import ConfigError


def _pattern(t: int, source) -> torch.Tensor:
    """(1, T, T) causal rows putting all of row t's attention on key ``source(t)``."""
    a = torch.zeros(1, t, t)
    for q in range(t):
        a[0, q, source(q)] = 1.0
    return a


def _mean(score, valid) -> float:
    s, c = hs.row_sums(score, valid)
    return float(hs.mean_over_rows(s, c)[0])


def test_pure_previous_token_head_scores_one_and_a_sink_head_zero() -> None:
    """Head 0 puts all of row t on t - 1 (row 0 on itself), head 1 all on the sink: the
    previous-token score is 1.0 and 0.0 over rows t >= 2; the sink score, over rows
    t >= 1, is 1/11 (row 1's previous token is the sink) and 1.0."""
    t = 12
    a = torch.cat([_pattern(t, lambda q: max(q - 1, 0)), _pattern(t, lambda q: 0)])
    q = torch.arange(t)
    score, ok = hs.previous_token_rows(a, q)
    assert ok.tolist() == [False, False] + [True] * (t - 2)
    assert _mean(score[:1], ok) == 1.0 and _mean(score[1:], ok) == 0.0
    sink, ok0 = hs.sink_rows(a, q)
    assert ok0.tolist() == [False] + [True] * (t - 1)
    assert _mean(sink[:1], ok0) == pytest.approx(1 / 11) and _mean(sink[1:], ok0) == 1.0


def test_induction_and_echo_heads_on_a_repeated_block() -> None:
    """[s] + R + R with |R| = L = 5: on the second copy (t = 6..10), an induction head
    attends t - L + 1 (the token after the first copy), an echo head t - L (the copy)."""
    period, t = 5, 11
    induction = _pattern(t, lambda q: q - period + 1 if q > period else 0)
    echo = _pattern(t, lambda q: q - period if q > period else 0)
    a = torch.cat([induction, echo])
    q = torch.arange(t)
    ind, ok = hs.repeat_rows(a, q, period, offset=1)
    ech, ok_e = hs.repeat_rows(a, q, period, offset=0)
    assert ok.tolist() == [False] * 6 + [True] * 5 and ok_e.tolist() == ok.tolist()
    assert (_mean(ind[:1], ok), _mean(ind[1:], ok)) == (1.0, 0.0)
    assert (_mean(ech[:1], ok), _mean(ech[1:], ok)) == (0.0, 1.0)


def test_duplicate_token_mass_counts_earlier_copies_only() -> None:
    """Tokens [9, 4, 5, 4, 4, 9]. Row 3 (token 4) splits 0.5 / 0.5 between key 1 (a copy)
    and key 2: 0.5. Row 4 (token 4): keys 1 and 3 are copies, 0.25 + 0.5. Row 5 (token 9)
    has its only copy at the sink, which does not count: not a valid row. Rows 0-2 have
    no earlier copy."""
    tokens = torch.tensor([9, 4, 5, 4, 4, 9])
    a = torch.zeros(1, 6, 6)
    a[0, 3, [1, 2]] = 0.5
    a[0, 4, [0, 1, 3]] = torch.tensor([0.25, 0.25, 0.5])
    a[0, 5, 0] = 1.0
    score, ok = hs.duplicate_token_rows(a, torch.arange(6), tokens)
    assert ok.tolist() == [False, False, False, True, True, False]
    assert score[0, 3].item() == 0.5 and score[0, 4].item() == 0.75
    assert _mean(score, ok) == 0.625


def test_streaming_change_by_hand() -> None:
    """T = 8, W = 2. Head 0 attends only the sink and the two latest keys: its output is
    unchanged (0). Head 1 gives 0.5 to the sink (v = (1, 0)) and 0.5 to key 2 (v = (0, 1)),
    outside the window: z = (0.5, 0.5), z_stream = v_0 = (1, 0), change = |(0.5, -0.5)| /
    |(0.5, 0.5)| = 1. Row 2 drops no key (t < W + 1): not valid."""
    v = torch.zeros(1, 8, 2)
    v[0, :, 0] = 1.0
    v[0, 2] = torch.tensor([0.0, 1.0])
    a = torch.zeros(2, 2, 8)
    a[0, 0, [0, 6, 7]] = torch.tensor([0.2, 0.3, 0.5])
    a[1, 0, [0, 2]] = 0.5
    a[:, 1, 2] = 1.0
    change, ok = hs.streaming_rows(a, torch.tensor([7, 2]), v, 2)
    assert ok.tolist() == [[True, False], [True, False]]
    assert change[0, 0].item() == pytest.approx(0.0, abs=1e-7)  # float32 alphas
    assert change[1, 0].item() == pytest.approx(1.0)


def test_retrieval_hits_and_trial_score() -> None:
    """Needle at keys 3..5 holding tokens 7, 8, 9. The generated token is 8: head 0's top
    key is 4 (token 8): a copy. Head 1's top key is 1 (token 8 but outside the needle):
    not. Head 2 ties keys 4 and 5; the tie goes to 4: a copy. Head 3 tops key 5 (token 9
    != 8): not. A trial of 3 steps (tokens 7, 8, 2) recovers 2 of 3 needle tokens (counts
    at share 0.5, not at 1.0); each copying step gives 1/3."""
    keys = torch.tensor([1, 8, 2, 7, 8, 9])
    a = torch.zeros(4, 6)
    a[0, 4] = 1.0
    a[1, 1] = 1.0
    a[2, [4, 5]] = 0.5
    a[3, 5] = 1.0
    assert hs.retrieval_hits(a, keys, 8, (3, 6)).tolist() == [True, False, True, False]
    hits = torch.zeros(3, 1, 4, dtype=torch.bool)
    hits[0, 0, 1] = True
    hits[1, 0, [0, 2]] = True
    score, ok = hs.retrieval_trial(hits, [7, 8, 2], [7, 8, 9])
    assert ok and score[0].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])
    assert not hs.retrieval_trial(hits, [7, 8, 2], [7, 8, 9], recovered_share=1.0)[1]
    with pytest.raises(ConfigError, match="needle"):
        hs.retrieval_trial(hits, [7], [])


def test_labels_thresholds_and_bad_input() -> None:
    """>= threshold is the type (sink 0.3 inclusive, retrieval 0.1); streaming is <= its
    threshold; NaN is never a type."""
    labels = hs.head_labels({
        "sink": torch.tensor([0.3, 0.29, math.nan], dtype=torch.float64),
        "streaming": torch.tensor([0.1, 0.11, math.nan], dtype=torch.float64),
        "retrieval": torch.tensor([0.1, 0.0, 1.0], dtype=torch.float64),
    })
    assert labels["sink"].tolist() == [True, False, False]
    assert labels["streaming"].tolist() == [True, False, False]
    assert labels["retrieval"].tolist() == [True, False, True]
    a = torch.full((1, 2, 4), 0.25)
    with pytest.raises(ConfigError, match=r"positions in \[0, 3\]"):
        hs.previous_token_rows(a, torch.tensor([1, 4]))
    with pytest.raises(ConfigError, match="shape"):
        hs.sink_rows(a[0], torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="window"):
        hs.streaming_rows(a, torch.tensor([2, 3]), torch.zeros(1, 4, 2), 0)
    with pytest.raises(ConfigError, match="period"):
        hs.repeat_rows(a, torch.tensor([2, 3]), 0, offset=1)
    assert math.isnan(float(hs.mean_over_rows(torch.zeros(1), torch.zeros(1))[0]))


def _random_rows(seed: int, h: int, t: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.unique(torch.randint(0, t, (max(t // 2, 1),), generator=gen))
    keys = torch.arange(t)
    logits = torch.randn(h, q.numel(), t, generator=gen, dtype=torch.float64) * 2
    alpha = torch.softmax(logits.masked_fill(keys[None, None] > q[None, :, None], -math.inf), -1)
    tokens = torch.randint(0, 4, (t,), generator=gen)
    return alpha, q, tokens, gen


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(1, 3), t=st.integers(2, 14),
       period=st.integers(1, 6), window=st.integers(1, 8))
def test_kernels_equal_plain_loops(seed: int, h: int, t: int, period: int, window: int) -> None:
    """Every row score equals its definition computed key by key."""
    alpha, q, tokens, gen = _random_rows(seed, h, t)
    v = torch.randn(1, t, 3, generator=gen, dtype=torch.float64)
    prev, ok_p = hs.previous_token_rows(alpha, q)
    dup, ok_d = hs.duplicate_token_rows(alpha, q, tokens)
    ind, ok_i = hs.repeat_rows(alpha, q, period, offset=1)
    stream, ok_s = hs.streaming_rows(alpha, q, v, window)
    for i, t_ in enumerate(q.tolist()):
        assert bool(ok_p[i]) == (t_ >= 2)
        copies = [j for j in range(1, t_) if tokens[j] == tokens[t_]]
        assert bool(ok_d[i]) == bool(copies)
        assert bool(ok_i[i]) == (t_ >= period + 1)
        for k in range(h):
            row = alpha[k, i]
            assert float(prev[k, i]) == (float(row[t_ - 1]) if t_ >= 2 else 0.0)
            assert float(dup[k, i]) == pytest.approx(sum(float(row[j]) for j in copies))
            want_i = float(row[t_ - period + 1]) if t_ >= period + 1 else 0.0
            assert float(ind[k, i]) == want_i
            z = sum(float(row[j]) * v[0, j] for j in range(t_ + 1))
            kept = [j for j in range(t_ + 1) if j == 0 or j > t_ - window]
            mass = sum(float(row[j]) for j in kept)
            if t_ >= window + 1 and mass > 0 and float(z.norm()) > 0:
                zs = sum(float(row[j]) * v[0, j] for j in kept) / mass
                assert bool(ok_s[k, i])
                assert float(stream[k, i]) == pytest.approx(float((z - zs).norm() / z.norm()),
                                                            rel=1e-9, abs=1e-12)
            else:
                assert not bool(ok_s[k, i])


def test_gqa_streaming_reads_each_heads_kv_head() -> None:
    """Heads 0, 1 read kv head 0 and heads 2, 3 kv head 1: each equals its own one-head
    computation."""
    alpha, q, _, gen = _random_rows(3, 4, 10)
    v = torch.randn(2, 10, 3, generator=gen, dtype=torch.float64)
    got, _ = hs.streaming_rows(alpha, q, v, 2)
    for h in range(4):
        one, _ = hs.streaming_rows(alpha[h:h + 1], q, v[h // 2:h // 2 + 1], 2)
        torch.testing.assert_close(got[h], one[0])


def test_accumulator_equals_the_kernels_and_merges_exactly() -> None:
    """Two windows' AttentionBatches in two chunks each: the accumulator's means equal the
    kernels' means over all rows; two shards merged give the same table; a window seen by
    both shards, a different W or a head count that changes are errors."""
    from attngeom.core.batch import ValueStats
    from tests.core.batches import assert_columns_equal, batch_of

    wins = []
    for seed in (1, 2):
        alpha, q, tokens, gen = _random_rows(seed, 4, 12)
        wins.append((alpha.float(), q, tokens, torch.randn(2, 12, 3, generator=gen)))
    whole = hs.HeadScoreAccumulator(3)
    shards = [hs.HeadScoreAccumulator(3), hs.HeadScoreAccumulator(3)]
    for w, (alpha, q, tokens, v) in enumerate(wins):
        stats = ValueStats(v)
        for part in torch.tensor_split(torch.arange(q.numel()), 2):
            batch = batch_of(v, alpha[:, part], q[part], window=w, layer=1, stats=stats,
                             tokens=tokens)
            whole.update(batch)
            shards[w].update(batch)
    prev = [hs.previous_token_rows(a, q) for a, q, _, _ in wins]
    s = sum(hs.row_sums(*p)[0] for p in prev)
    c = sum(hs.row_sums(*p)[1] for p in prev)
    torch.testing.assert_close(torch.as_tensor(whole.means("previous_token")[1][0]),
                               hs.mean_over_rows(s, c))
    stream = [hs.streaming_rows(a, q, v, 3) for a, q, _, v in wins]
    s = sum(hs.row_sums(*p)[0] for p in stream)
    c = sum(hs.row_sums(*p)[1] for p in stream)
    torch.testing.assert_close(torch.as_tensor(whole.means("streaming")[1][0]),
                               hs.mean_over_rows(s, c))
    table = whole.compute()["head_scores"]
    assert len(table["layer"]) == 4 * len(hs.corpus_scores()) and whole.windows == 2
    merged = shards[0].merge(shards[1]).compute()["head_scores"]
    assert_columns_equal(merged, table, rtol=1e-12)
    with pytest.raises(ConfigError, match="disjoint"):
        shards[0].merge(shards[1])
    with pytest.raises(ConfigError, match="streaming_window"):
        hs.HeadScoreAccumulator(3).merge(hs.HeadScoreAccumulator(4))
    alpha, q, tokens, v = wins[0]
    with pytest.raises(ConfigError, match="heads"):
        whole.add_rows(1, alpha[:2], q, v[:1], tokens)
    assert all(len(x) == 0 for x in hs.HeadScoreAccumulator().compute()["head_scores"].values())
