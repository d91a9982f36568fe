"""Window bootstrap and query-position modes."""

from __future__ import annotations

import numpy as np
import pytest

from attngeom.core.queries import query_positions
from attngeom.core.stats import bootstrap_mean_ci
from attngeom.errors import ConfigError


def test_bootstrap_is_reproducible_and_brackets_the_mean() -> None:
    rng = np.random.default_rng(0)
    vals = rng.normal(size=(5, 40))
    a = bootstrap_mean_ci(vals, n_boot=500, seed=3)
    b = bootstrap_mean_ci(vals, n_boot=500, seed=3)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    mean, lo, hi, n = a
    np.testing.assert_allclose(mean, vals.mean(1))
    assert (lo < mean).all() and (mean < hi).all()
    assert (n == 40).all()
    # the half-width is close to 1.96 standard errors for normal data
    se = vals.std(1, ddof=1) / np.sqrt(40)
    np.testing.assert_allclose((hi - lo) / 2, 1.96 * se, rtol=0.25)


def test_bootstrap_nan_windows_are_left_out() -> None:
    vals = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan]])
    mean, lo, hi, n = bootstrap_mean_ci(vals, n_boot=200, seed=0)
    assert mean[0] == 2.0 and list(n) == [2, 0]
    assert 1.0 <= lo[0] <= hi[0] <= 3.0
    assert np.isnan(mean[1]) and np.isnan(lo[1]) and np.isnan(hi[1])


def test_one_window_has_no_interval() -> None:
    """SPEC 2: with fewer than two windows the interval is undefined, never zero-width."""
    mean, lo, hi, n = bootstrap_mean_ci(np.array([[0.7], [np.nan]]), n_boot=100, seed=0)
    assert mean[0] == 0.7 and n.tolist() == [1, 0]
    assert np.isnan(lo).all() and np.isnan(hi).all()
    mean, lo, hi, n = bootstrap_mean_ci(np.array([[0.7, np.nan, np.nan]]), n_boot=100, seed=0)
    assert mean[0] == 0.7 and np.isnan(lo[0]) and np.isnan(hi[0])


def test_bootstrap_coverage() -> None:
    """About 95% of intervals contain the true mean (deterministic seeds, loose band)."""
    rng = np.random.default_rng(1)
    vals = rng.normal(loc=2.0, size=(300, 30))
    _, lo, hi, _ = bootstrap_mean_ci(vals, n_boot=400, seed=5)
    cover = ((lo <= 2.0) & (hi >= 2.0)).mean()
    assert 0.88 <= cover <= 0.99


def test_query_modes() -> None:
    assert query_positions("final", 10).tolist() == [9]
    assert query_positions("all", 5).tolist() == [1, 2, 3, 4]
    assert query_positions("all", 4, causal=False).tolist() == [0, 1, 2, 3]
    assert query_positions("stride:4", 10).tolist() == [1, 5, 9]
    assert query_positions("stride:1", 5).tolist() == query_positions("all", 5).tolist()


@pytest.mark.parametrize("mode", ["last", "stride:0", "stride:x", "stride:"])
def test_bad_query_mode(mode) -> None:
    with pytest.raises(ConfigError, match="query_mode"):
        query_positions(mode, 10)
