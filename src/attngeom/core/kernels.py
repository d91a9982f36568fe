"""The exact inner loops of the geometry, fused by ``torch.compile`` where that is on.

Two kinds of work dominate the top-N metrics once the closeness scores are known:
comparisons and counts over every key of every row and N (Precision's intruders,
Recall's clear keys, the inversion pairs), and the integer hashing of the random
control. Both are exact operations (comparisons, minima, maxima and sums of booleans
or integers; no rounding), so a fused, compiled version gives bit for bit the tables
of the plain one: the floating-point scores themselves are always computed outside.

``compiled(fn)`` returns the compiled version of one of these functions when
compilation is enabled (``set_compile(True)``, or the ``ATTNGEOM_COMPILE`` variable)
and works here (inductor's C++ backend needs a C compiler; on GPUs it emits Triton),
else ``fn`` itself; a compilation that fails is reported once and the plain function
used from then on. Compile time is spent once per shape family and is timed apart
(``compile_seconds``).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

_STATE = {"enabled": os.environ.get("ATTNGEOM_COMPILE", "") in ("1", "on", "true"),
          "broken": False, "seconds": 0.0, "temp_bytes": None}
_CACHE: dict[Callable, Callable] = {}


def set_compile(enabled: bool) -> None:
    """Switch the compiled kernels on or off for the rest of the process."""
    _STATE["enabled"] = bool(enabled)


@contextlib.contextmanager
def compiling(enabled: bool) -> Iterator[None]:
    """Compiled kernels on (or off) inside the block, the previous setting after it."""
    saved = _STATE["enabled"]
    set_compile(enabled)
    try:
        yield
    finally:
        set_compile(saved)


@contextlib.contextmanager
def temporaries(nbytes: int | None) -> Iterator[None]:
    """Inside the block the kernels cut their rows into chunks whose temporaries take
    about ``nbytes`` (``None``: each kernel's own default). The streaming pass sets it
    from ``--memory-budget``; chunking never changes a result, only how many rows one
    tensor operation holds."""
    saved = _STATE["temp_bytes"]
    _STATE["temp_bytes"] = None if nbytes is None else max(1, int(nbytes))
    try:
        yield
    finally:
        _STATE["temp_bytes"] = saved


def temp_bytes(default: int) -> int:
    """The byte budget of one chunk of kernel temporaries (``temporaries``), else
    ``default``."""
    return _STATE["temp_bytes"] or default


def resolve_compile(choice: str, *, device: str, query_mode: str) -> bool:
    """``on``/``off`` as given; ``auto``: the ``ATTNGEOM_COMPILE`` variable where it is
    set, else on for many query rows on a GPU.

    Compiling costs seconds to tens of seconds once (the C++ backend on CPU is the
    slowest); it pays back where the counting dominates, which is ``all``/``stride``
    queries on an accelerator. On CPU ``auto`` stays off: pass ``on`` for long runs.
    """
    if choice in ("on", "off"):
        return choice == "on"
    if os.environ.get("ATTNGEOM_COMPILE"):
        return _STATE["enabled"]
    return query_mode != "final" and not str(device).startswith("cpu")


def compile_enabled() -> bool:
    return _STATE["enabled"] and not _STATE["broken"]


def compile_seconds() -> float:
    """Seconds spent compiling (first calls of each shape family) so far."""
    return _STATE["seconds"]


def compiled(fn: Callable) -> Callable:
    """``fn`` compiled with ``torch.compile`` when enabled and working, else ``fn``."""
    if not compile_enabled():
        return fn
    wrapper = _CACHE.get(fn)
    if wrapper is None:
        wrapper = _CACHE[fn] = _guarded(fn)
    return wrapper


def _guarded(fn: Callable) -> Callable:
    fast = torch.compile(fn, dynamic=True, fullgraph=True)
    seen: set = set()

    def call(*args, **kwargs):
        if _STATE["broken"]:
            return fn(*args, **kwargs)
        key = tuple((a.dtype, a.dim()) if isinstance(a, Tensor) else a for a in args)
        first = key not in seen
        t0 = time.perf_counter()
        try:
            out = fast(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - no compiler, unsupported op: run plain
            _STATE["broken"] = True
            warnings.warn(f"attngeom: torch.compile unavailable ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}); using the uncompiled kernels",
                          RuntimeWarning, stacklevel=2)
            return fn(*args, **kwargs)
        if first:
            seen.add(key)
            _STATE["seconds"] += time.perf_counter() - t0
        return out

    return call


# --------------------------------------------------------------------------- counting


_PAIRWISE_UP_TO = 8  # selected keys up to which inversions are counted pairwise


def count_metrics(close: Tensor, slot: Tensor, universe: Tensor, top: Tensor,
                  grid: Sequence[int]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The exact counts behind Precision, Recall and the inversions, per row and N.

    ``close`` (R, NN, T) closeness scores (larger = nearer the aggregate), ``slot``
    (R, T) int64 each key's place in the rule order (N_max for keys outside the first
    N_max), ``universe`` (R, T) bool, ``top`` (R, N_max) the first N_max keys in order,
    ``grid`` the N of each of the NN columns. Returns, each (R, NN): the smallest
    selected score, the largest unselected score, the number of unselected keys at
    least as close as the farthest selected one, the number of selected keys closer
    than every unselected one, and the inversion pairs (i selected, j unselected,
    close[j] >= close[i]).
    """
    inf = torch.full((), float("inf"), dtype=close.dtype, device=close.device)
    cmins, cmaxs, intruders, clears, inversions = [], [], [], [], []
    for c, n in enumerate(grid):
        cl = close[:, c]
        sel = slot < n
        uns = universe & ~sel
        cmin = torch.where(sel, cl, inf).amin(-1)
        cmax = torch.where(uns, cl, -inf).amax(-1)
        intruders.append((uns & (cl >= cmin[:, None])).sum(-1))
        clears.append((sel & (cl > cmax[:, None])).sum(-1))
        # inversions: each unselected key counts the selected keys it is at least as
        # close as, #{i in I: close[i] <= close[j]}: for a few selected keys the pairwise
        # comparisons themselves (about 3x faster on CPU up to 8), past that a binary
        # search in the sorted selected scores (the same comparisons, O(T log N))
        k = min(int(n), top.shape[-1])
        csel = cl.gather(-1, top[:, :k])  # (R, k)
        if k <= _PAIRWISE_UP_TO:
            pairs = (cl[:, None, :] >= csel[:, :, None]) & uns[:, None, :]  # (R, k, T)
            inversions.append(pairs.sum((1, 2)))
        else:
            csel = torch.sort(csel, dim=-1).values  # ascending
            below = torch.searchsorted(csel, cl.contiguous(), right=True)  # (R, T)
            inversions.append(torch.where(uns, below, 0).sum(-1))
        cmins.append(cmin)
        cmaxs.append(cmax)
    return (torch.stack(cmins, -1), torch.stack(cmaxs, -1), torch.stack(intruders, -1),
            torch.stack(clears, -1), torch.stack(inversions, -1))


# --------------------------------------------------------------------------- hashing

_M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x846CA68B
_GOLDEN = 0x9E3779B9


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 and c < 2**32.

    The int64 product may pass 2**63; torch's integer multiply wraps modulo 2**64 (two's
    complement, on CPU, compiled C++ and CUDA alike), and the low 32 bits of a product
    modulo 2**64 are those of the true product. ``tests/core/test_random_control.py``
    checks this against a split multiply that never overflows, plain and compiled.
    """
    return (x * c) & _M32


def hash32(x: Tensor) -> Tensor:
    """lowbias32 finaliser on int64 tensors holding values in [0, 2**32)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 15)
    x = _mul32(x, _C2)
    x = x ^ (x >> 16)
    return x


def combine(state: Tensor, coord: Tensor) -> Tensor:
    return hash32(state ^ hash32((coord + _GOLDEN) & _M32))


def hashed_positions(keys: Tensor) -> Tensor:
    """The per-position half of ``combine``: ``hash32(key + golden)``, the same for
    every row, so it is computed once per window length and not once per row."""
    return hash32((keys + _GOLDEN) & _M32)


def key_chain(row_hi: Tensor, row_lo: Tensor, hashed: Tensor) -> Tensor:
    """63-bit sort keys from the two per-row hash states and ``hashed_positions``:
    ``(combine(row_hi, j) << 31) | (combine(row_lo, j) >> 1)`` for every position j.

    ``row_hi`` / ``row_lo`` (..., 1) int64, ``hashed`` (T,) int64 -> (..., T) int64.
    """
    return (hash32(row_hi ^ hashed) << 31) | (hash32(row_lo ^ hashed) >> 1)
