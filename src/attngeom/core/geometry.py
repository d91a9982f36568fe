"""Top-N geometric Precision, Recall, F_N, margin and inversions (method §4, fast as §11).

For a query row with universe U and selected set I (the first N keys of a rule's
order), every metric compares distances D[u] = dist(y_u, s_N) with y_u = alpha_u v_u
and s_N = sum_{i in I} y_i. Nothing here materialises y:

    <v_u, s_N> = sum_{k < N} alpha_{sigma(k)} <v_u, v_{sigma(k)}>
    ||s_N||^2 = sum_{k < N} alpha_{sigma(k)} <v_{sigma(k)}, s_N>
    g[u]      = 2 alpha_u <v_u, s_N> - alpha_u^2 ||v_u||^2 = ||s_N||^2 - D[u]^2

and every comparison the metrics make is a comparison of a "closeness" score with
the sign flipped: g for the Euclidean distance (never D, which loses the small
alphas to cancellation, method §11), the cosine similarity for the cosine distance.
Only the first N_max keys of each row's order matter (found by a partial selection,
ties to the smaller position); ``<v_u, s_N>`` comes one of two ways, both in float64
(they round differently, so exact ties can fall either way), whichever costs less for
a rule's rows at hand (decided from the rule's own row count, so a rule gets the same
path whatever other rules share its pass):

- **direct** (few rows, e.g. one ``final`` query per window): the aggregates s_N for
  every N of the grid are a cumulative sum of the N_max selected value rows, and
  ``<v_u, s_N>`` for every u is one product ``V s_N``; nothing of size T x T is made;
- **Gram** (many rows, ``all`` or a dense ``stride``): the value Gram matrix of the
  row's kv head, computed once per window and kv head, is read at the N_max selected
  columns and summed cumulatively, O(T * N_max) per row.

The comparisons and counts (``core/kernels.py``) are exact, so their compiled and
plain versions agree bit for bit. Rows are processed in chunks that bound memory.

Shapes: alpha (H, Q, T), values (G, T, d) with H % G == 0 (query head h reads kv
head h // (H // G)); results (K, H, Q, NN) with K the random repeats (1 otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
from attngeom.core.random_control import random_members
from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, METRICS, RULES, VARIANTS

COSINE_EPS = 1e-12
_INT64_MAX = torch.iinfo(torch.int64).max
_CHUNK_BYTES = 192 * 2**20
_CANCEL = 16 * torch.finfo(torch.float64).eps


@dataclass
class TopNMetrics:
    """Per-row metrics of one rule and distance; NaN (and ``valid`` False) where undefined.

    ``top`` holds each row's first N_max keys in rule order (entries past the row's
    universe size are padding), ``universe`` each row's keys (H, Q, T),
    ``sink_selected`` whether position 0 is in I_N, ``nonfinite`` the rows skipped
    for non-finite alpha or values.
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
    top: Tensor
    universe: Tensor
    n_grid: tuple[int, ...]
    # (len(METRICS), K, H, Q, NN): the metrics in ``METRICS`` order in one tensor, of
    # which the fields above are views (so that the accumulator sums them in one pass)
    stacked: Tensor = field(repr=False)

    def metric(self, name: str) -> Tensor:
        return getattr(self, name)

    @property
    def order(self) -> Tensor:
        """(K, H, Q, T) a full order consistent with ``top`` (see :func:`full_order`)."""
        return full_order(self.top, self.universe)


def full_order(top: Tensor, universe: Tensor) -> Tensor:
    """(..., T) int64: ``top`` first, then the rest of the universe, then the other keys.

    Every metric and bound of N <= N_max depends on the order only through I_N (the
    first N keys) and the universe; past N_max this completes the order by position.
    ``top`` (..., N_max), ``universe`` broadcastable to (..., T) bool.

    >>> full_order(torch.tensor([[2, 0]]), torch.tensor([[True, False, True, True]]))
    tensor([[2, 0, 3, 1]])
    """
    t = universe.shape[-1]
    nmax = top.shape[-1]
    universe = universe.expand(*top.shape[:-1], t)
    in_top = torch.zeros_like(universe).scatter_(-1, top, True) & universe
    c = in_top.sum(-1, keepdim=True)  # the universe keys in ``top`` fill its first c slots
    rest = universe & ~in_top
    outside = ~universe
    # each key's place in the order, without a sort: O(T) per row
    rank = torch.where(rest, c + rest.cumsum(-1) - 1,
                       universe.sum(-1, keepdim=True) + outside.cumsum(-1) - 1)
    slots = torch.arange(nmax, device=top.device).expand_as(top)
    rank = rank.scatter(-1, top, torch.where(universe.gather(-1, top), slots,
                                             rank.gather(-1, top)))
    pos = torch.arange(t, device=top.device).expand_as(rank)
    return torch.empty_like(rank).scatter_(-1, rank, pos)


def check_rule_distance(rule: str, distance: str) -> None:
    if rule not in RULES:
        raise ConfigError(f"rule: expected one of {', '.join(RULES)}, got {rule!r}")
    if distance not in DISTANCES:
        raise ConfigError(f"distance: expected one of {', '.join(DISTANCES)}, got {distance!r}")


def causal_visibility(query_positions: Tensor, num_keys: int) -> Tensor:
    """(1, Q, T) bool: key j visible from query t iff j <= t."""
    keys = torch.arange(num_keys, device=query_positions.device)
    return (keys[None, :] <= query_positions[:, None])[None]


def top_keys(score: Tensor, universe: Tensor, nmax: int, *, largest: bool = True) -> Tensor:
    """(..., nmax) int64: the first ``nmax`` universe keys by ``score``, in order.

    Ties go to the smaller position, as a stable sort would order them; keys outside
    the universe come after every universe key (so a row with fewer than ``nmax``
    universe keys ends in padding). A partial selection, not a sort: O(T) per row
    plus a sort of the ``nmax`` winners.

    >>> top_keys(torch.tensor([[0.2, 0.5, 0.2, 0.1]]), torch.ones(1, 4, dtype=torch.bool), 3)
    tensor([[1, 0, 2]])
    """
    t = score.shape[-1]
    nmax = min(int(nmax), t)
    if score.dtype.is_floating_point:
        fill = float("-inf") if largest else float("inf")
    else:
        fill = torch.iinfo(score.dtype).min if largest else torch.iinfo(score.dtype).max
    score = score.masked_fill(~universe, fill)
    # one key more than asked: without ties (the N_max-th score beats the next one, the
    # winners are strictly ordered) the set and its order are unique and topk's are the
    # answer, found without another pass over the row; real attention almost always
    # takes this path
    wide = min(nmax + 1, t)
    best, indices = torch.topk(score, wide, dim=-1, largest=largest, sorted=True)

    def before(a: Tensor, b: Tensor) -> Tensor:
        return a > b if largest else a < b

    if bool(before(best[..., : wide - 1], best[..., 1:]).all()):
        return indices[..., :nmax].contiguous()
    kth = best[..., nmax - 1 : nmax]
    equal = score == kth
    strict = before(score, kth)
    need = nmax - strict.sum(-1, keepdim=True)
    take = strict | (equal & (equal.cumsum(-1) <= need))  # ties: the smallest positions
    place = torch.where(take, take.cumsum(-1) - 1, nmax)  # ascending positions first
    picked = torch.zeros((*score.shape[:-1], nmax + 1), dtype=torch.int64,
                         device=score.device)
    picked.scatter_(-1, place, torch.arange(t, device=score.device).expand_as(place))
    picked = picked[..., :nmax]
    order = torch.sort(score.gather(-1, picked), dim=-1, descending=largest,
                       stable=True).indices  # stable: equal scores keep position order
    return picked.gather(-1, order)


def select_order(
    alpha: Tensor,
    head_norms: Tensor,
    universe: Tensor,
    rule: str,
    nmax: int,
    *,
    repeats: int = 1,
    query_positions: Tensor | None = None,
    seed: int = 0,
    window: int | Tensor = 0,
    layer: int = 0,
    head_index: Tensor | None = None,
) -> Tensor:
    """(K, H, Q, nmax) int64: each row's first ``nmax`` universe keys under a rule (§4).

    Ties go to the smaller position. ``alpha`` is (H, Q, T) float64 with non-finite
    entries already zeroed, ``head_norms`` (H, T) the value norms seen by each query
    head; the random rule's order is drawn by :func:`random_tops`.
    """
    if rule == "random":
        if query_positions is None:
            raise ConfigError("rule 'random' needs query_positions to seed the control")
        h = alpha.shape[0]
        heads = torch.arange(h, device=alpha.device) if head_index is None else head_index
        return random_first_keys({"u": universe}, min(nmax, alpha.shape[-1]), seed=seed,
                                 window=window, layer=layer, heads=heads,
                                 positions=query_positions, repeats=repeats)["u"]
    score = alpha if rule == "attention" else alpha * head_norms[:, None, :]
    return top_keys(score, universe, nmax)[None]


def random_first_keys(universes: dict[str, Tensor], width: int, *, seed: int,
                      window: int | Tensor, layer: int, heads: Tensor, positions: Tensor,
                      repeats: int) -> dict[str, Tensor]:
    """``random_tops`` of every universe in ``universes`` ((H or 1, Q, T) each, alike but
    for key 0), (K, H, Q, width) each, from one shuffle per row; rows in pieces whose
    shuffle temporaries fit the kernels' byte budget."""
    any_u = next(iter(universes.values()))
    h, (q, t) = heads.numel(), any_u.shape[1:]
    steps = width + 1  # one member more: key 0 may be dropped
    per_row = repeats * h * steps * 8 * 8 + h * t * 8  # the shuffle's, a holed row's table
    rows = max(1, temp_bytes(_CHUNK_BYTES) // per_row)
    parts: dict[str, list[Tensor]] = {name: [] for name in universes}
    for s in range(0, q, rows):
        sl = slice(s, s + rows)
        sizes = with_sink(any_u[:, sl]).sum(-1).expand(h, -1)
        members = random_members(seed, window, layer, heads, positions[sl], repeats, sizes,
                                 steps)
        for name, u in universes.items():
            parts[name].append(random_tops(members, u[:, sl], width))
    return {name: torch.cat(p, dim=2) for name, p in parts.items()}


def with_sink(universe: Tensor) -> Tensor:
    """The universe with key 0 put back: what the random control shuffles (§4)."""
    full = universe.clone()
    full[..., 0] = True
    return full


def random_tops(members: Tensor, universe: Tensor, width: int) -> Tensor:
    """(K, H, Q, width) int64: the random orders' first ``width`` keys of ``universe``
    (H or 1, Q, T) from ``members`` (K, H, Q, >= width + 1), the first members of a
    shuffle of ``with_sink(universe)`` (``random_control.random_members``).

    Key 0 is dropped where the universe lacks it, so the sink-excluded universe's order
    is the full one's with the sink taken out (both universes draw the same shuffle).
    Rows with fewer than ``width`` keys end in the smallest keys outside the universe,
    ascending, as :func:`top_keys` pads them.
    """
    k, h, q, _ = members.shape
    t = universe.shape[-1]
    width = min(width, t)
    full = with_sink(universe)
    keys = torch.arange(t, device=universe.device)

    def rows(x: Tensor) -> Tensor:  # (H or 1, Q, T) -> (K, H, Q, T), no copy
        return x[None].expand(k, h, q, t)

    if bool((full == (keys < full.sum(-1, keepdim=True))).all()):  # every row 0..n-1
        pos = members
    else:  # member r of a row is its r-th universe key by position
        table = torch.argsort((~full).to(torch.uint8), dim=-1, stable=True)
        pos = torch.where(members >= 0, rows(table).gather(-1, members.clamp_min(0)), -1)
    inside = (pos >= 0) & rows(universe).gather(-1, pos.clamp_min(0))
    if not bool(inside[..., :width].all()):  # drop the sink (or padding), keep the order
        order = torch.argsort((~inside).to(torch.uint8), dim=-1, stable=True)
        pos = torch.where(inside.gather(-1, order), pos.gather(-1, order), -1)
    pos = pos[..., :width].contiguous()
    short = (universe.sum(-1) < width).expand(h, q)  # rows padded past their universe
    if bool(short.any()):
        outside = torch.argsort(universe.expand(h, q, t)[short].to(torch.uint8), dim=-1,
                                stable=True)  # the keys outside first, ascending
        part = pos[:, short]  # (K, S, width)
        count = (part >= 0).sum(-1, keepdim=True)
        slot = (torch.arange(width, device=pos.device) - count).clamp_min(0)
        pad = outside[None].expand(k, *outside.shape).gather(-1, slot)
        pos[:, short] = torch.where(part >= 0, part, pad)
    return pos


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
    ks = {rule: int(repeats) if rule == "random" else 1 for rule in rules}
    repeats = sum(ks.values())  # the K orders of one pass, every rule's stacked
    if alpha.dim() != 3:
        raise ConfigError(f"alpha: expected shape (H, Q, T), got {tuple(alpha.shape)}")
    if stats is None:
        if values is None:
            raise ConfigError("topn_metrics needs values or stats")
        stats = ValueStats(values.to(alpha.device), queries=alpha.shape[1])
    given = stats  # as passed (non-finite values included), for a split by path below
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
    # each universe as given (often (1, Q, T): shared by the heads), and for every head
    light, universes, sizes = {}, {}, {}
    for variant in variants:
        light[variant] = seen_keys.clone()
        if variant == "no_sink":
            light[variant][..., 0] = False
        universes[variant] = light[variant].expand(h, q, t).clone()
        sizes[variant] = light[variant].sum(-1).expand(h, q)
    # the pass computed in full, and the sink-excluded universe read off it
    first = "full" if "full" in variants else variants[0]
    derived = "no_sink" if first == "full" and "no_sink" in variants else None

    group = h // g
    kv = torch.arange(h, device=device) // group
    head_norms = stats.norms[kv]
    alpha64 = alpha.to(torch.float64)
    # a row is skipped (and counted) when any key of its universe has a non-finite alpha
    # or value state (e.g. an fp16 overflow): its comparisons would be decided by NaN
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
    nmax = max(1, min(max(grid), t))
    grid_t = torch.tensor(grid, device=device, dtype=torch.int64)

    # each rule's path from its own rows per kv head (whole window), as if it were alone
    gram = {rule: path == "gram" or (path is None and _gram_pays(
        ks[rule] * group * stats.queries, t, int(stats.values.shape[-1]), len(grid), nmax,
        g, alpha.device)) for rule in rules}
    if len(set(gram.values())) > 1:  # rules that take different paths: one pass per path
        out: dict[str, dict[str, TopNMetrics]] = {v: {} for v in variants}
        for use in (False, True):
            part = topn_metrics_variants(
                alpha, None, n_grid, rules=[r for r in rules if gram[r] == use],
                variants=variants, distance=distance, visible=visible,
                query_positions=query_positions, repeats=ks.get("random", 1), seed=seed,
                window=window, layer=layer, stats=given, chunk_rows=chunk_rows,
                head_index=head_index, path="gram" if use else "direct")
            for variant in variants:
                out[variant].update(part[variant])
        return {v: {rule: out[v][rule] for rule in rules} for v in variants}
    use_gram = gram[rules[0]]
    if chunk_rows is None:
        per_row = max(1, repeats * h * t * max(nmax, len(grid)) * 8 * 3)
        chunk_rows = max(1, temp_bytes(_CHUNK_BYTES) // per_row)
    # each chunk works on the keys up to the last one any of its rows can see: causal
    # rows see a prefix, so ``all`` queries do about half the work of full rows; keys
    # past it are in no universe and change no order, count or aggregate
    seen = light[first].any(0)  # (Q, T)
    last = torch.where(seen, torch.arange(t, device=device), -1)
    computed = [first] if derived is None else [first, derived]
    # the random orders of every row at once (O(N_max^2) a row, whatever T), both
    # universes from one shuffle; chunks read their rows' first keys off them
    random_top = {}
    if "random" in rules:
        heads = torch.arange(h, device=device) if head_index is None else head_index
        random_top = random_first_keys({v: light[v] for v in computed}, min(nmax + 1, t),
                                       seed=seed, window=window, layer=layer, heads=heads,
                                       positions=query_positions, repeats=ks["random"])
    parts: dict[str, list] = {v: [] for v in computed}
    tops: dict[str, list] = {v: [] for v in computed}
    if derived is not None:
        alone = nonfinite[first] & ~nonfinite[derived]  # a non-finite sink skips full only
    for s in range(0, q, chunk_rows):
        sl = slice(s, s + chunk_rows)
        tk = max(1, int(last[sl].amax()) + 1)
        sub = stats.key_prefix(tk, with_gram=use_gram)
        width = min(nmax, tk)
        chunk = {v: (alphas[v][:, sl, :tk], None, universes[v][:, sl, :tk]) for v in computed}

        def orders(variant: str, n: int, sl: slice = sl, tk: int = tk,
                   chunk: dict = chunk) -> Tensor:
            a, _, u = chunk[variant]
            return torch.cat([random_top[variant][:, :, sl, :min(n, tk)] if rule == "random"
                              else select_order(a, head_norms[:, :tk], u, rule, n)
                              for rule in rules])

        # with both universes alike but for the sink, and every row longer than the first
        # keys, the full order's first width + 1 keys give both (``_without_sink``)
        extend = (derived is not None and alphas[derived] is alphas[first]
                  and int(chunk[first][2].sum(-1).amin()) > width)
        top = orders(first, nmax + 1 if extend else nmax)
        if derived is not None:
            top_d = _without_sink(top, width) if extend else orders(derived, nmax)
            chunk[derived] = (chunk[derived][0], top_d, chunk[derived][2])
        chunk[first] = (chunk[first][0], top[..., :width], chunk[first][2])
        for variant in computed:
            tops[variant].append(_pad_top(chunk[variant][1], nmax, tk))
        sink_rows = None
        if derived is not None:
            top, u = chunk[first][1], chunk[first][2]
            holds_sink = (top == 0).any(-1) & u[None, :, :, 0]  # padding is outside U
            sink_rows = (*chunk[derived], holds_sink | alone[None, :, sl])
        own, read_off = _metrics_rows(*chunk[first], sub, group, grid, min(nmax, tk),
                                      distance, use_gram, sink_rows)
        parts[first].append(own)
        if derived is not None:
            parts[derived].append(read_off)
    trivial = (grid_t == 1) & (distance == "euclidean")
    results: dict[str, dict[str, TopNMetrics]] = {}
    for variant in computed:
        top = torch.cat(tops[variant], dim=2)
        out = {name: torch.cat([p[name] for p in parts[variant]], dim=2)
               for name in parts[variant][0]}
        usize = sizes[variant]
        valid = ((grid_t >= 1) & (grid_t[None, None, :] < usize[..., None])
                 & ~nonfinite[variant][..., None])
        # NaN where N is invalid, once for every rule's orders (the rules share the rows)
        filled = torch.stack([out[name] for name in METRICS]).masked_fill_(~valid, float("nan"))
        results[variant], start = {}, 0
        for rule in rules:
            sl = slice(start, start + ks[rule])
            start += ks[rule]
            mine = valid[None].expand(ks[rule], h, q, len(grid)).clone()
            stacked = filled[:, sl]
            results[variant][rule] = TopNMetrics(
                **{name: stacked[i] for i, name in enumerate(METRICS)},
                stacked=stacked,
                valid=mine,
                trivial=trivial,
                nonfinite=nonfinite[variant],
                sink_selected=out["sink_selected"][sl] & mine,
                top=top[sl],
                universe=universes[variant],
                n_grid=grid,
            )
    return {variant: results[variant] for variant in variants}


def _without_sink(top: Tensor, width: int) -> Tensor:
    """An order's first ``width`` keys with key 0 taken out, from its first width + 1
    (all in the universe): taking the sink out moves no other key, so these are the
    sink-excluded universe's first keys.

    >>> _without_sink(torch.tensor([[4, 0, 2], [4, 1, 2]]), 2)
    tensor([[4, 2],
            [4, 1]])
    """
    keep = torch.argsort((top == 0).to(torch.uint8), dim=-1, stable=True)[..., :width]
    return top.gather(-1, keep)


def _pad_top(top: Tensor, nmax: int, num_keys: int) -> Tensor:
    """``top`` of a key prefix, padded to ``nmax`` entries as the whole window pads it:
    with the keys past the prefix (in no universe) in position order."""
    missing = nmax - top.shape[-1]
    if missing <= 0:
        return top
    pad = torch.arange(num_keys, num_keys + missing, device=top.device)
    return torch.cat([top, pad.expand(*top.shape[:-1], missing)], dim=-1)


_REDO_PACKS = 24  # the sink-excluded rows redone go in packs of ceil(M / 24) rows, >= 2
_GRAM_BYTES = 64 * 2**20  # the largest Gram matrix of a window the Gram path holds
# one Gram-row element read and added by the compiled ``gram_sums`` costs about as much
# as 4 multiply-adds of a float64 matrix product (measured on CPU, T = 1024, two threads)
_ROW_READ_COST = 4


def _gram_pays(rows: int, t: int, d: int, nn: int, nmax: int, kv_heads: int,
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


def _metrics_rows(
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
    """Metrics of one chunk of rows, (K, H, Q, NN) each; heads are folded into their kv
    group. With ``sink_rows`` (the sink-excluded universe's alpha, order and universe,
    and which (K, H, Q) rows hold the sink among their first keys) the second result is
    that universe's: read off this pass's counts, and computed anew for those rows.

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
        return {name: fd.unfold(x) for name, x in _scores(raw, grid, distance).items()}

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
    """The counts behind the metrics of folded rows (G, M, ·) -> (G, M, NN) each, with
    ``||s_N||^2`` and whether the sink is selected (``_scores`` turns them into metrics,
    once per chunk: elementwise, so the same bits as per piece); with ``drop_first``
    also those with key 0 taken out of the universe (valid for the rows whose first
    keys miss it)."""
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
    if distance == "euclidean" and fuses_float(device):  # scores never stored
        counts = counting_euclidean()(inner, alpha_m, stats.sq_norms, univ_m.reshape(g * m, t),
                                      top_m.reshape(g * m, nmax), grid, drop)
        counts = [x.reshape(g, m, len(grid)) for x in counts]
    else:
        counts = _counts_in_blocks(inner, s2, alpha_m, univ_m, top_m, stats, grid, distance,
                                   drop)
    # ``own`` and ``read_off`` share tensors (``s2``, ``cmin``): ``_metrics_rows`` joins
    # each into fresh ones (``torch.cat``) before ``_redo_sink_rows`` writes into them
    own = dict(zip(_COUNTS, counts[:5], strict=True))
    own["s2"] = s2
    own["sink_selected"] = (sink_slot < grid_t) & univ_m[..., 0, None]
    if not drop_first:
        return own, None
    read_off = dict(zip(_COUNTS, (counts[0], *counts[5:]), strict=True))
    read_off["s2"] = s2
    read_off["sink_selected"] = torch.zeros_like(own["sink_selected"])
    return own, read_off


_COUNTS = ("cmin", "cmax", "intruders", "clears", "inversions")  # what ``_scores`` reads


# bytes per (row, N, key) the plain counting holds beside the scores: its unselected
# copy (8) and comparisons (1), and some slack (with N past 32 and few N, its sorted
# thresholds add 16 / NN)
_PLAIN_COUNT_BYTES = 12


def _counts_in_blocks(inner: Tensor, s2: Tensor, alpha_m: Tensor, univ_m: Tensor,
                      top_m: Tensor, stats: ValueStats, grid: tuple[int, ...],
                      distance: str, drop: bool) -> list[Tensor]:
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
    parts = [counting()(*(x[s : s + block] for x in rows), grid, drop)
             for s in range(0, r, block)]
    return [torch.cat([p[i] for p in parts]).reshape(g, m, nn) for i in range(len(parts[0]))]


def _scores(raw: dict[str, Tensor], grid: tuple[int, ...], distance: str
            ) -> dict[str, Tensor]:
    """P, R, F, margin and inversions (float64), and ``sink_selected``, from the counts
    of each row and N (``_metrics_folded``)."""
    cmin, cmax, intruders, clears, inversions = (raw[name] for name in _COUNTS)
    s2 = raw["s2"]
    grid_t = torch.tensor(grid, device=s2.device, dtype=torch.int64)
    dtype = s2.dtype
    nf = grid_t.to(dtype)[None, None, :]
    precision = nf / (nf + intruders.to(dtype))
    recall = clears.to(dtype) / nf
    denom = precision + recall
    f_score = torch.where(denom > 0, 2 * precision * recall / denom.clamp_min(1e-300), 0.0)
    if distance == "euclidean":
        # rho_min - rho_max without subtracting two nearly equal distances
        rho_min = (s2 - cmax).clamp_min(0).sqrt()
        rho_max = (s2 - cmin).clamp_min(0).sqrt()
        spread = rho_min + rho_max
        margin = torch.where(spread > 0, (cmin - cmax) / spread.clamp_min(1e-300), 0.0)
    else:
        margin = cmin - cmax
    return {"precision": precision, "recall": recall, "f_score": f_score, "margin": margin,
            "inversions": inversions.to(dtype), "sink_selected": raw["sink_selected"]}


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
