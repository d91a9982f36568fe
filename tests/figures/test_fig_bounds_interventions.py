"""Bounds and intervention figures: measured vs bounds, pruning, head scan, restriction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import SymLogNorm

from attngeom.errors import ConfigError
from attngeom.figures.bounds import fig_bounds
from attngeom.figures.interventions import fig_head_scan, fig_pruning, fig_restrict


def test_bounds_lines_and_values(tables):
    bounds, metrics = tables["bounds"], tables["metrics"]
    d = fig_bounds(bounds, metrics, metric="precision")
    assert list(d.lines) == ["measured", "envelope", "certified", "inversion"]
    np.testing.assert_allclose(d.lines["measured"].get_ydata(),
                               bounds.groupby("n")["precision_measured"].mean())
    np.testing.assert_allclose(d.lines["envelope"].get_ydata(),
                               bounds.groupby("n")["precision_envelope"].mean())
    sub = metrics[(metrics.rule == "attention") & (metrics.variant == "full")]
    np.testing.assert_allclose(d.lines["certified"].get_ydata(),
                               sub.groupby("n")["precision_bound"].mean())
    assert "measured" in d.bands
    assert d.markers["largest_certified_n"].get_xdata()[0] == 4
    assert "P" in d.ax.get_ylabel()


def test_bounds_f_inversion_is_harmonic_mean(tables):
    bounds, metrics = tables["bounds"], tables["metrics"]
    d = fig_bounds(bounds, metrics, metric="f_score")
    sub = metrics[(metrics.rule == "attention") & (metrics.variant == "full")]
    p, r = sub["precision_inv_bound"], sub["recall_inv_bound"]
    exp = (2 * p * r / (p + r)).groupby(sub["n"]).mean()
    np.testing.assert_allclose(d.lines["inversion"].get_ydata(), exp.to_numpy())


def test_bounds_without_metrics_and_bad_metric(tables):
    d = fig_bounds(tables["bounds"], metric="recall", layer=1)
    assert list(d.lines) == ["measured", "envelope"]
    sub = tables["bounds"][tables["bounds"].layer == 1]
    np.testing.assert_allclose(d.lines["measured"].get_ydata(),
                               sub.groupby("n")["recall_measured"].mean())
    with pytest.raises(ConfigError, match="expected metric"):
        fig_bounds(tables["bounds"], metric="margin")


def test_pruning_lines_seed_band_and_axes(tables):
    pruning = tables["pruning"]
    d = fig_pruning(pruning)
    assert list(d.lines) == ["taxonomy", "magnitude", "entropy", "random"]
    assert list(d.bands) == ["random"]  # only the seeded ranker has a spread
    rnd = pruning[pruning.ranker == "random"].groupby("keep_fraction")["perplexity"]
    np.testing.assert_allclose(d.lines["random"].get_ydata(), rnd.mean())
    band = d.bands["random"].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(rnd.min().min())
    assert band.max() == pytest.approx(rnd.max().max())
    assert d.ax.get_yscale() == "log" and d.ax.xaxis_inverted()
    assert d.ax.get_xlabel() == "fraction of heads kept"
    assert "perplexity" in d.ax.get_ylabel()


def test_pruning_several_orders_get_their_own_lines(tables):
    p = tables["pruning"]
    tax = p[p.ranker == "taxonomy"]
    other = tax.assign(order="Reset,Mixer,Retriever", perplexity=tax.perplexity * 2)
    d = fig_pruning(pd.concat([p, other]))
    assert "taxonomy [Mixer,Reset,Retriever]" in d.lines
    np.testing.assert_allclose(d.lines["taxonomy [Reset,Mixer,Retriever]"].get_ydata(),
                               other.sort_values("keep_fraction").perplexity)


def test_head_scan_map_and_critical_marks(tables):
    scan = tables["head_scan"]
    d = fig_head_scan(scan)
    grid = scan.pivot(index="layer", columns="head", values="delta_nll_rel").to_numpy()
    np.testing.assert_allclose(d.data["grid"], grid)
    assert isinstance(d.images[0].norm, SymLogNorm)
    np.testing.assert_array_equal(d.markers["critical"].get_offsets(), [[2, 0]])  # (head, layer)
    assert "NLL" in d.colorbar.ax.get_ylabel()


def test_restrict_lines_and_nstar(tables):
    r, ns = tables["restrict"], tables["restrict_nstar"]
    d = fig_restrict(r, ns)
    assert set(d.lines) == {"renormalised", "not renormalised"}
    exp = r[r.renormalize].sort_values("n")
    np.testing.assert_allclose(d.lines["renormalised"].get_ydata(), exp.delta_nll_rel)
    np.testing.assert_array_equal(d.lines["renormalised"].get_xdata(), exp.n)
    offsets = d.markers["n_star renormalised"].get_offsets()
    np.testing.assert_array_equal(offsets, [[16, 0.05], [8, 0.1]])  # (n_star, tau)
    assert "NLL" in d.ax.get_ylabel() and "N" in d.ax.get_xlabel()


def test_restrict_layer_scope_only(tables):
    r = tables["restrict"]
    layer_rows = pd.concat(
        [r.assign(scope="layer", layer=l, delta_nll_rel=r.delta_nll_rel * (l + 1))
         for l in range(2)])
    d = fig_restrict(layer_rows)
    key = "renormalised (mean over layers)"
    exp = layer_rows[layer_rows.renormalize].groupby("n").delta_nll_rel.mean()
    np.testing.assert_allclose(d.lines[key].get_ydata(), exp)
