"""Sink geometry (SPEC 3): constructed values with known answers, streaming and merging."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attngeom.core.batch import ValueStats
from attngeom.core.sink import (
    SINK_COLUMNS,
    SINK_POSITION_COLUMNS,
    SinkAccumulator,
    sink_query_stats,
    sink_value_stats,
)
from attngeom.errors import ConfigError
from tests.core.batches import assert_columns_equal, batch_of, causal


def test_value_stats_by_hand() -> None:
    """v0 = (-1, 0) (norm 1); v1 = (3, 0), v2 = (0, 3), v3 = (0, -3) (norms 3).

    norm_ratio = 3 / 1 = 3; mean_{j>=1} v_j = (1, 0), so sink_cos_mean = cos(v0, (1, 0)) = -1;
    sink_cos_pairwise = mean(-1, 0, 0) = -1/3. A second kv head with a zero sink gets a
    NaN norm ratio and cosines 0 (the zero-vector convention).
    """
    v = torch.tensor([
        [[-1.0, 0.0], [3.0, 0.0], [0.0, 3.0], [0.0, -3.0]],
        [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    ])
    s = sink_value_stats(ValueStats(v))
    assert s["norm_ratio"][0].item() == pytest.approx(3.0)
    assert s["sink_cos_mean"][0].item() == pytest.approx(-1.0)
    assert s["sink_cos_pairwise"][0].item() == pytest.approx(-1 / 3)
    assert math.isnan(s["norm_ratio"][1].item())
    assert s["sink_cos_mean"][1].item() == 0.0 and s["sink_cos_pairwise"][1].item() == 0.0


def test_value_stats_match_direct_vectors() -> None:
    """Gram-based cosines equal cosines of explicit d-dimensional means."""
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(3, 9, 4, generator=gen, dtype=torch.float64)
    s = sink_value_stats(ValueStats(v))
    m = v[:, 1:].mean(1)
    direct = torch.nn.functional.cosine_similarity(v[:, 0], m, dim=-1)
    torch.testing.assert_close(s["sink_cos_mean"], direct)
    pair = torch.nn.functional.cosine_similarity(v[:, :1], v[:, 1:], dim=-1).mean(-1)
    torch.testing.assert_close(s["sink_cos_pairwise"], pair)
    ratio = v[:, 1:].norm(dim=-1).mean(-1) / v[:, 0].norm(dim=-1)
    torch.testing.assert_close(s["norm_ratio"], ratio)


def test_sink_in_top_n_ties_and_visibility() -> None:
    """Row 0: alpha = (.3, .3, .4, 0): one key beats the sink, the tie goes to the sink.
    Row 1: a sliding window hides the sink: never in the top N, still a valid row.
    Row 2: sees one key only: N = 1 invalid, no sink-mass sample."""
    alpha = torch.tensor([[[0.3, 0.3, 0.4, 0.0], [0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    uni = torch.tensor([[[1, 1, 1, 0], [0, 1, 1, 0], [1, 0, 0, 0]]], dtype=torch.bool)
    s = sink_query_stats(alpha, uni, [1, 2, 3])
    assert s["in_top_n"][0, 0].tolist() == [False, True, True]
    assert s["top_valid"][0, 0].tolist() == [True, True, False]
    assert s["in_top_n"][0, 1].tolist() == [False, False, False]
    assert s["top_valid"][0, 1].tolist() == [True, False, False]
    assert s["top_valid"][0, 2].tolist() == [False, False, False]
    assert s["mass_valid"][0].tolist() == [True, True, False]
    assert s["sink_mass"][0].tolist() == pytest.approx([0.3, 0.0, 1.0])


def test_accumulator_means_per_window_then_over_windows() -> None:
    """Window 0 has 1 query with sink mass .8; window 1 has 3 queries with mass .2:
    the mean over windows is .5 (a pooled mean would give .35)."""
    v = torch.tensor([[[0.5, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]]])
    a0 = torch.tensor([[[0.8, 0.05, 0.05, 0.05, 0.05]]])
    a1 = torch.tensor([[[0.2, 0.8, 0.0, 0.0, 0.0],
                        [0.2, 0.4, 0.4, 0.0, 0.0],
                        [0.2, 0.1, 0.1, 0.6, 0.0]]])
    acc = SinkAccumulator([1, 2])
    acc.update(batch_of(v, a0, torch.tensor([4]), window=0))
    acc.update(batch_of(v, a1, torch.tensor([1, 2, 3]), window=1))
    out = acc.compute()
    assert list(out) == list(SINK_COLUMNS)
    assert out["n"].tolist() == [1, 2] and out["head"].tolist() == [0, 0]
    assert out["sink_mass"].tolist() == pytest.approx([0.5, 0.5])
    # N = 1: window 0 in (1/1), window 1: 0/3 -> 0.5.  N = 2: w0 1, w1: t=1 has |U| = 2
    # (invalid), t=2: beaten by 2 -> out, t=3: beaten by 1 -> in: 1/2 -> mean 0.75
    assert out["sink_in_top_n"].tolist() == pytest.approx([0.5, 0.75])
    assert out["n_windows"].tolist() == [2, 2]
    assert out["sink_position"].tolist() == [0, 0]
    norms = np.array([1.0, 1.0, math.sqrt(2), 2.0])
    assert out["norm_ratio"][0] == pytest.approx(norms.mean() / 0.5)


def test_accumulator_gqa_heads_read_their_kv_head() -> None:
    """Heads 0, 1 read kv head 0; heads 2, 3 read kv head 1 (h // (H / G))."""
    gen = torch.Generator().manual_seed(2)
    v = torch.randn(2, 6, 3, generator=gen)
    qpos = torch.tensor([5])
    alpha = torch.softmax(torch.randn(4, 1, 6, generator=gen), -1)
    acc = SinkAccumulator([1])
    acc.update(batch_of(v, alpha, qpos))
    out = acc.compute()
    ref = sink_value_stats(ValueStats(v))["norm_ratio"]
    assert out["norm_ratio"].tolist() == pytest.approx(ref[[0, 0, 1, 1]].tolist())
    assert out["sink_mass"].tolist() == pytest.approx(alpha[:, 0, 0].tolist())


def _windows(seed: int, count: int, t: int = 8):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        v = torch.randn(2, t, 3, generator=gen)
        qpos = torch.arange(1, t)
        vis = causal(qpos, t)
        alpha = torch.softmax((torch.randn(4, t - 1, t, generator=gen) * 2)
                              .masked_fill(~vis, float("-inf")), -1)
        out.append((v, alpha, qpos))
    return out


def _equal(a: dict, b: dict) -> None:
    assert_columns_equal(a, b, rtol=1e-12, atol=1e-14)


def test_merge_and_chunks_equal_one_run() -> None:
    wins = _windows(3, 4)
    whole = SinkAccumulator([1, 2, 7, 9], min_share=0.0, min_ratio=1.0)
    for w, (v, a, q) in enumerate(wins):
        whole.update(batch_of(v, a, q, window=w, layer=1))
    shards = [SinkAccumulator([1, 2, 7, 9], min_share=0.0, min_ratio=1.0) for _ in range(2)]
    for w, (v, a, q) in enumerate(wins):
        stats = ValueStats(v)
        for part in torch.tensor_split(torch.arange(q.numel()), 3):
            shards[w % 2].update(batch_of(v, a[:, part], q[part], window=w, layer=1,
                                          stats=stats))
    half = shards[0].compute()
    merged = shards[0].merge(shards[1])
    _equal(merged.compute(), whole.compute())
    _equal(merged.compute_positions(), whole.compute_positions())
    assert len(whole.compute_positions()["position"]) > 0
    assert not np.allclose(half["sink_mass"], merged.compute()["sink_mass"])
    assert set(merged.tables()) == {"sink", "sink_positions"}
    with pytest.raises(ConfigError, match="disjoint"):
        merged.merge(shards[1])
    with pytest.raises(ConfigError, match="n_grid"):
        SinkAccumulator([1]).merge(SinkAccumulator([2]))


def test_sink_positions_detects_a_second_sink() -> None:
    """Head 0 puts half its mass on position 5 ([SEP]-like) at every query; head 1 is
    uniform: only (head 0, position 5) is reported, with its mass share."""
    t = 12
    qpos = torch.arange(t)
    vis = torch.ones(1, t, t, dtype=torch.bool)  # an encoder: every key visible
    alpha = torch.full((2, t, t), 1.0 / t)
    alpha[0] = 0.5 / (t - 1)
    alpha[0, :, 5] = 0.5
    v = torch.randn(1, t, 4, generator=torch.Generator().manual_seed(0))
    acc = SinkAccumulator([1])
    for w in range(2):
        acc.update(batch_of(v, alpha, qpos, window=w, visible=vis))
    pos = acc.compute_positions()
    assert list(pos) == list(SINK_POSITION_COLUMNS)
    assert pos["head"].tolist() == [0] and pos["position"].tolist() == [5]
    assert pos["mass_share"].tolist() == pytest.approx([0.5])
    assert pos["n_windows"].tolist() == [2]


def test_sink_positions_relative_to_uniform_in_causal_rows() -> None:
    """All-query causal rows that are uniform give early keys large alphas; measured against
    uniform they are not sinks."""
    t = 10
    qpos = torch.arange(t)
    vis = causal(qpos, t)
    alpha = vis.to(torch.float32) / vis.sum(-1, keepdim=True)
    v = torch.randn(1, t, 2, generator=torch.Generator().manual_seed(0))
    acc = SinkAccumulator([1], min_share=0.0, min_ratio=1.5)
    acc.update(batch_of(v, alpha, qpos))
    assert acc.compute_positions()["position"].tolist() == []


def test_empty_and_bad_arguments() -> None:
    acc = SinkAccumulator([1, 2])
    assert all(len(x) == 0 for x in acc.compute().values())
    assert all(len(x) == 0 for x in acc.compute_positions().values())
    for bad in ([], [0], [1, 1]):
        with pytest.raises(ConfigError, match="n_grid"):
            SinkAccumulator(bad)
    with pytest.raises(ConfigError, match="min_share"):
        SinkAccumulator([1], min_share=2.0)
    v = torch.randn(1, 4, 2)
    acc.update(batch_of(v, torch.full((2, 1, 4), 0.25), torch.tensor([3])))
    with pytest.raises(ConfigError, match="heads"):
        acc.update(batch_of(v, torch.full((1, 1, 4), 0.25), torch.tensor([3]), window=1))

