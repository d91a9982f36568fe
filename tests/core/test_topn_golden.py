"""Golden top-N cases worked by hand (SPEC 2), run through the reference and the fast path.

Every expected number below is counted in the test's docstring from the SPEC 2
definitions. Alphas are multiples of 1/16 and values small integers, so every
contribution y_u = alpha_u v_u is a multiple of 1/16 and the distances are exact in
binary floating point: the docstrings work in units of 1/16 ("y16", "D16").

Notation: U universe, I = I_N selected set, s = sum_{i in I} y_i, D[u] = dist(y_u, s),
P = N / (N + #{j not in I: D_j <= rho_max}), R = #{i in I: D_i < rho_min} / N,
F = 2PR / (P + R), margin = rho_min - rho_max, inv = #{(i, j): D_j <= D_i}.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

try:
    from tests.reference_geometry import reference_topn
except ImportError:  # tests/ itself is on sys.path when it is not a package
    from reference_geometry import reference_topn

from attngeom.names import METRICS  # noqa: E402

NAN = math.nan
IMPLEMENTATIONS = ["reference", "direct", "gram"]


def run(impl: str, alpha, values, n_grid, **kwargs):
    """Run one implementation and return numpy arrays of every field."""
    if impl == "reference":
        res = reference_topn(alpha, values, n_grid, **kwargs)
    else:
        from attngeom.core.geometry import topn_metrics

        res = topn_metrics(alpha, values, n_grid, path=impl, **kwargs)
    fields = (*METRICS, "valid", "trivial")
    out = {name: np.asarray(torch.as_tensor(getattr(res, name)).numpy()) for name in fields}
    out["nonfinite"] = np.asarray(torch.as_tensor(res.nonfinite).numpy())
    return out


def check_row(out, expected, k=0, h=0, q=0):
    """Compare one row (all N) with expected lists; NaN entries must be NaN and invalid."""
    for name, want in expected.items():
        got = out[name][k, h, q]
        want = np.asarray(want, dtype=np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: got {got}, want {want}"
        np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=1e-12,
                                   err_msg=name)
    want_valid = ~np.isnan(np.asarray(expected["precision"], dtype=np.float64))
    assert np.array_equal(out["valid"][k, h, q], want_valid), out["valid"][k, h, q]


# Five tokens, one query at t = 4, 1-D values.
ALPHA5 = torch.tensor([[[2.0, 4.0, 1.0, 6.0, 3.0]]]) / 16  # (H=1, Q=1, T=5)
VALUES5 = torch.tensor([[[-2.0], [1.0], [4.0], [1.0], [-2.0]]])  # (G=1, T=5, d=1)
GRID5 = [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_five_tokens_attention(impl, dtype):
    """alpha16 = [2, 4, 1, 6, 3], v = [-2, 1, 4, 1, -2], so y16 = [-4, 4, 4, 6, -6].

    Attention order (alpha descending): 3, 1, 4, 0, 2. U = {0..4}, |U| = 5.

    N = 1: I = {3}, s16 = 6. D16 = [10, 2, 2, 0, 12]. rho_max = 0, rho_min = 2.
      P = 1/(1+0) = 1, R = 1/1 = 1, F = 1, margin = 2/16, inv = 0. Trivial.
    N = 2: I = {3, 1}, s16 = 10. D16 = [14, 6, 6, 4, 16]. rho_max = 6 (u1),
      rho_min = min(14, 6, 16) = 6 (u2, an exact duplicate of u1).
      P = 2/(2 + #{6 <= 6}) = 2/3; R = #{4 < 6} / 2 = 1/2; F = (2/3)/(7/6) = 4/7;
      margin = 0; inv: (1, 2) only = 1.
    N = 3: I = {3, 1, 4}, s16 = 4. D16 = [8, 0, 0, 2, 10]. rho_max = 10, rho_min = 0.
      P = 3/(3 + #{8, 0 <= 10}) = 3/5; R = #{D_i < 0} / 3 = 0; F = 0;
      margin = -10/16; inv: i=3 (2): {u2}; i=1 (0): {u2}; i=4 (10): {u0, u2} = 4.
    N = 4: I = {3, 1, 4, 0}, s = 0. D16 = |y16| = [4, 4, 4, 6, 6]. rho_max = 6,
      rho_min = 4 (u2). P = 4/5; R = #{< 4} = 0; F = 0; margin = -2/16;
      inv: u2 (4) is <= every D_i = 4.
    N = 0, 5 (= |U|), 6: undefined.
    """
    out = run(impl, ALPHA5.to(dtype), VALUES5.to(dtype), GRID5)
    check_row(out, {
        "precision": [NAN, 1, 2 / 3, 3 / 5, 4 / 5, NAN, NAN],
        "recall": [NAN, 1, 1 / 2, 0, 0, NAN, NAN],
        "f_score": [NAN, 1, 4 / 7, 0, 0, NAN, NAN],
        "margin": [NAN, 2 / 16, 0, -10 / 16, -2 / 16, NAN, NAN],
        "inversions": [NAN, 0, 1, 4, 4, NAN, NAN],
    })
    assert out["trivial"].tolist() == [False, True, False, False, False, False, False]
    assert out["nonfinite"].tolist() == [[False]]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_five_tokens_contribution_ties(impl):
    """Same row, contribution rule: alpha16 * |v| = [4, 4, 4, 6, 6].

    Ties go to the smaller position: order 3, 4 (both 6), then 0, 1, 2 (all 4).
    N = 2: I = {3, 4}, s = 0, D16 = [4, 4, 4, 6, 6]. rho_max = 6, rho_min = 4.
      P = 2/(2+3) = 2/5; R = 0; F = 0; margin = -2/16; inv = 2 * 3 = 6.
    N = 3: I = {3, 4, 0}, s16 = -4, D16 = [0, 8, 8, 10, 2]. rho_max = 10, rho_min = 8.
      P = 3/(3+2) = 3/5; R = #{0, 2 < 8} / 3 = 2/3; F = (4/5)/(19/15) = 12/19;
      margin = -2/16; inv: i=3 (10): {u1, u2} = 2.
    (Had the ties gone to the larger position, N = 2 would select {4, 3} equally
    but N = 3 would add u2, with s16 = 4 and different metrics.)
    """
    out = run(impl, ALPHA5, VALUES5, [2, 3], rule="contribution")
    check_row(out, {
        "precision": [2 / 5, 3 / 5],
        "recall": [0, 2 / 3],
        "f_score": [0, 12 / 19],
        "margin": [-2 / 16, -2 / 16],
        "inversions": [6, 2],
    })


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_attention_ties_go_to_smaller_position(impl):
    """alpha = 1/4 for all four keys, v = [1, 2, 3, 4]: y (x4) = [1, 2, 3, 4], t = 3.

    All alphas tie, so the order is 0, 1, 2, 3.
    N = 2: I = {0, 1}, s (x4) = 3. D (x4) = [2, 1, 0, 1]. rho_max = 2, rho_min = 0.
      P = 2/(2 + 2) = 1/2; R = 0; F = 0; margin = -2/4; inv: i=0 (2): {u2, u3};
      i=1 (1): {u2, u3 (1 <= 1)} = 4.
    N = 3: I = {0, 1, 2}, s (x4) = 6. D (x4) = [5, 4, 3, 2]. rho_max = 5, rho_min = 2.
      P = 3/4; R = 0; F = 0; margin = -3/4; inv = 3.
    Selecting the larger positions first ({3, 2} for N = 2) would give s = 7/4,
    D (x4) = [6, 5, 1, 1]: P = 1, R = 1.
    """
    alpha = torch.full((1, 1, 4), 0.25)
    values = torch.tensor([[[1.0], [2.0], [3.0], [4.0]]])
    out = run(impl, alpha, values, [2, 3])
    check_row(out, {
        "precision": [1 / 2, 3 / 4],
        "recall": [0, 0],
        "f_score": [0, 0],
        "margin": [-2 / 4, -3 / 4],
        "inversions": [4, 3],
    })


SINK_ALPHA = torch.tensor([[[8.0, 4.0, 1.0, 2.0, 1.0]]]) / 16
SINK_VALUES = torch.tensor([[[1.0], [1.0], [-4.0], [3.0], [2.0]]])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_sink_in_universe(impl):
    """alpha16 = [8, 4, 1, 2, 1], v = [1, 1, -4, 3, 2]: y16 = [8, 4, -4, 6, 2], t = 4.

    Order 0, 1, 3, 2, 4 (u2 and u4 tie at 1: the smaller position first).
    N = 2: I = {0, 1}, s16 = 12, D16 = [4, 8, 16, 6, 10]. rho_max = 8, rho_min = 6.
      P = 2/(2+1) = 2/3; R = #{4 < 6} / 2 = 1/2; F = 4/7; margin = -2/16; inv = 1 (u3 vs u1).
    """
    out = run(impl, SINK_ALPHA, SINK_VALUES, [2])
    check_row(out, {"precision": [2 / 3], "recall": [1 / 2], "f_score": [4 / 7],
                    "margin": [-2 / 16], "inversions": [1]})


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("sink_alpha", [0.5, math.nan, math.inf])
def test_sink_excluded(impl, sink_alpha):
    """The same row with the sink removed from the universe: U = {1, 2, 3, 4}.

    The other alphas are NOT renormalised (sum 8/16): y16 = [., 4, -4, 6, 2].
    Order 1, 3, 2, 4.
    N = 1: I = {1}, s16 = 4, D16 = [., 0, 8, 2, 2]. P = R = F = 1, margin = 2/16, inv 0.
    N = 2: I = {1, 3}, s16 = 10, D16 = [., 6, 14, 4, 8]. rho_max = 6, rho_min = 8.
      P = R = F = 1; margin = 2/16 (renormalised alphas would double it); inv = 0.
    N = 3: I = {1, 3, 2}, s16 = 6, D16 = [., 2, 10, 0, 4]. rho_max = 10, rho_min = 4.
      P = 3/(3+1) = 3/4; R = #{2, 0 < 4} / 3 = 2/3; F = 1/(17/12) = 12/17;
      margin = -6/16; inv = 1 (u4 vs u2).
    N = 4 = |U|: undefined. The sink's own alpha is outside the universe, so a
    non-finite value there neither flags the row nor changes anything.
    """
    alpha = SINK_ALPHA.clone()
    alpha[0, 0, 0] = sink_alpha
    out = run(impl, alpha, SINK_VALUES, [1, 2, 3, 4], exclude_sink=True)
    check_row(out, {
        "precision": [1, 1, 3 / 4, NAN],
        "recall": [1, 1, 2 / 3, NAN],
        "f_score": [1, 1, 12 / 17, NAN],
        "margin": [2 / 16, 2 / 16, -6 / 16, NAN],
        "inversions": [0, 0, 1, NAN],
    })
    assert out["nonfinite"].tolist() == [[False]]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("broadcast", [True, False])
def test_masked_key(impl, broadcast):
    """The five-token row with key 3 (the largest alpha, 6/16) hidden by the mask.

    The mask, not the alpha, defines the universe: U = {0, 1, 2, 4}, y16 = [-4, 4, 4, ., -6].
    Order 1 (4), 4 (3), 0 (2), 2 (1).
    N = 2: I = {1, 4}, s16 = -2, D16 = [2, 6, 6, ., 4]. rho_max = 6, rho_min = 2.
      P = 2/(2+2) = 1/2; R = 0; F = 0; margin = -4/16; inv: i=1: {u0, u2}; i=4: {u0} = 3.
    N = 3: I = {1, 4, 0}, s16 = -6, D16 = [2, 10, 10, ., 0]. rho_max = 10, rho_min = 10.
      P = 3/(3+1) = 3/4; R = #{2, 0 < 10} / 3 = 2/3; F = 12/17; margin = 0; inv = 1.
    N = 4 = |U|: undefined. A second head sees everything (causal) and is the
    five-token case (N = 2, 3: P = 2/3, 3/5) when the mask is per head.
    """
    visible = torch.tensor([[[True, True, True, False, True]]])
    alpha, values = ALPHA5, VALUES5
    if not broadcast:
        alpha = ALPHA5.expand(2, 1, 5).clone()
        visible = torch.cat([visible, torch.ones(1, 1, 5, dtype=torch.bool)])
    out = run(impl, alpha, values, [2, 3, 4], visible=visible)
    check_row(out, {
        "precision": [1 / 2, 3 / 4, NAN],
        "recall": [0, 2 / 3, NAN],
        "f_score": [0, 12 / 17, NAN],
        "margin": [-4 / 16, 0, NAN],
        "inversions": [3, 1, NAN],
    })
    if not broadcast:
        check_row(out, {
            "precision": [2 / 3, 3 / 5, 4 / 5],
            "recall": [1 / 2, 0, 0],
            "f_score": [4 / 7, 0, 0],
            "margin": [0, -10 / 16, -2 / 16],
            "inversions": [1, 4, 4],
        }, h=1)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_cosine_with_zero_vector(impl):
    """Cosine distance, 2-D values: v = [(0,0), (1,0), (0,1), (1,1)], alpha16 = [8, 4, 2, 2].

    y = [0, (1/4, 0), (0, 1/8), (1/8, 1/8)], t = 3; order 0, 1, 2, 3 (u2, u3 tie).
    A zero y has <y, s> = 0, so D = 1 - 0 / (0 + 1e-12) = 1 exactly.
    N = 1: I = {0}, s = 0: every D = 1. rho_max = rho_min = 1.
      P = 1/(1+3) = 1/4; R = 0; F = 0; margin = 0; inv = 3. (Cosine N = 1 is not trivial.)
    N = 2: I = {0, 1}, s = (1/4, 0). D = [1, ~0, 1, 1 - 1/sqrt 2].
      rho_max = 1, rho_min = 1 - 1/sqrt 2. P = 2/(2+2) = 1/2; R = #{u1} / 2 = 1/2;
      F = 1/2; margin = -1/sqrt 2; inv: i=0: {u2, u3} = 2.
    N = 3: I = {0, 1, 2}, s = (1/4, 1/8), |s| = sqrt 5 / 8.
      D = [1, 1 - 2/sqrt 5, 1 - 1/sqrt 5, 1 - 3/sqrt 10]. rho_max = 1, rho_min = 1 - 3/sqrt 10.
      P = 3/4; R = 0; F = 0; margin = -3/sqrt 10; inv = 3 (u3, at 0.051, is closer
      than each of u0 at 1, u1 at 0.106 and u2 at 0.553).
    The 1e-12 in the denominator moves these by about 1e-11.
    """
    alpha = torch.tensor([[[8.0, 4.0, 2.0, 2.0]]]) / 16
    values = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    out = run(impl, alpha, values, [1, 2, 3], distance="cosine")
    r2, r5, r10 = math.sqrt(2), math.sqrt(5), math.sqrt(10)
    expected = {
        "precision": [1 / 4, 1 / 2, 3 / 4],
        "recall": [0, 1 / 2, 0],
        "f_score": [0, 1 / 2, 0],
        "margin": [0, -1 / r2, -3 / r10],
        "inversions": [3, 2, 3],
    }
    for name, want in expected.items():
        np.testing.assert_allclose(out[name][0, 0, 0], want, atol=1e-9, err_msg=name)
    assert out["valid"].all()
    assert out["trivial"].tolist() == [False, False, False]
    assert 1 - 2 / r5 > 1 - 3 / r10  # u1 is farther than u3 at N = 3: the R = 0 above


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_euclidean_n1_duplicate_is_not_perfect(impl):
    """Euclidean N = 1 is flagged trivial, but its metrics still follow the definitions.

    alpha16 = [4, 4, 2], v = [1, 1, 3]: y16 = [4, 4, 6], t = 2; order 0, 1, 2.
    N = 1: I = {0}, s16 = 4, D16 = [0, 0, 2]: the unselected duplicate u1 is at
    distance 0 = rho_max. P = 1/(1+1) = 1/2; R = #{0 < 0} = 0; F = 0; margin = 0;
    inv = 1. (SPEC 2's "N = 1 gives P = R = F = 1" assumes no other key has the same y.)
    N = 2: I = {0, 1}, s16 = 8, D16 = [4, 4, 2]. rho_max = 4, rho_min = 2.
      P = 2/(2+1) = 2/3; R = 0; F = 0; margin = -2/16; inv = 2.
    """
    alpha = torch.tensor([[[4.0, 4.0, 2.0]]]) / 16
    values = torch.tensor([[[1.0], [1.0], [3.0]]])
    out = run(impl, alpha, values, [1, 2])
    check_row(out, {
        "precision": [1 / 2, 2 / 3],
        "recall": [0, 0],
        "f_score": [0, 0],
        "margin": [0, -2 / 16],
        "inversions": [1, 2],
    })
    assert out["trivial"].tolist() == [True, False]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("bad", [math.inf, math.nan, -math.inf])
def test_nonfinite_row_is_skipped_alone(impl, bad):
    """Head 1 has a non-finite alpha at key 2 (in its universe): that row is all NaN.

    Head 0 is the five-token case and must be unaffected; head 1's row is flagged
    in ``nonfinite`` and every N is invalid.
    """
    alpha = ALPHA5.expand(2, 1, 5).clone()
    alpha[1, 0, 2] = bad
    out = run(impl, alpha, VALUES5, [1, 2, 3])
    assert out["nonfinite"].tolist() == [[False], [True]]
    check_row(out, {
        "precision": [1, 2 / 3, 3 / 5],
        "recall": [1, 1 / 2, 0],
        "f_score": [1, 4 / 7, 0],
        "margin": [2 / 16, 0, -10 / 16],
        "inversions": [0, 1, 4],
    })
    check_row(out, {name: [NAN] * 3 for name in METRICS}, h=1)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_n_limits_and_unsorted_grid(impl):
    """Grid order is kept: column c is N = n_grid[c]. |U| = 5 for the five-token row.

    N = 4 = |U| - 1 is the largest defined N; 5 = |U|, 0 and 7 are undefined.
    Expected values as in ``test_five_tokens_attention``.
    """
    out = run(impl, ALPHA5, VALUES5, [4, 0, 2, 5, 1, 7])
    check_row(out, {
        "precision": [4 / 5, NAN, 2 / 3, NAN, 1, NAN],
        "recall": [0, NAN, 1 / 2, NAN, 1, NAN],
        "f_score": [0, NAN, 4 / 7, NAN, 1, NAN],
        "margin": [-2 / 16, NAN, 0, NAN, 2 / 16, NAN],
        "inversions": [4, NAN, 1, NAN, 0, NAN],
    })
    assert out["trivial"].tolist() == [False, False, False, False, True, False]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_query_positions_define_causal_universe(impl):
    """Two query rows of the five-token window at t = 2 and t = 4 (explicit positions).

    Row t = 2: U = {0, 1, 2}, alpha16 = [2, 4, 1], y16 = [-4, 4, 4]; order 1, 0, 2.
      N = 1: I = {1}, s16 = 4, D16 = [8, 0, 0]: u2 duplicates u1.
        P = 1/2; R = 0; F = 0; margin = 0; inv = 1.
      N = 2: I = {1, 0}, s = 0, D16 = [4, 4, 4]. P = 2/3; R = 0; F = 0; margin = 0; inv = 2.
      N = 3 = |U|: undefined.
    Row t = 4: the five-token case.
    """
    alpha = ALPHA5.expand(1, 2, 5).clone()
    out = run(impl, alpha, VALUES5, [1, 2, 3], query_positions=torch.tensor([2, 4]))
    check_row(out, {
        "precision": [1 / 2, 2 / 3, NAN],
        "recall": [0, 0, NAN],
        "f_score": [0, 0, NAN],
        "margin": [0, 0, NAN],
        "inversions": [1, 2, NAN],
    }, q=0)
    check_row(out, {
        "precision": [1, 2 / 3, 3 / 5],
        "recall": [1, 1 / 2, 0],
        "f_score": [1, 4 / 7, 0],
        "margin": [2 / 16, 0, -10 / 16],
        "inversions": [0, 1, 4],
    }, q=1)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_gqa_head_reads_its_kv_head(impl):
    """H = 2 query heads, G = 2 kv heads: head 1 must read kv head 1, not kv head 0.

    Kv head 1 has v = [1, 1, 1, 1, 1], so for head 1 y16 = alpha16 = [2, 4, 1, 6, 3].
    Attention order 3, 1, 4, 0, 2.
    N = 2: I = {3, 1}, s16 = 10, D16 = [8, 6, 9, 4, 7]. rho_max = 6, rho_min = 7.
      P = R = F = 1; margin = 1/16; inv = 0.
    N = 3: I = {3, 1, 4}, s16 = 13, D16 = [11, 9, 12, 7, 10]. rho_max = 10, rho_min = 11.
      P = R = F = 1; margin = 1/16; inv = 0.
    Head 0 (kv head 0) is the five-token case.
    """
    alpha = ALPHA5.expand(2, 1, 5).clone()
    values = torch.cat([VALUES5, torch.ones(1, 5, 1)])
    out = run(impl, alpha, values, [2, 3])
    check_row(out, {"precision": [1, 1], "recall": [1, 1], "f_score": [1, 1],
                    "margin": [1 / 16, 1 / 16], "inversions": [0, 0]}, h=1)
    check_row(out, {"precision": [2 / 3, 3 / 5], "recall": [1 / 2, 0], "f_score": [4 / 7, 0],
                    "margin": [0, -10 / 16], "inversions": [1, 4]}, h=0)
