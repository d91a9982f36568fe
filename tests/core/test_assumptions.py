"""Assumption diagnostics (SPEC 5): norms, cosine decay, attention profile; streaming."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attngeom.core.assumptions import (
    ASSUMPTIONS_COLUMNS,
    AssumptionsAccumulator,
    attention_profile_masses,
    cosine_by_distance,
    fit_exponential_decay,
    norm_statistics,
)
from attngeom.core.batch import ValueStats
from attngeom.errors import ConfigError
from tests.core.batches import batch_of, causal


def decaying_values(t: int, lam: float, sink_scale: float = 0.2) -> torch.Tensor:
    """(1, t, t-1) values with cos(v_i, v_j) = exp(-|i - j| / lam) exactly for i, j >= 1
    (rows of the Cholesky factor of that positive-definite kernel) and a small sink."""
    pos = torch.arange(1, t, dtype=torch.float64)
    k = torch.exp(-(pos[:, None] - pos[None, :]).abs() / lam)
    chol = torch.linalg.cholesky(k)
    v = torch.zeros(1, t, t - 1, dtype=torch.float64)
    v[0, 1:] = chol
    v[0, 0, 0] = -sink_scale
    return v


def test_norm_statistics_by_hand() -> None:
    """Non-sink norms 1, 3 (mean 2, population std 1): cv 0.5; sink 0.5: ratio 4."""
    v = torch.tensor([[[0.5, 0.0], [1.0, 0.0], [0.0, 3.0]], [[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]]])
    s = norm_statistics(ValueStats(v))
    assert s["norm_cv"].tolist() == pytest.approx([0.5, 1 / 3])
    assert s["sink_norm_ratio"][0].item() == pytest.approx(4.0)
    assert math.isnan(s["sink_norm_ratio"][1].item())


def test_decay_fit_recovers_lambda() -> None:
    v = decaying_values(12, 2.5)
    cd = cosine_by_distance(ValueStats(v))
    assert cd["count"][0, 1:].tolist() == [11 - d for d in range(1, 11)] + [0]
    assert cd["negative"].item() == 0
    acc = AssumptionsAccumulator(recent=3)
    alpha = torch.full((1, 1, 12), 1 / 12)
    acc.update(batch_of(v, alpha, torch.tensor([11])))
    out = acc.compute()["assumptions"]
    assert out["cos_decay_lambda"][0] == pytest.approx(2.5, rel=1e-5)
    assert out["cos_decay_mae"][0] < 1e-6
    assert out["negative_cos_share"][0] == 0.0
    assert out["norm_cv"][0] == pytest.approx(0.0, abs=1e-12)
    assert out["sink_norm_ratio"][0] == pytest.approx(5.0)


def test_decay_fit_is_pair_weighted_least_squares() -> None:
    """The fit minimises the pair-weighted squared error: no grid lambda does better."""
    gen = np.random.default_rng(0)
    mean_cos = np.clip(np.exp(-np.arange(15) / 4.0) + gen.normal(0, 0.05, 15), -1, 1)[None]
    weight = np.r_[0, np.arange(14, 0, -1)].astype(float)[None]
    lam, mae = fit_exponential_decay(mean_cos, weight)
    d = np.arange(15)

    def loss(x):
        return (weight[0] * (mean_cos[0] - np.exp(-d / x)) ** 2).sum()

    grid = np.exp(np.linspace(np.log(0.1), np.log(100), 3000))
    assert loss(lam[0]) <= min(loss(x) for x in grid) + 1e-12
    fitted = np.exp(-d / lam[0])
    assert mae[0] == pytest.approx((weight[0] * np.abs(mean_cos[0] - fitted)).sum() / weight.sum())
    lam, mae = fit_exponential_decay(np.zeros((1, 4)), np.zeros((1, 4)))
    assert math.isnan(lam[0]) and math.isnan(mae[0])


def test_negative_cosine_share() -> None:
    """v1 = e1, v2 = -e1, v3 = e2: pairs (1,2) -1, (1,3) 0, (2,3) 0: one of three negative;
    the zero vector v4 is left out."""
    v = torch.tensor([[[1.0, 1.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]])
    acc = AssumptionsAccumulator()
    acc.update(batch_of(v, torch.full((1, 1, 5), 0.2), torch.tensor([4])))
    out = acc.compute()["assumptions"]
    assert out["negative_cos_share"][0] == pytest.approx(1 / 3)


def test_attention_profile_masses_by_hand() -> None:
    """t = 7, recent = 3: sink {0}, recent {5, 6, 7}, middle {1..4}; t = 1: sink {0},
    recent {1} (the sink stays the sink even when within reach)."""
    alpha = torch.tensor([[[0.4, 0.1, 0.05, 0.05, 0.1, 0.1, 0.1, 0.1],
                           [0.3, 0.7, 0, 0, 0, 0, 0, 0]]])
    qpos = torch.tensor([7, 1])
    uni = causal(qpos, 8).expand(1, -1, -1)
    m = attention_profile_masses(alpha, uni, qpos, recent=3)
    assert m["mass_sink"][0].tolist() == pytest.approx([0.4, 0.3])
    assert m["mass_recent"][0].tolist() == pytest.approx([0.3, 0.7])
    assert m["mass_middle"][0].tolist() == pytest.approx([0.3, 0.0])
    m = attention_profile_masses(alpha, uni, qpos, recent=3, sink_width=2)
    assert m["mass_sink"][0].tolist() == pytest.approx([0.5, 1.0])


def test_masses_sum_to_one_and_pool_over_queries() -> None:
    gen = torch.Generator().manual_seed(0)
    t = 20
    qpos = torch.arange(t)
    vis = causal(qpos, t)
    alpha = torch.softmax(torch.randn(2, t, t, generator=gen).masked_fill(~vis, -math.inf), -1)
    acc = AssumptionsAccumulator(recent=4)
    acc.update(batch_of(torch.randn(1, t, 3, generator=gen), alpha, qpos))
    out = acc.compute()["assumptions"]
    total = out["mass_sink"] + out["mass_middle"] + out["mass_recent"]
    np.testing.assert_allclose(total, 1.0, rtol=1e-6)
    # t = 0 sees one key and is left out of the profile
    np.testing.assert_allclose(out["mass_sink"], alpha[:, 1:, 0].double().mean(-1).numpy())
    assert list(out) == list(ASSUMPTIONS_COLUMNS)


def test_merge_and_chunks_equal_one_run() -> None:
    gen = torch.Generator().manual_seed(4)
    wins = []
    for _ in range(4):
        t = 10
        qpos = torch.arange(1, t)
        vis = causal(qpos, t)
        a = torch.softmax(torch.randn(4, t - 1, t, generator=gen).masked_fill(~vis, -math.inf),
                          -1)
        wins.append((torch.randn(2, t, 3, generator=gen), a, qpos))
    whole = AssumptionsAccumulator(recent=3)
    for w, (v, a, q) in enumerate(wins):
        whole.update(batch_of(v, a, q, window=w))
    shards = [AssumptionsAccumulator(recent=3), AssumptionsAccumulator(recent=3)]
    for w, (v, a, q) in enumerate(wins):
        stats = ValueStats(v)
        for part in torch.tensor_split(torch.arange(q.numel()), 3):
            shards[w % 2].update(batch_of(v, a[:, part], q[part], window=w, stats=stats))
    half = shards[0].compute()["assumptions"]
    merged = shards[0].merge(shards[1]).compute()["assumptions"]
    ref = whole.compute()["assumptions"]
    for k in ref:
        # the fitted lambda is a minimiser of a flat loss: sums that differ in the last bit
        # (another summation order) move it by ~sqrt(eps)
        rtol = 1e-6 if k in ("cos_decay_lambda", "cos_decay_mae") else 1e-12
        np.testing.assert_allclose(merged[k], ref[k], rtol=rtol, equal_nan=True)
    assert not np.allclose(half["norm_cv"], merged["norm_cv"])
    with pytest.raises(ConfigError, match="disjoint"):
        shards[0].merge(shards[1])
    with pytest.raises(ConfigError, match="recent"):
        AssumptionsAccumulator(recent=3).merge(AssumptionsAccumulator(recent=4))


def test_bad_arguments_and_empty() -> None:
    with pytest.raises(ConfigError, match="recent"):
        AssumptionsAccumulator(recent=0)
    with pytest.raises(ConfigError, match="sink_width"):
        AssumptionsAccumulator(sink_width=0)
    out = AssumptionsAccumulator().compute()["assumptions"]
    assert all(len(x) == 0 for x in out.values())

