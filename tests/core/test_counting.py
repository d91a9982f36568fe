"""The counting kernels against a per-row loop written from the definitions (SPEC §4).

``count_metrics`` (eager) and ``count_metrics_fused`` (the form compiled) must give the
same integers and extremes as counting key by key, on rows with ties, short universes
(padding in ``top``) and N from 1 to past 32 (where the eager version switches to a
binary search).
"""

from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.core import kernels
from attngeom.core.kernels import count_metrics, count_metrics_fused

COUNTS = ("cmin", "cmax", "intruders", "clears", "inversions")


def _flat(counts) -> tuple:
    """The kernels' (counts, counts with key 0 dropped) as one tuple: the five counts,
    then (with key 0 dropped) its cmax, intruders, clears and inversions."""
    own, off = counts
    assert set(own) == set(COUNTS) and (off is None or set(off) == set(COUNTS))
    return (*(own[n] for n in COUNTS), *(() if off is None else (off[n] for n in COUNTS[1:])))


def _reference(close, universe, top, grid):
    """Counts of each (row, N) by plain Python loops over the keys."""
    r, nn, t = close.shape
    out = [torch.zeros(r, nn, dtype=torch.float64) for _ in range(2)]
    ints = [torch.zeros(r, nn, dtype=torch.int64) for _ in range(3)]
    for row in range(r):
        keys = [j for j in top[row].tolist() if universe[row, j]]
        for c, n in enumerate(grid):
            cl = close[row, c].tolist()
            sel = set(keys[:n])
            uns = [j for j in range(t) if universe[row, j] and j not in sel]
            cmin = min((cl[i] for i in sel), default=float("inf"))
            cmax = max((cl[j] for j in uns), default=float("-inf"))
            out[0][row, c], out[1][row, c] = cmin, cmax
            ints[0][row, c] = sum(cl[j] >= cmin for j in uns)
            ints[1][row, c] = sum(cl[i] > cmax for i in sel)
            ints[2][row, c] = sum(cl[j] >= cl[i] for i in sel for j in uns)
    return (*out, *ints)


def _rows(seed: int, r: int, t: int, grid: tuple[int, ...], levels: int):
    gen = torch.Generator().manual_seed(seed)
    nmax = min(max(grid), t)
    close = torch.randint(0, levels, (r, len(grid), t), generator=gen).double() / levels
    universe = torch.rand(r, t, generator=gen) < 0.8
    universe[:, 0] = torch.rand(r, generator=gen) < 0.5  # with and without the sink
    # universe keys first in a random order, then the rest (padding), as top_keys does
    order = torch.argsort(torch.rand(r, t, generator=gen) + 2.0 * ~universe, dim=-1)
    return close, universe, order[:, :nmax].contiguous()


def _valid(universe, grid):
    return torch.tensor(grid)[None, :] < universe.sum(-1, keepdim=True)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), r=st.integers(1, 5), t=st.integers(2, 70),
       grid=st.sampled_from([(1,), (1, 2, 4, 8), (3, 16, 33), (1, 2, 4, 8, 16, 32, 64)]),
       levels=st.sampled_from([3, 1000]), at_once=st.sampled_from([1, 150, 2**21]))
def test_eager_and_fused_counts_match_the_definitions(seed, r, t, grid, levels, at_once):
    """Also with the eager comparisons cut into blocks of selected keys of every size
    (one key, a few with a ragged last block, all of them)."""
    close, universe, top = _rows(seed, r, t, grid, levels)
    ref = _reference(close, universe, top, grid)
    ok = _valid(universe, grid)
    for fn in (count_metrics, count_metrics_fused):
        with mock.patch.object(kernels, "_COMPARED_AT_ONCE", at_once):
            got = _flat(fn(close, universe, top, grid))
        for name, want, have in zip(COUNTS, ref, got, strict=True):
            assert torch.equal(have[ok], want[ok]), (fn.__name__, name)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), r=st.integers(1, 5), t=st.integers(2, 70),
       grid=st.sampled_from([(1,), (1, 2, 4, 8), (3, 16, 33), (1, 2, 4, 8, 16, 32, 64)]),
       levels=st.sampled_from([3, 1000]))
def test_counts_with_key_0_dropped_are_those_of_the_universe_without_it(
        seed, r, t, grid, levels):
    """``drop_first``'s four extra counts equal the plain counts of the same rows with
    key 0 out of the universe, wherever key 0 is not selected (the rows they serve)."""
    close, universe, top = _rows(seed, r, t, grid, levels)
    without = universe.clone()
    without[:, 0] = False
    want = _reference(close, without, top, grid)
    # key 0 unselected at N: not among the row's first N universe keys
    slot = torch.where((top == 0) & universe.gather(-1, top), torch.arange(top.shape[-1]),
                       top.shape[-1]).amin(-1, keepdim=True)
    ok = _valid(without, grid) & (slot >= torch.tensor(grid)[None, :])
    for fn in (count_metrics, count_metrics_fused):
        got = _flat(fn(close, universe, top, grid, True))
        assert len(got) == 9
        for have, plain in zip(got[:5], _flat(fn(close, universe, top, grid)), strict=True):
            assert torch.equal(have, plain), fn.__name__  # the full counts unchanged
        for name, w, have in zip(COUNTS, want, (got[0], *got[5:]), strict=True):
            assert torch.equal(have[ok], w[ok]), (fn.__name__, name)


def test_compiled_counting_equals_eager():
    """The kernel the pipeline calls with compilation on gives the eager integers."""
    grid = (1, 2, 4, 8, 16, 32, 40)
    close, universe, top = _rows(7, 12, 300, grid, 50)
    for drop in (False, True):
        want = _flat(count_metrics(close, universe, top, grid, drop))
        with kernels.compiling(True):
            got = _flat(kernels.counting()(close, universe, top, grid, drop))
        assert not kernels._STATE["broken"]
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w, g)


def test_compiled_euclidean_counting_equals_plain():
    """The closeness scores computed inside the compiled counting loops (CPU) round as
    the plain ``euclidean_close`` does: every count and extreme equal, also with tiny
    and zero alphas and exactly tied scores."""
    gen = torch.Generator().manual_seed(3)
    g, m, t, grid = 2, 9, 257, (1, 2, 4, 8, 16, 32)
    inner = torch.randn(g, m, len(grid), t, generator=gen, dtype=torch.float64)
    inner[:, :, :, 50:90] = inner[:, :, :, 50:90].round()
    alpha = torch.rand(g, m, t, generator=gen, dtype=torch.float64) ** 6
    alpha[:, :, 50:90] = 0.25
    alpha[:, 0, ::4] = 0.0
    sq = torch.rand(g, t, generator=gen, dtype=torch.float64) * 3
    universe = torch.rand(g * m, t, generator=gen) < 0.9
    order = torch.argsort(torch.rand(g * m, t, generator=gen) + 2.0 * ~universe, dim=-1)
    top = order[:, : max(grid)].contiguous()
    close = kernels.euclidean_close(inner, alpha, sq).reshape(g * m, len(grid), t)
    for drop in (False, True):
        want = _flat(count_metrics(close, universe, top, grid, drop))
        plain = _flat(kernels.counting_euclidean()(inner, alpha, sq, universe, top, grid, drop))
        with kernels.compiling(True):
            got = _flat(kernels.counting_euclidean()(inner, alpha, sq, universe, top, grid,
                                                     drop))
        assert not kernels._STATE["broken"]
        for w, p, c in zip(want, plain, got, strict=True):
            assert torch.equal(w, p) and torch.equal(w, c)


def test_compiled_kernels_allow_more_graphs_than_dynamos_default():
    """A compiled kernel may need more graphs than dynamo's default limit of 8 (one per
    stretch of the grid a run's key prefixes cross): 10 here, one per dtype and rank,
    all compiled (no fallback), and dynamo's own limit is left as it was."""
    before = torch._dynamo.config.recompile_limit

    def double(x):
        return x * 2

    with kernels.compiling(True), mock.patch.dict(kernels._STATE, broken=False):
        wrapped = kernels._guarded(double, double)
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
            for shape in ((3,), (3, 2)):
                x = torch.ones(shape, dtype=dtype)
                assert torch.equal(wrapped(x), x * 2)
        assert not kernels._STATE["broken"]
    assert torch._dynamo.config.recompile_limit == before


def test_compiled_float_runs_plain_off_the_cpu():
    """Float kernels are compiled for CPU tensors only (elsewhere a compiler may contract
    multiply-adds): a tensor on another device goes to the plain function."""
    calls = []

    def plain(x):
        calls.append(x.device.type)
        return x

    def fn(x):
        return x * 2.0

    with kernels.compiling(True):
        wrapped = kernels.compiled_float(fn, fallback=plain)
        wrapped(torch.empty(3, device="meta"))
    assert calls == ["meta"]
    with kernels.compiling(False):
        assert kernels.compiled_float(fn, fallback=plain) is plain


def _gram_case(seed: int, g: int = 2, m: int = 5, t: int = 70, k: int = 9):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(g, t, 5, generator=gen, dtype=torch.float64)
    gram = values @ values.transpose(-1, -2)
    top = torch.randint(0, t, (g, m, k), generator=gen)
    a_top = torch.rand(g, m, k, generator=gen, dtype=torch.float64) ** 4
    a_top[:, 0, -2:] = 0.0  # padding keys: alpha 0
    return gram, top, a_top


def test_gram_sums_add_the_selected_rows_in_rule_order():
    """``gram_sums`` is sum_{k <= step} a_k G[top_k, u], added key by key in rule order:
    equal bit for bit to a loop doing exactly that, at every width of the key prefix."""
    gram, top, a_top = _gram_case(0)
    steps = (3, 0, 1, 8, 8)  # N = 4, 1, 2, 9, one past K (the last sum again): grid order
    for width in (1, 33, 70):
        got = kernels.gram_sums(gram, top, a_top, steps, width)
        assert got.shape == (2, 5, len(steps), width)
        for gi in range(2):
            for mi in range(5):
                acc = None
                sums = []
                for j in range(top.shape[-1]):
                    term = a_top[gi, mi, j] * gram[gi, top[gi, mi, j], :width]
                    acc = term if acc is None else acc + term
                    sums.append(acc)
                want = torch.stack([sums[j] for j in steps])
                assert torch.equal(got[gi, mi], want), (width, gi, mi)


def test_compiled_gram_sums_equal_plain():
    """Compiled on CPU (no multiply-add contraction, the order kept) the sums round as
    the plain ones do, for several prefix widths from one graph."""
    gram, top, a_top = _gram_case(1, t=300, k=32)
    steps = (0, 1, 3, 7, 15, 31)
    for width in (40, 300, 129):
        want = kernels.gram_sums(gram, top.clamp_max(width - 1), a_top, steps, width)
        with kernels.compiling(True):
            got = kernels.summing_gram()(gram, top.clamp_max(width - 1), a_top, steps, width)
        assert not kernels._STATE["broken"]
        assert torch.equal(want, got), width


def test_blocks_stop_at_each_n_also_against_infinite_scores():
    """The eager blocks compare the first N selected keys only: the slots past N hold
    +inf, which an unselected +inf score would otherwise count as inversions."""
    grid = (1, 2, 4)
    close, universe, top = _rows(11, 3, 20, grid, 1000)
    universe[:] = True
    close[:, :, 5] = float("inf")  # an unselected key at +inf (key 5 is past top's 4)
    top = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2]])
    want = _reference(close, universe, top, grid)
    for at_once in (1, 150, 2**21):
        with mock.patch.object(kernels, "_COMPARED_AT_ONCE", at_once):
            got = _flat(count_metrics(close, universe, top, grid))
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w, g), at_once
    for w, g in zip(want, _flat(count_metrics_fused(close, universe, top, grid)), strict=True):
        assert torch.equal(w, g)


def test_euclidean_close_into_its_input_buffer_keeps_every_bit():
    """``euclidean_close(..., out=inner)`` (the plain counting writes the scores over
    ``<v_u, s_N>``) gives the bits of the allocating form."""
    gen = torch.Generator().manual_seed(11)
    inner = torch.randn(3, 5, 4, 70, generator=gen, dtype=torch.float64) * 1e3
    alpha = torch.rand(3, 5, 70, generator=gen, dtype=torch.float64) ** 5
    sq = torch.rand(3, 70, generator=gen, dtype=torch.float64) * 1e6
    want = kernels.euclidean_close(inner, alpha, sq)
    buf = inner.clone()
    got = kernels.euclidean_close(buf, alpha, sq, out=buf)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, want)


@given(seed=st.integers(0, 2**16), distance=st.sampled_from(["euclidean", "cosine"]),
       budget=st.sampled_from([1, 5_000, 40_000, None]))
@settings(max_examples=25, deadline=None)
def test_plain_counting_in_row_blocks_equals_one_call(seed, distance, budget):
    """``_counts_in_blocks`` (uncompiled: scores into the buffer of ``<v_u, s_N>``, rows
    counted in blocks sized by the byte budget) gives the counts and extremes of one
    counting call over scores computed apart, for both distances and any block size."""
    from attngeom.core.batch import ValueStats
    from attngeom.core.exact_counts import COSINE_EPS, _counts_in_blocks

    gen = torch.Generator().manual_seed(seed)
    g, m, t, grid = 2, 7, 61, (1, 2, 5, 16)
    values = torch.randn(g, t, 6, generator=gen, dtype=torch.float64)
    values[:, 3] = 0.0  # a zero vector
    stats = ValueStats(values)
    inner = torch.randn(g, m, len(grid), t, generator=gen, dtype=torch.float64)
    inner[..., 20:30] = inner[..., 20:30].round()  # ties
    s2 = torch.rand(g, m, len(grid), generator=gen, dtype=torch.float64) * 4
    s2[0, 0] = 0.0
    alpha = torch.rand(g, m, t, generator=gen, dtype=torch.float64) ** 3
    universe = torch.rand(g, m, t, generator=gen) < 0.85
    order = torch.argsort(torch.rand(g, m, t, generator=gen) + 2.0 * ~universe, dim=-1)
    top = order[..., : max(grid)].contiguous()
    a = alpha[:, :, None, :]
    if distance == "euclidean":
        close = kernels.euclidean_close(inner, alpha, sq_norms := stats.sq_norms)
    else:
        sq_norms = None
        close = (a * inner) / (a * stats.norms[:, None, None, :]
                               * s2.clamp_min(0).sqrt()[..., None] + COSINE_EPS)
    want = _flat(count_metrics(close.reshape(g * m, len(grid), t),
                               universe.reshape(g * m, t), top.reshape(g * m, -1), grid, True))
    buf = inner.clone()
    with kernels.compiling(False), kernels.temporaries(budget):
        got = _flat(_counts_in_blocks(buf, s2, alpha, universe, top, stats, grid, distance,
                                      True))
    assert sq_norms is None or torch.equal(buf, close)  # the scores went into the buffer
    for w, x in zip(want, got, strict=True):
        assert torch.equal(w.reshape(g, m, len(grid)), x), seed
