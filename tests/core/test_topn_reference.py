"""Fast top-N metrics against the slow reference on generated inputs (SPEC 2, STYLE habit 3).

The generated inputs are built so that the comparison is exact rather than lucky:

- Euclidean: alphas are k/64 with small integers k and values small integers in
  [-3, 3]. Every product and sum the fast path forms in float64 is then exact, so
  its comparisons of g agree with the reference's exact squared distances even on
  the many exact ties (equal alphas, duplicate and zero vectors) these inputs have.
- Cosine: rounding may decide an exact-math tie between different numbers, so the
  values are generic vectors in d >= 2 (normals rounded to multiples of 2**-12, so
  that every inner product is exact) with no two distinct contributions parallel,
  but with planted exact duplicates (same value and same alpha, hence the same y
  and bit-identical distances in both implementations), negated copies and zero
  vectors.
- Continuous: softmax of normal logits and normal values, where ties have
  probability 0, for both distances.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from tests.reference_geometry import RULES, assert_matches_reference, reference_topn
except ImportError:  # tests/ itself is on sys.path when it is not a package
    from reference_geometry import RULES, assert_matches_reference, reference_topn

from attngeom.core.geometry import topn_metrics  # noqa: E402
from attngeom.names import METRICS  # noqa: E402

PATHS = ("direct", "gram")

DTYPES = (torch.float32, torch.float64)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def divisors(n: int) -> list[int]:
    return [g for g in range(1, n + 1) if n % g == 0]


@st.composite
def layouts(draw, min_dim: int = 1, max_keys: int = 10):
    """Shapes, rule, variant, query positions, visibility, N grid and control coordinates."""
    h = draw(st.integers(1, 4))
    g = draw(st.sampled_from(divisors(h)))
    t = draw(st.one_of(st.integers(1, max_keys), st.integers(5, max_keys)))
    d = draw(st.integers(min_dim, 4))
    q = draw(st.integers(1, min(3, t)))
    rule = draw(st.sampled_from(RULES))
    if draw(st.booleans()):
        positions = None
        pos_list = list(range(t - q, t))
    else:
        pos_list = list(draw(st.permutations(range(t)))[:q])  # any order
        positions = torch.tensor(pos_list, dtype=torch.int64)
    vis_mode = draw(st.sampled_from(["causal", "causal_holes", "broadcast", "per_head"]))
    if vis_mode == "causal":
        visible = None
    else:
        rows = 1 if vis_mode == "broadcast" else h
        seen = st.sampled_from([True, True, True, False])  # mostly visible, some masked
        bits = draw(st.lists(seen, min_size=rows * q * t, max_size=rows * q * t))
        visible = torch.tensor(bits, dtype=torch.bool).reshape(rows, q, t)
        if vis_mode == "causal_holes":  # holes punched into the causal mask
            causal = torch.arange(t)[None, :] <= torch.tensor(pos_list)[:, None]
            visible = visible & causal[None]
    # N from 0 to T + 1, with at least one N that a full universe would allow
    grid = draw(st.sets(st.integers(0, t + 1), min_size=0, max_size=4))
    grid = sorted(grid | {draw(st.integers(1, max(1, t - 1)))})
    return {
        "shape": (h, g, q, t, d),
        "kwargs": {
            "rule": rule,
            "visible": visible,
            "exclude_sink": draw(st.booleans()),
            "query_positions": positions,
            "repeats": draw(st.integers(1, 3)),
            "seed": draw(st.integers(0, 2**40)),
            "window": draw(st.integers(0, 50)),
            "layer": draw(st.integers(0, 40)),
        },
        "grid": grid,
        "dtype": draw(st.sampled_from(DTYPES)),
    }


@st.composite
def token_kinds(draw, t: int, max_negs: int | None = None):
    """Per token: ("free", j), ("zero", j), ("copy", r) or ("neg", r) of a free token r < j.

    Copies give duplicate vectors; negated copies give equal norms (hence exact
    contribution-score ties when the alphas are equal) with different contributions.
    """
    kinds = []
    for j in range(t):
        free = [r for r in range(j) if kinds[r][0] == "free"]
        negs = sum(kind == "neg" for kind, _ in kinds)
        options = ["free", "zero"] + (["copy"] if free else [])
        if free and (max_negs is None or negs < max_negs):
            options.append("neg")
        kind = draw(st.sampled_from(options))
        kinds.append((kind, draw(st.sampled_from(free)) if kind in ("copy", "neg") else j))
    return kinds


def apply_kinds(values: np.ndarray, alpha: np.ndarray, kinds, share_alpha: bool) -> None:
    """Zero, copy or negate value vectors in place (every kv head alike).

    With ``share_alpha`` a copied or negated token also takes its source's alpha in
    every row (exact duplicates, or exact ties of the contribution score).
    """
    for j, (kind, root) in enumerate(kinds):
        if kind == "zero":
            values[:, j] = 0
        elif kind in ("copy", "neg"):
            values[:, j] = values[:, root] if kind == "copy" else -values[:, root]
            if share_alpha:
                alpha[:, :, j] = alpha[:, :, root]


@st.composite
def dyadic_cases(draw):
    """Euclidean inputs on which float64 arithmetic is exact, with many ties."""
    lay = draw(layouts())
    h, g, q, t, d = lay["shape"]
    kmax = draw(st.sampled_from([2, 8]))  # few distinct alphas: many ties
    vmax = draw(st.sampled_from([1, 3]))
    ks = draw(st.lists(st.integers(0, kmax), min_size=h * q * t, max_size=h * q * t))
    alpha = np.array(ks, dtype=np.float64).reshape(h, q, t) / 64
    ints = draw(st.lists(st.integers(-vmax, vmax), min_size=g * t * d, max_size=g * t * d))
    values = np.array(ints, dtype=np.float64).reshape(g, t, d)
    apply_kinds(values, alpha, draw(token_kinds(t)), share_alpha=draw(st.booleans()))
    lay["alpha"], lay["values"] = alpha, values
    return lay


@st.composite
def cosine_cases(draw):
    """Generic directions (d >= 2) with exact duplicates and zero vectors, dyadic alphas."""
    lay = draw(layouts(min_dim=2))
    h, g, q, t, d = lay["shape"]
    ks = draw(st.lists(st.integers(0, 8), min_size=h * q * t, max_size=h * q * t))
    alpha = np.array(ks, dtype=np.float64).reshape(h, q, t) / 64
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Generic directions on a 2**-12 grid: the Gram entries, <v_u, s> and |s|^2 are
    # then exact in float64, so a duplicate's distance is bit-identical to its
    # source's in both implementations (with unrounded normals the fast path's Gram
    # rows of two equal vectors can differ in the last bit, which turns an exact tie
    # into a strict inequality).
    values = np.round(rng.standard_normal((g, t, d)) * 4096) / 4096
    # A copied vector must also share the alpha in every row, or the two
    # contributions would be distinct but parallel (an exact tie of the cosine
    # distance that only rounding decides). Negated copies are anti-parallel (no
    # tie); they share the alpha too, for exact contribution-score ties. At most one
    # negated copy: two cancelling pairs in I would make s zero in exact arithmetic
    # but a rounding residual in float, where the cosine is meaningless.
    apply_kinds(values, alpha, draw(token_kinds(t, max_negs=1)), share_alpha=True)
    lay["alpha"], lay["values"] = alpha, values
    return lay


def compare(case, distance: str) -> None:
    dtype = case["dtype"]
    alpha = torch.tensor(case["alpha"], dtype=dtype)
    values = torch.tensor(case["values"], dtype=dtype)
    kwargs = dict(case["kwargs"], distance=distance)
    ref = reference_topn(alpha, values, case["grid"], **kwargs)
    for path in PATHS:  # both ways of computing <v_u, s_N> (geometry.py)
        fast = topn_metrics(alpha, values, case["grid"], path=path, **kwargs)
        assert_matches_reference(fast, ref)


@SETTINGS
@given(case=dyadic_cases())
def test_euclidean_dyadic_matches_reference(case):
    compare(case, "euclidean")


@SETTINGS
@given(case=cosine_cases())
def test_cosine_generic_matches_reference(case):
    compare(case, "cosine")


@st.composite
def continuous_cases(draw, min_dim: int = 1):
    """Softmax of normal logits over the visible keys, normal values: no ties."""
    lay = draw(layouts(min_dim=min_dim))
    h, g, q, t, d = lay["shape"]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    logits = rng.standard_normal((h, q, t)) * draw(st.sampled_from([0.5, 2.0, 6.0]))
    vis = lay["kwargs"]["visible"]
    if vis is None:
        pos = lay["kwargs"]["query_positions"]
        pos = np.arange(t - q, t) if pos is None else pos.numpy()
        vis_np = np.arange(t)[None, None, :] <= pos[None, :, None]
    else:
        vis_np = vis.numpy()
    vis_np = np.broadcast_to(vis_np, (h, q, t))
    logits = np.where(vis_np, logits, -np.inf)
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(logits - top)
    total = weights.sum(-1, keepdims=True)
    lay["alpha"] = weights / np.where(total > 0, total, 1.0)
    lay["values"] = rng.standard_normal((g, t, d)) * draw(st.sampled_from([0.1, 1.0, 10.0]))
    return lay


@SETTINGS
@given(case=continuous_cases())
def test_continuous_euclidean_matches_reference(case):
    compare(case, "euclidean")


@SETTINGS
@given(case=continuous_cases(min_dim=2))
def test_continuous_cosine_matches_reference(case):
    """d >= 2: in one dimension all contributions are parallel, and the cosine distances
    of same-sign tokens differ only through the 1e-12 in the denominator."""
    compare(case, "cosine")


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    distance=st.sampled_from(["euclidean", "cosine"]),
    bad=st.sampled_from([math.inf, -math.inf, math.nan]),
    where=st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 9)),
)
def test_nonfinite_alpha_matches_reference(data, distance, bad, where):
    """A non-finite alpha skips its row only if the key is in the row's universe.

    The reference flags a row when any alpha in its universe is non-finite and
    leaves every entry of that row NaN (valid False); every other row is computed
    as usual, and the whole result must still equal the reference.
    """
    case = data.draw(dyadic_cases() if distance == "euclidean" else cosine_cases())
    h, _, q, t, _ = case["shape"]
    case["alpha"][where[0] % h, where[1] % q, where[2] % t] = bad
    dtype = case["dtype"]
    alpha = torch.tensor(case["alpha"], dtype=dtype)
    values = torch.tensor(case["values"], dtype=dtype)
    kwargs = dict(case["kwargs"], distance=distance)
    ref = reference_topn(alpha, values, case["grid"], **kwargs)
    for path in PATHS:
        fast = topn_metrics(alpha, values, case["grid"], path=path, **kwargs)
        nonfinite = fast.nonfinite.numpy()
        assert np.array_equal(nonfinite, ref.nonfinite)
        assert not fast.valid.numpy()[:, nonfinite].any()
        for name in METRICS:
            assert np.isnan(fast.metric(name).numpy()[:, nonfinite]).all(), name
        assert_matches_reference(fast, ref)


def test_reference_sees_nonfinite_only_in_universe():
    """The reference itself: a NaN at a masked key or at an excluded sink flags nothing."""
    alpha = torch.tensor([[[0.5, 0.25, 0.125, 0.125]], [[0.5, 0.25, 0.125, 0.125]]])
    values = torch.tensor([[[1.0], [2.0], [-1.0], [3.0]]])
    alpha[0, 0, 2] = math.nan  # masked for head 0
    alpha[1, 0, 0] = math.nan  # the sink, excluded
    visible = torch.tensor([[[True, True, False, True]], [[True, True, True, True]]])
    ref = reference_topn(alpha, values, [1, 2], visible=visible, exclude_sink=True)
    assert ref.nonfinite.tolist() == [[False], [False]]
    assert ref.valid[0, 0, 0].tolist() == [True, False]  # |U| = 2 for head 0
    assert ref.valid[0, 1, 0].tolist() == [True, True]
    ref = reference_topn(alpha, values, [1, 2], visible=visible)
    assert ref.nonfinite.tolist() == [[False], [True]]
