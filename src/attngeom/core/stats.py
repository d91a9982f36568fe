"""Window-level bootstrap confidence intervals (method §5).

Windows are the independent units: per-window means are resampled with
replacement, and every group (layer, head, rule, N, ...) of one run is resampled
with the same window indices, which keeps groups comparable and makes the whole
bootstrap one matrix product. NaN entries (a window where a group had no valid
query) are left out of that group's resample mean.
"""

from __future__ import annotations

import numpy as np


def bootstrap_indices(n_windows: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n_windows) resample indices, reproducible from the seed."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0xB007]))
    return rng.integers(0, n_windows, size=(n_boot, n_windows))


def bootstrap_mean_ci(
    values: np.ndarray, *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and percentile interval over windows for each row of ``values``.

    ``values`` is (groups, windows) with NaN where a window has no value. Returns
    (mean, ci_low, ci_high, n_windows), each of shape (groups,). A group seen in fewer
    than two windows has no interval (NaN, never a zero-width one: one window says
    nothing about the spread over windows); with none the mean is NaN too.

    >>> m, lo, hi, n = bootstrap_mean_ci(np.array([[1.0, 1.0, 1.0], [2.0, np.nan, np.nan]]))
    >>> m.tolist(), lo.tolist(), hi.tolist(), n.tolist()
    ([1.0, 2.0], [1.0, nan], [1.0, nan], [3, 1])
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"values: expected shape (groups, windows), got {values.shape}")
    present = np.isfinite(values)
    counts = present.sum(1)
    filled = np.where(present, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = filled.sum(1) / counts
    groups, windows = values.shape
    low = np.full(groups, np.nan)
    high = np.full(groups, np.nan)
    if windows and n_boot > 0:
        idx = bootstrap_indices(windows, n_boot, seed)
        weights = np.zeros((n_boot, windows))
        np.add.at(weights, (np.arange(n_boot)[:, None], idx), 1.0)
        sums = filled @ weights.T
        cnts = present.astype(np.float64) @ weights.T
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = sums / cnts
        alpha = (1.0 - level) / 2.0
        ok = counts >= 2
        if ok.any():
            low[ok] = np.nanquantile(boot[ok], alpha, axis=1)
            high[ok] = np.nanquantile(boot[ok], 1.0 - alpha, axis=1)
    return mean, low, high, counts
