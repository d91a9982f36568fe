"""Contracts every SPEC 3-5 accumulator keeps: a row with a non-finite alpha counts nowhere."""

from __future__ import annotations

import math

import pytest
import torch

from attngeom.core.assumptions import AssumptionsAccumulator
from attngeom.core.bounds import BoundsAccumulator
from attngeom.core.sink import SinkAccumulator
from attngeom.core.taxonomy import TaxonomyAccumulator
from tests.core.batches import assert_columns_equal, batch_of, causal

FACTORIES = {
    "sink": lambda: SinkAccumulator([1, 2]),
    "taxonomy": TaxonomyAccumulator,
    "bounds": lambda: BoundsAccumulator([1, 2]),
    "assumptions": AssumptionsAccumulator,
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_rows_with_non_finite_alpha_are_skipped(name: str) -> None:
    """The table with a NaN row equals the table of the run without that row."""
    gen = torch.Generator().manual_seed(21)
    t = 7
    v = torch.randn(2, t, 3, generator=gen)
    qpos = torch.arange(1, t)
    vis = causal(qpos, t)
    logits = torch.randn(4, t - 1, t, generator=gen).masked_fill(~vis, -math.inf)
    alpha = torch.softmax(logits, -1)
    bad = alpha.clone()
    bad[:, 2, 1] = float("nan")
    keep = torch.tensor([0, 1, 3, 4, 5])
    acc_bad, acc_ref = FACTORIES[name](), FACTORIES[name]()
    acc_bad.update(batch_of(v, bad, qpos))
    acc_ref.update(batch_of(v, alpha[:, keep], qpos[keep]))
    assert_columns_equal(acc_bad.compute(), acc_ref.compute())
