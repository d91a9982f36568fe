"""Competition figures: what they draw is what the tables say."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attngeom.errors import ConfigError
from attngeom.figures.competition import (
    fig_nstar_vs_length,
    fig_support_recall_map,
    fig_support_vs_background,
)


def _nstar():
    rows = []
    for tau, scale in ((0.05, 1.0), (0.10, 0.5)):
        for length in (256, 512, 1024, 2048):
            n = scale * (2 + length / 32)
            rows.append({"model": "m", "corpus": "c", "length": length, "tau": tau,
                         "ranking": "attention", "mode": "deletion", "scoring": "tail",
                         "nstar": n, "nstar_low": n - 1, "nstar_high": n + 2})
    return pd.DataFrame(rows)


def test_nstar_vs_length_is_log_log_with_intervals() -> None:
    drawn = fig_nstar_vs_length(_nstar())
    assert drawn.ax.get_xscale() == "log" and drawn.ax.get_yscale() == "log"
    line = drawn.lines["attention/deletion, tau=0.05"]
    np.testing.assert_allclose(line.get_ydata(), [10, 18, 34, 66])
    assert set(drawn.lines) == {"attention/deletion, tau=0.05", "attention/deletion, tau=0.1"}
    with pytest.raises(ConfigError, match="expected rows"):
        fig_nstar_vs_length(_nstar(), scoring="all")


def test_support_vs_background_and_recall_map() -> None:
    summary = pd.DataFrame([
        {"model": "m", "background": b, "score": "attention", "statistic": "mass",
         "split": s, "mean": m, "ci_low": m - 0.01, "ci_high": m + 0.01, "n_examples": 10}
        for b, m in ((0, 0.3), (256, 0.2), (1024, 0.1)) for s in ("all", "correct")])
    drawn = fig_support_vs_background(summary, statistic="mass")
    np.testing.assert_allclose(drawn.lines["all"].get_xdata(), [0, 256, 1024])
    np.testing.assert_allclose(drawn.lines["correct"].get_ydata(), [0.3, 0.2, 0.1])
    per_head = pd.DataFrame([
        {"model": "m", "background": 0, "score": "attention", "statistic": "recall",
         "split": "all", "layer": layer, "head": head, "mean": (layer + head) / 4}
        for layer in range(3) for head in range(2)])
    drawn = fig_support_recall_map(per_head)
    grid = np.asarray(drawn.images[0].get_array())
    assert grid.shape == (3, 2) and grid[2, 1] == 0.75
