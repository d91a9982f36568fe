"""Both universes in one pass (``topn_metrics_variants``) against one pass per universe.

The sink-excluded universe is read off the full one's counts for rows whose first
N_max keys miss the sink, and computed anew (packed per kv head) for the others; the
metrics must equal, bit for bit, what ``topn_metrics_rules`` gives each universe alone:
with the sink among the first keys of some rows and not others, a sink that is the
nearest unselected key (the second largest score takes over), ties, a non-finite sink
(which skips a full row but not its sink-excluded one), both distances, both paths and
compiled kernels. The redone rows' products ``V s_N`` come from a call with fewer rows
than a pass of their own, and a matrix product may round by row count (torch's
small-matrix loop, BLAS kernels for very few rows), so on the direct path the margin is
compared within rounding; every count exactly.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.core import kernels
from attngeom.core.geometry import (
    causal_visibility,
    topn_metrics_rules,
    topn_metrics_variants,
)
from attngeom.core.metrics import metric
from attngeom.errors import ConfigError
from attngeom.names import METRICS

RULES = ("attention", "contribution", "random")
FIELDS = (*METRICS, "valid", "top", "sink_selected", "nonfinite", "universe")


def _window(seed: int, h: int, g: int, q: int, t: int, d: int, *, sink: float,
            ties: bool, bad: str | None):
    gen = torch.Generator().manual_seed(seed)
    positions = torch.arange(t - q, t)
    vis = causal_visibility(positions, t)
    logits = torch.randn(h, q, t, generator=gen)
    # a sink on some rows only: there its first keys hold key 0, elsewhere they miss it
    logits[..., 0] += sink * (torch.rand(h, q, generator=gen) < 0.5)
    if ties:
        logits = (logits * 2).round() / 2
    alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
    values = torch.randn(g, t, d, generator=gen)
    if ties:
        values = (values * 2).round() / 2
        values[:, 0] = values[:, 1]  # the sink ties a key's value state
    if bad == "sink_alpha":
        alpha[0, 0, 0] = float("nan")  # skips that full row only
    elif bad == "sink_value":
        values[0, 0, 0] = float("inf")  # every full row of kv head 0
    elif bad == "other":
        alpha[-1, -1, 1] = float("inf")  # skips the row in both universes
    return alpha, values, positions, vis


def _assert_same(both, alone, where, *, exact_margin=True):
    for rule in alone:
        for name in FIELDS:
            got, want = getattr(both[rule], name), getattr(alone[rule], name)
            if got.dtype.is_floating_point:
                got, want = got.nan_to_num(-7.0), want.nan_to_num(-7.0)
            if name in METRICS and not metric(name).exact and not exact_margin:
                # rho_max of a lone selected key is the square root of a rounding residue
                # (D = 0 exactly), so the last bit of a product moves it by ~1e-8
                assert torch.allclose(got, want, rtol=1e-9, atol=1e-7), (*where, rule)
            else:
                assert torch.equal(got, want), (*where, rule, name)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), g=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]),
       q=st.integers(1, 6), t=st.integers(2, 48),
       grid=st.sampled_from([(1,), (1, 2, 4, 8), (2, 5, 40)]),
       sink=st.sampled_from([0.0, 3.0, 8.0]), ties=st.booleans(),
       bad=st.sampled_from([None, None, "sink_alpha", "sink_value", "other"]),
       distance=st.sampled_from(["euclidean", "cosine"]),
       path=st.sampled_from(["direct", "gram"]),
       budget=st.sampled_from([None, 1, 20_000]))
def test_both_universes_equal_one_pass_each(seed, g, group, q, t, grid, sink, ties, bad,
                                            distance, path, budget):
    """Also with the folded rows cut into pieces (a byte budget of one row, or a few),
    the rows redone gathered from every piece into packs of their own."""
    q = min(q, t)
    alpha, values, positions, vis = _window(seed, g * group, g, q, t, 4, sink=sink,
                                            ties=ties, bad=bad)
    kw = dict(rules=RULES, distance=distance, visible=vis, query_positions=positions,
              repeats=3, seed=seed, path=path)
    with kernels.temporaries(budget):
        both = topn_metrics_variants(alpha, values, grid, **kw)
    assert list(both) == ["full", "no_sink"]
    for variant in ("full", "no_sink"):
        alone = topn_metrics_rules(alpha, values, grid, exclude_sink=variant == "no_sink",
                                   **kw)
        # the redone rows' V s_N products come from a call with fewer rows than a pass
        # of their own; on tiny shapes torch's own small-matrix loop and BLAS round
        # the last bit apart (counts agree, the margin within rounding)
        _assert_same(both[variant], alone, (variant,), exact_margin=path == "gram")


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_both_universes_compiled_equal_one_pass_each(distance):
    """The compiled counting (key 0 dropped inside the fused loops) gives the same
    counts as one plain pass per universe, on a window large enough for the packed
    rows to be a minority of each kv head's (the margin within rounding, as above)."""
    alpha, values, positions, vis = _window(5, 8, 2, 3, 200, 16, sink=4.0, ties=False,
                                            bad="sink_alpha")
    kw = dict(rules=RULES, distance=distance, visible=vis, query_positions=positions,
              repeats=8, seed=1)
    alone = {v: topn_metrics_rules(alpha, values, (1, 2, 4, 8, 16, 32),
                                   exclude_sink=v == "no_sink", **kw)
             for v in ("full", "no_sink")}
    with kernels.compiling(True):
        both = topn_metrics_variants(alpha, values, (1, 2, 4, 8, 16, 32), **kw)
    assert not kernels._STATE["broken"]
    for variant in alone:
        _assert_same(both[variant], alone[variant], (variant,), exact_margin=False)


def test_a_nearest_sink_hands_cmax_to_the_next_key():
    """A row whose sink is the closest unselected key: without it the largest unselected
    score is another key's, and the margin, Recall and Precision follow that key."""
    t = 12
    positions = torch.tensor([t - 1])
    vis = causal_visibility(positions, t)
    values = torch.zeros(1, t, 2)
    values[0, :, 0] = 1.0
    values[0, 0] = torch.tensor([1.2, 0.0])  # the sink reaches furthest toward s_N
    logits = torch.zeros(1, 1, t)
    logits[0, 0, 1:4] = 3.0  # keys 1..3 on top, the sink among the rest
    alpha = torch.softmax(logits, -1)
    kw = dict(rules=("attention",), visible=vis, query_positions=positions)
    both = topn_metrics_variants(alpha, values, (3,), **kw)
    alone = topn_metrics_rules(alpha, values, (3,), exclude_sink=True, **kw)
    _assert_same(both["no_sink"], alone, ("no_sink",))
    assert not torch.equal(both["full"]["attention"].margin, alone["attention"].margin)


def test_variants_are_checked():
    alpha, values, positions, vis = _window(0, 2, 1, 1, 8, 2, sink=0.0, ties=False, bad=None)
    for bad in ((), ("full", "full"), ("sinkless",)):
        with pytest.raises(ConfigError, match="variants"):
            topn_metrics_variants(alpha, values, (1, 2), variants=bad, visible=vis,
                                  query_positions=positions)
    one = topn_metrics_variants(alpha, values, (1, 2), variants=("no_sink",), visible=vis,
                                query_positions=positions)
    assert list(one) == ["no_sink"]


def test_compiled_kernels_stay_on_across_prefixes_pieces_and_redone_rows(monkeypatch):
    """A layer of every query position, one row per chunk (as a long window's budget
    cuts them), both distances and both universes with a sink on half the rows: the
    counting kernels see many key prefixes (each a stretch of the N grid), views and
    fresh tensors, and the redone rows' packs. Their graphs must stay within the
    compile limit, or compilation would switch off for the rest of the process."""
    from attngeom.core.accumulators import TopNAccumulator, TopNConfig
    from attngeom.core.batch import AttentionBatch, ValueStats

    monkeypatch.setitem(kernels._STATE, "broken", False)
    h, g, t = 4, 2, 40
    gen = torch.Generator().manual_seed(0)
    positions = torch.arange(1, t)
    vis = causal_visibility(positions, t)
    logits = torch.randn(h, positions.numel(), t, generator=gen)
    logits[..., 0] += 4.0 * (torch.rand(h, positions.numel(), generator=gen) < 0.5)
    alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
    values = torch.randn(g, t, 8, generator=gen)
    cfg = TopNConfig(n_grid=(1, 2, 4, 8, 16, 32), distances=("euclidean", "cosine"),
                     repeats=2, bounds=False)
    tables = []
    for compiled in (False, True):
        acc = TopNAccumulator(cfg)
        with kernels.compiling(compiled), kernels.temporaries(200_000):
            acc.update(AttentionBatch(0, 0, alpha, vis, positions, ValueStats(values)))
        tables.append(acc.compute()["metrics"])
    assert not kernels._STATE["broken"]
    for name, column in tables[0].items():
        if column.dtype.kind == "f":
            assert ((column == tables[1][name]) | (column != column)).all(), name
        else:
            assert (column == tables[1][name]).all(), name
