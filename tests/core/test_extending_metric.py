"""docs/extending.md, "A new per-query metric", done as the recipe says: a toy metric
registered at test time (and taken out after) is checked against a loop reference,
on the plain and the compiled kernels, and comes out of ``attngeom.analyze`` in
``metrics.parquet`` and ``summary.parquet``.

The toy metric, "exclusion", is the share of the unselected keys that lie farther from
the aggregate than every selected key: 1 - #{j not in I : D[j] <= rho_max} / |U \\ I|.
It is a per-key metric on purpose (its count goes through the kernels; it equals
1 - intruders / (|U| - N), which the test also checks), so the fused and compiled
counting are exercised with a count they were never written for.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from attngeom.core import kernels
from attngeom.core.geometry import topn_metrics, topn_metrics_variants
from attngeom.core.metrics import KeyScores, Metric, RowCounts, register_metric, unregister_metric
from attngeom.names import METRICS
from tests import reference_geometry as ref


def exclusion_count(keys: KeyScores) -> torch.Tensor:
    """#{j not in I : D[j] <= rho_max}: unselected keys at least as close as the
    farthest selected one (closeness >= cmin); -inf off the unselected keys fails."""
    return (keys.unselected >= keys.cmin[..., None]).sum(-1)


def exclusion(c: RowCounts) -> torch.Tensor:
    outside = c.size - c.n  # |U \ I|, >= 1 wherever N is valid
    return 1 - c.counts["exclusion"].to(c.dtype) / outside.clamp_min(1)


def exclusion_reference(r: ref.RowFacts) -> Fraction:
    rho_max = max(r.dist[i] for i in r.selected)
    return 1 - Fraction(sum(1 for j in r.rest if r.dist[j] <= rho_max), len(r.rest))


@pytest.fixture
def toy_metric():
    register_metric(Metric("exclusion", exclusion, count=exclusion_count, tolerance=1e-12,
                           doc="share of the unselected keys farther than every selected one"))
    ref.REFERENCE["exclusion"] = exclusion_reference
    try:
        yield
    finally:
        unregister_metric("exclusion")
        ref.REFERENCE.pop("exclusion", None)


def _case(seed: int, h=2, g=1, q=3, t=14, d=3, *, dyadic: bool):
    """Euclidean cases are dyadic (alphas k/64, small integer values: every product
    exact, so ties fall as the reference's exact fractions decide); cosine ones
    continuous (no ties)."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(t - q, t)
    if dyadic:
        k = torch.randint(0, 9, (h, q, t), generator=gen).double()
        k = k * (torch.arange(t)[None, :] <= pos[:, None])[None]
        k[..., 0] += 20  # a sink
        alpha = k / 64
        values = torch.randint(-3, 4, (g, t, d), generator=gen).double()
    else:
        vis = torch.arange(t)[None, :] <= pos[:, None]
        alpha = torch.softmax((torch.randn(h, q, t, generator=gen) * 2).masked_fill(
            ~vis, float("-inf")), -1)
        values = torch.randn(g, t, d, generator=gen)
    return alpha, values, pos


def test_a_registered_metric_joins_the_names_and_leaves_again(toy_metric):
    assert METRICS.names()[-1] == "exclusion"
    alpha, values, pos = _case(0, dyadic=True)
    res = topn_metrics(alpha, values, (1, 4), query_positions=pos)
    assert res.stacked.shape[0] == len(METRICS) and res.exclusion.shape == res.precision.shape
    unregister_metric("exclusion")
    assert "exclusion" not in METRICS
    register_metric(Metric("exclusion", exclusion, count=exclusion_count, tolerance=1e-12))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_toy_metric_matches_its_loop_reference(toy_metric, distance, compiled):
    """Every rule, both universes (the sink-excluded one read off the full pass), both
    ``<v_u, s_N>`` paths; the plain and the fused, compiled counting."""
    grid = (1, 2, 5, 30)
    for seed, path in ((0, "direct"), (1, "gram")):
        alpha, values, pos = _case(seed, dyadic=distance == "euclidean")
        with kernels.compiling(compiled):
            both = topn_metrics_variants(
                alpha, values, grid, rules=("attention", "contribution", "random"),
                distance=distance, query_positions=pos, repeats=2, seed=seed, path=path)
        for variant, by_rule in both.items():
            for rule, fast in by_rule.items():
                want = ref.reference_topn(alpha, values, grid, rule=rule,
                                          distance=distance, query_positions=pos,
                                          exclude_sink=variant == "no_sink", repeats=2,
                                          seed=seed)
                ref.assert_matches_reference(fast, want)
                # the per-key count is the intruders' count seen another way
                p = fast.precision.numpy()
                n = np.asarray(grid, dtype=np.float64)
                size = fast.universe.sum(-1).numpy()[None, ..., None]
                intruders = n / p - n
                np.testing.assert_allclose(fast.exclusion.numpy(),
                                           1 - intruders / (size - n), atol=1e-12)
    assert not kernels._STATE["broken"]


def test_a_metric_without_reference_fails_the_reference(toy_metric):
    """The reference is data-driven: a registered metric with no definition there makes
    every reference comparison fail, rather than be skipped."""
    ref.REFERENCE.pop("exclusion")
    alpha, values, pos = _case(1, dyadic=True)
    with pytest.raises(ref.MissingReference, match="exclusion"):
        ref.reference_topn(alpha, values, (1, 2), query_positions=pos)


def test_toy_metric_comes_out_of_analyze(toy_metric, tmp_path):
    """End to end on a tiny random Llama: the metric is a column of ``metrics.parquet``
    (per window, layer, head, rule, variant, distance and N) and a ``metric`` of
    ``summary.parquet``."""
    import pandas as pd

    import attngeom
    from tests.architectures import make_model
    from tests.engine.test_boundaries import WORDS, word_tokenizer

    gen = np.random.default_rng(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(gen.choice(WORDS[:-3], 40)) for _ in range(6)))
    tok = word_tokenizer(bos="<s>", eos="</s>")
    run = attngeom.analyze("tiny-llama", str(corpus), tmp_path / "run",
                           model_and_tokenizer=(make_model("llama", seed=2), tok),
                           window_length=12, n_windows=2, query_mode="all", n_grid=(1, 2, 4),
                           repeats=2, analyses=("metrics",), bootstrap=10, progress=False,
                           device="cpu", distances=("euclidean", "cosine"))
    metrics = pd.read_parquet(tmp_path / "run" / "metrics.parquet")
    summary = pd.read_parquet(tmp_path / "run" / "summary.parquet")
    assert "exclusion" in metrics.columns
    ok = metrics["n_queries"] > 0
    values = metrics.loc[ok, "exclusion"]
    assert values.notna().all() and values.between(0, 1).all()
    assert (metrics.loc[~ok, "exclusion"].isna()).all()
    assert set(summary["metric"]) >= {"precision", "exclusion"}
    assert run is not None
