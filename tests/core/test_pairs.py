"""The window-wide pair statistics: every pair for short windows, a fixed sample beyond."""

from __future__ import annotations

import torch

from attngeom.core.assumptions import cosine_by_distance
from attngeom.core.batch import ValueStats
from attngeom.core.pairs import PAIR_SAMPLE, num_pairs, pair_sample


def test_short_windows_use_every_pair() -> None:
    for t in (2, 3, 10, 363):
        a, b = pair_sample(t)
        assert a.numel() == num_pairs(t)
        assert len(set(zip(a.tolist(), b.tolist(), strict=True))) == num_pairs(t)
        assert bool((a >= 1).all()) and bool((a < b).all()) and bool((b < t).all())


def test_long_windows_use_a_fixed_sample() -> None:
    t = 1500
    assert num_pairs(t) > PAIR_SAMPLE
    a, b = pair_sample(t)
    assert a.numel() == 362 * 361 // 2 <= PAIR_SAMPLE
    assert bool((a >= 1).all()) and bool((a < b).all()) and bool((b < t).all())
    a2, b2 = pair_sample(t)  # the same pairs every time (every window, layer, shard)
    assert torch.equal(a, a2) and torch.equal(b, b2)
    # roughly uniform over distances: as many pairs below T/3 apart as a full census
    share = float(((b - a) < t // 3).double().mean())
    m = t - 1
    d = torch.arange(1, m, dtype=torch.float64)
    full = float(((m - d) * (d < t // 3)).sum() / (m - d).sum())
    assert abs(share - full) < 0.03


def test_sampled_decay_tracks_the_census() -> None:
    """Values with a decaying correlation: the sample's mean cosine per distance is
    close to the full census's where the sample has enough pairs."""
    t, d = 800, 32
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(t, d, generator=gen, dtype=torch.float64)
    v = torch.empty(t, d, dtype=torch.float64)
    v[0] = noise[0]
    for i in range(1, t):
        v[i] = 0.9 * v[i - 1] + (1 - 0.81) ** 0.5 * noise[i]
    sampled = cosine_by_distance(ValueStats(v[None]))
    n = v.norm(dim=-1)
    cos = (v @ v.T) / (n[:, None] * n[None, :])
    for dist in (1, 5, 20):
        exact = float(torch.diagonal(cos[1:, 1:], offset=dist).mean())
        est = float(sampled["cos_sum"][0, dist] / sampled["count"][0, dist])
        assert sampled["count"][0, dist] > 100
        assert abs(est - exact) < 0.05, (dist, est, exact)


def test_the_sample_cached_per_length_is_never_handed_out() -> None:
    """Callers get their own position tensors: one that wrote into them would otherwise
    change the pairs of every later window of that length."""
    from attngeom.core.pairs import sampled_pair_cosines

    t = 1200
    a, b = pair_sample(t)
    a.zero_()
    values = torch.randn(2, t, 4, dtype=torch.float64)
    a2, b2, _, _ = sampled_pair_cosines(values, values.norm(dim=-1))
    a2.zero_()
    a3, b3 = pair_sample(t)
    assert bool((a3 >= 1).all()) and torch.equal(b, b3) and torch.equal(b2, b3)
