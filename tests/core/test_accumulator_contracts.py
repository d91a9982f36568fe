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
    got, ref = acc_bad.compute(), acc_ref.compute()
    assert list(got) == list(ref)
    for table in ref:
        assert_columns_equal(got[table], ref[table])


def _batches(seed: int, windows: int):
    gen = torch.Generator().manual_seed(seed)
    t = 20
    out = []
    for w in range(windows):
        v = torch.randn(2, t, 3, generator=gen)
        qpos = torch.arange(1, t)
        vis = causal(qpos, t)
        alpha = torch.softmax(torch.randn(4, t - 1, t, generator=gen).masked_fill(~vis, -math.inf),
                              -1)
        out.append(batch_of(v, alpha, qpos, window=w, tokens=torch.randint(0, 9, (t,),
                                                                          generator=gen)))
    return out


def test_every_registered_analysis_follows_the_protocol() -> None:
    """Each analysis of the registry: its accumulator computes exactly the tables it
    declares, merge returns the accumulator, and two shards merged equal one run."""
    from attngeom.config import AnalysisConfig
    from attngeom.engine.analyses import AnalysisContext
    from attngeom.names import ANALYSES as REGISTRY
    cfg = AnalysisConfig(model="m", corpus="c", n_grid=(1, 2, 4), query_mode="all",
                         bootstrap=20)
    batches = _batches(3, 4)
    for name, spec in REGISTRY.items():
        whole = spec.make(cfg, AnalysisContext())
        whole.update_many(batches)
        shards = [spec.make(cfg, AnalysisContext()) for _ in range(2)]
        for b in batches:
            shards[b.window % 2].update(b)
        merged = shards[0].merge(shards[1])
        assert merged is shards[0], name
        ref, got = whole.compute(), merged.compute()
        assert set(ref) == set(type(whole).tables) == set(spec.tables) - {"summary"} | set(
            spec.internal), name
        for table in ref:
            # sums added in another order differ in the last bits; the decay fit's lambda
            # (a 1-D search) moves within its resolution
            assert_columns_equal(got[table], ref[table], rtol=1e-7, atol=1e-12)
