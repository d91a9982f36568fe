"""Top-N geometric Precision, Recall, F_N, margin and inversions (method §4, fast as §11).

For a query row with universe U and selected set I (the first N keys of a rule's
order), every metric compares distances D[u] = dist(y_u, s_N) with y_u = alpha_u v_u
and s_N = sum_{i in I} y_i. Nothing here materialises y: with the value Gram matrix
G of the row's kv head,

    <v_u, s_N> = sum_{k < N} alpha_{sigma(k)} G[u, sigma(k)]      (a gather + cumsum)
    ||s_N||^2 = sum_{k < N} alpha_{sigma(k)} <v_{sigma(k)}, s_N>
    g[u]      = 2 alpha_u <v_u, s_N> - alpha_u^2 ||v_u||^2 = ||s_N||^2 - D[u]^2

and every comparison the metrics make is a comparison of a "closeness" score with
the sign flipped: g for the Euclidean distance (never D, which loses the small
alphas to cancellation, method §11), the cosine similarity for the cosine distance.
One cumulative sum over the first N_max sorted keys serves every N of the grid at
once; the work per row is O(T * N_max) and rows are processed in chunks.

Shapes: alpha (H, Q, T), values (G, T, d) with H % G == 0 (query head h reads kv
head h // (H // G)); results (K, H, Q, NN) with K the random repeats (1 otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attngeom.core.batch import ValueStats
from attngeom.core.random_control import permutation_keys
from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, METRICS, RULES

COSINE_EPS = 1e-12
_INT64_MAX = torch.iinfo(torch.int64).max
_CHUNK_BYTES = 192 * 2**20
_DENSE_RATIO = 24
_CANCEL = 16 * torch.finfo(torch.float64).eps


@dataclass
class TopNMetrics:
    """Per-row metrics of one rule and distance; NaN (and ``valid`` False) where undefined.

    ``order`` holds each row's full key order (universe first), ``sink_selected``
    whether position 0 is in I_N, ``nonfinite`` the rows skipped for non-finite alpha.
    """

    precision: Tensor
    recall: Tensor
    f_score: Tensor
    margin: Tensor
    inversions: Tensor
    valid: Tensor
    trivial: Tensor
    nonfinite: Tensor
    sink_selected: Tensor
    order: Tensor
    n_grid: tuple[int, ...]

    def metric(self, name: str) -> Tensor:
        return getattr(self, name)


def check_rule_distance(rule: str, distance: str) -> None:
    if rule not in RULES:
        raise ConfigError(f"rule: expected one of {', '.join(RULES)}, got {rule!r}")
    if distance not in DISTANCES:
        raise ConfigError(f"distance: expected one of {', '.join(DISTANCES)}, got {distance!r}")


def causal_visibility(query_positions: Tensor, num_keys: int) -> Tensor:
    """(1, Q, T) bool: key j visible from query t iff j <= t."""
    keys = torch.arange(num_keys, device=query_positions.device)
    return (keys[None, :] <= query_positions[:, None])[None]


def select_order(
    alpha: Tensor,
    head_norms: Tensor,
    universe: Tensor,
    rule: str,
    *,
    repeats: int = 1,
    query_positions: Tensor | None = None,
    seed: int = 0,
    window: int | Tensor = 0,
    layer: int = 0,
    head_index: Tensor | None = None,
) -> Tensor:
    """(K, H, Q, T) int64 key order of every row under a selection rule (method §4).

    Universe keys come first, in rule order; ties go to the smaller position (stable
    sorts). ``alpha`` is (H, Q, T) float64 with non-finite entries already zeroed,
    ``head_norms`` (H, T) the value norms seen by each query head.
    """
    if rule == "random":
        h, q, t = alpha.shape
        if query_positions is None:
            raise ConfigError("rule 'random' needs query_positions to seed the control")
        heads = torch.arange(h, device=alpha.device) if head_index is None else head_index
        keys = permutation_keys(seed, window, layer, heads, query_positions, repeats, t)
        keys = keys.masked_fill(~universe[None], _INT64_MAX)
        return torch.sort(keys, dim=-1, stable=True).indices
    score = alpha if rule == "attention" else alpha * head_norms[:, None, :]
    score = score.masked_fill(~universe, float("-inf"))
    return torch.sort(score, dim=-1, descending=True, stable=True).indices[None]


def _grid_tensor(n_grid: Sequence[int]) -> tuple[int, ...]:
    try:
        grid = tuple(int(n) for n in n_grid)
    except (TypeError, ValueError):
        raise ConfigError(f"n_grid: expected a sequence of integers, got {n_grid!r}") from None
    if not grid:
        raise ConfigError("n_grid: expected at least one N, got an empty grid")
    return grid


def topn_metrics(
    alpha: Tensor,
    values: Tensor | None,
    n_grid: Sequence[int],
    *,
    rule: str = "attention",
    distance: str = "euclidean",
    visible: Tensor | None = None,
    exclude_sink: bool = False,
    query_positions: Tensor | None = None,
    repeats: int = 1,
    seed: int = 0,
    window: int | Tensor = 0,
    layer: int = 0,
    stats: ValueStats | None = None,
    chunk_rows: int | None = None,
    head_index: Tensor | None = None,
) -> TopNMetrics:
    """Geometric P_N, R_N, F_N, margin and inversions of every row and N (method §4).

    ``alpha`` (H, Q, T) probabilities of the analysed rows, ``values`` (G, T, d)
    (or a prepared ``stats``), ``visible`` (H or 1, Q, T) bool (default: causal from
    ``query_positions``, which default to the last Q positions). Returns
    ``TopNMetrics`` with tensors of shape (K, H, Q, NN), float64. Rows of several
    windows may be stacked along the head dimension: then ``window`` and ``head_index``
    give each head row's window and head, which seed the random control.

    >>> a = torch.tensor([[[0.25, 0.5, 0.25]]])   # one head, one query (t = 2), T = 3
    >>> v = torch.tensor([[[1.0], [1.0], [-1.0]]])
    >>> r = topn_metrics(a, v, [1, 2])            # N = 2: I = {1, 0}, s = 0.75
    >>> r.precision[0, 0, 0].tolist(), r.recall[0, 0, 0].tolist(), bool(r.trivial[0])
    ([1.0, 1.0], [1.0, 1.0], True)
    """
    check_rule_distance(rule, distance)
    grid = _grid_tensor(n_grid)
    if rule != "random":
        repeats = 1
    if alpha.dim() != 3:
        raise ConfigError(f"alpha: expected shape (H, Q, T), got {tuple(alpha.shape)}")
    if stats is None:
        if values is None:
            raise ConfigError("topn_metrics needs values or stats")
        stats = ValueStats(values.to(alpha.device))
    h, q, t = alpha.shape
    g = stats.num_kv_heads
    if h % g or stats.num_keys != t:
        raise ConfigError(
            f"alpha (H={h}, T={t}) does not fit values (G={g}, T={stats.num_keys}): "
            "expected H divisible by G and equal T"
        )
    device = alpha.device
    if query_positions is None:
        query_positions = torch.arange(t - q, t, device=device)
    query_positions = query_positions.to(device=device, dtype=torch.int64)
    if visible is None:
        visible = causal_visibility(query_positions, t)
    universe = visible.to(device=device, dtype=torch.bool).expand(h, q, t).clone()
    if exclude_sink:
        universe[..., 0] = False

    group = h // g
    kv = torch.arange(h, device=device) // group
    head_norms = stats.norms[kv]
    alpha64 = alpha.to(torch.float64)
    # a row is skipped (and counted) when any key of its universe has a non-finite alpha
    # or value state (e.g. an fp16 overflow): its comparisons would be decided by NaN
    bad_key = ~torch.isfinite(alpha64) | ~torch.isfinite(head_norms)[:, None, :]
    nonfinite = (bad_key & universe).any(-1)
    alpha64 = torch.where(torch.isfinite(alpha64), alpha64, torch.zeros((), dtype=alpha64.dtype))
    alpha64 = alpha64.masked_fill(nonfinite[..., None], 0.0)
    if bool(nonfinite.any()):
        stats = ValueStats(torch.nan_to_num(stats.values, nan=0.0, posinf=0.0, neginf=0.0),
                           stats.dtype)
        head_norms = stats.norms[kv]
    order = select_order(
        alpha64, head_norms, universe, rule, repeats=repeats,
        query_positions=query_positions, seed=seed, window=window, layer=layer,
        head_index=head_index,
    )

    nmax = max(1, min(max(grid), t))
    grid_t = torch.tensor(grid, device=device, dtype=torch.int64)
    usize = universe.sum(-1)
    valid = (grid_t >= 1) & (grid_t[None, None, :] < usize[..., None]) & ~nonfinite[..., None]
    valid = valid[None].expand(repeats, h, q, len(grid)).clone()

    if chunk_rows is None:
        per_row = max(1, repeats * h * t * nmax * 8 * 4)
        chunk_rows = max(1, _CHUNK_BYTES // per_row)
    parts = []
    for s in range(0, q, chunk_rows):
        rows = (alpha64[:, s : s + chunk_rows], order[:, :, s : s + chunk_rows],
                universe[:, s : s + chunk_rows])
        parts.append(_metrics_rows(*rows, stats, group, grid_t, nmax, distance))
    out = {name: torch.cat([p[name] for p in parts], dim=2) for name in parts[0]}
    for name in METRICS:
        out[name] = out[name].masked_fill(~valid, float("nan"))
    trivial = (grid_t == 1) & (distance == "euclidean")
    return TopNMetrics(
        **{name: out[name] for name in METRICS},
        valid=valid,
        trivial=trivial,
        nonfinite=nonfinite,
        sink_selected=out["sink_selected"] & valid,
        order=order,
        n_grid=grid,
    )


class _Folding:
    """(K, H, Q, ...) rows <-> (G, K*group*Q, ...): each query head joins its kv group."""

    def __init__(self, k: int, h: int, q: int, group: int) -> None:
        self.k, self.h, self.q, self.group = k, h, q, group
        self.g = h // group
        self.m = k * group * q

    def fold(self, x: Tensor) -> Tensor:
        rest = x.shape[3:]
        x = x.reshape(self.k, self.g, self.group, self.q, *rest).movedim(1, 0)
        return x.reshape(self.g, self.m, *rest)

    def unfold(self, x: Tensor) -> Tensor:
        rest = x.shape[2:]
        x = x.reshape(self.g, self.k, self.group, self.q, *rest).movedim(0, 1)
        return x.reshape(self.k, self.h, self.q, *rest)


def _from_closeness(
    close: Tensor,
    selected: Tensor,
    unselected: Tensor,
    close_sel: Tensor,
    s2: Tensor,
    grid: Tensor,
    kmask: Tensor,
    euclidean: bool,
) -> dict[str, Tensor]:
    """method §4 metrics from closeness scores (larger = nearer the aggregate).

    ``close`` (G, M, NN, C) over C keys, ``selected`` / ``unselected`` masks broadcast
    to it, ``close_sel`` (G, M, NN, N_max) the scores of the sorted selected keys,
    ``kmask`` (NN, N_max) which of them are in I_N. Every comparison is one of scores:
    D[j] <= rho_max is close[j] >= min_I close, D[i] < rho_min is close[i] > max close[j].
    """
    inf = torch.tensor(float("inf"), dtype=close.dtype, device=close.device)
    cmin_sel = torch.where(selected, close, inf).amin(-1)
    cmax_uns = torch.where(unselected, close, -inf).amax(-1)
    nf = grid.to(close.dtype)[None, None, :]
    n_close = (unselected & (close >= cmin_sel[..., None])).sum(-1)
    precision = nf / (nf + n_close)
    recall = (selected & (close > cmax_uns[..., None])).sum(-1) / nf
    denom = precision + recall
    f_score = torch.where(denom > 0, 2 * precision * recall / denom.clamp_min(1e-300), 0.0)
    if euclidean:
        # rho_min - rho_max without subtracting two nearly equal distances
        rho_min = (s2 - cmax_uns).clamp_min(0).sqrt()
        rho_max = (s2 - cmin_sel).clamp_min(0).sqrt()
        spread = rho_min + rho_max
        margin = torch.where(spread > 0, (cmin_sel - cmax_uns) / spread.clamp_min(1e-300), 0.0)
    else:
        margin = cmin_sel - cmax_uns
    # inversions: pairs (i in I, j not in I) with D[j] <= D[i], i.e. close[j] >= close[i]
    uns_sorted = torch.where(unselected, close, -inf).sort(dim=-1).values
    below = torch.searchsorted(uns_sorted.contiguous(), close_sel.contiguous(), right=False)
    inversions = ((close.shape[-1] - below) * kmask).sum(-1).to(close.dtype)
    return {
        "precision": precision, "recall": recall, "f_score": f_score, "margin": margin,
        "inversions": inversions, "cmin_sel": cmin_sel, "cmax_uns": cmax_uns,
    }


def _metrics_rows(
    alpha: Tensor,
    order: Tensor,
    universe: Tensor,
    stats: ValueStats,
    group: int,
    grid: Tensor,
    nmax: int,
    distance: str,
) -> dict[str, Tensor]:
    """Metrics of one chunk of rows over every key; heads are folded into their kv group."""
    k, h, q, t = order.shape
    fd = _Folding(k, h, q, group)
    g, m, nn = fd.g, fd.m, grid.numel()
    alpha_m = fd.fold(alpha[None].expand(k, h, q, t))
    univ_m = fd.fold(universe[None].expand(k, h, q, t))
    order_m = fd.fold(order)
    sel = order_m[..., :nmax]
    a_sel = torch.gather(alpha_m, -1, sel)
    gram = stats.gram
    kmask = (torch.arange(nmax, device=alpha.device)[:, None] < grid[None, :]).to(alpha.dtype)
    weights = a_sel[..., :, None] * kmask  # (G, M, Nmax, NN): alpha_sigma(k) [k < N]
    # <v_u, s_N> = sum_k G[u, sigma(k)] weights[k, N]: the cumulative sum over the sorted
    # keys read off at every N of the grid, as one matrix product
    if t <= _DENSE_RATIO * nmax:
        # scatter the weights to key positions and multiply by the whole Gram matrix:
        # more flops than the gather, but one BLAS call wins while T is a small multiple
        # of N_max
        dense = torch.zeros(g, m, t, nn, dtype=alpha.dtype, device=alpha.device)
        dense.scatter_(2, sel[..., None].expand(g, m, nmax, nn), weights)
        dense = dense.permute(0, 2, 1, 3).reshape(g, t, m * nn)
        inner = torch.bmm(gram, dense).reshape(g, t, m, nn).permute(0, 2, 3, 1).contiguous()
    else:
        gathered = torch.gather(
            gram[:, None].expand(g, m, t, t), 3, sel[:, :, None, :].expand(g, m, t, nmax)
        )  # (G, M, T, Nmax): G[u, sigma(k)]
        inner = torch.matmul(gathered, weights).transpose(-1, -2).contiguous()
    inner_sel = torch.gather(inner, -1, sel[:, :, None, :].expand(g, m, nn, nmax))
    s2 = (inner_sel * weights.transpose(-1, -2)).sum(-1)  # (G, M, NN): ||s_N||^2
    if distance == "cosine":
        # An aggregate that cancels exactly (e.g. two equal alphas on opposite values) is
        # left with rounding noise of order N eps (sum alpha ||v||)^2, and every cosine to
        # it would be decided by that noise; call it zero, as exact arithmetic does. (The
        # Euclidean comparisons need no such care: there the noise is negligible against
        # alpha^2 ||v||^2.)
        lengths = a_sel * torch.gather(stats.norms[:, None].expand(g, m, t), -1, sel)
        scale = (lengths[:, :, None, :] * kmask.T).sum(-1)
        limit = _CANCEL * grid.to(alpha.dtype)[None, None, :] * scale * scale
        degenerate = s2 <= limit
        s2 = s2.masked_fill(degenerate, 0.0)
        inner = inner.masked_fill(degenerate[..., None], 0.0)

    rank = torch.empty_like(order_m)
    rank.scatter_(-1, order_m, torch.arange(t, device=alpha.device).expand_as(order_m))
    selected = rank[:, :, None, :] < grid[None, None, :, None]
    unselected = univ_m[:, :, None, :] & ~selected
    a = alpha_m[:, :, None, :]
    if distance == "euclidean":
        close = 2.0 * a * inner - a * a * stats.sq_norms[:, None, None, :]
    else:
        norms = stats.norms[:, None, None, :]
        close = (a * inner) / (a * norms * s2.clamp_min(0).sqrt()[..., None] + COSINE_EPS)
    close_sel = torch.gather(close, -1, sel[:, :, None, :].expand(g, m, nn, nmax))
    out = _from_closeness(close, selected, unselected, close_sel, s2, grid, kmask.T.bool(),
                          distance == "euclidean")
    out["sink_selected"] = selected[..., 0] & univ_m[:, :, None, 0]
    return {name: fd.unfold(out[name]) for name in (*METRICS, "sink_selected")}

