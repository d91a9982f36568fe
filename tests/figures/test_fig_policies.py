"""Policy figures (issue 39): what they draw is what the tables say."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attngeom.figures.policies import fig_policy_nstar, fig_study_policy_types, fig_study_qa_budget

NSTAR = {"attention": 8, "window": 40, "quest": 64}


def _nstar() -> pd.DataFrame:
    rows = []
    for ranking, n in NSTAR.items():
        for renorm, scale in ((False, 1), (True, 2)):
            for tau, k in ((0.05, 1), (0.1, 0.5)):
                value = n * scale * k
                rows.append({"model": "m", "corpus": "c", "scope": "model", "layer": -1,
                             "head": -1, "ranking": ranking, "renormalize": renorm,
                             "tau": tau, "n_star": value, "n_star_low": value - 1,
                             "n_star_high": value + 3})
    return pd.DataFrame(rows)


def test_policy_nstar_draws_each_ranking_beside_the_oracle_line() -> None:
    drawn = fig_policy_nstar(_nstar())  # deletion: the run has it
    data = drawn.data["tau=0.05"].set_index("ranking")
    assert list(data.index) == ["attention", "window", "quest"]  # the registry's order
    assert data["n_star"].tolist() == [8, 40, 64]
    assert drawn.lines["oracle tau=0.05"].get_ydata()[0] == 8
    assert drawn.lines["oracle tau=0.1"].get_ydata()[0] == 4
    offsets = drawn.markers["tau=0.1"].get_offsets()
    np.testing.assert_allclose(offsets[:, 1], [4, 20, 32])
    assert drawn.ax.get_yscale() == "log"
    renorm = fig_policy_nstar(_nstar(), renormalize=True)
    assert renorm.data["tau=0.05"]["n_star"].tolist() == [16, 80, 128]


def test_study_policy_types_and_qa_budget() -> None:
    types = pd.DataFrame([
        {"model": "m", "corpus": "c", "part": "policies", "ranking": r, "renormalize": False,
         "tau": 0.05, "n": 8, "head_type": t, "n_heads": 3,
         "mean_delta_nll_rel": math.nan if r == "quest" else v * (2 if r == "window" else 1),
         "max_delta_nll_rel": 1.0}
        for r in ("window", "attention", "quest")
        for t, v in (("all", 0.1), ("streaming", 0.02), ("sink", 0.3), ("untyped", 0.05))])
    drawn = fig_study_policy_types(types)
    grid = drawn.data["m / c / policies"]
    assert list(grid.index) == ["sink", "streaming", "untyped", "all"]  # registry order
    assert list(grid.columns) == ["attention", "window", "quest"]
    assert grid.loc["streaming", "window"] == 0.04 and grid["quest"].isna().all()
    budget = pd.DataFrame([
        {"model": "m", "corpus": "c", "background": b, "ranking": r, "mode": "deletion",
         "n": n, "accuracy": a + n / 1000 - b / 10000, "delta_loss": 0.1}
        for b in (0, 1024) for r, a in (("attention", 0.5), ("window", 0.1))
        for n in (16, 64, 256)])
    drawn = fig_study_qa_budget(budget)
    line = drawn.lines["m / c / window bg=1024"]
    np.testing.assert_allclose(line.get_xdata(), [16, 64, 256])
    np.testing.assert_allclose(line.get_ydata(), [0.1 + n / 1000 - 0.1024 for n in
                                                  (16, 64, 256)])
    assert len(drawn.lines) == 4
