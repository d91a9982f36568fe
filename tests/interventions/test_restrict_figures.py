"""The restriction figures: every ranking's curve, the localised layer bars and head map."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attngeom.errors import ConfigError
from attngeom.figures.interventions import (
    fig_restrict,
    fig_restrict_heads,
    fig_restrict_layers,
)


def _local() -> pd.DataFrame:
    rows = []
    for flag in (False, True):
        for layer in range(4):
            rows.append(("layer", layer, -1, "attention", flag, 8, 1.0, 0.1 * layer,
                         0.1 * layer + flag, 0))
        for layer in (3, 2):
            for head in range(3):
                rows.append(("head", layer, head, "attention", flag, 8, 1.0, 0.01 * head,
                             0.01 * head + layer, 0))
    frame = pd.DataFrame(rows, columns=["scope", "layer", "head", "ranking", "renormalize", "n",
                                        "nll", "delta_nll_rel", "mean_doc_delta_rel", "rank"])
    frame.insert(0, "corpus", "c")
    frame.insert(0, "model", "m")
    return frame


def test_layer_bars_and_head_map_draw_the_scores():
    local = _local()
    bars = fig_restrict_layers(local)
    np.testing.assert_allclose(bars.data["layers"]["mean_doc_delta_rel"], [0, 0.1, 0.2, 0.3])
    assert len(bars.bars["layers"]) == 4
    heads = fig_restrict_heads(local, renormalize=True)
    grid = heads.data["grid"]
    assert grid.shape == (4, 3)
    assert np.isnan(grid[:2]).all() and grid[3, 2] == pytest.approx(3.02)
    with pytest.raises(ConfigError, match="head-scope rows"):
        fig_restrict_heads(local[local["scope"] == "layer"])


def test_restrict_curve_per_ranking():
    rows = []
    for ranking in ("attention", "random"):
        for flag in (False, True):
            for n in (1, 2, 3, 4, 8):
                rows.append(("m", "c", "model", -1, -1, n, flag, 1.0, 2.7, 1.0 / n, ranking,
                             n != 3, ""))
    restrict = pd.DataFrame(rows, columns=["model", "corpus", "scope", "layer", "head", "n",
                                           "renormalize", "nll", "perplexity",
                                           "delta_nll_rel", "ranking", "on_grid", "passes"])
    drawn = fig_restrict(restrict)
    assert set(drawn.lines) == {"renormalised", "not renormalised", "random, renormalised",
                                "random, not renormalised"}
    assert drawn.data["renormalised"]["n"].tolist() == [1, 2, 3, 4, 8]
