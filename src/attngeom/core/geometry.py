"""Top-N geometric metrics of attention rows: the public entry points (method §4).

For every analysed row, rule, universe (``variants``) and N of the grid, the metrics
registered in ``core/metrics.py`` (precision, recall, F_N, margin, inversions and any
declared later) compare the distances D[u] = dist(alpha_u v_u, s_N) of the universe's
keys to the aggregate s_N of the first N keys of the rule's order. The work is split
by what it is about:

- ``core/selection.py``: each row's first N_max keys under a rule (partial selection,
  ties to the smaller position; the random control's shuffle);
- ``core/exact_counts.py``: ``<v_u, s_N>`` (direct or Gram path) and the exact counts
  of each row and N, in chunks, with the sink-excluded universe read off the full one;
- ``core/kernels.py``: the exact comparisons and counts, plain or fused and compiled;
- ``core/metrics.py``: each metric, declared once, as a function of those counts.

This module checks the inputs, prepares each universe's rows (non-finite rows
skipped), runs the chunks and assembles a :class:`TopNMetrics` per rule and variant.

Shapes: alpha (H, Q, T), values (G, T, d) with H % G == 0 (query head h reads kv
head h // (H // G)); results (K, H, Q, NN) with K the random repeats (1 otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attngeom.core.batch import ValueStats
from attngeom.core.exact_counts import COSINE_EPS, chunk_metrics, gram_pays
from attngeom.core.kernels import temp_bytes
from attngeom.core.selection import (
    causal_visibility,
    check_rule_distance,
    full_order,
    pad_top,
    random_first_keys,
    select_order,
    top_keys,
    without_sink,
)
from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, METRICS, RULES, VARIANTS

__all__ = [
    "COSINE_EPS", "DISTANCES", "METRICS", "RULES", "VARIANTS", "TopNMetrics",
    "causal_visibility", "check_rule_distance", "full_order", "select_order", "top_keys",
    "topn_metrics", "topn_metrics_rules", "topn_metrics_variants",
]

_CHUNK_BYTES = 192 * 2**20


@dataclass
class TopNMetrics:
    """Per-row metrics of one rule and distance; NaN (and ``valid`` False) where undefined.

    ``stacked`` (len(names), K, H, Q, NN) float64 holds every registered metric, in
    ``names`` order (``names.METRICS`` when computed), so that the accumulator sums
    them in one pass; ``metric(name)`` (or the attribute of that name, e.g.
    ``.precision``) is a view of it. ``top`` holds each row's first N_max keys in rule
    order (entries past the row's universe size are padding), ``universe`` each row's
    keys (H, Q, T), ``sink_selected`` whether position 0 is in I_N, ``nonfinite`` the
    rows skipped for non-finite alpha or values.
    """

    valid: Tensor
    trivial: Tensor
    nonfinite: Tensor
    sink_selected: Tensor
    top: Tensor
    universe: Tensor
    n_grid: tuple[int, ...]
    stacked: Tensor = field(repr=False)
    names: tuple[str, ...] = ()

    def metric(self, name: str) -> Tensor:
        """(K, H, Q, NN) float64: the metric ``name``."""
        try:
            return self.stacked[self.names.index(name)]
        except ValueError:
            raise ConfigError(f"metric: expected one of {', '.join(self.names)}, "
                              f"got {name!r}") from None

    def __getattr__(self, name: str) -> Tensor:  # only for names not found otherwise
        if name.startswith("_") or name in ("names", "stacked"):
            raise AttributeError(name)
        if name in self.names:
            return self.stacked[self.names.index(name)]
        raise AttributeError(f"TopNMetrics has no metric or field {name!r}")

    @property
    def order(self) -> Tensor:
        """(K, H, Q, T) a full order consistent with ``top`` (see :func:`full_order`)."""
        return full_order(self.top, self.universe)


def _grid_tensor(n_grid: Sequence[int]) -> tuple[int, ...]:
    grid = tuple(int(n) for n in n_grid)
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
    path: str | None = None,
) -> TopNMetrics:
    """Geometric P_N, R_N, F_N, margin and inversions of every row and N (method §4).

    ``alpha`` (H, Q, T) probabilities of the analysed rows, ``values`` (G, T, d)
    (or a prepared ``stats``), ``visible`` (H or 1, Q, T) bool (default: causal from
    ``query_positions``, which default to the last Q positions). Returns
    ``TopNMetrics`` with tensors of shape (K, H, Q, NN), float64. Rows of several
    windows may be stacked along the head dimension: then ``window`` and ``head_index``
    give each head row's window and head, which seed the random control. ``path``
    (``"direct"`` or ``"gram"``) forces how ``<v_u, s_N>`` is computed (module
    docstring); both give the same metrics. :func:`topn_metrics_rules` computes several
    rules in one pass.

    >>> a = torch.tensor([[[0.25, 0.5, 0.25]]])   # one head, one query (t = 2), T = 3
    >>> v = torch.tensor([[[1.0], [1.0], [-1.0]]])
    >>> r = topn_metrics(a, v, [1, 2])            # N = 2: I = {1, 0}, s = 0.75
    >>> r.precision[0, 0, 0].tolist(), r.recall[0, 0, 0].tolist(), bool(r.trivial[0])
    ([1.0, 1.0], [1.0, 1.0], True)
    """
    return topn_metrics_rules(
        alpha, values, n_grid, rules=(rule,), distance=distance, visible=visible,
        exclude_sink=exclude_sink, query_positions=query_positions, repeats=repeats,
        seed=seed, window=window, layer=layer, stats=stats, chunk_rows=chunk_rows,
        head_index=head_index, path=path,
    )[rule]


def topn_metrics_rules(
    alpha: Tensor,
    values: Tensor | None,
    n_grid: Sequence[int],
    *,
    rules: Sequence[str] = ("attention",),
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
    path: str | None = None,
) -> dict[str, TopNMetrics]:
    """:func:`topn_metrics` of several rules of the same rows, one result per rule.

    The rules' orders (``repeats`` of them for the random rule, one otherwise) are
    stacked as the K rows of one pass, so the rows' shared work (value norms, chunking,
    one ``<v_u, s_N>`` product and one counting call per chunk) is done once; each
    rule gets the metrics :func:`topn_metrics` gives it alone (a test checks that they
    are equal bit for bit). :func:`topn_metrics_variants` does both universes at once.
    """
    variant = "no_sink" if exclude_sink else "full"
    return topn_metrics_variants(
        alpha, values, n_grid, rules=rules, variants=(variant,), distance=distance,
        visible=visible, query_positions=query_positions, repeats=repeats, seed=seed,
        window=window, layer=layer, stats=stats, chunk_rows=chunk_rows,
        head_index=head_index, path=path,
    )[variant]


def topn_metrics_variants(
    alpha: Tensor,
    values: Tensor | None,
    n_grid: Sequence[int],
    *,
    rules: Sequence[str] = ("attention",),
    variants: Sequence[str] = VARIANTS,
    distance: str = "euclidean",
    visible: Tensor | None = None,
    query_positions: Tensor | None = None,
    repeats: int = 1,
    seed: int = 0,
    window: int | Tensor = 0,
    layer: int = 0,
    stats: ValueStats | None = None,
    chunk_rows: int | None = None,
    head_index: Tensor | None = None,
    path: str | None = None,
) -> dict[str, dict[str, TopNMetrics]]:
    """:func:`topn_metrics_rules` in each universe of ``variants`` ({variant: {rule: ...}}).

    With both universes, one pass serves most rows of the sink-excluded one: removing
    key 0 from the universe changes no other key's place in any rule's order, so a row
    whose first N_max keys (full universe) do not hold the sink keeps them, and with
    them every aggregate and score; its counts are the full universe's with key 0
    taken out, which the counting kernels return alongside (``drop_first``). Only the
    rows whose first keys hold the sink (or whose non-finite sink skips the full row
    alone) get a pass of their own, packed per kv head. Every count equals that of one
    pass per universe (tested); a redone row's margin may differ in its last bits, its
    ``V s_N`` product coming from a call with fewer rows.
    """
    rules, variants, grid = _checked(alpha, rules, variants, distance, path, n_grid)
    ks = {rule: int(repeats) if rule == "random" else 1 for rule in rules}
    if stats is None:
        if values is None:
            raise ConfigError("topn_metrics needs values or stats")
        stats = ValueStats(values.to(alpha.device), queries=alpha.shape[1])
    rows = _Rows.prepare(alpha, stats, variants, visible, query_positions)
    nmax = max(1, min(max(grid), rows.t))
    # each rule's path from its own rows per kv head (whole window), as if it were alone
    gram = {rule: path == "gram" or (path is None and gram_pays(
        ks[rule] * rows.group * stats.queries, rows.t, int(stats.values.shape[-1]),
        len(grid), nmax, rows.g, alpha.device)) for rule in rules}
    if len(set(gram.values())) > 1:  # rules that take different paths: one pass per path
        out: dict[str, dict[str, TopNMetrics]] = {v: {} for v in variants}
        for use in (False, True):
            part = topn_metrics_variants(
                alpha, None, n_grid, rules=[r for r in rules if gram[r] == use],
                variants=variants, distance=distance, visible=visible,
                query_positions=rows.positions, repeats=ks.get("random", 1), seed=seed,
                window=window, layer=layer, stats=stats, chunk_rows=chunk_rows,
                head_index=head_index, path="gram" if use else "direct")
            for variant in variants:
                out[variant].update(part[variant])
        return {v: {rule: out[v][rule] for rule in rules} for v in variants}
    random_top = {}  # the random orders of every row at once, both universes from one shuffle
    if "random" in rules:
        heads = torch.arange(rows.h, device=alpha.device) if head_index is None else head_index
        random_top = random_first_keys({v: rows.light[v] for v in rows.computed},
                                       min(nmax + 1, rows.t), seed=seed, window=window,
                                       layer=layer, heads=heads, positions=rows.positions,
                                       repeats=ks["random"])
    parts, tops = _chunked(rows, rules, grid, nmax, distance, gram[rules[0]], chunk_rows,
                           random_top, sum(ks.values()))
    results = {variant: _assembled(rows, variant, parts[variant], tops[variant], rules, ks,
                                   grid, distance) for variant in rows.computed}
    return {variant: results[variant] for variant in variants}


def _checked(alpha: Tensor, rules: Sequence[str], variants: Sequence[str], distance: str,
             path: str | None, n_grid: Sequence[int]):
    """The arguments checked (one ``ConfigError`` each): rules, variants, grid."""
    rules, variants = tuple(rules), tuple(variants)
    if not rules or len(set(rules)) != len(rules):
        raise ConfigError(f"rules: expected distinct rule names, got {list(rules)}")
    if not variants or len(set(variants)) != len(variants) or not set(variants) <= set(VARIANTS):
        raise ConfigError(
            f"variants: expected distinct names among {', '.join(VARIANTS)}, got {list(variants)}")
    for rule in rules:
        check_rule_distance(rule, distance)
    if path not in (None, "direct", "gram"):
        raise ConfigError(f"path: expected 'direct' or 'gram', got {path!r}")
    grid = _grid_tensor(n_grid)
    if alpha.dim() != 3:
        raise ConfigError(f"alpha: expected shape (H, Q, T), got {tuple(alpha.shape)}")
    return rules, variants, grid


@dataclass
class _Rows:
    """The analysed rows of every universe, ready for the chunks: each universe as given
    (``light``, often (1, Q, T): shared by the heads) and for every head
    (``universes``), its sizes, its alpha (float64, non-finite rows zeroed) and which
    rows are skipped (``nonfinite``); the value stats with non-finite states zeroed and
    each query head's value norms. ``first`` is the universe computed in full,
    ``derived`` the sink-excluded one read off it (or None)."""

    h: int
    q: int
    t: int
    g: int
    group: int
    positions: Tensor
    light: dict[str, Tensor]
    universes: dict[str, Tensor]
    sizes: dict[str, Tensor]
    alphas: dict[str, Tensor]
    nonfinite: dict[str, Tensor]
    stats: ValueStats
    head_norms: Tensor
    first: str
    derived: str | None

    @property
    def computed(self) -> list[str]:
        return [self.first] if self.derived is None else [self.first, self.derived]

    @classmethod
    def prepare(cls, alpha: Tensor, stats: ValueStats, variants: tuple[str, ...],
                visible: Tensor | None, query_positions: Tensor | None) -> _Rows:
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
        seen_keys = visible.to(device=device, dtype=torch.bool)
        light, universes, sizes = {}, {}, {}
        for variant in variants:
            light[variant] = seen_keys.clone()
            if variant == "no_sink":
                light[variant][..., 0] = False
            universes[variant] = light[variant].expand(h, q, t).clone()
            sizes[variant] = light[variant].sum(-1).expand(h, q)
        first = "full" if "full" in variants else variants[0]
        derived = "no_sink" if first == "full" and "no_sink" in variants else None
        group = h // g
        kv = torch.arange(h, device=device) // group
        head_norms = stats.norms[kv]
        alpha64 = alpha.to(torch.float64)
        # a row is skipped (and counted) when any key of its universe has a non-finite
        # alpha or value state (e.g. an fp16 overflow): its comparisons would be decided
        # by NaN
        bad_norm = ~torch.isfinite(head_norms)
        any_bad_norm = bool(bad_norm.any())
        finite = torch.isfinite(alpha)  # as in float64: the cast keeps finiteness
        alphas, nonfinite = {}, {}
        if bool(finite.all()) and not any_bad_norm:  # the usual case: one pass
            for variant in variants:
                nonfinite[variant] = torch.zeros((h, q), dtype=torch.bool, device=device)
                alphas[variant] = alpha64
        else:
            bad = ~finite | bad_norm[:, None, :]
            zeroed = torch.where(finite, alpha64, torch.zeros((), dtype=alpha64.dtype))
            for variant in variants:
                nonfinite[variant] = (bad & universes[variant]).any(-1)
                alphas[variant] = zeroed.masked_fill(nonfinite[variant][..., None], 0.0)
        # any non-finite value state is zeroed, also at keys no row sees: those still pad
        # short rows' orders, and a NaN padding column would poison the Gram path's sums
        if any_bad_norm:
            stats = ValueStats(torch.nan_to_num(stats.values, nan=0.0, posinf=0.0, neginf=0.0),
                               stats.dtype, queries=stats.queries)
            head_norms = stats.norms[kv]
        return cls(h, q, t, g, group, query_positions, light, universes, sizes, alphas,
                   nonfinite, stats, head_norms, first, derived)


def _chunked(rows: _Rows, rules: tuple[str, ...], grid: tuple[int, ...], nmax: int,
             distance: str, use_gram: bool, chunk_rows: int | None,
             random_top: dict[str, Tensor], orders: int):
    """Every chunk of query rows through ``chunk_metrics``: ({variant: [metrics of each
    chunk]}, {variant: [first keys of each chunk]}). ``orders`` is K, every rule's
    orders stacked."""
    if chunk_rows is None:
        per_row = max(1, orders * rows.h * rows.t * max(nmax, len(grid)) * 8 * 3)
        chunk_rows = max(1, temp_bytes(_CHUNK_BYTES) // per_row)
    first, derived = rows.first, rows.derived
    # each chunk works on the keys up to the last one any of its rows can see: causal
    # rows see a prefix, so ``all`` queries do about half the work of full rows; keys
    # past it are in no universe and change no order, count or aggregate
    seen = rows.light[first].any(0)  # (Q, T)
    last = torch.where(seen, torch.arange(rows.t, device=seen.device), -1)
    parts: dict[str, list] = {v: [] for v in rows.computed}
    tops: dict[str, list] = {v: [] for v in rows.computed}
    if derived is not None:  # a non-finite sink skips the full row only
        alone = rows.nonfinite[first] & ~rows.nonfinite[derived]
    for s in range(0, rows.q, chunk_rows):
        sl = slice(s, s + chunk_rows)
        tk = max(1, int(last[sl].amax()) + 1)
        sub = rows.stats.key_prefix(tk, with_gram=use_gram)
        width = min(nmax, tk)
        chunk = {v: [rows.alphas[v][:, sl, :tk], None, rows.universes[v][:, sl, :tk]]
                 for v in rows.computed}

        def orders_of(variant: str, n: int, sl: slice = sl, tk: int = tk,
                      chunk: dict = chunk) -> Tensor:
            a, _, u = chunk[variant]
            return torch.cat([random_top[variant][:, :, sl, :min(n, tk)] if rule == "random"
                              else select_order(a, rows.head_norms[:, :tk], u, rule, n)
                              for rule in rules])

        # with both universes alike but for the sink, and every row longer than the first
        # keys, the full order's first width + 1 keys give both (``without_sink``)
        extend = (derived is not None and rows.alphas[derived] is rows.alphas[first]
                  and int(chunk[first][2].sum(-1).amin()) > width)
        top = orders_of(first, nmax + 1 if extend else nmax)
        if derived is not None:
            chunk[derived][1] = without_sink(top, width) if extend else orders_of(derived, nmax)
        chunk[first][1] = top[..., :width]
        for variant in rows.computed:
            tops[variant].append(pad_top(chunk[variant][1], nmax, tk))
        sink_rows = None
        if derived is not None:
            top, u = chunk[first][1], chunk[first][2]
            holds_sink = (top == 0).any(-1) & u[None, :, :, 0]  # padding is outside U
            sink_rows = (*chunk[derived], holds_sink | alone[None, :, sl])
        own, read_off = chunk_metrics(*chunk[first], sub, rows.group, grid, min(nmax, tk),
                                      distance, use_gram, sink_rows)
        parts[first].append(own)
        if derived is not None:
            parts[derived].append(read_off)
    return parts, tops


def _assembled(rows: _Rows, variant: str, parts: list[dict[str, Tensor]], tops: list[Tensor],
               rules: tuple[str, ...], ks: dict[str, int], grid: tuple[int, ...],
               distance: str) -> dict[str, TopNMetrics]:
    """One universe's chunks joined into a :class:`TopNMetrics` per rule, NaN where N is
    out of the row's range or the row is skipped."""
    h, q = rows.h, rows.q
    grid_t = torch.tensor(grid, device=rows.positions.device, dtype=torch.int64)
    top = torch.cat(tops, dim=2)
    out = {name: torch.cat([p[name] for p in parts], dim=2) for name in parts[0]}
    valid = ((grid_t >= 1) & (grid_t[None, None, :] < rows.sizes[variant][..., None])
             & ~rows.nonfinite[variant][..., None])
    names = tuple(METRICS)
    # NaN where N is invalid, once for every rule's orders (the rules share the rows)
    filled = torch.stack([out[name] for name in names]).masked_fill_(~valid, float("nan"))
    trivial = (grid_t == 1) & (distance == "euclidean")
    results, start = {}, 0
    for rule in rules:
        sl = slice(start, start + ks[rule])
        start += ks[rule]
        mine = valid[None].expand(ks[rule], h, q, len(grid)).clone()
        results[rule] = TopNMetrics(
            valid=mine, trivial=trivial, nonfinite=rows.nonfinite[variant],
            sink_selected=out["sink_selected"][sl] & mine, top=top[sl],
            universe=rows.universes[variant], n_grid=grid, stacked=filled[:, sl], names=names)
    return results
