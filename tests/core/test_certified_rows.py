"""The candidate-and-certificate path (SPEC 8) gives exactly the full rows' metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attngeom.core.geometry import METRICS, causal_visibility, topn_metrics
from tests.reference_geometry import assert_matches_reference, reference_topn


def _inputs(seed: int, h: int, g: int, t: int, d: int, *, dyadic: bool, peaked: float):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.arange(1, t)
    vis = causal_visibility(rows, t)
    if dyadic:  # exact arithmetic, many ties and zero vectors
        values = torch.randint(-2, 3, (g, t, d), generator=gen).float()
        alpha = torch.randint(0, 5, (h, t - 1, t), generator=gen).float() / 64
        alpha = alpha.masked_fill(~vis, 0.0)
    else:
        values = torch.randn(g, t, d, generator=gen)
        logits = peaked * torch.randn(h, t - 1, t, generator=gen)
        alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
    return alpha, values, rows, vis


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("extra", [0, 1, 3, 8])
@pytest.mark.parametrize("rule", ["attention", "contribution", "random"])
def test_certified_equals_full_rows(seed: int, extra: int, rule: str) -> None:
    alpha, values, rows, vis = _inputs(seed, 4, 2, 40, 3, dyadic=seed % 2 == 0,
                                       peaked=1.0 + seed)
    kw = dict(rule=rule, visible=vis, query_positions=rows, repeats=2, seed=seed)
    for exclude in (False, True):
        fast = topn_metrics(alpha, values, (1, 2, 3, 8), exclude_sink=exclude,
                            candidates=extra, **kw)
        full = topn_metrics(alpha, values, (1, 2, 3, 8), exclude_sink=exclude,
                            candidates=-1, **kw)
        for name in (*METRICS, "valid", "sink_selected"):
            a, b = getattr(fast, name).numpy(), getattr(full, name).numpy()
            if a.dtype.kind == "f":
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True,
                                           err_msg=name)
            else:
                assert (a == b).all(), name


@pytest.mark.parametrize("seed", range(8))
def test_certified_rows_match_the_exact_reference(seed: int) -> None:
    """Dyadic inputs, so the reference's exact Fractions and the fast float64 agree."""
    alpha, values, rows, vis = _inputs(seed, 2, 1, 9, 2, dyadic=True, peaked=1.0)
    grid = (1, 2, 3)
    for rule in ("attention", "random"):
        kw = dict(rule=rule, visible=vis, query_positions=rows, repeats=2, seed=seed,
                  window=0, layer=0, exclude_sink=False)
        fast = topn_metrics(alpha, values, grid, candidates=1, **kw)
        ref = reference_topn(alpha, values, grid, distance="euclidean", **kw)
        assert_matches_reference(fast, ref)
