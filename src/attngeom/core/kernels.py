"""The exact inner loops of the geometry, fused by ``torch.compile`` where that is on.

Once the closeness scores are known, the top-N metrics are comparisons and counts
over every key of every row and N (Precision's intruders, Recall's clear keys, the
inversion pairs): exact operations (comparisons, minima, maxima and sums of booleans
or integers; no rounding), so a fused, compiled version gives bit for bit the tables
of the plain one. Floating-point kernels (the Euclidean closeness scores, the bounds'
per-N steps) are compiled only through ``compiled_float``: on CPU, where the generated
C++ rounds every operation as the plain one does, and never with float sums inside.
The integer hash of the random control lives here too.

``compiled(fn)`` returns the compiled version of one of these functions when
compilation is enabled (``set_compile(True)``, or the ``ATTNGEOM_COMPILE`` variable)
and works here (inductor's C++ backend needs a C compiler; on GPUs it emits Triton),
else ``fn`` itself or an eager form of it written for speed without fusion (the
counting has one of each: ``counting()`` picks); a compilation that fails is reported
once and the eager function used from then on. Compile time is spent once per shape
family and is timed apart (``compile_seconds``).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from attngeom.core.metrics import KeyScores

# the counts of rows by name, and the same with key 0 out of the universe (or None)
Counts = tuple[dict[str, Tensor], dict[str, Tensor] | None]
PerKey = tuple[tuple[str, Callable[[KeyScores], Tensor]], ...]  # (name, count) pairs

_STATE = {"enabled": os.environ.get("ATTNGEOM_COMPILE", "") in ("1", "on", "true"),
          "broken": False, "seconds": 0.0, "temp_bytes": None, "windows": 1}
_CACHE: dict[tuple[Callable, bool], Callable] = {}  # (fn, cpu_only) -> wrapper
# graphs one kernel may compile (dynamo's default is 8): the counting specialises on how
# the row width compares with each N of the grid, so a run whose chunks see several
# key prefixes (``all`` queries) needs one graph per stretch of the grid
_RECOMPILE_LIMIT = 32


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
    from ``--memory-budget``; chunking changes no count, only how many rows one tensor
    operation holds (on the direct path a margin may move in its last bits: a float64
    matrix product can round by its row count)."""
    saved = _STATE["temp_bytes"]
    _STATE["temp_bytes"] = None if nbytes is None else max(1, int(nbytes))
    try:
        yield
    finally:
        _STATE["temp_bytes"] = saved


@contextlib.contextmanager
def stacked_windows(count: int) -> Iterator[None]:
    """Inside the block one kernel call holds ``count`` windows stacked along the heads,
    and the byte budget (``temporaries``, or a kernel's default) is per window: it is
    multiplied by ``count``, so that rows are cut into the same pieces whatever the
    batch size (a piece's shape can decide how a matrix product rounds)."""
    saved = _STATE["windows"]
    _STATE["windows"] = saved * max(1, int(count))
    try:
        yield
    finally:
        _STATE["windows"] = saved


def temp_bytes(default: int) -> int:
    """The byte budget of one chunk of kernel temporaries (``temporaries``, else
    ``default``), per window, times the windows stacked (``stacked_windows``)."""
    return (_STATE["temp_bytes"] or default) * _STATE["windows"]


def window_bytes(nbytes: int) -> int:
    """``nbytes`` per window, times the windows stacked (``stacked_windows``): a fixed
    size that holds whatever the batch size, like ``temp_bytes`` but not set by the run's
    memory budget."""
    return int(nbytes) * _STATE["windows"]


# ``final`` runs of at least this many windows compile on CPU under ``auto``: compiling
# saves 7-12% of such a run (0.2-0.5 s a window at T = 512-1024 on two cores, the
# benchmark model and SmolLM2), which repays the compile (about 6 s with a warm inductor
# cache, about a minute with an empty one) by about 256 windows
FINAL_COMPILE_WINDOWS = 256


def resolve_compile(choice: str, *, device: str, query_mode: str,
                    run_windows: int | None = None) -> bool:
    """``on``/``off`` as given; ``auto``: the ``ATTNGEOM_COMPILE`` variable where it is
    set, else on for many query rows: ``all`` or ``stride:k`` queries on a GPU, and on
    CPU ``all``, a stride of at most 4, or ``final`` queries in a run of at least
    ``FINAL_COMPILE_WINDOWS`` windows (``run_windows``: what this process streams in
    the run, its own units less those resumed; not one batch's).

    Compiling costs seconds to tens of seconds once (the C++ backend on CPU is the
    slowest); it pays back where the per-row work dominates or the run is long. On CPU
    the Gram path's row sums (``gram_sums``) run about six times faster compiled; with
    ``final`` queries the whole run gains about a tenth, worth it only over many
    windows; a sparse stride stays off (pass ``on`` for a long run). The tables are the
    same either way.
    """
    if choice in ("on", "off"):
        return choice == "on"
    if os.environ.get("ATTNGEOM_COMPILE"):
        return _STATE["enabled"]
    on_cpu = str(device).startswith("cpu")
    if query_mode == "final":
        return on_cpu and run_windows is not None and run_windows >= FINAL_COMPILE_WINDOWS
    if not on_cpu:
        return True
    return query_mode == "all" or (query_mode.startswith("stride:")
                                   and int(query_mode.split(":", 1)[1]) <= 4)


def compile_enabled() -> bool:
    return _STATE["enabled"] and not _STATE["broken"]


def fuses_float(device: torch.device | str) -> bool:
    """Whether ``compiled_float`` kernels run compiled for tensors on ``device`` now."""
    return compile_enabled() and torch.device(device).type == "cpu"


def compile_seconds() -> float:
    """Seconds spent compiling (first calls of each shape family) so far."""
    return _STATE["seconds"]


def compiled(fn: Callable, fallback: Callable | None = None, *,
             cpu_only: bool = False) -> Callable:
    """``fn`` compiled with ``torch.compile`` when enabled and working, else
    ``fallback`` (default ``fn`` itself), which must compute the same thing; with
    ``cpu_only`` the compiled form serves CPU tensors only (``compiled_float``)."""
    plain = fn if fallback is None else fallback
    if not compile_enabled():
        return plain
    wrapper = _CACHE.get((fn, cpu_only))
    if wrapper is None:
        wrapper = _CACHE[(fn, cpu_only)] = _guarded(fn, plain, cpu_only=cpu_only)
    return wrapper


def compiled_float(fn: Callable, fallback: Callable | None = None) -> Callable:
    """``compiled(fn)`` for a function with floating-point arithmetic, used only where
    the compiled form rounds exactly as the plain one: on CPU, where inductor's C++
    keeps the operations' order and contracts no multiply-add (``-ffp-contract=off``)
    and never turns a division into a reciprocal. ``fn`` must leave float sums (whose
    order a compiler may change) to its caller. Elsewhere (Triton fuses multiply-adds)
    it runs ``fallback`` (default ``fn`` itself), which must compute the same thing."""
    return compiled(fn, fallback, cpu_only=True)


def _fresh(view: Tensor) -> Tensor:
    """A view as a tensor that is not one: without a copy where it covers its storage
    from the start in order (``detach`` drops the view's link to its base; e.g. a
    product reshaped, which a piece of the metrics must not hold twice), else a copy."""
    if view.is_contiguous() and view.storage_offset() == 0:
        out = view.detach()
        if out._base is None:
            return out
    return view.clone()


def _guarded(fn: Callable, plain: Callable, *, cpu_only: bool = False) -> Callable:
    fast = torch.compile(fn, dynamic=True, fullgraph=True)
    seen: set = set()
    # made once: building the patch (a class and a context variable) cost about 25 us a
    # call, and it is reusable (its saved values are a stack)
    limit = torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT)

    def call(*args, **kwargs):
        if _STATE["broken"] or (cpu_only and any(
                isinstance(a, Tensor) and a.device.type != "cpu" for a in args)):
            return plain(*args, **kwargs)
        # a new graph per dtype and rank, and per size 0 or 1 (dynamo specialises those)
        key = tuple((a.dtype, tuple(min(n, 2) for n in a.shape)) if isinstance(a, Tensor)
                    else a for a in args)
        first = key not in seen
        t0 = time.perf_counter()
        try:
            # a view and a fresh tensor are guarded apart (one graph each): pass fresh
            args = tuple(_fresh(a) if isinstance(a, Tensor) and a._base is not None else a
                         for a in args)
            with limit:
                out = fast(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - no compiler, unsupported op: run plain
            _STATE["broken"] = True
            what = ("stopped: more shapes than its graph limit" if "RecompileLimit"
                    in type(exc).__name__ else "unavailable")
            warnings.warn(f"attngeom: torch.compile {what} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]}); using the uncompiled kernels "
                          "(same tables)", RuntimeWarning, stacklevel=2)
            return plain(*args, **kwargs)
        if first:
            seen.add(key)
            _STATE["seconds"] += time.perf_counter() - t0
        return out

    return call


# --------------------------------------------------------------------------- counting


_LOOP_UP_TO = 32  # selected keys up to which eager inversions go one key at a time
# comparisons one eager operation makes at most: a few selected keys at once when the
# rows are few (one operation per key costs more than its work there), one key at a
# time when they are many (a larger boolean temporary runs slower: measured on CPU)
_COMPARED_AT_ONCE = 2**16


def count_metrics(close: Tensor, universe: Tensor, top: Tensor, grid: Sequence[int],
                  drop_first: bool = False, per_key: PerKey = ()) -> Counts:
    """The exact counts behind the metrics (``core/metrics.py``), per row and N.

    ``close`` (R, NN, T) closeness scores (larger = nearer the aggregate),
    ``universe`` (R, T) bool, ``top`` (R, N_max) the first N_max keys in rule order,
    ``grid`` the N of each of the NN columns. Returns a dict of (R, NN) tensors: the
    smallest selected score (``cmin``), the largest unselected score (``cmax``), the
    number of unselected keys at least as close as the farthest selected one
    (``intruders``), the number of selected keys closer than every unselected one
    (``clears``), the inversion pairs (i selected, j unselected, close[j] >= close[i]),
    and the count of each (name, function) of ``per_key`` (the per-key metrics'
    ``count``, given the :class:`KeyScores`). With ``drop_first`` a second dict holds
    the same with key 0 taken out of the universe (the sink-excluded universe's counts
    of a row whose selection does not hold key 0; meaningless where it does), else None.

    This is the eager version: each selected key i counts its inversions,
    #{j unselected: close[j] >= close[i]}, in one comparison pass (no (R, N, T)
    temporary past ``_COMPARED_AT_ONCE`` comparisons; faster on CPU than a binary
    search up to about 32 keys), and past that
    each unselected key is searched in the sorted selected scores (the same
    comparisons). ``count_metrics_fused`` is the form ``torch.compile`` fuses.
    """
    counts, unsel, thresholds, dropped = _selection_counts(
        close, universe, top, grid, drop_first)
    inversions = []
    r, t = unsel.shape[0], unsel.shape[-1]
    block = max(1, _COMPARED_AT_ONCE // max(1, r * t))  # selected keys per comparison
    for c, n in enumerate(grid):
        k = min(int(n), top.shape[-1])
        u = unsel[:, c]
        if k <= _LOOP_UP_TO:
            count = torch.zeros(r, dtype=torch.int64, device=u.device)
            for i in range(0, k, block):  # never past k: the slots after are +inf
                hits = u[:, None, :] >= thresholds[:, c, i : min(i + block, k), None]
                count = count + hits.reshape(r, -1).sum(-1)
        else:
            ordered = torch.sort(thresholds[:, c, :k], dim=-1).values
            count = torch.searchsorted(ordered, u.contiguous(), right=True).sum(-1)
        inversions.append(count)
    return _named(counts, torch.stack(inversions, -1), dropped, unsel, thresholds, per_key)


def count_metrics_fused(close: Tensor, universe: Tensor, top: Tensor, grid: Sequence[int],
                        drop_first: bool = False, per_key: PerKey = ()) -> Counts:
    """``count_metrics`` written as one broadcast comparison per N, (R, N, T), which the
    compiler turns into a single loop with no temporary (about 4x faster than the eager
    version on CPU, and a small graph: seconds to compile). Eager, it would materialise
    the (R, N, T) comparisons, so it is only called compiled (``counting``)."""
    counts, unsel, thresholds, dropped = _selection_counts(
        close, universe, top, grid, drop_first)
    inversions = []
    for c, n in enumerate(grid):
        k = min(int(n), top.shape[-1])
        inversions.append((unsel[:, c, None, :] >= thresholds[:, c, :k, None]).sum((1, 2)))
    return _named(counts, torch.stack(inversions, -1), dropped, unsel, thresholds, per_key)


def _named(counts: tuple, inversions: Tensor, dropped: tuple | None, unsel: Tensor,
           thresholds: Tensor, per_key: PerKey) -> Counts:
    """The counts by name, the per-key metrics' with them; with key 0 dropped, a second
    dict of the same names (``cmin`` unchanged: key 0 is unselected there)."""
    cmin, cmax, intruders, clears = counts
    own = {"cmin": cmin, "cmax": cmax, "intruders": intruders, "clears": clears,
           "inversions": inversions}
    for name, count in per_key:
        own[name] = count(KeyScores(unsel, thresholds, cmin, cmax))
    if dropped is None:
        return own, None
    cmax0, intruders0, clears0, first_inversions = dropped
    off = {"cmin": cmin, "cmax": cmax0, "intruders": intruders0, "clears": clears0,
           "inversions": inversions - first_inversions}
    if per_key:  # key 0 out of the universe: its score -inf, like a key outside it
        keys = torch.arange(unsel.shape[-1], device=unsel.device)
        unsel0 = torch.where(keys == 0, -float("inf"), unsel)
        for name, count in per_key:
            off[name] = count(KeyScores(unsel0, thresholds, cmin, cmax0))
    return own, off


def counting() -> Callable:
    """The counting kernel to call: fused and compiled where compilation is on, else
    the eager one (also the fallback if compiling fails); both give the same counts."""
    return compiled(count_metrics_fused, fallback=count_metrics)


def euclidean_close(inner: Tensor, alpha: Tensor, sq_norms: Tensor, *,
                    out: Tensor | None = None) -> Tensor:
    """(G, M, NN, T) Euclidean closeness ``g = 2 alpha <v, s_N> - alpha^2 ||v||^2`` from
    ``inner`` (G, M, NN, T), ``alpha`` (G, M, T) and ``sq_norms`` (G, T); into ``out``
    (which may be ``inner``) with the same operations, so the same bits."""
    a = alpha[:, :, None, :]
    if out is None:
        return 2.0 * a * inner - a * a * sq_norms[:, None, None, :]
    return torch.mul(2.0 * a, inner, out=out).sub_(a * a * sq_norms[:, None, None, :])


def count_euclidean_fused(inner: Tensor, alpha: Tensor, sq_norms: Tensor, universe: Tensor,
                          top: Tensor, grid: Sequence[int], drop_first: bool = False,
                          per_key: PerKey = ()) -> Counts:
    """``count_metrics_fused`` of ``euclidean_close``: compiled (``compiled_float``), the
    scores are computed inside the counting loops and never stored."""
    return count_metrics_fused(_close_rows(inner, alpha, sq_norms), universe, top, grid,
                               drop_first, per_key)


def _count_euclidean_plain(inner: Tensor, alpha: Tensor, sq_norms: Tensor, universe: Tensor,
                           top: Tensor, grid: Sequence[int], drop_first: bool = False,
                           per_key: PerKey = ()) -> Counts:
    return counting()(_close_rows(inner, alpha, sq_norms), universe, top, grid, drop_first,
                      per_key)


def _close_rows(inner: Tensor, alpha: Tensor, sq_norms: Tensor) -> Tensor:
    """``euclidean_close`` as the (G M, NN, T) rows the counting kernels take."""
    g, m, nn, t = inner.shape
    return euclidean_close(inner, alpha, sq_norms).reshape(g * m, nn, t)


def counting_euclidean() -> Callable:
    """The counting of the Euclidean metrics from ``<v_u, s_N>``: the closeness scores and
    the counts in one compiled pass on CPU, where compiled float arithmetic rounds as the
    plain one does; elsewhere the scores are computed plain, then ``counting()``."""
    return compiled_float(count_euclidean_fused, fallback=_count_euclidean_plain)


def flat_index(keys: Tensor, t: int) -> Tensor:
    """(G, ...) key indices per kv head -> the same keys' rows in the (G T, ...) tensor
    that flattens the kv heads' (T, ...) rows, so one ``index_select`` reads them all (a
    ``gather`` over an expanded view indexes every element of each row instead)."""
    return keys + (torch.arange(keys.shape[0], device=keys.device) * t).reshape(
        -1, *(1,) * (keys.dim() - 1))


def gram_sums(gram: Tensor, top: Tensor, a_top: Tensor, steps: tuple[int, ...],
              width: int) -> Tensor:
    """(G, M, NN, width) ``<v_u, s_N>`` from rows of the value Gram matrix: for every row
    and key u < ``width``, sum_{k <= steps[c]} a_top[k] G[top[k], u], added one selected
    key at a time in rule order (a fixed order: each product rounded, then each sum).

    ``gram`` (G, T, T) the window's whole Gram matrix (symmetric, so row top[k] holds
    the column too: the reads are contiguous), ``top`` (G, M, K) and ``a_top`` (G, M, K)
    each row's first keys and their alphas, ``steps`` the last k of each N of the grid.
    Compiled (``compiled_float``, CPU) it is one pass with K row reads per output entry
    and no temporary; plain, K passes of a multiply and an add, which round alike.
    """
    g, m, k = top.shape
    t = gram.shape[-1]
    flat = gram.reshape(g * t, t)[:, :width]
    index = flat_index(top, t)
    acc, kept = None, [None] * len(steps)  # the running sum, and its value at each step
    for j in range(k):
        row = flat.index_select(0, index[:, :, j].reshape(-1)).reshape(g, m, width)
        term = a_top[:, :, j, None] * row
        acc = term if acc is None else acc + term
        for c, step in enumerate(steps):
            if step == j:
                kept[c] = acc
    return torch.stack(kept, 2)  # in the grid's order


def summing_gram() -> Callable:
    """``gram_sums``, compiled on CPU where that is on (exact, ``compiled_float``)."""
    return compiled_float(gram_sums)


def _selection_counts(close: Tensor, universe: Tensor, top: Tensor, grid: Sequence[int],
                      drop_first: bool = False):
    """What both counting versions share: cmin, cmax, intruders and clears (R, NN), the
    unselected scores (R, NN, T), each column's thresholds (R, NN, N_max) and, with
    ``drop_first``, the counts with key 0 out of the universe (else None): the largest
    score over the unselected keys past 0, the intruders and clear keys against it, and
    key 0's own inversions (the selected scores it reaches).

    The selected keys are the first N entries of ``top`` that lie in the universe, so
    everything about them is read at those N_max columns. One copy of the scores, with
    the selected and non-universe keys at -inf (they never win a maximum nor pass a
    ``>=`` test against a finite score), serves every pass over all T keys; a
    threshold is a selected key's score, or +inf (passed by no score) off the selection.
    """
    r, nn, _ = close.shape
    nmax = top.shape[-1]
    inf = torch.full((), float("inf"), dtype=close.dtype, device=close.device)
    grid_t = torch.tensor(list(grid), dtype=torch.int64, device=close.device)
    first = torch.arange(nmax, device=close.device)[None, :] < grid_t[:, None]  # (NN, N_max)
    index = top[:, None, :].expand(r, nn, nmax)
    csel = close.gather(-1, index)  # (R, NN, N_max): the scores of the first N_max keys
    in_u = universe.gather(-1, top)[:, None, :]  # padding past |U| is in no universe
    sel = first & in_u
    unsel = torch.where(universe[:, None, :], close, -inf)
    unsel.scatter_(-1, index, torch.where(sel | ~in_u, -inf, csel))
    thresholds = torch.where(sel, csel, inf)
    cmin = thresholds.amin(-1)
    if drop_first:  # the maximum past key 0 first, then with it: one pass either way
        key0 = unsel[..., 0]  # key 0's score where it is unselected and in U, else -inf
        rest = unsel[..., 1:]
        cmax0 = rest.amax(-1) if rest.shape[-1] else torch.full_like(cmin, -float("inf"))
        cmax = torch.maximum(cmax0, key0)
    else:
        cmax = unsel.amax(-1)
    intruders = (unsel >= cmin[..., None]).sum(-1)
    clears = (sel & (csel > cmax[..., None])).sum(-1)
    dropped = None
    if drop_first:
        dropped = (cmax0, intruders - (key0 >= cmin).to(intruders.dtype),
                   (sel & (csel > cmax0[..., None])).sum(-1),
                   (key0[..., None] >= thresholds).sum(-1))
    return (cmin, cmax, intruders, clears), unsel, thresholds, dropped


# --------------------------------------------------------------------------- hashing

_M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x846CA68B
_GOLDEN = 0x9E3779B9


def _mul32(x: Tensor | int, c: int) -> Tensor | int:
    """(x * c) mod 2**32 for 0 <= x < 2**32 and c < 2**32 (an int64 tensor or a Python int).

    The int64 product may pass 2**63; torch's integer multiply wraps modulo 2**64 (two's
    complement, on CPU, compiled C++ and CUDA alike), and the low 32 bits of a product
    modulo 2**64 are those of the true product. ``tests/core/test_random_control.py``
    checks this against a split multiply that never overflows, plain and compiled.
    """
    return (x * c) & _M32


def hash32(x: Tensor | int) -> Tensor | int:
    """lowbias32 finaliser on int64 tensors holding values in [0, 2**32), or on a Python
    int (the same bits)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 15)
    x = _mul32(x, _C2)
    x = x ^ (x >> 16)
    return x


def combine(state: Tensor | int, coord: Tensor | int) -> Tensor | int:
    return hash32(state ^ hash32((coord + _GOLDEN) & _M32))


def hashed_positions(keys: Tensor) -> Tensor:
    """The per-position half of ``combine``: ``hash32(key + golden)``, the same for
    every row, so it is computed once per window length and not once per row."""
    return hash32((keys + _GOLDEN) & _M32)


# bytes of words hashed per block by ``hash32_rows``: 256 rows of 1024 int64 keys are
# 2 MB, half of it per thread of two, whose in-place passes stay in their 1 MB caches
_HASH_BLOCK_BYTES = 1 << 21
# the lowbias32 rounds as int32 arithmetic: an arithmetic shift copies the sign bit into
# the top, so the shifted word is masked to the bits a logical shift keeps; a multiply
# wraps modulo 2**32 as the int64 one does modulo 2**64 (see ``_mul32``)
_INT32_ROUNDS = ((16, 0xFFFF, _C1), (15, 0x1FFFF, _C2 - (1 << 32)), (16, 0xFFFF, None))
ORDER_MIN = -(1 << 31)  # the order word of hash word 0: the smallest int32


def _as_int32(words: Tensor) -> Tensor:
    """Words in [0, 2**32) (int64) as int32 with the same 32 bits."""
    words = words.to(torch.int64)
    return (words - ((words >> 31) << 32)).to(torch.int32)


def hash32_rows(states: Tensor, keys: Tensor, out: Tensor | None = None,
                limit: Tensor | None = None, *, order: bool = False) -> Tensor:
    """``hash32(states[..., None] ^ keys)`` as a new (..., T) int64 tensor, bit for bit.

    The restriction's random ranking hashes every (row, key) pair of every layer:
    ``hash32`` on the full (B, H, Q, T) block allocates a fresh tensor for each of its
    eleven operations and cost seven times the ranking's top-n selection. Here a block
    of rows at a time is hashed in place with one scratch buffer, the same operations in
    the same order on the same int64 values, so the words are identical.
    ``states`` (...) in [0, 2**32), ``keys`` (T,) in [0, 2**32); ``out``: a contiguous
    tensor of the result's shape and dtype to write into (reused buffers skip the page
    faults of a fresh one). ``limit`` (broadcastable to ``states``): each row needs only
    its first ``limit`` words (a causal row's visible keys); a block of rows then hashes
    the columns below its largest limit and leaves the rest of ``out`` unwritten, for a
    caller that masks them.

    ``order``: int32 *order words* instead, word - 2**31 (the same 32 bits with the top
    one flipped): ordered as signed integers exactly as the words are as unsigned ones,
    so a top-n over them keeps the same keys, ties included. They are computed in int32
    arithmetic, the same rounds on the same bits: half the bytes, and multiplies the
    CPU vectorises (an int64 multiply it does not), about twice as fast.
    """
    dtype = torch.int32 if order else torch.int64
    width = keys.shape[-1]
    shape = (*states.shape, width)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=states.device)
    elif out.shape != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous {str(dtype).removeprefix('torch.')} "
                         f"tensor of shape {shape}")
    rows = out.view(-1, width)
    flat = states.reshape(-1, 1).to(torch.int64)
    if order:
        flat, keys = _as_int32(flat), _as_int32(keys)
        # the constants as int32 tensors: a Python int is cast anew at every operation
        rounds = [(shift, torch.tensor(kept, dtype=dtype, device=states.device),
                   None if factor is None else torch.tensor(factor, dtype=dtype,
                                                            device=states.device))
                  for shift, kept, factor in _INT32_ROUNDS]
        flip = torch.tensor(ORDER_MIN, dtype=dtype, device=states.device)
    reach = None
    if limit is not None:
        reach = torch.broadcast_to(limit, states.shape).reshape(-1).clamp(0, width).tolist()
    step = max(1, _HASH_BLOCK_BYTES // out.element_size() // max(width, 1))
    scratch = torch.empty(min(step, rows.shape[0]) * width, dtype=dtype,
                          device=states.device)
    for a in range(0, rows.shape[0], step):
        b = min(a + step, rows.shape[0])
        cols = width if reach is None else max(reach[a:b])
        if cols == 0:
            continue
        x = rows[a:b, :cols]
        tmp = scratch[: (b - a) * cols].view(b - a, cols)
        torch.bitwise_xor(flat[a:b], keys[:cols], out=x)
        if order:
            for shift, kept, factor in rounds:
                torch.bitwise_right_shift(x, shift, out=tmp)
                tmp &= kept
                x ^= tmp
                if factor is not None:
                    x.mul_(factor)
            x ^= flip
            continue
        x &= _M32
        for shift, factor in ((16, _C1), (15, _C2), (16, None)):
            torch.bitwise_right_shift(x, shift, out=tmp)
            x ^= tmp
            if factor is not None:
                x.mul_(factor)
                x &= _M32
    return out
