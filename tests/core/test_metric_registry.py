"""The metric registry's contract, run over every registered metric (``core/metrics.py``).

A metric is tested the moment it is registered: against its loop reference
(``tests/reference_geometry.py``, which must define it) within the tolerance its
declaration gives, in the range its kind promises, the same however the rows are
chunked (bit for bit where it is declared exact) and whether the kernels are compiled
or not. ``test_extending_metric.py`` registers a toy metric and runs the same checks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attngeom.core import kernels
from attngeom.core.geometry import topn_metrics_variants
from attngeom.core.metrics import BUILT_IN, Metric, metric, metrics, precision, register_metric
from attngeom.errors import ConfigError
from attngeom.names import METRICS
from tests import reference_geometry as ref

GRID = (1, 2, 3, 6, 20)


def _case(seed: int, distance: str):
    """A window with a sink, GQA and a masked key; dyadic (exact) for the Euclidean
    distance, continuous for the cosine one."""
    gen = torch.Generator().manual_seed(seed)
    h, g, q, t, d = 4, 2, 3, 13, 3
    pos = torch.arange(t - q, t)
    vis = (torch.arange(t)[None, :] <= pos[:, None])[None].expand(h, q, t).clone()
    vis[1, :, 4] = False
    if distance == "euclidean":
        alpha = torch.randint(0, 6, (h, q, t), generator=gen).double() * vis / 64
        alpha[..., 0] += 0.25
        values = torch.randint(-3, 4, (g, t, d), generator=gen).double()
    else:
        alpha = torch.softmax((torch.randn(h, q, t, generator=gen) * 2).masked_fill(
            ~vis, float("-inf")), -1)
        values = torch.randn(g, t, d, generator=gen)
    return alpha, values, pos, vis


def _run(alpha, values, pos, vis, distance, **kw):
    return topn_metrics_variants(alpha, values, GRID, rules=("attention", "contribution",
                                 "random"), distance=distance, visible=vis,
                                 query_positions=pos, repeats=2, seed=5, **kw)


def test_names_are_the_registry_and_every_metric_has_a_reference():
    assert tuple(METRICS) == tuple(m.name for m in metrics())
    assert METRICS.names()[: len(BUILT_IN)] == tuple(m.name for m in BUILT_IN)
    missing = [name for name in METRICS if name not in ref.REFERENCE]
    assert not missing, f"no reference definition for {missing}"


@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_every_metric_matches_its_reference_and_its_kind(name, distance):
    m = metric(name)
    alpha, values, pos, vis = _case(1, distance)
    for variant, by_rule in _run(alpha, values, pos, vis, distance).items():
        for rule, fast in by_rule.items():
            want = ref.reference_topn(alpha, values, GRID, rule=rule, distance=distance,
                                      visible=vis, query_positions=pos, repeats=2, seed=5,
                                      exclude_sink=variant == "no_sink").metric(name)
            got = fast.metric(name).numpy()
            if distance == "cosine" and not m.cosine:
                assert np.isnan(got).all()
                continue
            assert np.array_equal(np.isnan(got), np.isnan(want)), (variant, rule)
            ok = ~np.isnan(want)
            assert np.abs(got[ok] - want[ok]).max(initial=0) <= m.tolerance, (variant, rule)
            if m.kind == "fraction":
                assert ((got[ok] >= 0) & (got[ok] <= 1)).all()
            elif m.kind == "count":
                assert (got[ok] >= 0).all() and np.array_equal(got[ok], np.round(got[ok]))


@pytest.mark.parametrize("name", list(METRICS))
def test_every_metric_is_the_same_chunked_and_compiled(name):
    """One row at a time and the whole window: bit for bit where the metric is declared
    exact; compiled and plain: bit for bit (exact counts, the same float operations)."""
    m = metric(name)
    alpha, values, pos, vis = _case(2, "euclidean")
    whole = _run(alpha, values, pos, vis, "euclidean", path="direct")
    rows = _run(alpha, values, pos, vis, "euclidean", path="direct", chunk_rows=1)
    with kernels.compiling(True):
        fused = _run(alpha, values, pos, vis, "euclidean", path="direct")
    for variant in whole:
        for rule in whole[variant]:
            a = whole[variant][rule].metric(name).nan_to_num(-9.0)
            b = rows[variant][rule].metric(name).nan_to_num(-9.0)
            c = fused[variant][rule].metric(name).nan_to_num(-9.0)
            assert torch.equal(a, c), (variant, rule)
            if m.exact:
                assert torch.equal(a, b), (variant, rule)
            else:
                torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-12)


def test_registering_a_taken_name_or_an_unknown_kind_is_one_clear_error():
    with pytest.raises(ConfigError, match="precision"):
        register_metric(Metric("precision", precision))
    with pytest.raises(ConfigError, match="kind"):
        register_metric(Metric("oddity", precision, kind="ratio"))
    assert "oddity" not in METRICS
