"""Small builders shared by the core accumulator tests."""

from __future__ import annotations

import numpy as np
import torch

from attngeom.core.batch import AttentionBatch, ValueStats


def causal(qpos: torch.Tensor, t: int) -> torch.Tensor:
    """(1, Q, T) causal visibility of the rows at positions ``qpos``."""
    return (torch.arange(t)[None, :] <= qpos[:, None])[None]


def batch_of(values, alpha, qpos, *, window=0, layer=0, visible=None, stats=None, tokens=None):
    """An AttentionBatch with causal visibility unless ``visible`` is given."""
    vis = causal(qpos, values.shape[1]) if visible is None else visible
    return AttentionBatch(window, layer, alpha, vis, qpos, stats or ValueStats(values),
                          tokens=tokens)


def assert_columns_equal(
    got: dict, ref: dict, rtol: float = 1e-12, atol: float = 0.0
) -> None:
    """Two column dicts hold the same table: same columns in the same order, floats to
    ``rtol`` / ``atol`` with NaN where NaN, everything else equal."""
    assert list(got) == list(ref)
    for k in ref:
        if np.asarray(ref[k]).dtype.kind == "f":
            np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert list(got[k]) == list(ref[k]), k
