"""Diagnostics of the regularities behind the bounds (method §8, "assumption diagnostics").

The paper motivates its bounds with three empirical regularities; this module
measures each per (layer, head) instead of assuming it:

(a) stable non-sink value norms with a compressed sink: ``norm_cv`` = std / mean of
    ``||v_j||`` over j >= 1 (population std) per window, and ``sink_norm_ratio`` =
    mean_{j>=1} ||v_j|| / ||v_0|| per window (the method's ``norm_ratio``), each averaged
    over the windows where it is defined;
(b) exponential decay of value cosines with distance: ``cos(v_i, v_j) ~ exp(-|i-j| /
    lambda)`` over the non-sink pairs 1 <= i < j (pairs with a zero vector left out;
    for T > 363 a fixed sample of 65,536 pairs, ``pairs.py``), pooled over windows.
    The fit minimises the squared error over those pairs, which equals least squares
    on the mean cosine per distance weighted by the number of pairs at that distance;
    lambda is found by a 1-D search (a log-spaced grid from 1e-2 to 1e2 T, refined by
    golden section in log lambda). ``cos_decay_mae`` is the
    pair-weighted mean absolute error of the fitted curve against the mean cosine per
    distance; ``negative_cos_share`` the share of those pairs with a negative cosine
    (which the exponential model cannot express);
(c) the piecewise attention profile: at every analysed query with >= 2 visible keys,
    ``mass_sink`` = attention on positions < ``sink_width`` (default 1: the sink),
    ``mass_recent`` = on the other keys within distance ``|t - j| < recent`` of the query
    (default 16, the query itself included; in a causal model the ``recent`` most recent
    keys), ``mass_middle`` = on the remaining visible keys. Pooled means over queries.

Value statistics are taken once per (window, layer), whatever the number of query
chunks; all state is sums and counts, so shards with disjoint windows merge exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.bounds import finite_rows
from attngeom.core.protocol import Accumulator, check_disjoint
from attngeom.errors import ConfigError
from attngeom.names import SINK

ASSUMPTIONS_COLUMNS = (
    "layer", "head", "norm_cv", "sink_norm_ratio", "cos_decay_lambda", "cos_decay_mae",
    "negative_cos_share", "mass_sink", "mass_middle", "mass_recent",
)


def norm_statistics(stats: ValueStats) -> dict[str, torch.Tensor]:
    """Per kv head ``norm_cv`` and ``sink_norm_ratio`` of one window, each (G,) float64.

    >>> v = torch.tensor([[[0.5, 0.0], [1.0, 0.0], [0.0, 3.0]]])
    >>> {k: float(x[0]) for k, x in norm_statistics(ValueStats(v)).items()}
    {'norm_cv': 0.5, 'sink_norm_ratio': 4.0}
    """
    norms = stats.norms
    g, t = norms.shape
    nan = torch.full((g,), math.nan, dtype=torch.float64, device=norms.device)
    if t < 2:
        return {"norm_cv": nan, "sink_norm_ratio": nan.clone()}
    rest = norms[:, 1:]
    mean = rest.mean(-1)
    std = rest.std(-1, correction=0)
    ok = mean > 0
    cv = torch.where(ok, std / torch.where(ok, mean, 1.0), math.nan)
    n0 = norms[:, SINK]
    ratio = torch.where(n0 > 0, mean / torch.where(n0 > 0, n0, 1.0), math.nan)
    return {"norm_cv": cv, "sink_norm_ratio": ratio}


def cosine_by_distance(stats: ValueStats) -> dict[str, torch.Tensor]:
    """Sums of non-sink pair cosines by distance, for the decay fit (method §8 (b)).

    Over all pairs, or for long windows the fixed pair sample of ``pairs.py`` (the
    same pairs in every window), pairs with a zero vector left out.

    Shapes: -> ``cos_sum``, ``count`` (G, T) float64 indexed by distance |i - j|
    (entry 0 unused), ``negative`` (G,) float64 count of negative cosines.
    """
    a, b, cos, ok = stats.sampled_pairs()
    g, t = stats.norms.shape
    dist = (b - a).expand(g, -1)
    w = ok.to(torch.float64)
    cos_sum = torch.zeros(g, t, dtype=torch.float64, device=cos.device)
    count = torch.zeros_like(cos_sum)
    cos_sum.scatter_add_(1, dist, cos * w)
    count.scatter_add_(1, dist, w)
    negative = (ok & (cos < 0)).sum(-1).to(torch.float64)
    return {"cos_sum": cos_sum, "count": count, "negative": negative}


def fit_exponential_decay(
    mean_cos: np.ndarray, weight: np.ndarray, *, steps: int = 60
) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``mean_cos[..., delta] ~ exp(-delta / lambda)`` by weighted least squares.

    Shapes: mean_cos, weight (H, D) with entry ``delta`` the mean cosine at distance
    ``delta`` and its pair count (entries with weight 0 ignored) -> ``lambda`` (H,) and the
    weighted mean absolute error (H,), both NaN where no pair has weight.

    >>> d = np.arange(20.0)
    >>> lam, mae = fit_exponential_decay(np.exp(-d / 3.0)[None], (d > 0)[None] * 1.0)
    >>> round(float(lam[0]), 4), float(mae[0]) < 1e-6
    (3.0, True)
    """
    mean_cos = np.asarray(mean_cos, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    h, dn = mean_cos.shape
    delta = np.arange(dn, dtype=np.float64)
    y = np.where(weight > 0, mean_cos, 0.0)
    total = weight.sum(-1)

    def loss(log_lam: np.ndarray) -> np.ndarray:  # (H, K) -> (H, K)
        f = np.exp(-delta[None, None, :] / np.exp(log_lam)[..., None])
        return (weight[:, None, :] * (y[:, None, :] - f) ** 2).sum(-1)

    grid = np.linspace(math.log(1e-2), math.log(1e2 * max(dn, 1)), 97)
    losses = loss(np.broadcast_to(grid, (h, grid.size)))
    best = np.argmin(losses, -1)
    lo = grid[np.maximum(best - 1, 0)]
    hi = grid[np.minimum(best + 1, grid.size - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(steps):  # golden section on the bracket around the best grid point
        a = hi - ratio * (hi - lo)
        b = lo + ratio * (hi - lo)
        la, lb = loss(np.stack([a, b], -1)).T
        left = la <= lb
        hi = np.where(left, b, hi)
        lo = np.where(left, lo, a)
    cand = np.stack([(lo + hi) / 2, grid[best]], -1)
    cl = loss(cand)
    log_lam = np.where(cl[:, 0] <= cl[:, 1], cand[:, 0], cand[:, 1])
    lam = np.exp(log_lam)
    fitted = np.exp(-delta[None, :] / lam[:, None])
    mae = (weight * np.abs(y - fitted)).sum(-1) / np.maximum(total, 1e-300)
    return np.where(total > 0, lam, np.nan), np.where(total > 0, mae, np.nan)


def attention_profile_masses(
    alpha: torch.Tensor, universe: torch.Tensor, query_positions: torch.Tensor,
    *, recent: int = 16, sink_width: int = 1,
) -> dict[str, torch.Tensor]:
    """Attention mass on the sink, the middle and the recent keys of each row (method §8 (c)).

    Shapes: alpha, universe (H, Q, T), query_positions (Q,) -> ``mass_sink``,
    ``mass_middle``, ``mass_recent`` (H, Q) float64 and ``valid`` (H, Q) (>= 2 keys seen).

    >>> a = torch.tensor([[[0.5, 0.1, 0.1, 0.3]]])
    >>> m = attention_profile_masses(a, torch.ones(1, 1, 4, dtype=torch.bool),
    ...                              torch.tensor([3]), recent=2)
    >>> [round(float(m[k][0, 0]), 3) for k in ("mass_sink", "mass_middle", "mass_recent")]
    [0.5, 0.1, 0.4]
    """
    t = alpha.shape[-1]
    pos = torch.arange(t, device=alpha.device)
    qpos = query_positions.to(device=alpha.device, dtype=torch.int64)
    a = torch.where(universe, alpha, 0.0).to(torch.float64)
    sink = (pos < sink_width)[None, None, :]
    near = ((qpos[:, None] - pos[None, :]).abs() < recent)[None] & ~sink
    return {
        "mass_sink": torch.where(sink, a, 0.0).sum(-1),
        "mass_recent": torch.where(near, a, 0.0).sum(-1),
        "mass_middle": torch.where(~sink & ~near, a, 0.0).sum(-1),
        "valid": (universe.sum(-1) >= 2) & finite_rows(alpha, universe),
    }


class _AssumLayer:
    def __init__(self, num_heads: int) -> None:
        z = np.zeros
        self.num_heads = num_heads
        self.cv_sum, self.cv_count = z(num_heads), z(num_heads)
        self.ratio_sum, self.ratio_count = z(num_heads), z(num_heads)
        self.cos_sum, self.cos_count = z((num_heads, 0)), z((num_heads, 0))
        self.negative = z(num_heads)
        self.mass = {k: z(num_heads) for k in ("mass_sink", "mass_middle", "mass_recent")}
        self.query_count = z(num_heads)

    def add_cos(self, cos_sum: np.ndarray, count: np.ndarray) -> None:
        w = max(self.cos_sum.shape[1], cos_sum.shape[1])
        pad = lambda x: np.pad(x, ((0, 0), (0, w - x.shape[1])))  # noqa: E731
        self.cos_sum = pad(self.cos_sum) + pad(cos_sum)
        self.cos_count = pad(self.cos_count) + pad(count)


class AssumptionsAccumulator(Accumulator):
    """Streaming assumption diagnostics for table ``assumptions`` (method §8); merge exact.

    ``recent`` is the width of the recent stretch (keys with |t - j| < recent) and
    ``sink_width`` that of the sink peak (positions < sink_width) in the mass profile.
    """

    tables = ("assumptions",)

    def __init__(self, *, recent: int = 16, sink_width: int = 1) -> None:
        if int(recent) != recent or recent < 1:
            raise ConfigError(f"recent: expected an integer >= 1, got {recent!r}")
        if int(sink_width) != sink_width or sink_width < 1:
            raise ConfigError(f"sink_width: expected an integer >= 1, got {sink_width!r}")
        self.recent = int(recent)
        self.sink_width = int(sink_width)
        self._layers: dict[int, _AssumLayer] = {}
        self._seen: set[tuple[int, int]] = set()

    def _layer(self, layer: int, num_heads: int) -> _AssumLayer:
        return self._layer_state(layer, num_heads, _AssumLayer)

    def update(self, batch: AttentionBatch) -> None:
        """Add one query chunk (value statistics only on a window's first chunk)."""
        st = self._layer(batch.layer, batch.num_heads)
        key = (batch.layer, batch.window)
        if key not in self._seen:
            self._seen.add(key)
            kv = batch.kv_of_head.cpu()
            ns = {k: v.cpu()[kv].numpy() for k, v in norm_statistics(batch.stats).items()}
            for name, s, c in (("norm_cv", "cv_sum", "cv_count"),
                               ("sink_norm_ratio", "ratio_sum", "ratio_count")):
                ok = np.isfinite(ns[name])
                setattr(st, s, getattr(st, s) + np.where(ok, ns[name], 0.0))
                setattr(st, c, getattr(st, c) + ok)
            cd = {k: v.cpu()[kv].numpy() for k, v in cosine_by_distance(batch.stats).items()}
            st.add_cos(cd["cos_sum"], cd["count"])
            st.negative += cd["negative"]
        m = attention_profile_masses(batch.alpha, batch.universe(), batch.query_positions,
                                     recent=self.recent, sink_width=self.sink_width)
        v = m["valid"]
        for name in st.mass:
            st.mass[name] += torch.where(v, m[name], 0.0).sum(-1).cpu().numpy()
        st.query_count += v.sum(-1).cpu().numpy()

    def merge(self, other: AssumptionsAccumulator) -> AssumptionsAccumulator:
        """Add another shard's state (disjoint windows); returns self."""
        self._check_mergeable(other, recent=self.recent, sink_width=self.sink_width)
        check_disjoint(self._seen, other._seen)
        for layer, ost in other._layers.items():
            st = self._layer(layer, ost.num_heads)
            for name in ("cv_sum", "cv_count", "ratio_sum", "ratio_count", "negative",
                         "query_count"):
                setattr(st, name, getattr(st, name) + getattr(ost, name))
            for name in st.mass:
                st.mass[name] = st.mass[name] + ost.mass[name]
            st.add_cos(ost.cos_sum, ost.cos_count)
        self._seen |= other._seen
        return self

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """Table ``assumptions``: one row per (layer, head)."""
        cols: dict[str, list[np.ndarray]] = {c: [] for c in ASSUMPTIONS_COLUMNS}
        for layer in sorted(self._layers):
            st = self._layers[layer]
            h = st.num_heads

            def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
                return np.where(den > 0, num / np.maximum(den, 1e-300), np.nan)

            mean_cos = ratio(st.cos_sum, st.cos_count) if st.cos_sum.size else st.cos_sum
            lam, mae = fit_exponential_decay(np.nan_to_num(mean_cos), st.cos_count)
            pairs = st.cos_count.sum(-1)
            cols["layer"].append(np.full(h, layer, dtype=np.int64))
            cols["head"].append(np.arange(h, dtype=np.int64))
            cols["norm_cv"].append(ratio(st.cv_sum, st.cv_count))
            cols["sink_norm_ratio"].append(ratio(st.ratio_sum, st.ratio_count))
            cols["cos_decay_lambda"].append(lam)
            cols["cos_decay_mae"].append(mae)
            cols["negative_cos_share"].append(ratio(st.negative, pairs))
            for name in st.mass:
                cols[name].append(ratio(st.mass[name], st.query_count))
        return {"assumptions": {
            c: (np.concatenate(p) if p else
                np.zeros(0, dtype=np.int64 if c in ("layer", "head") else np.float64))
            for c, p in cols.items()
        }}
