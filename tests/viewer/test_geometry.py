"""The viewer's per-key geometry against topn_metrics and against the definition (SPEC 2).

What the viewer prints must be what the tables average: P, R, F, margin and
inversions of a row equal ``attngeom.geometry.topn_metrics`` for that row, bit for
bit (one head's row through the same direct path). With every head of a layer at
once, as a run computes them, the counts (P, R, F, inversions) are still equal and
the margin within a few ulps: a matrix product may round by its row count. And the
picture is the metrics: every selected key lies within rho_max, every unselected key
outside rho_min but the flagged ones, and the flagged keys are exactly the Precision
and Recall offenders.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attngeom.errors import ConfigError
from attngeom.geometry import topn_metrics
from attngeom.viewer.geometry import principal_angles, selection_geometry

METRICS = ("precision", "recall", "f_score", "margin", "inversions")
CASES = [(r, d) for r in ("attention", "contribution", "random") for d in ("euclidean", "cosine")]


def _random_row(gen: torch.Generator, heads: int = 4, kv: int = 2):
    t_len = int(torch.randint(3, 48, (), generator=gen))
    d = int(torch.randint(1, 9, (), generator=gen))
    t = int(torch.randint(1, t_len, (), generator=gen))
    logits = torch.randn(heads, 1, t_len, generator=gen) * 3
    logits[..., t + 1 :] = -float("inf")
    alpha = logits.softmax(-1)
    if bool(torch.rand((), generator=gen) < 0.3):  # exact ties in alpha
        alpha = (alpha * 8).round() / 8
        alpha[..., t + 1 :] = 0
    values = torch.randn(kv, t_len, d, generator=gen)
    values[:, 0] *= 0.1  # a compressed sink, as real models have
    return alpha.float(), values, t


@pytest.mark.parametrize(("rule", "distance"), CASES)
def test_one_head_equals_topn_metrics_bit_for_bit(rule, distance):
    gen = torch.Generator().manual_seed(7)
    for _ in range(25):
        alpha, values, t = _random_row(gen, heads=1, kv=1)
        ns = list(range(1, t + 1))
        ref = topn_metrics(alpha, values, ns, rule=rule, distance=distance,
                           query_positions=torch.tensor([t]), seed=3, window=5, layer=2,
                           head_index=torch.tensor([6]))
        geo = selection_geometry(alpha[0, 0], values[0], torch.arange(alpha.shape[-1]) <= t, ns,
                                 rule=rule, distance=distance, query=t, seed=3, window=5,
                                 layer=2, head=6)
        for name in METRICS:
            np.testing.assert_array_equal(getattr(geo, name), getattr(ref, name)[0, 0, 0].numpy(),
                                          err_msg=f"{name} t={t}")


@pytest.mark.parametrize(("rule", "distance"), CASES)
def test_every_head_as_a_run_computes_them(rule, distance):
    gen = torch.Generator().manual_seed(11)
    for _ in range(10):
        alpha, values, t = _random_row(gen)
        ns = [1, 2, 4, 8, 16, 32]
        ns = [n for n in ns if n <= t]
        ref = topn_metrics(alpha, values, ns, rule=rule, distance=distance,
                           query_positions=torch.tensor([t]), seed=1, window=2, layer=3)
        for h in range(alpha.shape[0]):
            geo = selection_geometry(alpha[h, 0], values[h // 2],
                                     torch.arange(alpha.shape[-1]) <= t,
                                     list(range(1, max(ns) + 1)), rule=rule,
                                     distance=distance, query=t, seed=1, window=2, layer=3,
                                     head=h)
            at = [geo.at(n) for n in ns]
            for name in ("precision", "recall", "f_score", "inversions"):
                np.testing.assert_array_equal(getattr(geo, name)[at],
                                              getattr(ref, name)[0, h, 0].numpy())
            np.testing.assert_allclose(geo.margin[at], ref.margin[0, h, 0].numpy(),
                                       rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_the_circles_are_the_metrics(distance):
    gen = torch.Generator().manual_seed(5)
    for _ in range(20):
        alpha, values, t = _random_row(gen, heads=1, kv=1)
        geo = selection_geometry(alpha[0, 0], values[0], torch.arange(alpha.shape[-1]) <= t,
                                 range(1, t + 1), rule="attention", distance=distance,
                                 query=t)
        for i, n in enumerate(geo.ns):
            sel, dist = geo.selected[i], geo.distances[i]
            assert sel.sum() == n
            assert (dist[sel] <= geo.rho_max[i]).all()  # every selected key inside rho_max
            assert (dist[~sel] >= geo.rho_min[i]).all()  # every unselected outside rho_min
            # the flagged keys are exactly the offenders the metrics count
            assert geo.intruders[i].sum() == round(n / geo.precision[i] - n)
            assert geo.stragglers[i].sum() == round(n * (1 - geo.recall[i]))
            assert (dist[geo.intruders[i]] <= geo.rho_max[i]).all()
            assert (dist[~sel & ~geo.intruders[i]] >= geo.rho_max[i]).all()
            assert (dist[geo.stragglers[i]] >= geo.rho_min[i]).all()
            assert (dist[sel & ~geo.stragglers[i]] <= geo.rho_min[i]).all()
            # each offender is at least one inversion (SPEC 2's bounds)
            assert geo.inversions[i] >= max(geo.intruders[i].sum(), geo.stragglers[i].sum())


def test_hand_counted_case():
    """Five keys would do; four suffice. t = 3, d = 1, alpha = (.1, .4, .3, .2),
    v = (1, 1, -1, 1): y = (.1, .4, -.3, .2). Attention top-2 is I = {1, 2}, s = .1,
    D = (0, .3, .4, .1): rho_max = .4, rho_min = 0. Keys 0 and 3 are unselected inside
    rho_max (P = 2/4), no selected key is nearer than rho_min = 0 (R = 0, F = 0),
    inversions: key 1 has 2 unselected at least as near, key 2 has 2 (4); the margin
    is 0 - .4. At N = 1 (I = {1}, s = .4): D = (.3, 0, .7, .2), rho_max = 0,
    rho_min = .2: P = R = F = 1, margin .2, no inversion."""
    alpha = torch.tensor([0.1, 0.4, 0.3, 0.2], dtype=torch.float64)
    values = torch.tensor([[1.0], [1.0], [-1.0], [1.0]])
    geo = selection_geometry(alpha, values, torch.ones(4, dtype=torch.bool), [1, 2], query=3)
    # D = sqrt(||s||^2 - g): a distance of 0 comes out as the root of a rounding residue
    np.testing.assert_allclose(geo.distances, [[0.3, 0, 0.7, 0.2], [0, 0.3, 0.4, 0.1]],
                               atol=1e-8)
    assert geo.precision.tolist() == [1.0, 0.5]
    assert geo.recall.tolist() == [1.0, 0.0]
    assert geo.f_score.tolist() == [1.0, 0.0]
    assert geo.inversions.tolist() == [0.0, 4.0]
    np.testing.assert_allclose(geo.margin, [0.2, -0.4], atol=1e-12)
    np.testing.assert_allclose(geo.rho_max, [0.0, 0.4], atol=1e-8)
    assert geo.intruders[1].tolist() == [True, False, False, True]
    assert geo.stragglers[1].tolist() == [False, True, True, False]


def test_bad_n_and_rows():
    alpha = torch.tensor([0.5, 0.5, 0.0])
    values = torch.ones(3, 2)
    with pytest.raises(ConfigError, match=r"expected N in \[1, 1\]"):
        selection_geometry(alpha, values, torch.tensor([True, True, False]), [2, 4], query=1)
    with pytest.raises(ConfigError, match="non-finite"):
        selection_geometry(torch.tensor([0.5, float("nan"), 0.0]), values,
                           torch.tensor([True, True, False]), [1], query=1)
    with pytest.raises(ConfigError, match="distance: expected one of euclidean, cosine"):
        selection_geometry(alpha, values, torch.tensor([True, True, False]), [1], query=1,
                           distance="manhattan")


def test_principal_angles_place_the_plane_of_the_largest_contributions():
    y = np.array([[3.0, 0.0, 0.0], [0.0, -2.0, 0.0], [0.0, 0.0, 0.01], [-1.0, 0.0, 0.0]])
    angles, axes, (extra,) = principal_angles(y, np.array([0.0, 1.0, 0.0]))
    assert np.allclose(np.abs(axes[0]), [1, 0, 0]) and np.allclose(np.abs(axes[1]), [0, 1, 0])
    assert angles[0] == 0.0  # the largest contribution sits on the positive first axis
    assert np.isclose(abs(angles[3]), np.pi)
    assert np.isclose(abs(extra), np.pi / 2)
