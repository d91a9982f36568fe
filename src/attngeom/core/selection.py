"""The first keys of each row's order under a selection rule (method §4).

Every metric and bound of N <= N_max depends on a rule's order only through its first
N_max keys (I_N for every N of the grid) and the universe, so this finds those by a
partial selection (ties to the smaller position), never a full sort; the random
control's orders come from one shuffle per row (``core/random_control.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attngeom.core.kernels import temp_bytes
from attngeom.core.random_control import random_members
from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, RULES

_CHUNK_BYTES = 192 * 2**20  # the shuffle temporaries of one piece of rows


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


def without_sink(top: Tensor, width: int) -> Tensor:
    """An order's first ``width`` keys with key 0 taken out, from its first width + 1
    (all in the universe): taking the sink out moves no other key, so these are the
    sink-excluded universe's first keys.

    >>> without_sink(torch.tensor([[4, 0, 2], [4, 1, 2]]), 2)
    tensor([[4, 2],
            [4, 1]])
    """
    keep = torch.argsort((top == 0).to(torch.uint8), dim=-1, stable=True)[..., :width]
    return top.gather(-1, keep)


def pad_top(top: Tensor, nmax: int, num_keys: int) -> Tensor:
    """``top`` of a key prefix, padded to ``nmax`` entries as the whole window pads it:
    with the keys past the prefix (in no universe) in position order."""
    missing = nmax - top.shape[-1]
    if missing <= 0:
        return top
    pad = torch.arange(num_keys, num_keys + missing, device=top.device)
    return torch.cat([top, pad.expand(*top.shape[:-1], missing)], dim=-1)
