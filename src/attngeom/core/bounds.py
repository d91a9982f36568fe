"""Certified separability bounds and the constant-norm envelope (method §8).

method §8 writes every comparison of the Euclidean metrics as a comparison of
``g[u] = 2 alpha_u <v_u, s> - alpha_u^2 ||v_u||^2`` (larger g = closer to the aggregate
``s`` of the selected set). Expanding ``<v_u, s>`` leaves only the alphas, the value
norms and the cosines between value vectors; replacing every cosine by a bound gives
``L[i] <= g[i]`` (selected) and ``U[j] >= g[j]`` (unselected), hence deterministic lower
bounds on Recall, Precision and F that need no value direction at all:

- non-sink coherence ``|cos(v_a, v_b)| <= mu`` for a != b, a, b >= 1;
- sink relation ``c_lo <= cos(v_0, v_b) <= c_hi`` for b >= 1.

With ``a_u = alpha_u ||v_u||`` (the contribution's length), the selected set ``I`` of size
N, ``S`` the summed length of its non-sink members and ``A0 = a_0`` if the sink is selected
(else 0), the bounds are, for non-sink i in I, the sink in I, non-sink j not in I, and the
sink not in I::

    L[i] = a_i^2 - 2 mu a_i (S - a_i) + 2 c_lo a_i A0
    L[0] = a_0^2 + 2 c_lo a_0 S
    U[j] = 2 a_j (mu S + c_hi A0) - a_j^2
    U[0] = 2 c_hi a_0 S - a_0^2

so one prefix sum over the rule's order serves each N in O(T) (method §11): no N x T x T
tensor. Every comparison is made with a slack of ``1e-10 (sum_u a_u)^2`` against the
bound (a selected token counts only if it beats the unselected ones by more than the
rounding of g itself), so a bound measured with mu, c_lo, c_hi taken from the window
never exceeds the float64 metric even on exact ties.

Cosines with a zero vector: ``cos(v, 0)`` is taken as 0 wherever a cosine is reported,
but pairs with a zero vector are left out of ``mu``, ``c_lo`` and ``c_hi``: their inner
product is 0 whatever bound is used, so they constrain nothing (a window without any
measurable pair gets ``mu = c_lo = c_hi = 0``).

The constant-norm envelope (method §8, "constant-norm envelope") applies the same
formulas to a synthetic row: the head's alpha profile, non-sink norms 1, sink norm
1 / kappa, coherence mu and one sink cosine. ``BoundsAccumulator`` fits kappa, mu and the
sink cosine per head, reports the envelope against N and how often the fitted
assumptions fail on the measured windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.kernels import compiled_float, temp_bytes
from attngeom.core.pairs import coherence_slack, max_abs_cosine
from attngeom.core.protocol import Accumulator, check_disjoint
from attngeom.errors import ConfigError
from attngeom.names import SINK

_SLACK = 1e-10
_CHUNK_BYTES = 256 * 2**20
_FUSED_N = 6  # the N of the grid one fused bound call takes (bounds_of_top's chunking
# assumes about six (K, H, rows, T) float64 temporaries, which a compiler that stored
# the unselected keys' U per N would hold)


def grid_of(n_grid: Sequence[int]) -> tuple[int, ...]:
    """The N grid as a tuple of ints (its values are checked by the configuration)."""
    return tuple(int(n) for n in n_grid)


def finite_rows(alpha: Tensor, universe: Tensor) -> Tensor:
    """(H, Q) bool: rows whose alphas are finite on their universe (others are skipped)."""
    return (torch.isfinite(alpha) | ~universe).all(-1)


def safe_cos(inner: Tensor, denom: Tensor) -> Tensor:
    """``inner / denom`` clamped to [-1, 1], with 0 where ``denom`` is 0 (a zero vector)."""
    ok = denom > 0
    out = torch.where(ok, inner / torch.where(ok, denom, torch.ones_like(denom)), 0.0)
    return out.clamp(-1.0, 1.0)


class WindowConstants(NamedTuple):
    """Per kv head angle constants of one window (method §8), each (G,) float64."""

    mu: Tensor
    c_lo: Tensor
    c_hi: Tensor


def window_constants(stats: ValueStats, exclude: Tensor | None = None) -> WindowConstants:
    """Measure mu, c_lo, c_hi per kv head on one window, so that the method's assumptions hold.

    ``mu = max_{a != b, a, b >= 1} |cos(v_a, v_b)|`` (measured in float32 and raised by
    its rounding bound, ``pairs.py``), ``c_lo / c_hi = min / max_{b >= 1} cos(v_0, v_b)``
    in float64. ``exclude`` (T,) bool leaves positions out (e.g. keys that are in no
    universe); pairs with a zero vector are left out (their inner product is 0 whatever
    the bound), and a kv head with nothing left gets 0.

    Shapes: stats (G, T, d) values -> three (G,) float64 tensors.

    >>> v = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [-1.0, 1.0]]])
    >>> [round(float(x[0]), 4) for x in window_constants(ValueStats(v))]
    [0.7071, -1.0, 0.0]
    """
    norms = stats.norms
    g, t = norms.shape
    keep = norms > 0
    if exclude is not None:
        if exclude.shape != (t,):
            raise ConfigError(f"exclude: expected shape ({t},), got {tuple(exclude.shape)}")
        keep = keep & ~exclude.to(device=keep.device, dtype=torch.bool)[None, :]
    zeros = norms.new_zeros(g)
    if t < 2:
        return WindowConstants(zeros, zeros.clone(), zeros.clone())
    nonsink = keep.clone()
    nonsink[:, SINK] = False
    # measured in float32 (pairs.py), then raised by its rounding bound: never below
    # the exact maximum, so the bounds stay certified
    raw = stats.nonsink_coherence() if exclude is None else max_abs_cosine(stats.values, nonsink)
    slack = coherence_slack(int(stats.values.shape[-1]))
    mu = torch.where(nonsink.sum(-1) >= 2, (raw + slack).clamp_max(1.0), 0.0)
    with_sink = keep[:, 1:] & keep[:, SINK : SINK + 1]
    sink_row = stats.sink_cosines()
    any_sink = with_sink.any(-1)
    c_lo = torch.where(any_sink, torch.where(with_sink, sink_row, math.inf).amin(-1), 0.0)
    c_hi = torch.where(any_sink, torch.where(with_sink, sink_row, -math.inf).amax(-1), 0.0)
    return WindowConstants(mu, c_lo, c_hi)


def sorted_descending(x: Tensor) -> Tensor:
    """The values of ``x`` sorted in descending order along the last dimension (exact).
    On CPU, in float32 or float64, through NumPy, whose vectorised sort runs about six
    times faster than ``torch.sort`` on a layer's attention rows (0.1 against 0.7 ms
    for 16 rows of 1023)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return torch.sort(x, dim=-1, descending=True).values
    return torch.from_numpy(np.sort(x.detach().numpy(), axis=-1)[..., ::-1].copy())


def _as_param(x: Tensor | float, like: Tensor) -> Tensor:
    return torch.as_tensor(x, dtype=torch.float64, device=like.device)


def _bound_keys(
    a: Tensor,
    top: Tensor,
    universe: Tensor,
    n_grid: tuple[int, ...],
    mu: Tensor,
    c_lo: Tensor,
    c_hi: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """The method §8 bound of each row, from its contribution lengths in key order.

    a (1, R, T) float64 contribution lengths ``alpha_u ||v_u||`` of R rows (the sink is
    key 0); top (K, R, W) the first W keys in rule order of K orders of each row (W >=
    every N of the grid that is valid for the row; entries past the universe size are
    padding outside it); universe (1, R, T) bool; mu, c_lo, c_hi (1, R). The K orders
    (the random control's repeats) share the key-order terms. Returns precision, recall,
    f bounds (K, R, NN), NaN where N is invalid.

    Per N the non-sink bounds are ``L = (1 + 2 mu) a^2 - 2 a B`` on the selected keys
    (the first N of ``top``) and ``U = 2 a C - a^2`` on the others, with per-row
    scalars ``B = mu S - c_lo A0`` and ``C = mu S + c_hi A0``; the sink is handled apart.
    So each N costs one pass over the T keys (the unselected ones are those whose rank
    in ``top`` is N or more) and one over the W first ones; no full order is needed.
    """
    k, r, width = top.shape
    t = a.shape[-1]
    dev = a.device
    universe = universe.to(torch.bool)
    a = torch.where(universe, a, 0.0)
    # the float sums stay outside the compiled steps, which must round exactly as the
    # plain ones do (elementwise arithmetic, minima, maxima and counts only)
    tol2 = 2.0 * _SLACK * a.sum(-1) ** 2
    usize = universe.sum(-1)
    has_sink = universe[..., SINK]
    a0 = a[..., SINK]
    is_key0 = torch.arange(t, device=dev) == SINK
    a_ns = torch.where(is_key0, 0.0, a)  # key order, shared by the K orders
    a_sq, two_a = a_ns * a_ns, 2.0 * a_ns
    open_keys = universe & ~is_key0  # the non-sink universe keys
    in_u = universe.expand(k, r, t).gather(-1, top)
    a_top = torch.where(in_u, a_ns.expand(k, r, t).gather(-1, top), 0.0)
    sink_at = (top == SINK) & in_u
    csum = torch.cumsum(a_top, -1)
    rank = torch.full((k, r, t), width, dtype=torch.int32, device=dev)
    slots = torch.arange(width, dtype=torch.int32, device=dev)
    rank.scatter_(-1, top, slots.expand(k, r, width))
    sink_slot = torch.where(has_sink, rank[..., SINK], width)
    # the sink's slot gets L = +inf (never the minimum; its count is corrected per N)
    low_base = ((1.0 + 2.0 * mu)[..., None] * (a_top * a_top)
                + torch.where(sink_at, math.inf, 0.0))
    two_a_top = 2.0 * a_top
    # each N and min(N, W) as tensors, not constants: one compiled graph serves every
    # grid and width
    kk = torch.tensor([min(n, width) for n in n_grid], dtype=torch.int32, device=dev)
    ns = torch.tensor([float(n) for n in n_grid], dtype=torch.float64, device=dev)
    s = csum.index_select(-1, (kk - 1).to(torch.int64))  # (K, R, NN) selected mass
    steps = compiled_float(_bound_columns_fused, fallback=_bound_columns)
    # the fused form's loops hold (K, R, W) per N of a call (and would hold (K, R, T) if
    # the compiler stored U): at most ``_FUSED_N`` of them, as the chunking assumes
    parts = [steps(low_base, two_a_top, two_a, a_sq, open_keys, rank, slots,
                   s[..., i : i + _FUSED_N], a0, has_sink, sink_slot, usize, tol2, mu, c_lo,
                   c_hi, ns[i : i + _FUSED_N], kk[i : i + _FUSED_N])
             for i in range(0, len(n_grid), _FUSED_N)]
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat([p[i] for p in parts], -1) for i in range(3))


def _bound_columns(low_base: Tensor, two_a_top: Tensor, two_a: Tensor, a_sq: Tensor,
                   open_keys: Tensor, rank: Tensor, slots: Tensor, s: Tensor, a0: Tensor,
                   has_sink: Tensor, sink_slot: Tensor, usize: Tensor, tol2: Tensor,
                   mu: Tensor, c_lo: Tensor, c_hi: Tensor, n: Tensor, k: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Precision, recall and F bounds (K, R, NN) of every N of the grid (``n`` (NN,)
    float64, ``k`` (NN,) int32, ``s`` (K, R, NN) their selected masses), one N at a
    time: the eager form, whose temporaries are one N's (K, R, T)."""
    columns = [_bound_step(low_base, two_a_top, two_a, a_sq, open_keys, rank, slots,
                           s[..., i], a0, has_sink, sink_slot, usize, tol2, mu, c_lo, c_hi,
                           n[i], k[i]) for i in range(n.shape[0])]
    return tuple(torch.stack([c[i] for c in columns], -1) for i in range(3))


def _bound_columns_fused(low_base: Tensor, two_a_top: Tensor, two_a: Tensor, a_sq: Tensor,
                         open_keys: Tensor, rank: Tensor, slots: Tensor, s: Tensor,
                         a0: Tensor, has_sink: Tensor, sink_slot: Tensor, usize: Tensor,
                         tol2: Tensor, mu: Tensor, c_lo: Tensor, c_hi: Tensor, n: Tensor,
                         k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``_bound_columns`` as one ``_bound_step`` broadcast over the N of the grid (the
    key-order terms gain an N dimension, the per-row ones a trailing one): the same
    operations on the same operands for every element, so the same bits. Compiled
    (``compiled_float``), one call instead of one per N; the generated loops hold
    (K, R, NN, W) buffers (the selected keys' lower bounds) and compute the unselected
    keys' upper bounds within each pass over T (``_bound_step``)."""
    def per_key(x: Tensor) -> Tensor:  # (..., T) -> (..., 1, T)
        return x.unsqueeze(-2)

    def per_row(x: Tensor) -> Tensor:  # (K, R) -> (K, R, 1)
        return x.unsqueeze(-1)

    return _bound_step(per_key(low_base), per_key(two_a_top), per_key(two_a), per_key(a_sq),
                       per_key(open_keys), per_key(rank), slots, s, per_row(a0),
                       per_row(has_sink), per_row(sink_slot), per_row(usize), per_row(tol2),
                       per_row(mu), per_row(c_lo), per_row(c_hi), n, k[:, None])


def _bound_step(low_base: Tensor, two_a_top: Tensor, two_a: Tensor, a_sq: Tensor,
                open_keys: Tensor, rank: Tensor, slots: Tensor, s: Tensor, a0: Tensor,
                has_sink: Tensor, sink_slot: Tensor, usize: Tensor, tol2: Tensor, mu: Tensor,
                c_lo: Tensor, c_hi: Tensor, n: Tensor, k: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Precision, recall and F bounds (K, R) of one N (``_bound_keys``), ``k`` = min(N, W)
    selected slots: one pass over the W first keys and one over all T. Written for
    broadcasting: ``_bound_columns_fused`` calls it with an N dimension added."""
    sink_sel = has_sink & (sink_slot < n)
    sink_uns = has_sink & ~sink_sel
    a0_sel = torch.where(sink_sel, a0, 0.0)
    selected = slots < k
    low = torch.where(selected,
                      low_base - two_a_top * (mu * s - c_lo * a0_sel)[..., None], math.inf)
    low_sink = a0 * a0 + 2.0 * c_lo * a0 * s
    up_sink = 2.0 * c_hi * a0 * s - a0 * a0
    # U of the unselected keys (-inf at the others), read by a maximum and, against the
    # precision threshold, a count. The count is written on the unmasked values, not on
    # U itself, so that the compiler computes U within each pass instead of storing a
    # (K, R, NN, T) buffer between them (1.6x faster at T = 1024); a masked key counts
    # where -inf >= the threshold, as it would in U
    unselected = open_keys & (rank >= k)
    up_open = two_a * (mu * s + c_hi * a0_sel)[..., None] - a_sq
    max_u = torch.where(unselected, up_open, -math.inf).amax(-1)
    min_low = torch.minimum(low.amin(-1), torch.where(sink_sel, low_sink, math.inf))
    max_up = torch.maximum(max_u, torch.where(sink_uns, up_sink, -math.inf))
    p_thr = min_low - tol2
    p_cnt = (torch.where(unselected, up_open >= p_thr[..., None],
                         (p_thr == -math.inf)[..., None]).sum(-1)
             + (sink_uns & (up_sink >= p_thr)))
    r_thr = max_up + tol2
    r_cnt = ((selected & (low > r_thr[..., None])).sum(-1) - sink_sel.to(torch.int64)
             + (sink_sel & (low_sink > r_thr)).to(torch.int64))
    valid = usize > n
    r = r_cnt.to(torch.float64) / n
    p = n / (n + p_cnt.to(torch.float64))
    denom = p + r
    f = torch.where(denom > 0, 2 * p * r / torch.where(denom > 0, denom, 1.0), 0.0)
    return (torch.where(valid, p, math.nan), torch.where(valid, r, math.nan),
            torch.where(valid, f, math.nan))


def certified_bounds(
    alpha: Tensor,
    stats: ValueStats,
    kv_of_head: Tensor,
    order: Tensor,
    universe: Tensor,
    n_grid: Sequence[int],
    mu: Tensor,
    c_lo: Tensor,
    c_hi: Tensor,
) -> dict[str, Tensor]:
    """Deterministic lower bounds on Precision, Recall and F per query and N (method §8).

    They hold whenever ``|cos| <= mu`` on non-sink pairs and ``c_lo <= cos(v_0, v_b) <=
    c_hi``; with the constants of :func:`window_constants` they never exceed the measured
    Euclidean metric. The sink is key 0 whenever it is in the universe (the sink-excluded
    variant simply passes a universe without it).

    Shapes: alpha (H, Q, T) float, order (H, Q, T) int64 keys sorted by the selection
    rule with the universe's keys first, universe (H, Q, T) bool, kv_of_head (H,),
    mu / c_lo / c_hi (G,) -> ``precision_bound``, ``recall_bound``, ``f_bound`` each
    (H, Q, NN) float64, NaN where N is invalid (1 <= N < |U| required).

    >>> v = torch.tensor([[[0.1, 0.0], [1.0, 0.0], [0.0, 1.0], [-0.3, -0.3]]])
    >>> st = ValueStats(v)
    >>> alpha = torch.tensor([[[0.1, 0.6, 0.2, 0.1]]])
    >>> order = torch.tensor([[[1, 2, 0, 3]]])
    >>> c = window_constants(st)
    >>> b = certified_bounds(alpha, st, torch.tensor([0]), order,
    ...                      torch.ones(1, 1, 4, dtype=torch.bool), [1, 2], *c)
    >>> b["recall_bound"][0, 0].tolist()
    [1.0, 0.5]
    """
    grid = grid_of(n_grid)
    if alpha.dim() != 3:
        raise ConfigError(f"alpha: expected shape (H, Q, T), got {tuple(alpha.shape)}")
    h, q, t = alpha.shape
    for name, x in (("order", order), ("universe", universe)):
        if tuple(x.shape) != (h, q, t):
            raise ConfigError(f"{name}: expected shape {(h, q, t)}, got {tuple(x.shape)}")
    if tuple(kv_of_head.shape) != (h,):
        raise ConfigError(f"kv_of_head: expected shape ({h},), got {tuple(kv_of_head.shape)}")
    if stats.num_keys != t:
        raise ConfigError(f"stats: expected {t} keys, got {stats.num_keys}")
    g = stats.num_kv_heads
    for name, x in (("mu", mu), ("c_lo", c_lo), ("c_hi", c_hi)):
        shape = tuple(torch.as_tensor(x).shape)
        if shape != (g,):
            raise ConfigError(f"{name}: expected shape ({g},), got {shape}")
    universe = universe.to(torch.bool)
    order = order.to(torch.int64)
    usize = universe.sum(-1)
    slot = torch.arange(t, device=alpha.device)
    if not torch.equal(universe.gather(-1, order), slot < usize[..., None]):
        raise ConfigError("order: expected the universe's keys first in every row, got a row that "
                          "puts a key outside the universe before one inside it")
    top = order[..., : max(1, min(max(grid), t))]
    return {name: x[0] for name, x in bounds_of_top(
        alpha, stats, kv_of_head, top[None], universe, grid, mu, c_lo, c_hi).items()}


def bounds_of_top(
    alpha: Tensor,
    stats: ValueStats,
    kv_of_head: Tensor,
    top: Tensor,
    universe: Tensor,
    n_grid: Sequence[int],
    mu: Tensor,
    c_lo: Tensor,
    c_hi: Tensor,
) -> dict[str, Tensor]:
    """:func:`certified_bounds` of K orders at once, each given by its first keys only.

    top (K, H, Q, W): each row's first W keys in rule order (W at least the largest
    valid N; the topN metrics' ``top``), alpha / universe (H, Q, T) shared by the K
    orders. Returns the three bounds, each (K, H, Q, NN). No argument checks: the
    accumulator and :func:`certified_bounds` call it with what they have checked.
    """
    grid = grid_of(n_grid)
    k, h, q, _ = top.shape
    t = alpha.shape[-1]
    kv = kv_of_head.to(alpha.device)
    norms = stats.norms.to(alpha.device)[kv]  # (H, T)
    params = [_as_param(x, norms)[kv][:, None] for x in (mu, c_lo, c_hi)]  # (H, 1)
    # rows in chunks: each N keeps a few (K, H, rows, T) temporaries (eager)
    rows = max(1, temp_bytes(_CHUNK_BYTES) // max(1, 8 * 6 * k * h * t))
    parts = []
    for s in range(0, q, rows):
        sl = slice(s, s + rows)
        a = alpha[:, sl].to(torch.float64) * norms[:, None, :]
        m = a.shape[1]

        def flat(x: Tensor, m: int = m) -> Tensor:  # (K', H, m, ...) -> (K', H m, ...)
            return x.reshape(x.shape[0], h * m, *x.shape[3:])

        got = _bound_keys(flat(a[None]), flat(top[:, :, sl]), flat(universe[None, :, sl]),
                          grid, *(flat(x.expand(1, h, m)) for x in params))
        parts.append([x.reshape(k, h, m, -1) for x in got])
    p, r, f = (torch.cat([part[i] for part in parts], 2) for i in range(3))
    # a window with a non-finite value state has NaN constants: no bound for its rows
    # (NaN thresholds would count nothing and claim P = 1)
    bad = ~(torch.isfinite(params[0]) & torch.isfinite(params[1]) & torch.isfinite(params[2]))
    p, r, f = (x.masked_fill(bad[None, :, :, None], math.nan) for x in (p, r, f))
    return {"precision_bound": p, "recall_bound": r, "f_bound": f}


def inversion_bounds(inversions: Tensor, n: Tensor | int) -> tuple[Tensor, Tensor]:
    """the method's inversion bounds ``P >= N / (N + GInv)``, ``R >= max(0, 1 - GInv / N)``.

    Shapes: inversions (...) float (NaN where undefined, which propagates), n broadcast
    to it (e.g. (NN,) against (K, H, Q, NN)) -> two float64 tensors of the broadcast shape.

    >>> [x.tolist() for x in inversion_bounds(torch.tensor([0.0, 1.0, 4.0]), 2)]
    [[1.0, 0.6666666666666666, 0.3333333333333333], [1.0, 0.5, 0.0]]
    """
    inv = torch.as_tensor(inversions, dtype=torch.float64)
    n = torch.as_tensor(n, dtype=torch.float64, device=inv.device)
    if bool((n < 1).any()):
        raise ConfigError(f"n: expected values >= 1, got {n.tolist()}")
    return n / (n + inv), (1.0 - inv / n).clamp_min(0.0)


def constant_norm_envelope(
    alpha_profile: Tensor,
    n_grid: Sequence[int],
    kappa: Tensor | float,
    mu: Tensor | float,
    sink_cos: Tensor | float | tuple[Tensor | float, Tensor | float],
) -> dict[str, Tensor]:
    """P, R, F envelopes against N in the constant-norm regime (method §8).

    The synthetic row: ``alpha_profile[..., 0]`` is the sink's attention, entries 1..
    the non-sink attention (the accumulator uses the head's mean sink mass and mean
    descending-sorted non-sink profile at the analysed queries); non-sink norms 1 (the
    bound is scale free), sink norm ``1 / kappa``; ``|cos| <= mu`` off the sink and the
    sink cosine fixed at ``sink_cos`` (or bracketed, if a pair ``(c_lo, c_hi)`` is given).
    Selection is the attention rule (descending alpha, ties to the smaller position).

    ``certified`` is P = R = 1 (R = 1 already implies P = 1) and ``largest_certified_n``
    the largest grid N such that every grid N' <= N is certified (0 if the smallest is
    not): the predicted small-N operating regime. NaN parameters give NaN envelopes.

    Shapes: alpha_profile (..., T), kappa / mu / sink_cos broadcast to (...) ->
    ``precision_envelope``, ``recall_envelope``, ``f_envelope`` (..., NN) float64,
    ``certified`` (..., NN) bool, ``largest_certified_n`` (...) int64.

    >>> env = constant_norm_envelope(torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05]),
    ...                              [1, 2, 3], kappa=5.0, mu=0.2, sink_cos=-0.5)
    >>> env["recall_envelope"].tolist(), int(env["largest_certified_n"])
    ([1.0, 0.5, 0.3333333333333333], 1)
    """
    grid = grid_of(n_grid)
    prof = torch.as_tensor(alpha_profile, dtype=torch.float64)
    if prof.dim() < 1 or prof.shape[-1] < 1:
        raise ConfigError(f"alpha_profile: expected shape (..., T) with T >= 1, got "
                          f"{tuple(prof.shape)}")
    if bool((prof < 0).any()):
        raise ConfigError("alpha_profile: expected non-negative attention weights")
    if isinstance(sink_cos, tuple):
        if len(sink_cos) != 2:
            raise ConfigError(
                f"sink_cos: expected a value or a pair (c_lo, c_hi), got {sink_cos!r}"
            )
        c_lo, c_hi = (_as_param(x, prof) for x in sink_cos)
    else:
        c_lo = c_hi = _as_param(sink_cos, prof)
    kappa, mu = _as_param(kappa, prof), _as_param(mu, prof)
    # numpy's broadcast_shapes: torch's imports sympy on first use (~1 s)
    batch = np.broadcast_shapes(*(tuple(x.shape) for x in (prof[..., 0], kappa, mu, c_lo, c_hi)))
    t = prof.shape[-1]
    prof = prof.expand(*batch, t).reshape(-1, t)
    kappa, mu, c_lo, c_hi = (x.expand(batch).reshape(-1) for x in (kappa, mu, c_lo, c_hi))
    norms = torch.ones_like(prof)
    norms[:, SINK] = 1.0 / kappa
    # attention rule: descending alpha, ties to the smaller position (stable sort on -alpha)
    order = torch.sort(-prof, dim=-1, stable=True).indices
    top = order[:, : max(1, min(max(grid), t))]
    p, r, f = (x[0] for x in _bound_keys(
        (prof * norms)[None], top[None], torch.ones_like(prof, dtype=torch.bool)[None], grid,
        mu[None], c_lo[None], c_hi[None]))
    bad = ~((kappa > 0) & torch.isfinite(mu) & torch.isfinite(c_lo)
            & torch.isfinite(c_hi) & torch.isfinite(prof).all(-1))[:, None]
    p, r, f = (torch.where(bad, math.nan, x) for x in (p, r, f))
    certified = (r == 1.0) & (p == 1.0)
    gvals = torch.tensor(grid, dtype=torch.int64, device=prof.device)
    # the grid need not be sorted: "every grid N' <= N" is checked in ascending N
    asc = torch.argsort(gvals)
    run = torch.cumprod(certified[:, asc].to(torch.int64), -1).to(torch.bool)
    largest = torch.where(run, gvals[asc], 0).amax(-1)
    shape = (*batch, len(grid))
    return {
        "precision_envelope": p.reshape(shape),
        "recall_envelope": r.reshape(shape),
        "f_envelope": f.reshape(shape),
        "certified": certified.reshape(shape),
        "largest_certified_n": largest.reshape(batch),
    }


class _BoundsLayer:
    """Sufficient statistics of one layer: pooled sums, a |cos| histogram, the profile."""

    def __init__(self, num_heads: int, bins: int) -> None:
        z = np.zeros
        self.num_heads = num_heads
        self.nonsink_norm_sum = z(num_heads)
        self.nonsink_norm_count = z(num_heads)
        self.sink_norm_sum = z(num_heads)
        self.sink_norm_count = z(num_heads)
        self.cos_hist = z((num_heads, bins))
        self.cos_max = np.full(num_heads, -np.inf)
        self.sink_cos_sum = z(num_heads)
        self.sink_cos_count = z(num_heads)
        self.sink_pos_count = z(num_heads)
        self.sink_neg_count = z(num_heads)
        self.sink_pos_max = z(num_heads)
        self.sink_neg_max = z(num_heads)  # largest |cos| among negative sink cosines
        self.alpha_sink_sum = z(num_heads)
        self.profile_sum = z((num_heads, 0))
        self.query_count = z(num_heads)
        self.max_universe = np.zeros(num_heads, dtype=np.int64)

    def add_profile(self, prof: np.ndarray) -> None:
        width = max(self.profile_sum.shape[1], prof.shape[1])
        self.profile_sum = _pad(self.profile_sum, width) + _pad(prof, width)

    def merge(self, other: _BoundsLayer) -> None:
        for name in ("nonsink_norm_sum", "nonsink_norm_count", "sink_norm_sum",
                     "sink_norm_count", "cos_hist", "sink_cos_sum", "sink_cos_count",
                     "sink_pos_count", "sink_neg_count", "alpha_sink_sum", "query_count"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("cos_max", "sink_pos_max", "sink_neg_max", "max_universe"):
            setattr(self, name, np.maximum(getattr(self, name), getattr(other, name)))
        self.add_profile(other.profile_sum)


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, width - x.shape[1])))


class BoundsAccumulator(Accumulator):
    """Streaming fit of kappa, mu and the sink cosine per head, and the envelope (method §8).

    Fits, pooled over every analysed window of a layer (value statistics counted once
    per (window, layer) however many query chunks arrive):

    - ``kappa`` = mean non-sink value norm / mean sink norm (a ratio of pooled means);
    - ``mu`` = the ``quantile`` (default 0.99) of |cos(v_a, v_b)| over non-sink pairs
      a < b (all pairs, or for T > 363 the fixed sample of 65,536 of ``pairs.py``),
      read from a histogram of ``bins`` equal right-closed bins on [0, 1] and
      reported as the upper edge of the bin where the quantile falls (so it errs high by
      < 1 / bins, and the pairs above it are exactly those in higher bins);
    - ``sink_cos`` = mean of cos(v_0, v_b) over b >= 1.

    Pairs with a zero vector are left out (see module docstring). The envelope uses the
    head's alpha profile: mean sink mass and the mean descending-sorted non-sink
    attention over the analysed queries (zero-padded to the largest universe seen).
    The violations are reported apart, since the first is a quantile by construction:
    ``pair_violation_rate`` is the share of non-sink pairs with |cos| > mu (about
    1 - ``mu_quantile``, up to the histogram's resolution) and ``pair_violation_max``
    the largest excess |cos| - mu over all pairs; ``sink_cos_violation_rate`` the share
    of sink cosines of the opposite sign to a non-zero fitted ``sink_cos`` and
    ``sink_cos_violation_max`` the largest such magnitude (0 when none). ``precision_measured``,
    ``recall_measured``, ``f_measured`` are NaN here: the geometry pass fills them.
    """

    tables = ("bounds",)

    def __init__(self, n_grid: Sequence[int], *, quantile: float = 0.99, bins: int = 1000):
        self.n_grid = grid_of(n_grid)
        if not 0.0 < quantile <= 1.0:
            raise ConfigError(f"quantile: expected 0 < quantile <= 1, got {quantile!r}")
        if int(bins) != bins or bins < 1:
            raise ConfigError(f"bins: expected an integer >= 1, got {bins!r}")
        self.quantile = float(quantile)
        self.bins = int(bins)
        self._layers: dict[int, _BoundsLayer] = {}
        self._seen: set[tuple[int, int]] = set()

    def _layer(self, layer: int, num_heads: int) -> _BoundsLayer:
        return self._layer_state(layer, num_heads, lambda h: _BoundsLayer(h, self.bins))

    def update(self, batch: AttentionBatch) -> None:
        """Add one query chunk (value statistics only on a window's first chunk)."""
        state = self._layer(batch.layer, batch.num_heads)
        key = (batch.layer, batch.window)
        if key not in self._seen:
            self._seen.add(key)
            self._add_values(state, batch.stats, batch.kv_of_head.cpu())
        universe = batch.universe()
        rows = finite_rows(batch.alpha, universe) & universe.any(-1)
        universe = universe & rows[..., None]
        alpha = torch.where(universe, batch.alpha, 0.0)
        state.alpha_sink_sum += alpha[..., SINK].to(torch.float64).sum(-1).cpu().numpy()
        # sorted in the input dtype (exact), summed in float64
        rest = sorted_descending(alpha[..., 1:])
        state.add_profile(rest.to(torch.float64).sum(1).cpu().numpy())
        state.query_count += rows.sum(-1).cpu().numpy()
        usize = universe.sum(-1).amax(-1).cpu().numpy()
        state.max_universe = np.maximum(state.max_universe, usize)

    def _add_values(self, state: _BoundsLayer, stats: ValueStats, kv: Tensor) -> None:
        """Fold one window's value geometry in (computed on the stats' device)."""
        norms = stats.norms
        dev = norms.device
        g, t = norms.shape

        def host(x: Tensor) -> np.ndarray:
            return x.to(torch.float64).cpu()[kv].numpy()

        state.nonsink_norm_sum += host(norms[:, 1:].sum(-1))
        state.nonsink_norm_count += float(t - 1)
        state.sink_norm_sum += host(norms[:, SINK])
        state.sink_norm_count += 1.0
        if t < 2:
            return
        nz = norms > 0
        _, _, pair_cos, pair_ok = stats.sampled_pairs()  # (G, P)
        abs_cos = pair_cos.abs()
        # right-closed bins (b / B, (b + 1) / B]: |cos| lands in bin ceil(B |cos|) - 1
        idx = (torch.ceil(abs_cos * self.bins) - 1).clamp(0, self.bins - 1).to(torch.int64)
        flat = idx + self.bins * torch.arange(g, device=dev)[:, None]
        flat = flat.reshape(-1) if bool(pair_ok.all()) else flat[pair_ok]
        hist = torch.bincount(flat, minlength=g * self.bins).reshape(g, self.bins)
        state.cos_hist += host(hist)
        if t > 2:
            state.cos_max = np.maximum(state.cos_max, host(stats.nonsink_coherence()))
        sink_ok = nz[:, 1:] & nz[:, SINK : SINK + 1]
        sc = stats.sink_cosines()
        pos = sink_ok & (sc > 0)
        neg = sink_ok & (sc < 0)
        state.sink_cos_sum += host(torch.where(sink_ok, sc, 0.0).sum(-1))
        state.sink_cos_count += host(sink_ok.sum(-1))
        state.sink_pos_count += host(pos.sum(-1))
        state.sink_neg_count += host(neg.sum(-1))
        state.sink_pos_max = np.maximum(state.sink_pos_max,
                                        host(torch.where(pos, sc, 0.0).amax(-1)))
        state.sink_neg_max = np.maximum(state.sink_neg_max,
                                        host(torch.where(neg, -sc, 0.0).amax(-1)))

    def merge(self, other: BoundsAccumulator) -> BoundsAccumulator:
        """Add another shard's state (disjoint windows); returns self."""
        self._check_mergeable(other, n_grid=self.n_grid, quantile=self.quantile, bins=self.bins)
        check_disjoint(self._seen, other._seen)
        for layer, st in other._layers.items():
            self._layer(layer, st.num_heads).merge(st)
        self._seen |= other._seen
        return self

    def fits(self) -> dict[int, dict[str, np.ndarray]]:
        """Per layer the fitted (H,) ``kappa``, ``mu``, ``sink_cos``, violation columns."""
        out = {}
        edges = np.arange(1, self.bins + 1, dtype=np.float64) / self.bins
        for layer, st in self._layers.items():
            with np.errstate(divide="ignore", invalid="ignore"):
                mean_ns = st.nonsink_norm_sum / st.nonsink_norm_count
                mean_s = st.sink_norm_sum / st.sink_norm_count
                kappa = np.where(mean_s > 0, mean_ns / np.where(mean_s > 0, mean_s, 1.0), np.nan)
                kappa = np.where(st.sink_norm_count > 0, kappa, np.nan)
                sink_cos = np.where(st.sink_cos_count > 0,
                                    st.sink_cos_sum / np.maximum(st.sink_cos_count, 1), np.nan)
            total = st.cos_hist.sum(-1)
            cum = np.cumsum(st.cos_hist, -1)
            b = np.argmax(cum >= self.quantile * total[:, None] - 1e-9 * total[:, None], -1)
            mu = np.where(total > 0, edges[b], np.nan)
            above = np.where(total > 0, total - cum[np.arange(st.num_heads), b], 0.0)
            excess = np.where(total > 0, np.maximum(st.cos_max - mu, 0.0), 0.0)
            wrong = np.where(sink_cos < 0, st.sink_pos_count,
                             np.where(sink_cos > 0, st.sink_neg_count, 0.0))
            wrong_max = np.where(sink_cos < 0, st.sink_pos_max,
                                 np.where(sink_cos > 0, st.sink_neg_max, 0.0))
            pair_rate = np.where(total > 0, above / np.maximum(total, 1), np.nan)
            pair_max = np.where(total > 0, excess, np.nan)
            scount = st.sink_cos_count
            sink_rate = np.where(scount > 0, wrong / np.maximum(scount, 1), np.nan)
            sink_max = np.where(scount > 0, wrong_max, np.nan)
            out[layer] = {"kappa": kappa, "mu": mu, "sink_cos": sink_cos,
                          "pair_violation_rate": pair_rate, "pair_violation_max": pair_max,
                          "sink_cos_violation_rate": sink_rate,
                          "sink_cos_violation_max": sink_max}
        return out

    def profiles(self) -> dict[int, np.ndarray]:
        """Per layer the (H, T_max) alpha profile of the envelope (column 0 the sink)."""
        out = {}
        for layer, st in self._layers.items():
            width = int(st.max_universe.max(initial=1))
            cnt = np.maximum(st.query_count, 1)[:, None]
            rest = _pad(st.profile_sum, max(width - 1, st.profile_sum.shape[1]))[:, : width - 1]
            prof = np.concatenate([st.alpha_sink_sum[:, None], rest], -1) / cnt
            prof[st.query_count == 0] = np.nan
            out[layer] = prof
        return out

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """Table ``bounds``: one row per (layer, head, n), ordered that way."""
        cols: dict[str, list] = {c: [] for c in BOUNDS_COLUMNS}
        fits, profiles = self.fits(), self.profiles()
        nn = len(self.n_grid)
        for layer in sorted(self._layers):
            fit, prof = fits[layer], profiles[layer]
            h = prof.shape[0]
            env = constant_norm_envelope(torch.from_numpy(np.nan_to_num(prof, nan=0.0)),
                                         self.n_grid, torch.from_numpy(fit["kappa"]),
                                         torch.from_numpy(fit["mu"]),
                                         torch.from_numpy(fit["sink_cos"]))
            no_q = torch.from_numpy(self._layers[layer].query_count == 0)[:, None]
            for name in ("precision_envelope", "recall_envelope", "f_envelope"):
                env[name] = torch.where(no_q, math.nan, env[name])
            env["certified"] = env["certified"] & ~no_q
            env["largest_certified_n"] = torch.where(no_q[:, 0], 0, env["largest_certified_n"])
            rep = lambda x: np.repeat(np.asarray(x), nn)  # noqa: E731
            cols["layer"].append(np.full(h * nn, layer, dtype=np.int64))
            cols["head"].append(rep(np.arange(h, dtype=np.int64)))
            cols["n"].append(np.tile(np.asarray(self.n_grid, dtype=np.int64), h))
            for name in ("kappa", "mu", "sink_cos", *VIOLATION_COLUMNS):
                cols[name].append(rep(fit[name]).astype(np.float64))
            cols["mu_quantile"].append(np.full(h * nn, self.quantile))
            for name in ("precision_envelope", "recall_envelope", "f_envelope", "certified"):
                cols[name].append(env[name].numpy().reshape(-1))
            cols["largest_certified_n"].append(rep(env["largest_certified_n"].numpy()))
            for name in ("precision_measured", "recall_measured", "f_measured"):
                cols[name].append(np.full(h * nn, np.nan))
        return {"bounds": {c: _concat(v, c) for c, v in cols.items()}}


VIOLATION_COLUMNS = (
    "pair_violation_rate", "pair_violation_max", "sink_cos_violation_rate",
    "sink_cos_violation_max",
)
BOUNDS_COLUMNS = (
    "layer", "head", "n", "kappa", "mu", "mu_quantile", "sink_cos", "precision_envelope",
    "recall_envelope", "f_envelope", "certified", "largest_certified_n", "precision_measured",
    "recall_measured", "f_measured", *VIOLATION_COLUMNS,
)

_INT_COLUMNS = {"layer", "head", "n", "largest_certified_n", "position", "n_windows",
                "n_queries"}


def _concat(parts: list, name: str) -> np.ndarray:
    if parts:
        return np.concatenate(parts)
    if name in _INT_COLUMNS:
        return np.zeros(0, dtype=np.int64)
    if name == "certified":
        return np.zeros(0, dtype=bool)
    return np.zeros(0, dtype=np.float64)
