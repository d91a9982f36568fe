"""Sink maps and taxonomy figures: the grids and bars drawn equal the tables."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import LogNorm, TwoSlopeNorm

from attngeom.figures.sink import fig_sink_cosine, fig_sink_norm_ratio, fig_sink_split
from attngeom.figures.taxonomy import (
    REGIME_CODES,
    fig_regime_map,
    fig_regime_shares,
    fig_source_fractions,
)


def _pivot(df, column):
    return df.groupby(["layer", "head"])[column].mean().unstack().to_numpy()


def test_norm_ratio_map(tables):
    sink = tables["sink"]
    d = fig_sink_norm_ratio(sink)
    (image,) = d.images
    np.testing.assert_allclose(np.asarray(image.get_array()), _pivot(sink, "norm_ratio"))
    assert isinstance(image.norm, LogNorm)
    assert d.colorbar is not None and "ratio" in d.colorbar.ax.get_ylabel()
    assert (d.ax.get_xlabel(), d.ax.get_ylabel()) == ("head", "layer")


def test_sink_cosine_map_is_centred(tables):
    sink = tables["sink"]
    for column in ("sink_cos_mean", "sink_cos_pairwise"):
        d = fig_sink_cosine(sink, column=column)
        np.testing.assert_allclose(d.data["grid"], _pivot(sink, column))
        norm = d.images[0].norm
        assert isinstance(norm, TwoSlopeNorm) and norm.vcenter == 0
        assert norm.vmin == pytest.approx(-np.abs(_pivot(sink, column)).max())


def test_sink_split_lines_skip_empty_columns(tables):
    sink = tables["sink"].copy()
    sink["f_nosink_sink_selected"] = np.nan  # e.g. the sink is never selected
    d = fig_sink_split(sink)
    assert set(d.lines) == {"f_full_sink_selected", "f_full_sink_unselected",
                            "f_nosink_sink_unselected"}
    exp = sink.groupby("n")["f_full_sink_selected"].mean()
    np.testing.assert_allclose(d.lines["f_full_sink_selected"].get_ydata(), exp.to_numpy())
    np.testing.assert_array_equal(d.lines["f_full_sink_selected"].get_xdata(), exp.index)
    assert "F" in d.ax.get_ylabel() and "N" in d.ax.get_xlabel()


def test_regime_map_codes_and_legend(tables):
    tax = tables["taxonomy"].copy()
    tax.loc[0, "regime"] = "none"
    d = fig_regime_map(tax)
    grid = d.data["grid"]
    for row in tax.itertuples():
        assert grid[row.layer, row.head] == REGIME_CODES[row.regime]
    np.testing.assert_array_equal(np.asarray(d.images[0].get_array()), grid)
    assert [t.get_text() for t in d.legend.get_texts()] == ["Retriever", "Mixer", "Reset",
                                                            "none", "stability < 0.8"]


def test_regime_map_marks_unstable_labels(tables):
    """A label kept in fewer than 80% of bootstrap resamples is drawn faded and hatched:
    exactly the heads with stability < 0.8, and nothing when every label is stable."""
    tax = tables["taxonomy"].copy()
    d = fig_regime_map(tax)
    assert d.data["unstable"] == [(1, 1)]
    hatched = [p for p in d.ax.patches if p.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_xy() == (0.5, 0.5)
    tax["stability"] = 1.0
    d = fig_regime_map(tax)
    assert d.data["unstable"] == [] and not [p for p in d.ax.patches if p.get_hatch()]
    assert "stability" not in " ".join(t.get_text() for t in d.legend.get_texts())


def test_regime_shares_sum_to_one(tables):
    tax = tables["taxonomy"]
    d = fig_regime_shares(tax)
    assert list(d.bars) == ["Retriever", "Mixer", "Reset"]
    heights = np.array([[p.get_height() for p in bars] for bars in d.bars.values()])
    np.testing.assert_allclose(heights.sum(axis=0), 1.0)
    exp = (tax[tax.layer == 0].regime == "Mixer").mean()
    assert d.bars["Mixer"][0].get_height() == pytest.approx(exp)
    assert d.ax.get_ylabel() == "share of heads" and d.ax.get_xlabel() == "layer"


def test_source_fractions_per_head(tables):
    tax = tables["taxonomy"].sort_values(["layer", "head"])
    d = fig_source_fractions(tax)
    assert list(d.bars) == ["f_self", "f_sink", "f_other"]
    assert all(len(b) == len(tax) for b in d.bars.values())
    np.testing.assert_allclose([p.get_height() for p in d.bars["f_sink"]], tax["f_sink"])
    # stacked: f_sink sits on top of f_self
    np.testing.assert_allclose([p.get_y() for p in d.bars["f_sink"]], tax["f_self"])
    assert [t.get_text() for t in d.ax.get_xticklabels()] == ["0", "1", "2", "3"]
