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
(its first N entries) are nested in N. The work per row is O(width^2), independent of
the window length: the swaps are kept as a list of ``width`` (index, value) pairs,
not as an array of n members.

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

from attngeom.core.kernels import _M32, combine, hash32, hashed_positions
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
    """
    device = heads.device
    heads = heads.to(torch.int64).reshape(1, -1, 1, 1)
    positions = positions.to(device=device, dtype=torch.int64).reshape(1, 1, -1, 1)
    ks = torch.arange(repeats, dtype=torch.int64, device=device).reshape(-1, 1, 1, 1)
    states = []
    for salt in (0x243F6A88, 0x85A308D3):
        state = torch.tensor(_fold(seed) ^ salt, dtype=torch.int64, device=device)
        state = combine(state, _fold_coord(window, device).reshape(1, -1, 1, 1)
                        if isinstance(window, Tensor) else
                        torch.tensor(_fold(window), dtype=torch.int64, device=device))
        state = combine(state, torch.tensor(_fold(layer), dtype=torch.int64, device=device))
        state = combine(state, heads & _M32)
        state = combine(state, positions & _M32)
        state = combine(state, ks)
        states.append(state.expand(repeats, heads.shape[1], positions.shape[2], 1))
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
    i. Only entries that an earlier step wrote differ from their index: step s wrote
    its old entry s at j_s, so entry x holds what the latest step with j_s = x wrote
    there, or x itself. Entry i is never touched after step i (later j >= later i), so
    ``width`` (index, value) pairs describe the whole array.

    >>> shuffle_prefix(torch.tensor([[2, 0, 0]]), torch.tensor([3])).tolist()
    [[2, 1, 0]]
    """
    width = draws.shape[-1]
    lead = draws.shape[:-1]
    # int32 (n < 2**31): half the memory traffic of int64 in this step-by-step loop
    draws = draws.reshape(-1, width).to(torch.int32)
    n = sizes.reshape(-1).to(torch.int32)
    rows = draws.shape[0]
    steps = torch.arange(width, dtype=torch.int32, device=draws.device)
    rank = steps + 1
    targets = (steps + draws).contiguous()  # j_i
    moved = torch.empty_like(draws)  # what step i wrote at j_i: its old entry i
    out = torch.empty_like(draws)
    for i in range(width):
        want = torch.stack([targets[:, i], steps[i].expand(rows)], dim=1)  # (R, 2): j_i, i
        if i:
            hit = targets[:, None, :i] == want[:, :, None]  # (R, 2, i)
            latest = torch.where(hit, rank[:i], 0).amax(-1)  # 1 + the latest step, 0 if none
            held = moved[:, :i].gather(1, (latest - 1).clamp_min(0).long())
            value = torch.where(latest > 0, held, want)
        else:
            value = want
        out[:, i] = value[:, 0]
        moved[:, i] = value[:, 1]
    out = torch.where(steps < n[:, None], out, -1)
    return out.reshape(*lead, width).long()


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
