"""Counter-based randomness for the random-selection control (method §4).

The control must be reproducible bit for bit from the seed and must not depend on
the order in which windows, layers, heads or queries are processed (so that shards
of a data-parallel run merge into the tables of a single run). A stateful
``torch.Generator`` per (seed, window, layer, head, t, k) would need a Python loop
over heads and queries; instead every random number is a pure function of its
coordinates: step i of repeat k of query t draws a 64-bit word hashed from
(seed, window, layer, head, t, k, i).

Only the first N_max keys of a random order are ever used (the sets of size N <=
N_max), so the order is not built in full: a partial Fisher-Yates shuffle of the
universe's members stops after ``width`` steps. Step i swaps member i with member
i + r_i, where r_i is uniform on [0, n - i) (n the universe size), so the first
``width`` entries are those of a uniformly random permutation, and the sets of size N
(its first N entries) are nested in N. The work per row is O(width log width), independent
of the window length: the swaps are resolved from the list of ``width`` draws
(``shuffle_prefix``), never on an array of n members.

The hash is Chris Wellons' ``lowbias32`` integer finaliser, evaluated in int64 with
every product kept below 2**63 (no reliance on signed overflow), chained over the
coordinates; two independent chains give the high and low halves of each word.
Everything is integer arithmetic, so every device and the compiled kernels give the
same draws.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from attngeom.core.kernels import _GOLDEN, _M32, combine, hash32, hashed_positions
from attngeom.names import RANDOM_CONTROL as SCHEME  # noqa: F401 - this module's scheme


def _fold(value: int) -> int:
    """Fold an arbitrary Python int (negative or wider than 32 bits) into 32 bits."""
    value = int(value) & ((1 << 64) - 1)
    return (value ^ (value >> 32)) & _M32


def _fold_coord(values: Tensor, device) -> Tensor:
    """``_fold`` of every entry of a tensor of non-negative indices."""
    v = values.to(device=device, dtype=torch.int64)
    return (v ^ (v >> 32)) & _M32


@functools.lru_cache(maxsize=8)
def _hashed_steps(width: int, device: str) -> Tensor:
    return hashed_positions(torch.arange(width, dtype=torch.int64, device=device))


def row_states(seed: int, window: int | Tensor, layer: int, heads: Tensor, positions: Tensor,
               repeats: int) -> tuple[Tensor, Tensor]:
    """The two hash states of every row, each (repeats, len(heads), len(positions), 1).

    ``heads`` are query-head indices and ``positions`` the query positions t; ``window``
    is one window index, or one per entry of ``heads`` when rows of several windows are
    stacked along the head dimension (the states are the same either way).

    Each chain is ``combine`` over (window, layer, head, t, k) in that order, from
    ``_fold(seed) ^ salt``. The scalar links run on Python ints (``hash32`` and
    ``combine`` take them as they take int64 tensors, with the same bits) and each
    tensor coordinate's own hash (the half of ``combine`` that does not depend on the
    state) is computed once for both chains: a few dozen tensor operations a call,
    where a chain of tensor ``combine`` calls took a few hundred.
    """
    device = heads.device
    heads = heads.to(torch.int64).reshape(-1) & _M32
    positions = positions.to(device=device, dtype=torch.int64).reshape(-1) & _M32
    coords = [heads, positions, torch.arange(repeats, dtype=torch.int64, device=device)]
    per_row = isinstance(window, Tensor)
    if per_row:
        coords.append(_fold_coord(window, device).reshape(-1))
    hashed = hashed_positions(torch.cat(coords)).split([c.numel() for c in coords])
    h_heads, h_pos, h_ks = (hashed[0].reshape(1, -1, 1, 1), hashed[1].reshape(1, 1, -1, 1),
                            hashed[2].reshape(-1, 1, 1, 1))
    layer_link = hash32(_fold(layer) + _GOLDEN)
    states = []
    for salt in (0x243F6A88, 0x85A308D3):
        state = _fold(seed) ^ salt
        if per_row:
            chain = hash32(hash32(hashed[3] ^ state) ^ layer_link).reshape(1, -1, 1, 1)
        else:
            chain = hash32(combine(state, _fold(window)) ^ layer_link)
        chain = hash32(hash32(hash32(h_heads ^ chain) ^ h_pos) ^ h_ks)
        states.append(chain.expand(repeats, heads.numel(), positions.numel(), 1))
    return states[0], states[1]


def uniform_draws(states: tuple[Tensor, Tensor], sizes: Tensor, width: int) -> Tensor:
    """(..., width) int64: step i's draw r_i, uniform on [0, n - i) (0 where n <= i).

    ``states`` from :func:`row_states` (..., 1), ``sizes`` the universe sizes n (...).
    Step i's 64-bit word X = hi 2^32 + lo (hi, lo the two chains hashed with i) becomes
    floor(X (n - i) / 2^64), computed exactly in int64 as
    (hi m + ((lo m) >> 32)) >> 32 with m = n - i < 2^31: every product stays below
    2^63. Each r has probability within (n - i) / 2^64 of 1 / (n - i).

    >>> s = row_states(0, 0, 0, torch.tensor([0]), torch.tensor([9]), 1)
    >>> r = uniform_draws(s, torch.tensor([[[10]]]), 4)
    >>> bool(((r >= 0) & (r < torch.tensor([10, 9, 8, 7]))).all())
    True
    """
    steps = _hashed_steps(width, str(sizes.device))
    hi = hash32(states[0] ^ steps)
    lo = hash32(states[1] ^ steps)
    m = (sizes[..., None] - torch.arange(width, device=sizes.device)).clamp_min(0)
    return (hi * m + ((lo * m) >> 32)) >> 32


def shuffle_prefix(draws: Tensor, sizes: Tensor) -> Tensor:
    """(..., width) int64: the first ``width`` members (indices 0..n-1) of the partial
    Fisher-Yates shuffle that ``draws`` (from :func:`uniform_draws`) describe, and -1
    past n.

    Step i swaps entries i and j_i = i + r_i of the array 0..n-1 and emits the new entry
    i. Entry i is never touched after step i (later j >= later i), so only the entries
    that steps wrote at their j matter: before step i, entry x holds what the latest
    step s < i with j_s = x wrote there (its old entry s), or x itself if none did.
    So step i emits ``held(j_i)`` and moves its old entry ``held(i)``, where a step s's
    moved entry is itself ``held(s)`` before step s: a chain of ever earlier steps that
    ends at an entry no step wrote, whose value is its own index.

    All steps at once, O(width log width) per row: a stable sort of the j puts each
    step after the latest earlier one with the same j; the writers of entry i are the
    steps s != i with j_s = i (all earlier, as j_s >= s), the latest found by one
    scatter; pointer jumping (ceil(log2 width) gathers) follows every chain to its end.
    About twenty tensor operations per call whatever the width (the step-by-step
    swaps are the test's reference).

    >>> shuffle_prefix(torch.tensor([[2, 0, 0]]), torch.tensor([3])).tolist()
    [[2, 1, 0]]
    """
    width = draws.shape[-1]
    lead = draws.shape[:-1]
    rows = lead.numel()
    draws = draws.reshape(rows, width)
    n = sizes.reshape(-1)
    steps = torch.arange(width, device=draws.device)
    targets = steps + draws  # j_i
    after = (steps + 1).expand(rows, width)  # 1 + s: 0 stands for "no step"
    # what step i emits: the latest earlier step with the same j (its predecessor once
    # the j are sorted, ties kept in step order)
    js, by_j = torch.sort(targets.to(torch.int32), dim=-1, stable=True)
    last_out = torch.zeros_like(targets).scatter_(
        1, by_j[:, 1:], torch.where(js[:, 1:] == js[:, :-1], by_j[:, :-1] + 1, 0))
    # what step i moves: the latest step s != i that wrote entry i (j past the width
    # go to a spare column)
    slot = torch.where((targets < width) & (targets != steps), targets, width)
    last_in = torch.zeros(rows, width + 1, dtype=targets.dtype, device=targets.device)
    last_in = last_in.scatter_reduce_(1, slot, after, "amax")[:, :width]
    # follow writer -> earlier writer to the entry none wrote: its index is the value
    ptr = torch.where(last_in > 0, last_in - 1, steps)
    for _ in range(max(0, width - 1).bit_length()):
        ptr = ptr.gather(1, ptr)
    out = torch.where(last_out > 0, ptr.gather(1, (last_out - 1).clamp_min(0)), targets)
    out = torch.where(steps < n[:, None], out, -1)
    return out.reshape(*lead, width)


def random_members(seed: int, window: int | Tensor, layer: int, heads: Tensor,
                   positions: Tensor, repeats: int, sizes: Tensor, width: int) -> Tensor:
    """(repeats, H, Q, width) int64: the first ``width`` members of each row's random
    order, as indices into its universe listed by position (-1 past its size).

    ``sizes`` (H, Q) the universe sizes; the other arguments as :func:`row_states`.
    Repeat k's order is fixed by (seed, window, layer, head, t, k) alone, so it does not
    depend on what else is computed with it.

    >>> m = random_members(0, 0, 0, torch.tensor([0]), torch.tensor([4]), 2,
    ...                    torch.tensor([[5]]), 5)
    >>> [sorted(r) for r in m.reshape(2, 5).tolist()]
    [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    """
    states = row_states(seed, window, layer, heads, positions, repeats)
    n = sizes.to(device=heads.device, dtype=torch.int64)[None].expand(repeats, *sizes.shape)
    return shuffle_prefix(uniform_draws(states, n, width), n)
