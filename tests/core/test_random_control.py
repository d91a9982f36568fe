"""The random-selection control (SPEC 2): reproducible, seeded by every coordinate, nested, uniform.

Every draw is a pure function of (seed, window, layer, head, t, k, step); a row's
random order is a Fisher-Yates shuffle of its universe (with position 0 put back, and
taken out again where the universe lacks it), stopped after the first keys. The checks
here are deterministic (fixed seeds), so the statistical ones cannot flake: they either
pass for this hash or they do not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.core.geometry import select_order
from attngeom.core.random_control import (
    random_members,
    row_states,
    shuffle_prefix,
    uniform_draws,
)

try:
    from tests import reference_geometry as ref
except ImportError:  # tests/ itself is on sys.path when it is not a package
    import reference_geometry as ref

METRIC_FIELDS, reference_topn, row_metrics = ref.METRIC_FIELDS, ref.reference_topn, ref.row_metrics
random_draws, shuffled, universe_of_row = ref.random_draws, ref.shuffled, ref.universe_of_row


def members(seed=0, window=0, layer=0, heads=(0, 1, 2), positions=(3, 7), repeats=3, size=8,
            width=None):
    sizes = torch.full((len(heads), len(positions)), size, dtype=torch.int64)
    return random_members(seed, window, layer, torch.tensor(heads), torch.tensor(positions),
                          repeats, sizes, size if width is None else width)


def test_members_shape_dtype_reproducible_and_permutations():
    a, b = members(), members()
    assert a.shape == (3, 3, 2, 8)
    assert a.dtype == torch.int64
    assert torch.equal(a, b)
    # a full-width shuffle is a permutation of the members
    assert all(sorted(row.tolist()) == list(range(8)) for row in a.reshape(-1, 8))
    # past the universe size: -1
    short = members(width=11)
    assert (short[..., 8:] == -1).all()
    assert torch.equal(short[..., :8], a)


@pytest.mark.parametrize(
    "change",
    [{"seed": 1}, {"seed": 2**31 + 5}, {"window": 1}, {"layer": 1}, {"window": 7, "layer": 3}],
)
def test_orders_change_with_seed_window_layer(change):
    base, other = members(size=40), members(size=40, **change)
    assert (base != other).any(-1).all(), f"{change}: some orders unchanged"


def test_orders_change_with_head_position_and_repeat():
    m = members(heads=(0, 1), positions=(5, 6), repeats=2, size=40)
    assert (m[:, 0] != m[:, 1]).any(-1).all()  # head
    assert (m[:, :, 0] != m[:, :, 1]).any(-1).all()  # query position t
    assert (m[0] != m[1]).any(-1).all()  # repeat
    # the head index is the query head, not its position in the batch
    assert (members(heads=(1,), size=40) != members(heads=(0,), size=40)).any(-1).all()


def test_orders_do_not_depend_on_the_batch():
    """The order of one (head, t) is the same whatever else is computed with it (shards
    merge), and a row's first keys do not depend on how many are asked for."""
    full = members(heads=(0, 1, 2, 3), positions=(2, 5, 7))
    for hi, h in enumerate((0, 1, 2, 3)):
        for qi, t in enumerate((2, 5, 7)):
            single = members(heads=(h,), positions=(t,))
            assert torch.equal(full[:, hi, qi], single[:, 0, 0])
            assert torch.equal(members(heads=(h,), positions=(t,), width=3)[..., 0, 0, :],
                               single[:, 0, 0, :3])
    swapped = members(heads=(3, 0), positions=(7, 2))
    assert torch.equal(swapped[:, 0, 0], full[:, 3, 2])


def test_draws_are_the_exact_multiply_shift():
    """r_i = floor(X (n - i) / 2^64) for the 64-bit word X = hi 2^32 + lo, in big ints."""
    from attngeom.core.kernels import hash32, hashed_positions

    states = row_states(5, 2, 1, torch.tensor([0, 3]), torch.tensor([9, 4000]), 2)
    sizes = torch.tensor([[[1, 2**31 - 1]], [[7, 4096]]]).expand(2, 2, 2)
    width = 6
    draws = uniform_draws(states, sizes, width)
    steps = hashed_positions(torch.arange(width))
    hi, lo = hash32(states[0] ^ steps), hash32(states[1] ^ steps)
    for idx in itertools.product(range(2), range(2), range(2), range(width)):
        m = max(0, int(sizes[idx[:3]]) - idx[3])
        word = (int(hi[idx]) << 32) | int(lo[idx])
        assert int(draws[idx]) == (word * m) >> 64, idx
        assert m == 0 or 0 <= int(draws[idx]) < m


def _textbook(draws: torch.Tensor, sizes: list[int]) -> list[list[int]]:
    """Swap entries of the whole array 0..n-1, step by step."""
    width = draws.shape[-1]
    out = []
    for r, n in enumerate(sizes):
        array = list(range(n))
        for i in range(min(width, n)):
            j = i + int(draws[r, i])
            array[i], array[j] = array[j], array[i]
        out.append(array[:width] + [-1] * max(0, width - n))
    return out


@settings(max_examples=300, deadline=None)
@given(data=st.data(), rows=st.integers(1, 4), width=st.integers(1, 40))
def test_partial_shuffle_is_the_textbook_one(data, rows, width):
    """The sparse (index, value) shuffle equals swapping entries of the whole array, also
    when several steps pick the same entry (small n makes that common) and past the
    widths that one pointer-jumping round covers."""
    sizes = data.draw(st.lists(st.integers(0, 48), min_size=rows, max_size=rows))
    draws = torch.zeros(rows, width, dtype=torch.int64)
    for r, n in enumerate(sizes):
        for i in range(min(width, n)):
            draws[r, i] = data.draw(st.integers(0, min(n - i - 1, data.draw(
                st.sampled_from([1, 2, 3, n])))))
    assert shuffle_prefix(draws, torch.tensor(sizes)).tolist() == _textbook(draws, sizes)


@pytest.mark.parametrize("width", [1, 2, 3, 31, 32, 33, 64, 100])
def test_partial_shuffle_follows_the_longest_chains(width):
    """Every step but the last swaps with the next entry, so entry 0 moves one place a
    step and the last step emits it (the longest chain of moved entries: step i moves
    what step i - 1 wrote); or every step swaps with the last entry (all write the same
    one); also batched past one pass's rows."""
    n = width + 1
    nexts = torch.ones(1, width, dtype=torch.int64)
    nexts[0, -1] = 0
    lasts = (n - 1 - torch.arange(width))[None]
    draws = torch.cat([nexts, lasts]).repeat(40_000 // width + 1, 1)
    sizes = [n] * draws.shape[0]
    got = shuffle_prefix(draws, torch.tensor(sizes)).tolist()
    want = _textbook(draws[:2], sizes[:2])
    assert got[:2] == want and got == want * (draws.shape[0] // 2)


def causal_row(t: int, num_keys: int) -> torch.Tensor:
    return (torch.arange(num_keys) <= t)[None, None, :]


def test_sink_excluded_order_is_the_full_one_without_the_sink():
    """Both universes draw the same shuffle: taking key 0 out moves no other key."""
    alpha = torch.full((3, 1, 12), 1 / 12, dtype=torch.float64)
    norms = torch.ones(3, 12, dtype=torch.float64)
    full = causal_row(11, 12).expand(3, 1, 12)
    nosink = full.clone()
    nosink[..., 0] = False
    kw = dict(repeats=20, query_positions=torch.tensor([11]), seed=4, window=1, layer=2)
    a = select_order(alpha, norms, full, "random", 12, **kw)
    b = select_order(alpha, norms, nosink, "random", 11, **kw)
    held = 0
    for row_a, row_b in zip(a.reshape(-1, 12).tolist(), b.reshape(-1, 11).tolist(),
                            strict=True):
        assert [j for j in row_a if j != 0] == row_b
        held += row_a.index(0) < 11
    assert held > 0  # the sink was in the way in some rows


def test_orders_follow_the_reference_shuffle_on_holed_universes():
    """select_order against the textbook shuffle of the reference, on universes with holes
    (encoder padding, sliding windows), with and without key 0, and short rows padded
    with the keys outside the universe, ascending."""
    gen = torch.Generator().manual_seed(3)
    t = 10
    visible = torch.rand(4, 5, t, generator=gen) < 0.6
    visible[0, 0] = False  # an empty universe
    visible[1, 1, 0] = False
    alpha = torch.full((4, 5, t), 0.1, dtype=torch.float64)
    norms = torch.ones(4, t, dtype=torch.float64)
    positions = torch.tensor([9, 3, 7, 8, 5])
    for exclude in (False, True):
        uni = visible.clone()
        if exclude:
            uni[..., 0] = False
        got = select_order(alpha, norms, uni, "random", 6, repeats=3,
                           query_positions=positions, seed=7, window=2, layer=5)
        for h, q in itertools.product(range(4), range(5)):
            universe = [j for j in range(t) if bool(uni[h, q, j])]
            draws = random_draws(7, 2, 5, h, int(positions[q]), 3, universe)
            outside = [j for j in range(t) if j not in universe]
            for k in range(3):
                want = (shuffled(universe, draws[k]) + outside)[:6]
                assert got[k, h, q].tolist() == want, (exclude, h, q, k)


def first_keys(universe, seeds, heads=4, t=7, repeats=8, num_keys=8):
    """First key of the random order of ``universe`` for many seeds, heads and repeats."""
    uni = torch.zeros(heads, 1, num_keys, dtype=torch.bool)
    uni[..., universe] = True
    alpha = torch.zeros(heads, 1, num_keys, dtype=torch.float64)
    norms = torch.ones(heads, num_keys, dtype=torch.float64)
    firsts = [select_order(alpha, norms, uni, "random", 1, repeats=repeats,
                           query_positions=torch.tensor([t]), seed=seed)[..., 0].reshape(-1)
              for seed in seeds]
    return torch.cat(firsts).numpy()


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("universe", [list(range(8)), [1, 2, 3, 4, 5, 6, 7], [0, 2, 5]])
def test_first_position_roughly_uniform(universe):
    """Chi-square of the first key over 200 seeds x 4 heads x 8 repeats (6400 draws).

    Limits are the 99.99% quantiles of chi-square (29.9 for 7 degrees of freedom,
    27.9 for 6, 18.4 for 2): a biased hash (one ignoring the seed, or favouring small
    positions) exceeds them by far; the sample is deterministic, so this cannot flake.
    """
    firsts = first_keys(universe, seeds=range(200))
    counts = np.array([(firsts == j).sum() for j in universe])
    assert counts.sum() == 6400
    limit = {8: 29.9, 7: 27.9, 3: 18.4}[len(universe)]
    assert chi_square(counts) < limit, counts


def test_whole_permutation_roughly_uniform():
    """All 6 orders of a 3-key universe appear about equally often (6400 draws, 5 dof)."""
    counts = {}
    alpha = torch.zeros(4, 1, 3, dtype=torch.float64)
    norms = torch.ones(4, 3, dtype=torch.float64)
    uni = torch.ones(4, 1, 3, dtype=torch.bool)
    for seed in range(200):
        order = select_order(alpha, norms, uni, "random", 3, repeats=8,
                             query_positions=torch.tensor([2]), seed=seed)
        for row in order.reshape(-1, 3):
            perm = tuple(row.tolist())
            counts[perm] = counts.get(perm, 0) + 1
    assert sorted(counts) == sorted(itertools.permutations(range(3)))
    # 25.7: the 99.99% quantile of chi-square with 5 degrees of freedom
    assert chi_square(np.array(list(counts.values()))) < 25.7, counts


def test_chi_square_check_can_fail():
    """The uniformity check rejects a mildly biased sampler of the same size."""
    rng = np.random.default_rng(0)
    biased = rng.choice(8, size=6400, p=[0.16] + [0.12] * 7)
    assert chi_square(np.bincount(biased, minlength=8)) > 29.9


# ---- nesting, seen through the fast path's metrics -------------------------------------


def fast_geometry():
    from attngeom.core import geometry

    return geometry


def metrics_match(got: dict, order, n, alpha_row, values_kv) -> bool:
    """Do the observed metrics equal those of the set order[:n]? (counts exactly, margin 1e-6)

    The margin tolerance allows for the fast path's float64 radii: near D = 0 (every
    N = 1 row) a radius is the square root of a rounding residual, about 1e-8 * |s|.
    """
    want = row_metrics(list(order), n, alpha_row, values_kv, "euclidean")
    want = [float(getattr(want, name)) for name in METRIC_FIELDS]
    return all(abs(got[name] - w) <= 1e-6 for name, w in zip(METRIC_FIELDS, want, strict=True))


def nested_chain_exists(observed, universe, alpha_row, values_kv) -> bool:
    """Is there an order of U whose prefixes of size N = 1..|U|-1 give the observed metrics?

    ``observed[n]`` is the metrics dict of the row at N = n. Depth-first search over
    prefixes, keeping only prefixes whose set reproduces the observed metrics; the
    metrics of a set do not depend on the order inside it, so prefixes are kept as sets.
    """
    frontier = {frozenset()}
    for n in range(1, len(universe)):
        grown = set()
        for prefix in frontier:
            for u in universe:
                if u in prefix:
                    continue
                candidate = prefix | {u}
                if candidate in grown:
                    continue
                order = sorted(candidate) + [j for j in universe if j not in candidate]
                if metrics_match(observed[n], order, n, alpha_row, values_kv):
                    grown.add(candidate)
        if not grown:
            return False
        frontier = grown
    return True


NEST_T, NEST_D = 6, 3


def nesting_inputs():
    gen = torch.Generator().manual_seed(1234)
    values = torch.randn(1, NEST_T, NEST_D, generator=gen, dtype=torch.float64)
    logits = torch.randn(2, 2, NEST_T, generator=gen, dtype=torch.float64)
    return torch.softmax(logits, dim=-1), values


def observed_rows(res, k, h, q, grid):
    return {
        n: {name: float(getattr(res, name)[k, h, q, c]) for name in METRIC_FIELDS}
        for c, n in enumerate(grid)
    }


@pytest.mark.parametrize("exclude_sink", [False, True])
def test_fast_random_sets_are_nested(exclude_sink):
    """Every repeat's random sets of size 1..|U|-1 form a chain I_1 c I_2 c ... (SPEC 2).

    The sets are recovered from the fast path's metrics alone: with generic inputs
    different sets give different metrics, and the search asks whether some chain
    of sets reproduces the metrics at every N.
    """
    geometry = fast_geometry()
    alpha, values = nesting_inputs()
    positions = torch.tensor([4, 5])
    grid = list(range(1, NEST_T))
    res = geometry.topn_metrics(alpha, values, grid, rule="random", repeats=4, seed=11,
                                window=2, layer=3, query_positions=positions,
                                exclude_sink=exclude_sink)
    for k, h, q in itertools.product(range(4), range(2), range(2)):
        vis = [j <= int(positions[q]) for j in range(NEST_T)]
        universe = universe_of_row(vis, exclude_sink)
        observed = observed_rows(res, k, h, q, grid)
        assert all(np.isnan(observed[n]["precision"]) for n in grid if n >= len(universe))
        assert nested_chain_exists(observed, universe, alpha[h, q].numpy(), values[0].numpy()), (
            f"repeat {k}, head {h}, query {q}: no nested chain of sets gives these metrics"
        )


def test_nesting_check_can_fail():
    """Independent random sets for each N (not nested) are rejected by the chain search."""
    alpha, values = nesting_inputs()
    rng = np.random.default_rng(5)
    universe = list(range(NEST_T))
    rejected = 0
    for _ in range(10):
        observed = {}
        for n in range(1, NEST_T):
            order = [int(j) for j in rng.permutation(NEST_T)]
            res = row_metrics(order, n, alpha[0, 0].numpy(), values[0].numpy(), "euclidean")
            observed[n] = {name: float(getattr(res, name)) for name in METRIC_FIELDS}
        rejected += not nested_chain_exists(observed, universe, alpha[0, 0].numpy(),
                                            values[0].numpy())
    assert rejected >= 8, rejected


def test_fast_random_control_reproducible_and_seeded():
    """Same coordinates: bit-identical metrics; another seed: other random sets."""
    geometry = fast_geometry()
    alpha, values = nesting_inputs()
    kwargs = dict(rule="random", repeats=3, query_positions=torch.tensor([4, 5]))
    a = geometry.topn_metrics(alpha, values, [1, 2, 3], seed=3, window=1, layer=2, **kwargs)
    b = geometry.topn_metrics(alpha, values, [1, 2, 3], seed=3, window=1, layer=2, **kwargs)
    for name in METRIC_FIELDS:
        x, y = getattr(a, name).numpy(), getattr(b, name).numpy()
        assert np.array_equal(x, y, equal_nan=True), name
    for change in ({"seed": 4}, {"window": 2}, {"layer": 3}):
        coords = {"seed": 3, "window": 1, "layer": 2, **change}
        c = geometry.topn_metrics(alpha, values, [1, 2, 3], **coords, **kwargs)
        assert not np.allclose(a.margin.numpy(), c.margin.numpy(), equal_nan=True), change


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_random_rule_follows_the_shuffle(impl, distance):
    """Repeat k's random order is the textbook shuffle of the control's draws.

    Only y_u = alpha_u v_u enters the metrics, so the same contributions can be
    written with other alphas: alpha'_u decreasing along the shuffled order sigma and
    v'_u = y_u / alpha'_u. The attention rule on (alpha', v') then selects sigma's
    prefixes, and must reproduce the random rule on (alpha, v) for every N.
    """
    run = reference_topn if impl == "reference" else fast_geometry().topn_metrics
    alpha, values = nesting_inputs()
    alpha, values = alpha[:1, :1], values  # one head, one query row at t = 5
    t, coords = NEST_T - 1, {"seed": 8, "window": 4, "layer": 1}
    grid = list(range(1, NEST_T))
    random_res = run(alpha, values, grid, rule="random", repeats=3, distance=distance,
                     **coords)
    draws = random_draws(coords["seed"], coords["window"], coords["layer"], 0, t, 3,
                         list(range(NEST_T)))
    for k in range(3):
        sigma = shuffled(list(range(NEST_T)), draws[k])
        new_alpha = torch.zeros_like(alpha)
        for rank, j in enumerate(sigma):
            new_alpha[0, 0, j] = (NEST_T - rank) / 16
        new_values = values * (alpha[0, 0] / new_alpha[0, 0])[None, :, None]
        att = run(new_alpha, new_values, grid, rule="attention", distance=distance)
        for name in METRIC_FIELDS:
            got = np.asarray(getattr(random_res, name))[k, 0, 0]
            want = np.asarray(getattr(att, name))[0, 0, 0]
            # counts agree exactly; 1e-7 leaves room for the float64 radii near D = 0
            np.testing.assert_allclose(got, want, atol=1e-7, err_msg=f"{name}, repeat {k}")


def _split_mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 by 16-bit halves: no intermediate passes 2**63."""
    lo, hi = x & 0xFFFF, x >> 16
    return ((lo * c) + (((hi * c) & 0xFFFF) << 16)) & 0xFFFFFFFF


@pytest.mark.parametrize("compile_on", [False, True])
def test_wrapping_multiply_equals_the_split_one(compile_on):
    # the random keys rest on this: (x * c) & M32 with an int64 product that wraps
    from attngeom.core import kernels

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2**32, (200_000,), dtype=torch.int64, generator=g)
    x[:5] = torch.tensor([0, 1, 2**31, 2**32 - 2, 2**32 - 1])
    with kernels.compiling(compile_on):
        for c in (kernels._C1, kernels._C2, 2**32 - 1):
            fn = kernels.compiled(kernels._mul32)
            assert torch.equal(fn(x, c), _split_mul32(x, c))


def test_orders_are_those_of_the_split_multiply(monkeypatch):
    # the same orders as with the overflow-free multiply
    from attngeom.core import kernels

    fast = members(seed=3, window=5, layer=2, size=64)
    monkeypatch.setattr(kernels, "_mul32", _split_mul32)
    assert torch.equal(fast, members(seed=3, window=5, layer=2, size=64))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(-2**40, 2**70), window=st.integers(0, 2**40), layer=st.integers(0, 200),
       heads=st.lists(st.integers(0, 2**33), min_size=1, max_size=4),
       positions=st.lists(st.integers(0, 2**20), min_size=1, max_size=3),
       repeats=st.integers(1, 3), per_row=st.booleans())
def test_row_states_are_the_coordinate_chain(seed, window, layer, heads, positions, repeats,
                                             per_row):
    """Each chain is combine() over (window, layer, head, t, k) from fold(seed) ^ salt,
    evaluated here one row at a time on Python ints (a window per head row or one for
    all: the same states)."""
    from attngeom.core.kernels import combine
    from attngeom.core.random_control import _fold

    windows = [window + 3 * i for i in range(len(heads))] if per_row else [window] * len(heads)
    got = row_states(seed, torch.tensor(windows) if per_row else window, layer,
                     torch.tensor(heads), torch.tensor(positions), repeats)
    for c, salt in enumerate((0x243F6A88, 0x85A308D3)):
        assert got[c].shape == (repeats, len(heads), len(positions), 1)
        for k, (i, h), (j, t) in itertools.product(range(repeats), enumerate(heads),
                                                   enumerate(positions)):
            state = _fold(seed) ^ salt
            for coord in (_fold(windows[i]), _fold(layer), h & 0xFFFFFFFF, t, k):
                state = combine(state, coord)
            assert int(got[c][k, i, j, 0]) == state, (c, k, h, t)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40),
       width=st.integers(1, 2100), shape=st.sampled_from([(-1,), (1, -1), (-1, 1, 1)]))
def test_row_hash_is_the_elementwise_hash(rows, width, shape):
    """hash32_rows (in place, blocks of rows) gives the words of hash32 on the full
    broadcast, for widths around the block size and any leading shape; its int32 order
    words are those words minus 2**31, computed in int32 arithmetic."""
    from attngeom.core.kernels import hash32, hash32_rows, hashed_positions

    keys = hashed_positions(torch.arange(width, dtype=torch.int64))
    states = torch.tensor(rows, dtype=torch.int64).reshape(shape)
    expected = hash32(states[..., None] ^ keys)
    got = hash32_rows(states, keys)
    assert got.dtype == torch.int64 and got.shape == expected.shape
    assert torch.equal(got, expected)
    order = hash32_rows(states, keys, order=True)
    assert order.dtype == torch.int32 and order.shape == expected.shape
    assert torch.equal(order.to(torch.int64), expected - 2**31)


def _unhash32(word: int) -> int:
    """The input lowbias32 maps to ``word``: its steps undone in reverse (a xorshift by
    16 is its own inverse on 32 bits, one by 15 needs the 30 too; a multiply by an odd
    constant has a modular inverse)."""
    from attngeom.core.kernels import _C1, _C2

    m = (1 << 32) - 1
    x = word ^ (word >> 16)
    x = (x * pow(_C2, -1, 1 << 32)) & m
    x = x ^ (x >> 15) ^ (x >> 30)
    x = (x * pow(_C1, -1, 1 << 32)) & m
    return x ^ (x >> 16)


def test_order_words_at_the_ends_and_across_the_sign_bit():
    """Words 0, 1, 2**31 - 1, 2**31 and 2**32 - 1 (the int32 rounds' sign-bit cases):
    their order words are word - 2**31, and signed order is the words' unsigned order."""
    from attngeom.core.kernels import ORDER_MIN, hash32, hash32_rows

    targets = [0, 1, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1]
    states = torch.tensor([_unhash32(w) for w in targets], dtype=torch.int64)
    keys = torch.tensor([0], dtype=torch.int64)
    words = hash32(states[:, None] ^ keys)[:, 0]
    assert words.tolist() == targets
    order = hash32_rows(states, keys, order=True)[:, 0]
    assert order.tolist() == [w - 2**31 for w in targets]
    assert int(order[0]) == ORDER_MIN
    shuffled = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    assert torch.equal(torch.argsort(order[shuffled]), torch.argsort(words[shuffled]))


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300),
       width=st.integers(1, 700), data=st.data())
def test_row_hash_limits_write_each_rows_prefix_exactly(rows, width, data):
    """With ``limit``, every row's first ``limit`` words are hash32's; the rest are
    left as they were (a block hashes up to its largest limit, never past it; blocks of
    8 kB here, so that a few hundred rows make several)."""
    from unittest import mock

    from attngeom.core import kernels
    from attngeom.core.kernels import hash32, hash32_rows, hashed_positions

    keys = hashed_positions(torch.arange(width, dtype=torch.int64))
    states = torch.tensor(rows, dtype=torch.int64)
    limit = torch.tensor(data.draw(st.lists(st.integers(0, width + 3), min_size=len(rows),
                                            max_size=len(rows))))
    expected = hash32(states[:, None] ^ keys)
    cols = torch.arange(width)
    inside = cols[None, :] < limit[:, None]
    for order, dtype, shift in [(False, torch.int64, 0), (True, torch.int32, 2**31)]:
        out = torch.full((len(rows), width), -7, dtype=dtype)
        with mock.patch.object(kernels, "_HASH_BLOCK_BYTES", 1 << 13):
            hash32_rows(states, keys, out=out, limit=limit, order=order)
        assert torch.equal(out[inside].to(torch.int64), expected[inside] - shift)
        # nothing past a row's block maximum is written
        block = max(1, (1 << 13) // out.element_size() // width)
        for a in range(0, len(rows), block):
            top = int(limit[a : a + block].clamp(max=width).max())
            assert bool((out[a : a + block, top:] == -7).all())
