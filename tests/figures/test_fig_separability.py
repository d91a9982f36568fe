"""Top-N curves: one line and one band per rule, values straight from summary.parquet."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attngeom.errors import ConfigError
from attngeom.figures.separability import (
    fig_sink_variant,
    fig_topn_by_layer,
    fig_topn_curves,
    summary_from_metrics,
)


def _expected(summary, **eq):
    rows = summary
    for k, v in eq.items():
        rows = rows[rows[k] == v]
    return rows.sort_values("n")


def test_model_scope_lines_bands_and_labels(tables):
    s = tables["summary"]
    d = fig_topn_curves(s, metric="f_score")
    assert list(d.lines) == ["attention", "contribution", "random"]
    assert set(d.bands) == set(d.lines)
    for rule, line in d.lines.items():
        exp = _expected(s, scope="model", metric="f_score", rule=rule, variant="full")
        np.testing.assert_array_equal(line.get_xdata(), exp["n"].to_numpy(float))
        np.testing.assert_allclose(line.get_ydata(), exp["mean"].to_numpy())
        band = d.bands[rule].get_paths()[0].vertices
        assert band[:, 1].min() == pytest.approx(exp["ci_low"].min())
        assert band[:, 1].max() == pytest.approx(exp["ci_high"].max())
    assert "N" in d.ax.get_xlabel() and "tokens" in d.ax.get_xlabel()
    assert "F" in d.ax.get_ylabel()
    assert d.ax.get_xscale() == "log"  # the grid 1..16 spans 16x
    assert [t.get_text() for t in d.legend.get_texts()][0] == "attention top-N"


def test_trivial_points_are_drawn_hollow(tables):
    d = fig_topn_curves(tables["summary"], metric="recall", rules=["attention"])
    (scatter,) = d.markers["trivial"]
    np.testing.assert_array_equal(scatter.get_offsets()[:, 0], [1.0])
    np.testing.assert_allclose(scatter.get_facecolors()[0][:3], [1, 1, 1])
    # the filled markers on the line skip the trivial N = 1
    assert 0 not in d.lines["attention"].get_markevery()


def test_layer_scope_reads_layer_rows(tables):
    s = tables["summary"]
    d = fig_topn_curves(s, metric="precision", layer=2, rules=["random"], legend=False)
    exp = _expected(s, scope="layer", layer=2, metric="precision", rule="random",
                    variant="full")
    np.testing.assert_allclose(d.lines["random"].get_ydata(), exp["mean"].to_numpy())
    assert d.legend is None and d.ax.get_legend() is None


def test_head_scope_and_missing_rows(tables):
    s = tables["summary"]
    d = fig_topn_curves(s, layer=1, head=3)
    exp = _expected(s, scope="head", layer=1, head=3, metric="f_score", rule="attention",
                    variant="full")
    np.testing.assert_allclose(d.lines["attention"].get_ydata(), exp["mean"].to_numpy())
    with pytest.raises(ConfigError, match="summary"):
        fig_topn_curves(s, distance="cosine")


def test_two_models_need_a_choice(tables):
    s = tables["summary"]
    both = pd.concat([s, s.assign(model="other")], ignore_index=True)
    with pytest.raises(ConfigError, match="expected one model"):
        fig_topn_curves(both)
    d = fig_topn_curves(both, model="other")
    assert len(d.lines) == 3


def test_by_layer_values(tables):
    s = tables["summary"]
    d = fig_topn_by_layer(s, n=4, metric="recall")
    exp = s[(s.scope == "layer") & (s.n == 4) & (s.metric == "recall") & (s.rule == "attention")
            & (s.variant == "full")].sort_values("layer")
    np.testing.assert_array_equal(d.lines["attention"].get_xdata(), [0, 1, 2, 3])
    np.testing.assert_allclose(d.lines["attention"].get_ydata(), exp["mean"].to_numpy())
    assert set(d.bands) == {"attention", "contribution", "random"}
    assert d.ax.get_xlabel() == "layer" and "N=4" in d.ax.get_ylabel()


def test_sink_variant_lines(tables):
    s = tables["summary"]
    d = fig_sink_variant(s)
    assert set(d.lines) == {"full", "no_sink"}
    for variant, line in d.lines.items():
        exp = _expected(s, scope="model", metric="f_score", rule="attention", variant=variant)
        np.testing.assert_allclose(line.get_ydata(), exp["mean"].to_numpy())
    assert d.lines["no_sink"].get_ydata()[1] > d.lines["full"].get_ydata()[1]


def test_summary_from_metrics_means_without_intervals(tables):
    m = tables["metrics"]
    s = summary_from_metrics(m)
    row = s[(s.scope == "model") & (s.rule == "attention") & (s.variant == "full")
            & (s.n == 4) & (s.metric == "f_score")]
    sub = m[(m.rule == "attention") & (m.variant == "full") & (m.n == 4)]
    assert row["mean"].item() == pytest.approx(sub.groupby("window")["f_score"].mean().mean())
    assert row["ci_low"].isna().all()
    d = fig_topn_curves(s)
    assert d.bands == {} and len(d.lines) == 3
