"""The exact quantities behind the metrics of chunks of rows (method §4, fast as §11).

For a query row with universe U and selected set I (the first N keys of a rule's
order), every metric compares distances D[u] = dist(y_u, s_N) with y_u = alpha_u v_u
and s_N = sum_{i in I} y_i. Nothing here materialises y:

    <v_u, s_N> = sum_{k < N} alpha_{sigma(k)} <v_u, v_{sigma(k)}>
    ||s_N||^2 = sum_{k < N} alpha_{sigma(k)} <v_{sigma(k)}, s_N>
    g[u]      = 2 alpha_u <v_u, s_N> - alpha_u^2 ||v_u||^2 = ||s_N||^2 - D[u]^2

and every comparison the metrics make is a comparison of a "closeness" score with
the sign flipped: g for the Euclidean distance (never D, which loses the small
alphas to cancellation, method §11), the cosine similarity for the cosine distance.
``<v_u, s_N>`` comes one of two ways, both in float64 (they round differently, so
exact ties can fall either way), whichever costs less for a rule's rows at hand
(``gram_pays``, decided from the rule's own row count, so a rule gets the same path
whatever other rules share its pass):

- **direct** (few rows, e.g. one ``final`` query per window): the aggregates s_N for
  every N of the grid are a cumulative sum of the N_max selected value rows, and
  ``<v_u, s_N>`` for every u is one product ``V s_N``; nothing of size T x T is made;
- **Gram** (many rows, ``all`` or a dense ``stride``): the value Gram matrix of the
  row's kv head, computed once per window and kv head, is read at the N_max selected
  columns and summed cumulatively, O(T * N_max) per row.

The comparisons and counts (``core/kernels.py``) are exact, so their compiled and
plain versions agree bit for bit; the registered metrics (``core/metrics.py``) are
then elementwise functions of the counts. Rows go through in pieces that bound memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attngeom.core.batch import ValueStats
from attngeom.core.kernels import (
    compile_enabled,
    counting,
    counting_euclidean,
    euclidean_close,
    flat_index,
    fuses_float,
    summing_gram,
    temp_bytes,
    window_bytes,
)
from attngeom.core.metrics import key_counts, metric_values

COSINE_EPS = 1e-12
_CHUNK_BYTES = 192 * 2**20
_CANCEL = 16 * torch.finfo(torch.float64).eps

_REDO_PACKS = 24  # the sink-excluded rows redone go in packs of ceil(M / 24) rows, >= 2
_GRAM_BYTES = 64 * 2**20  # the largest Gram matrix of a window the Gram path holds
# one Gram-row element read and added by the compiled ``gram_sums`` costs about as much
# as 4 multiply-adds of a float64 matrix product (measured on CPU, T = 1024, two threads)
_ROW_READ_COST = 4


def gram_pays(rows: int, t: int, d: int, nn: int, nmax: int, kv_heads: int,
               device: torch.device) -> bool:
    """Whether the Gram path costs less than the direct one for ``rows`` per kv head:
    T^2 d once plus T N_max Gram-row reads per row (weighted by ``_ROW_READ_COST``),
    against T d NN multiply-adds per row; and only where it is cheap and fits.

    Only on CPU, where ``gram_sums`` compiles to exact fused C++ (elsewhere it would run
    as N_max plain passes, and a float64 product is the cheaper way), and only when the
    window's (G, T, T) float64 Gram matrix takes at most ``_GRAM_BYTES`` (64 MB: T = 1024
    with up to 8 kv heads; a longer window takes the direct path). The two paths round
    apart (exact ties may fall either way), so the choice depends on the window's shapes
    and the device alone: never on the chunk, the batch or the memory budget, which
    change no table."""
    if device.type != "cpu" or kv_heads * t * t * 8 > window_bytes(_GRAM_BYTES):
        return False
    return t * t * d + _ROW_READ_COST * rows * t * nmax < rows * t * d * nn


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

    def fold_rows(self, x: Tensor) -> Tensor:
        """(H, Q, ...) shared by the K orders -> (G, M, ...)."""
        return self.fold(x[None].expand(self.k, *x.shape))


def chunk_metrics(
    alpha: Tensor,
    top: Tensor,
    universe: Tensor,
    stats: ValueStats,
    group: int,
    grid: tuple[int, ...],
    nmax: int,
    distance: str,
    use_gram: bool,
    sink_rows: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """The registered metrics (and ``sink_selected``) of one chunk of rows, (K, H, Q, NN)
    each; heads are folded into their kv group. With ``sink_rows`` (the sink-excluded
    universe's alpha, order and universe, and which (K, H, Q) rows hold the sink among
    their first keys) the second result is that universe's: read off this pass's
    counts, and computed anew for those rows.

    The folded rows go through in pieces whose ``<v_u, s_N>`` (G, rows, NN, T) float64
    takes half the kernels' byte budget, so that one ``final`` query's 16 random
    repeats need not hold them all at once. The fused, compiled counting holds one more
    tensor of that size (its unselected copy of the scores); the plain one writes the
    scores into ``<v_u, s_N>``'s buffer and counts in row blocks that take the other
    half (``_counts_in_blocks``). The pieces do not depend on whether the kernels are
    compiled: a matrix product may round by its row count."""
    k, h, q, _ = top.shape
    fd = _Folding(k, h, q, group)
    t = alpha.shape[-1]
    piece = max(1, temp_bytes(_CHUNK_BYTES) // max(1, 2 * 8 * fd.g * len(grid) * t))
    piece = -(-fd.m // -(-fd.m // piece))  # pieces of even size: no row left alone
    rows = (fd.fold_rows(alpha), fd.fold_rows(universe), fd.fold(top))
    if sink_rows is not None:
        redo = fd.fold(sink_rows[3])  # (G, M)
        # the redone rows' inputs, folded only if any row is redone (and alpha, the same
        # tensor in both universes unless a non-finite sink differs, folded once)
        rows_d = None if not bool(redo.any()) else (
            rows[0] if sink_rows[0] is alpha else fd.fold_rows(sink_rows[0]),
            fd.fold_rows(sink_rows[2]), fd.fold(sink_rows[1]))
    owns, read_offs = [], []
    for s in range(0, fd.m, piece):
        sl = slice(s, s + piece)
        # one piece: the folded tensors themselves (a view would be copied again on its
        # way into a compiled kernel)
        mine = rows if piece >= fd.m else tuple(x[:, sl] for x in rows)
        own, read_off = _metrics_folded(*mine, stats, grid, nmax, distance, use_gram,
                                        drop_first=sink_rows is not None)
        owns.append(own)
        if sink_rows is not None:
            read_offs.append(read_off)

    def joined(parts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        return {name: torch.cat([p[name] for p in parts], dim=1) for name in parts[0]}

    def finished(raw: dict[str, Tensor]) -> dict[str, Tensor]:
        values = metric_values(raw, grid, distance)
        values["sink_selected"] = raw["sink_selected"]
        return {name: fd.unfold(x) for name, x in values.items()}

    if not read_offs:
        return finished(joined(owns)), None
    read_off = joined(read_offs)
    if rows_d is not None:  # the rows redone, gathered from every piece: fewer packs
        _redo_sink_rows(read_off, redo, rows_d, stats, grid, nmax, distance, use_gram,
                        piece)
    return finished(joined(owns)), finished(read_off)


def _redo_sink_rows(read_off: dict[str, Tensor], redo: Tensor, rows: tuple[Tensor, ...],
                    stats: ValueStats, grid: tuple[int, ...], nmax: int, distance: str,
                    use_gram: bool, piece: int) -> None:
    """Overwrite, in ``read_off`` (G, M, NN), the sink-excluded counts of the rows marked
    in ``redo`` (G, M) with a pass of their own over ``rows`` (their folded alpha,
    universe and order), in packs of at most ``piece`` rows per kv head (but at least
    2: with pieces of one row a pack holds two)."""
    if not bool(redo.any()):
        return
    # each kv head's rows to redo first (stable: in row order), in packs of a width set
    # by M (and the piece) alone, never by the data: a row's products then come from a
    # call of the same shape whatever else the batch holds (pack slots past a head's
    # count hold rows that are not redone; their results are dropped). Narrow packs:
    # few rows hold the sink but those of the deterministic rules on a model with one
    # (2 of 18 orders with final queries), and an unused slot costs a whole row.
    g, m = redo.shape
    count = redo.sum(-1, keepdim=True)
    # not 1: a size-1 dim is a new graph
    width = min(m, max(2, min(piece, -(-m // _REDO_PACKS))))
    packs = -(-int(count.max()) // width)
    order = torch.argsort((~redo).to(torch.uint8), dim=-1, stable=True)
    if packs * width > m:
        order = torch.cat([order, order[:, : packs * width - m]], dim=1)
    heads = torch.arange(g, device=redo.device)[:, None]
    for p in range(packs):
        pack = order[:, p * width : (p + 1) * width]
        keep = torch.arange(p * width, (p + 1) * width, device=pack.device) < count

        def pick(x: Tensor, pack: Tensor = pack) -> Tensor:
            index = pack.reshape(*pack.shape, *(1,) * (x.dim() - 2))
            return x.gather(1, index.expand(*pack.shape, *x.shape[2:]))

        again, _ = _metrics_folded(*(pick(x) for x in rows), stats, grid, nmax, distance,
                                   use_gram, drop_first=False)
        at = (heads.expand_as(pack)[keep], pack[keep])
        for name, x in again.items():
            read_off[name][at] = x[keep]


def _metrics_folded(
    alpha_m: Tensor,
    univ_m: Tensor,
    top_m: Tensor,
    stats: ValueStats,
    grid: tuple[int, ...],
    nmax: int,
    distance: str,
    use_gram: bool,
    *,
    drop_first: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """The exact quantities behind the metrics of folded rows (G, M, ·) -> (G, M, NN)
    each (``core/metrics.py``): the kernels' counts, ``||s_N||^2`` (``s2``), |U|
    (``size``, (G, M)) and whether the sink is selected (``metric_values`` turns them
    into metrics, once per chunk: elementwise, so the same bits as per piece); with
    ``drop_first`` also those with key 0 taken out of the universe (valid for the rows
    whose first keys miss it)."""
    g, m, t = alpha_m.shape
    device = alpha_m.device
    usize = univ_m.sum(-1)
    in_u = torch.arange(nmax, device=device) < usize[..., None]  # padding past |U|
    a_top = torch.gather(alpha_m, -1, top_m) * in_u
    grid_t = torch.tensor(grid, device=device, dtype=torch.int64)

    if use_gram:
        inner, s2 = _inner_gram(stats, top_m, a_top, grid, nmax)
    else:
        inner, s2 = _inner_direct(stats, top_m, a_top, grid, nmax)
    if distance == "cosine":
        # An aggregate that cancels exactly (e.g. two equal alphas on opposite values) is
        # left with rounding noise of order N eps (sum alpha ||v||)^2, and every cosine to
        # it would be decided by that noise; call it zero, as exact arithmetic does. (The
        # Euclidean comparisons need no such care: there the noise is negligible against
        # alpha^2 ||v||^2.)
        lengths = a_top * torch.gather(stats.norms[:, None].expand(g, m, t), -1, top_m)
        kmask = (torch.arange(nmax, device=device)[:, None] < grid_t[None, :]).to(alpha_m.dtype)
        scale = (lengths[:, :, None, :] * kmask.T).sum(-1)
        limit = _CANCEL * grid_t.to(alpha_m.dtype)[None, None, :] * scale * scale
        degenerate = s2 <= limit
        s2 = s2.masked_fill(degenerate, 0.0)
        inner = inner.masked_fill(degenerate[..., None], 0.0)

    # the sink's place in the order (N_max when it is not among the first N_max keys)
    sink_slot = torch.where((top_m == 0) & in_u, torch.arange(nmax, device=device),
                            nmax).amin(-1, keepdim=True)
    # compiled, the counts with key 0 dropped are always asked for (O(N) more per row),
    # used or not: one graph per shape family, not two (dynamo limits the graphs)
    drop = drop_first or compile_enabled()
    per_key = key_counts()
    if distance == "euclidean" and fuses_float(device):  # scores never stored
        counts, off = counting_euclidean()(
            inner, alpha_m, stats.sq_norms, univ_m.reshape(g * m, t),
            top_m.reshape(g * m, nmax), grid, drop, per_key)
        counts, off = ({name: x.reshape(g, m, len(grid)) for name, x in c.items()}
                       if c is not None else None for c in (counts, off))
    else:
        counts, off = _counts_in_blocks(inner, s2, alpha_m, univ_m, top_m, stats, grid,
                                        distance, drop, per_key)
    # ``own`` and ``read_off`` share tensors (``s2``, ``cmin``): ``chunk_metrics`` joins
    # each into fresh ones (``torch.cat``) before ``_redo_sink_rows`` writes into them
    own = {**counts, "s2": s2, "size": usize,
           "sink_selected": (sink_slot < grid_t) & univ_m[..., 0, None]}
    if not drop_first:
        return own, None
    read_off = {**off, "s2": s2, "size": usize - univ_m[..., 0].to(usize.dtype),
                "sink_selected": torch.zeros_like(own["sink_selected"])}
    return own, read_off


# bytes per (row, N, key) the plain counting holds beside the scores: its unselected
# copy (8) and comparisons (1), and some slack (with N past 32 and few N, its sorted
# thresholds add 16 / NN)
_PLAIN_COUNT_BYTES = 12


def _counts_in_blocks(inner: Tensor, s2: Tensor, alpha_m: Tensor, univ_m: Tensor,
                      top_m: Tensor, stats: ValueStats, grid: tuple[int, ...],
                      distance: str, drop: bool, per_key: tuple = ()
                      ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """The counts of folded rows, (G, M, NN) each, with the closeness scores computed
    plain into ``inner``'s own buffer (which this overwrites; the same operations on the
    same operands as the fused kernel, so the same bits). Uncompiled, the counting goes
    through the rows in blocks whose temporaries take half the kernels' byte budget;
    counts and extremes are exact, so blocks change nothing."""
    g, m, nn, t = inner.shape
    if distance == "euclidean":
        close = euclidean_close(inner, alpha_m, stats.sq_norms, out=inner)
    else:
        a = alpha_m[:, :, None, :]
        close = torch.mul(a, inner, out=inner)
        lengths = (a * stats.norms[:, None, None, :])[:, :, 0]  # (G, M, T)
        root = s2.clamp_min(0).sqrt()
        for c in range(nn):  # a denominator of one N at a time, not (G, M, NN, T)
            close[:, :, c].div_((lengths * root[:, :, c, None]).add_(COSINE_EPS))
    r = g * m
    rows = (close.reshape(r, nn, t), univ_m.reshape(r, t), top_m.reshape(r, -1))
    block = r if compile_enabled() else max(
        1, temp_bytes(_CHUNK_BYTES) // max(1, 2 * _PLAIN_COUNT_BYTES * nn * t))
    parts = [counting()(*(x[s : s + block] for x in rows), grid, drop, per_key)
             for s in range(0, r, block)]

    def joined(i: int) -> dict[str, Tensor] | None:
        if parts[0][i] is None:
            return None
        return {name: torch.cat([p[i][name] for p in parts]).reshape(g, m, nn)
                for name in parts[0][i]}

    return joined(0), joined(1)


def _inner_direct(stats: ValueStats, top: Tensor, a_top: Tensor, grid, nmax: int):
    """``<v_u, s_N>`` (G, M, NN, T) and ``||s_N||^2`` (G, M, NN) from the aggregates."""
    v = stats.values64  # (G, T, d)
    g, m, _ = top.shape
    d = v.shape[-1]
    t = v.shape[1]
    rows = v.reshape(g * t, d).index_select(0, flat_index(top, t).reshape(-1))
    rows = rows.reshape(g, m, nmax, d)
    partial = torch.cumsum(a_top[..., None] * rows, dim=2)
    at = torch.tensor([max(0, min(n, nmax) - 1) for n in grid], device=v.device)
    s = partial.index_select(2, at)  # (G, M, NN, d): s_N
    inner = torch.matmul(s.reshape(g, -1, d), v.transpose(-1, -2)).reshape(g, m, len(grid), -1)
    return inner, (s * s).sum(-1)


def _inner_gram(stats: ValueStats, top: Tensor, a_top: Tensor, grid, nmax: int):
    """The same from rows of the value Gram matrix (``kernels.gram_sums``): each row's
    first keys padded to the grid's largest N (key 0 with alpha 0, which adds exact
    zeros), and the sums read at steps set by the grid and the window alone, so that a
    compiled kernel serves every chunk width with one graph (its steps are constants of
    the graph; a step per width would compile a graph per width)."""
    whole = stats.whole_gram  # (G, T_window, T_window)
    g, m, _ = top.shape
    k = min(max(grid), whole.shape[-1])
    if nmax < k:
        top = torch.cat([top, top.new_zeros(g, m, k - nmax)], dim=-1)
        a_top = torch.cat([a_top, a_top.new_zeros(g, m, k - nmax)], dim=-1)
    steps = tuple(max(0, min(n, k) - 1) for n in grid)
    inner = summing_gram()(whole, top, a_top, steps, stats.num_keys)  # (G, M, NN, T)
    sel = top[:, :, None, :nmax].expand(g, m, len(grid), nmax)
    kmask = (torch.arange(nmax, device=top.device)[:, None]
             < torch.tensor(grid, device=top.device)[None, :])
    weights = a_top[:, :, None, :nmax] * kmask.T.to(a_top.dtype)  # alpha_sigma(k) [k < N]
    s2 = (torch.gather(inner, -1, sel) * weights).sum(-1)
    return inner, s2
