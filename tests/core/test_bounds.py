"""Certified bounds, inversion bounds, the constant-norm envelope and their fit (SPEC 5).

The central property: with mu, c_lo, c_hi measured on the window itself, the
certified bound never exceeds the measured Euclidean metric. It is checked against
a plain float64 loop written from the definition (SPEC 2) and against the fast
``topn_metrics``, on generated inputs with ties, zero vectors, GQA groups, both
variants, all rules and N at its limits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngeom.core.batch import ValueStats
from attngeom.core.bounds import (
    BOUNDS_COLUMNS,
    BoundsAccumulator,
    certified_bounds,
    constant_norm_envelope,
    inversion_bounds,
    sorted_descending,
    window_constants,
)
from attngeom.core.geometry import topn_metrics
from attngeom.core.pairs import coherence_slack
from attngeom.errors import ConfigError
from tests.core.batches import assert_columns_equal, batch_of, causal

# ---------------------------------------------------------------- helpers


def rule_order(alpha: torch.Tensor, norms: torch.Tensor, universe: torch.Tensor, rule: str,
               gen: torch.Generator) -> torch.Tensor:
    """(H, Q, T) order of a plain loop: universe keys first, by rule, ties to smaller j."""
    h, q, t = alpha.shape
    order = torch.empty(h, q, t, dtype=torch.int64)
    for hi in range(h):
        for qi in range(q):
            keys = list(range(t))
            inside = [j for j in keys if universe[hi, qi, j]]
            outside = [j for j in keys if not universe[hi, qi, j]]
            if rule == "attention":
                inside.sort(key=lambda j: (-float(alpha[hi, qi, j]), j))
            elif rule == "contribution":
                inside.sort(key=lambda j: (-float(alpha[hi, qi, j]) * float(norms[hi, j]), j))
            else:
                perm = torch.randperm(len(inside), generator=gen).tolist()
                inside = [inside[p] for p in perm]
            order[hi, qi] = torch.tensor(inside + outside)
    return order


def measured_pr(alpha, values, kv, order, universe, n_grid):
    """Plain-loop float64 Precision and Recall (SPEC 2, compared through g as SPEC 8 says)."""
    h, q, t = alpha.shape
    p = np.full((h, q, len(n_grid)), np.nan)
    r = np.full((h, q, len(n_grid)), np.nan)
    v64 = values.to(torch.float64).numpy()
    a64 = alpha.to(torch.float64).numpy()
    for hi in range(h):
        vv = v64[int(kv[hi])]
        for qi in range(q):
            u = [int(j) for j in order[hi, qi] if universe[hi, qi, int(j)]]
            for k, n in enumerate(n_grid):
                if not 1 <= n < len(u):
                    continue
                sel, uns = u[:n], u[n:]
                s = sum(a64[hi, qi, i] * vv[i] for i in sel)
                g = {j: 2 * a64[hi, qi, j] * float(vv[j] @ s)
                     - a64[hi, qi, j] ** 2 * float(vv[j] @ vv[j]) for j in u}
                gmin = min(g[i] for i in sel)
                gmax = max(g[j] for j in uns)
                p[hi, qi, k] = n / (n + sum(1 for j in uns if g[j] >= gmin))
                r[hi, qi, k] = sum(1 for i in sel if g[i] > gmax) / n
    return p, r


def random_window(gen: torch.Generator, h=4, g=2, t=10, d=3, q=None):
    values = torch.randn(g, t, d, generator=gen)
    values[:, 0] *= 0.2
    qpos = torch.arange(1, t) if q is None else torch.arange(t - q, t)
    vis = causal(qpos, t)
    logits = torch.randn(h, qpos.numel(), t, generator=gen)
    alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
    return values, alpha, qpos


# ---------------------------------------------------------------- window constants


def test_window_constants_by_hand() -> None:
    """v1 = e1, v2 = e2, v3 = (-1, 1)/1: mu = 1/sqrt2; sink (1, 0): cos -1, 0, -1/sqrt2."""
    v = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [-1.0, 1.0], [0.0, 0.0]]])
    mu, c_lo, c_hi = window_constants(ValueStats(v))
    s = 1 / math.sqrt(2)
    # the zero vector v4 is left out: it would otherwise put 0 in [c_lo, c_hi] and mu;
    # mu is measured in float32 and raised by its rounding bound: never below the truth
    slack = coherence_slack(2)
    assert s <= float(mu[0]) <= s + 2 * slack
    assert c_lo.tolist() == pytest.approx([-1.0])
    assert c_hi.tolist() == pytest.approx([0.0])
    ex = torch.tensor([False, True, False, False, False])
    mu2, lo2, hi2 = window_constants(ValueStats(v), exclude=ex)
    assert s <= float(mu2[0]) <= s + 2 * slack and lo2.tolist() == pytest.approx([-s])
    assert hi2.tolist() == pytest.approx([0.0])
    with pytest.raises(ConfigError, match="exclude"):
        window_constants(ValueStats(v), exclude=torch.zeros(3, dtype=torch.bool))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), t=st.integers(2, 40), d=st.integers(1, 70),
       dup=st.booleans())
def test_coherence_never_below_float64(seed: int, t: int, d: int, dup: bool) -> None:
    """The float32 blocked max |cos| plus its slack bounds the float64 maximum from above,
    by at most twice the slack, with duplicated and zero vectors mixed in."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(2, t, d, generator=gen) * torch.rand(2, t, 1, generator=gen) * 10
    if dup and t > 3:
        v[:, 2] = v[:, 1] * 3.0
        v[:, 3] = 0.0
    mu = window_constants(ValueStats(v)).mu
    v64 = v.double()
    n = v64.norm(dim=-1)
    cos = (v64 @ v64.transpose(-1, -2)) / (n[:, :, None] * n[:, None, :]).clamp_min(1e-300)
    keep = n > 0
    keep[:, 0] = False
    ok = keep[:, :, None] & keep[:, None, :] & ~torch.eye(t, dtype=torch.bool)
    exact = torch.where(ok, cos.abs(), 0.0).amax(dim=(-1, -2)).clamp_max(1.0)
    has = keep.sum(-1) >= 2
    assert bool((mu[has] >= exact[has]).all())
    assert bool((mu[has] <= exact[has] + 2 * coherence_slack(d)).all())
    assert bool((mu[~has] == 0).all())


def test_window_constants_degenerate() -> None:
    """A zero sink or a single non-sink token leave nothing to measure: constants 0."""
    v = torch.tensor([[[0.0, 0.0], [1.0, 2.0]], [[1.0, 0.0], [0.0, 0.0]]])
    mu, c_lo, c_hi = window_constants(ValueStats(v))
    assert mu.tolist() == [0.0, 0.0] and c_lo.tolist() == [0.0, 0.0]
    assert c_hi.tolist() == [0.0, 0.0]


# ---------------------------------------------------------------- golden bound


def test_certified_bound_golden() -> None:
    """Four tokens, hand-worked (a_u = alpha_u ||v_u||).

    v0 = (0.1, 0), v1 = (1, 0), v2 = (0, 1), v3 = (-0.3, -0.3); alpha = (.1, .6, .2, .1);
    order 1, 2, 0, 3. mu = |cos(v1, v3)| = 1/sqrt2, c_lo = -1/sqrt2 (v3), c_hi = 1 (v1).
    a = (0.01, 0.6, 0.2, 0.1 * 0.3 sqrt2 = 0.04243).
    N = 2, I = {1, 2}, S = 0.8: L1 = .36 - 2 mu .6 .2 = .1903, L2 = .04 - 2 mu .2 .6 = -.1297;
    U3 = 2 a3 mu .8 - a3^2 = .0462, U0 = 2 .01 .8 - .0001 = .0159. Only token 1 beats
    max U = .0462, so R >= 1/2; both unselected tokens have U >= min L = L2, so
    P >= 2 / (2 + 2) = 1/2 and F >= 1/2.
    """
    v = torch.tensor([[[0.1, 0.0], [1.0, 0.0], [0.0, 1.0], [-0.3, -0.3]]])
    st_ = ValueStats(v)
    alpha = torch.tensor([[[0.1, 0.6, 0.2, 0.1]]])
    order = torch.tensor([[[1, 2, 0, 3]]])
    uni = torch.ones(1, 1, 4, dtype=torch.bool)
    b = certified_bounds(alpha, st_, torch.tensor([0]), order, uni, [1, 2, 3, 4],
                         *window_constants(st_))
    assert b["recall_bound"][0, 0, :2].tolist() == [1.0, 0.5]
    assert b["precision_bound"][0, 0, :2].tolist() == [1.0, 0.5]
    assert b["f_bound"][0, 0, 1].item() == pytest.approx(0.5)
    assert math.isnan(b["recall_bound"][0, 0, 3].item())  # N = |U| is undefined


def test_certified_bounds_rejects_bad_inputs() -> None:
    v = torch.randn(1, 4, 2)
    st_ = ValueStats(v)
    alpha = torch.full((1, 1, 4), 0.25)
    uni = torch.tensor([[[True, True, False, True]]])
    c = window_constants(st_)
    with pytest.raises(ConfigError, match="universe's keys first"):
        certified_bounds(alpha, st_, torch.tensor([0]), torch.tensor([[[0, 2, 1, 3]]]), uni,
                         [1], *c)
    with pytest.raises(ConfigError, match="mu"):
        certified_bounds(alpha, st_, torch.tensor([0]), torch.tensor([[[0, 1, 3, 2]]]), uni,
                         [1], torch.zeros(2), c.c_lo, c.c_hi)


# ---------------------------------------------------------------- the property


@st.composite
def bound_cases(draw):
    g = draw(st.sampled_from([1, 2]))
    h = g * draw(st.sampled_from([1, 2]))
    t = draw(st.integers(2, 7))
    d = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    # small integer grids give exact ties in alpha, norms and cosines
    values = torch.randint(-2, 3, (g, t, d), generator=gen).to(torch.float32)
    if draw(st.booleans()):
        values = values + 0.3 * torch.randn(g, t, d, generator=gen)
    if draw(st.booleans()):
        values[:, 0] *= 0.1
    if draw(st.booleans()):
        values[:, draw(st.integers(0, t - 1))] = 0.0
    encoder = draw(st.booleans())
    qpos = torch.arange(t) if encoder else torch.arange(1, t)
    vis = torch.ones(1, qpos.numel(), t, dtype=torch.bool) if encoder else causal(qpos, t)
    logits = torch.randint(-2, 3, (h, qpos.numel(), t), generator=gen).to(torch.float32)
    alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
    rule = draw(st.sampled_from(["attention", "contribution", "random"]))
    exclude_sink = draw(st.booleans())
    return values, alpha, qpos, vis, rule, exclude_sink, seed


def _loop_case(case):
    """A drawn case's stats, kv heads, universe, full grid and plain-loop rule order."""
    values, alpha, qpos, vis, rule, exclude_sink, seed = case
    stats = ValueStats(values)
    h, _, t = alpha.shape
    kv = torch.arange(h) // (h // values.shape[0])
    uni = vis.expand(h, -1, -1).clone()
    if exclude_sink:
        uni[..., 0] = False
    grid = list(range(1, t + 1))
    order = rule_order(alpha, stats.norms[kv], uni, rule, torch.Generator().manual_seed(seed))
    return values, alpha, stats, kv, uni, grid, order


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bound_cases())
def test_bounds_never_exceed_measured_loop(case) -> None:
    """P, R, F bounds with window-measured constants are <= the plain-loop metric."""
    values, alpha, stats, kv, uni, grid, order = _loop_case(case)
    b = certified_bounds(alpha.to(torch.float64), stats, kv, order, uni, grid,
                         *window_constants(stats))
    p, r = measured_pr(alpha, values, kv, order, uni, grid)
    valid = ~np.isnan(p)
    assert np.array_equal(valid, ~np.isnan(b["precision_bound"].numpy()))
    pb, rb, fb = (b[k].numpy()[valid] for k in ("precision_bound", "recall_bound", "f_bound"))
    pm, rm = p[valid], r[valid]
    fm = np.where(pm + rm > 0, 2 * pm * rm / np.maximum(pm + rm, 1e-300), 0.0)
    assert (pb <= pm + 1e-12).all() and (rb <= rm + 1e-12).all() and (fb <= fm + 1e-12).all()
    assert ((pb >= 0) & (pb <= 1) & (rb >= 0) & (rb <= 1)).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bound_cases())
def test_bounds_and_inversion_bounds_below_fast_metrics(case) -> None:
    """The same property against ``topn_metrics``, with its own orders; also GInv bounds."""
    values, alpha, qpos, vis, rule, exclude_sink, seed = case
    stats = ValueStats(values)
    h, _, t = alpha.shape
    kv = torch.arange(h) // (h // values.shape[0])
    grid = list(range(1, t + 1))
    res = topn_metrics(alpha, None, grid, rule=rule, distance="euclidean", visible=vis,
                       exclude_sink=exclude_sink, query_positions=qpos, repeats=2, seed=seed,
                       stats=stats)
    uni = vis.expand(h, -1, -1).clone()
    if exclude_sink:
        uni[..., 0] = False
    c = window_constants(stats)
    for k in range(res.order.shape[0]):
        b = certified_bounds(alpha.to(torch.float64), stats, kv, res.order[k], uni, grid, *c)
        ok = res.valid[k]
        assert torch.equal(ok, ~torch.isnan(b["recall_bound"]))
        for name, meas in (("precision_bound", res.precision[k]), ("recall_bound", res.recall[k]),
                           ("f_bound", res.f_score[k])):
            assert (b[name][ok] <= meas[ok] + 1e-12).all(), name
        p_inv, r_inv = inversion_bounds(res.inversions[k], torch.tensor(grid))
        assert (p_inv[ok] <= res.precision[k][ok] + 1e-12).all()
        assert (r_inv[ok] <= res.recall[k][ok] + 1e-12).all()


def test_bounds_tight_when_separated() -> None:
    """Orthogonal values, one dominant token: the bound certifies N = 1 and 2 exactly."""
    v = torch.eye(5).unsqueeze(0)
    v[0, 0] *= 0.1
    alpha = torch.tensor([[[0.05, 0.6, 0.3, 0.03, 0.02]]])
    stats = ValueStats(v)
    order = torch.tensor([[[1, 2, 0, 3, 4]]])
    b = certified_bounds(alpha, stats, torch.tensor([0]), order,
                         torch.ones(1, 1, 5, dtype=torch.bool), [1, 2], *window_constants(stats))
    assert b["precision_bound"][0, 0].tolist() == [1.0, 1.0]
    assert b["recall_bound"][0, 0].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- inversion bounds


def test_inversion_bounds_golden_and_nan() -> None:
    p, r = inversion_bounds(torch.tensor([[0.0, 3.0, float("nan")]]), torch.tensor([1, 2, 4]))
    assert p[0, :2].tolist() == [1.0, 0.4] and r[0, :2].tolist() == [1.0, 0.0]
    assert math.isnan(p[0, 2].item()) and math.isnan(r[0, 2].item())
    with pytest.raises(ConfigError, match="n"):
        inversion_bounds(torch.tensor([1.0]), 0)


# ---------------------------------------------------------------- envelope


def test_envelope_equals_bound_on_constant_norm_row() -> None:
    """The envelope is the certified bound of a row with norms (1/kappa, 1, ..., 1)."""
    gen = torch.Generator().manual_seed(3)
    prof = torch.softmax(torch.randn(9, generator=gen) * 2, -1).to(torch.float64)
    kappa, mu, sc = 4.0, 0.15, -0.4
    values = torch.randn(1, 9, 5, generator=gen, dtype=torch.float64)
    values = values / values.norm(dim=-1, keepdim=True)
    values[0, 0] /= kappa
    stats = ValueStats(values)
    grid = [1, 2, 3, 5, 8]
    order = torch.sort(-prof, stable=True).indices.view(1, 1, 9)
    b = certified_bounds(prof.view(1, 1, 9), stats, torch.tensor([0]), order,
                         torch.ones(1, 1, 9, dtype=torch.bool), grid,
                         torch.tensor([mu]), torch.tensor([sc]), torch.tensor([sc]))
    env = constant_norm_envelope(prof, grid, kappa, mu, sc)
    torch.testing.assert_close(env["precision_envelope"], b["precision_bound"][0, 0])
    torch.testing.assert_close(env["recall_envelope"], b["recall_bound"][0, 0])
    torch.testing.assert_close(env["f_envelope"], b["f_bound"][0, 0])


def test_envelope_holds_on_vectors_meeting_the_assumptions() -> None:
    """Orthonormal non-sink values (cos 0 <= mu) and a sink at cos -1/sqrt(T-1) to each:
    the measured P and R of the profile row are at least the envelope."""
    t = 8
    kappa = 5.0
    v = torch.zeros(1, t, t, dtype=torch.float64)
    v[0, 1:, 1:] = torch.eye(t - 1, dtype=torch.float64)
    v[0, 0, 1:] = -1.0 / math.sqrt(t - 1) / kappa
    sink_cos = -1.0 / math.sqrt(t - 1)
    prof = torch.tensor([0.4, 0.25, 0.15, 0.08, 0.05, 0.04, 0.02, 0.01], dtype=torch.float64)
    grid = list(range(1, t))
    env = constant_norm_envelope(prof, grid, kappa, 0.05, sink_cos)
    order = torch.sort(-prof, stable=True).indices.view(1, 1, t)
    uni = torch.ones(1, 1, t, dtype=torch.bool)
    p, r = measured_pr(prof.view(1, 1, t), v, torch.tensor([0]), order, uni, grid)
    assert (env["precision_envelope"].numpy() <= p[0, 0] + 1e-12).all()
    assert (env["recall_envelope"].numpy() <= r[0, 0] + 1e-12).all()
    assert env["certified"][0].item() and int(env["largest_certified_n"]) >= 1


def test_envelope_monotone_in_mu_and_sane() -> None:
    """Envelopes lie in [0, 1], shrink as mu grows, are certified at N = 1 for mu < 1,
    and largest_certified_n is the end of the certified run from the smallest N."""
    prof = torch.tensor([0.5, 0.2, 0.1, 0.08, 0.06, 0.04, 0.02], dtype=torch.float64)
    grid = [1, 2, 3, 4, 5, 6]
    mus = torch.linspace(0.0, 1.0, 11, dtype=torch.float64)
    env = constant_norm_envelope(prof.expand(11, -1), grid, torch.full((11,), 3.0), mus, -0.3)
    for name in ("precision_envelope", "recall_envelope", "f_envelope"):
        x = env[name]
        assert ((x >= 0) & (x <= 1)).all()
        assert (x[1:] <= x[:-1] + 1e-12).all(), name
    assert env["certified"][:-1, 0].all()
    for row in range(11):
        cert = env["certified"][row].tolist()
        run = 0
        for n, c in zip(grid, cert, strict=True):
            if not c:
                break
            run = n
        assert int(env["largest_certified_n"][row]) == run
    assert int(env["largest_certified_n"][0]) > int(env["largest_certified_n"][-1])
    # unsorted grids give the same answer per N
    env2 = constant_norm_envelope(prof, [3, 1, 2], 3.0, 0.2, -0.3)
    env1 = constant_norm_envelope(prof, [1, 2, 3], 3.0, 0.2, -0.3)
    expected = [env1["recall_envelope"][i].item() for i in (2, 0, 1)]
    assert env2["recall_envelope"].tolist() == expected
    assert int(env2["largest_certified_n"]) == int(env1["largest_certified_n"])


def test_envelope_nan_parameters_and_errors() -> None:
    prof = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    env = constant_norm_envelope(prof, [1, 2], float("nan"), 0.1, -0.2)
    assert torch.isnan(env["recall_envelope"]).all() and not env["certified"].any()
    assert int(env["largest_certified_n"]) == 0
    env = constant_norm_envelope(prof, [1, 2], 2.0, 0.1, (-0.5, -0.1))
    assert torch.isfinite(env["recall_envelope"]).all()
    # N = |U| is invalid
    assert torch.isnan(constant_norm_envelope(prof, [3], 2.0, 0.1, -0.2)["f_envelope"]).all()
    with pytest.raises(ConfigError, match="alpha_profile"):
        constant_norm_envelope(torch.tensor([-0.1, 1.1]), [1], 2.0, 0.1, -0.2)


# ---------------------------------------------------------------- accumulator


def _table_equal(a: dict, b: dict) -> None:
    assert_columns_equal(a, b, rtol=1e-12, atol=1e-14)


def test_bounds_accumulator_fit_by_hand() -> None:
    """T = 4, d = 3. v0 = (0.5, 0, 0): sink norm 0.5; v1 = e1 * 2, v2 = e2 * 2, v3 = (2, 2, 0)
    / sqrt2 * 2 -> norms 2, 2, 2: kappa = 4. Non-sink |cos|: 0, 1/sqrt2, 1/sqrt2; sink cos
    1, 0, 1/sqrt2 (mean 0.569). With quantile 0.5 and 100 bins mu = 0.71 (the upper edge
    of the bin holding 0.7071), so nothing exceeds it; the fitted sink cosine is positive
    and no sink cosine is negative: no violation of either kind."""
    v = torch.tensor([[[0.5, 0, 0], [2.0, 0, 0], [0, 2.0, 0], [math.sqrt(2), math.sqrt(2), 0]]])
    alpha = torch.tensor([[[0.7, 0.1, 0.1, 0.1]]])
    acc = BoundsAccumulator([1, 2], quantile=0.5, bins=100)
    acc.update(batch_of(v, alpha, torch.tensor([3])))
    out = acc.compute()["bounds"]
    assert list(out) == list(BOUNDS_COLUMNS)
    assert out["kappa"].tolist() == pytest.approx([4.0, 4.0])
    assert out["mu"].tolist() == pytest.approx([0.71, 0.71])
    assert out["sink_cos"][0] == pytest.approx((1 + 0 + 1 / math.sqrt(2)) / 3)
    assert out["mu_quantile"].tolist() == [0.5, 0.5]
    for kind in ("pair", "sink_cos"):
        assert out[f"{kind}_violation_rate"].tolist() == [0.0, 0.0]
        assert out[f"{kind}_violation_max"].tolist() == [0.0, 0.0]
    assert np.isnan(out["precision_measured"]).all() and np.isnan(out["f_measured"]).all()
    # quantile 0.3 puts mu at 0.01 (bin of the 0): two of the three non-sink pairs exceed
    # it; the sink cosines, all >= 0 beside a positive fit, violate nothing
    acc = BoundsAccumulator([1], quantile=0.3, bins=100)
    acc.update(batch_of(v, alpha, torch.tensor([3])))
    out = acc.compute()["bounds"]
    assert out["mu"][0] == pytest.approx(0.01) and out["mu_quantile"][0] == 0.3
    assert out["pair_violation_rate"][0] == pytest.approx(2 / 3)
    assert out["pair_violation_max"][0] == pytest.approx(1 / math.sqrt(2) - 0.01)
    assert out["sink_cos_violation_rate"][0] == 0.0


def test_bounds_accumulator_sink_sign_violation() -> None:
    """Sink cosines -1, -1, +0.6: fitted mean negative, the positive one violates by 0.6."""
    v = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [-2.0, 0.0], [0.6, 0.8]]])
    acc = BoundsAccumulator([1], quantile=1.0, bins=1000)
    acc.update(batch_of(v, torch.full((1, 1, 4), 0.25), torch.tensor([3])))
    out = acc.compute()["bounds"]
    assert out["sink_cos"][0] == pytest.approx((-1 - 1 + 0.6) / 3)
    # quantile 1 = largest |cos| (1.0): no non-sink violation; 1 of the 3 sink cosines
    assert out["mu"][0] == pytest.approx(1.0)
    assert out["pair_violation_rate"][0] == 0.0
    assert out["sink_cos_violation_rate"][0] == pytest.approx(1 / 3)
    assert out["sink_cos_violation_max"][0] == pytest.approx(0.6)


def test_bounds_accumulator_envelope_uses_profile() -> None:
    """The envelope columns equal constant_norm_envelope on the mean sorted profile."""
    gen = torch.Generator().manual_seed(5)
    values, alpha, qpos = random_window(gen, h=2, g=1, t=6, q=1)
    acc = BoundsAccumulator([1, 2, 3])
    acc.update(batch_of(values, alpha, qpos))
    out = acc.compute()["bounds"]
    a = alpha[:, 0].to(torch.float64)
    prof = torch.cat([a[:, :1], torch.sort(a[:, 1:], -1, descending=True).values], -1)
    fit_rows = slice(None, None, 3)
    env = constant_norm_envelope(prof, [1, 2, 3], torch.from_numpy(out["kappa"][fit_rows]),
                                 torch.from_numpy(out["mu"][fit_rows]),
                                 torch.from_numpy(out["sink_cos"][fit_rows]))
    np.testing.assert_allclose(out["recall_envelope"], env["recall_envelope"].reshape(-1).numpy())
    assert out["largest_certified_n"].tolist() == np.repeat(env["largest_certified_n"].numpy(),
                                                            3).tolist()


def test_bounds_accumulator_merge_and_chunks() -> None:
    """Two shards merged equal one run; query chunks equal one chunk; halves differ."""
    gen = torch.Generator().manual_seed(1)
    wins = [random_window(gen) for _ in range(4)]
    whole = BoundsAccumulator([1, 2, 5])
    for w, (values, alpha, qpos) in enumerate(wins):
        whole.update(batch_of(values, alpha, qpos, window=w))
    shards = [BoundsAccumulator([1, 2, 5]), BoundsAccumulator([1, 2, 5])]
    for w, (values, alpha, qpos) in enumerate(wins):
        stats = ValueStats(values)
        for part in torch.tensor_split(torch.arange(qpos.numel()), 3):
            shards[w % 2].update(batch_of(values, alpha[:, part], qpos[part], window=w,
                                          stats=stats))
    half = shards[0].compute()["bounds"]
    merged = shards[0].merge(shards[1]).compute()["bounds"]
    _table_equal(merged, whole.compute()["bounds"])
    assert not np.allclose(half["kappa"], merged["kappa"])
    with pytest.raises(ConfigError, match="disjoint"):
        shards[0].merge(shards[1])
    with pytest.raises(ConfigError, match="n_grid"):
        BoundsAccumulator([1]).merge(BoundsAccumulator([2]))


def test_bounds_accumulator_empty_and_bad_args() -> None:
    out = BoundsAccumulator([1]).compute()["bounds"]
    assert list(out) == list(BOUNDS_COLUMNS) and all(len(x) == 0 for x in out.values())
    with pytest.raises(ConfigError, match="quantile"):
        BoundsAccumulator([1], quantile=0.0)
    with pytest.raises(ConfigError, match="bins"):
        BoundsAccumulator([1], bins=0)


def test_certified_bounds_row_chunks_equal_one_pass(monkeypatch) -> None:
    """Rows processed in chunks (memory bound) give the same bounds as one pass."""
    import attngeom.core.bounds as bounds_mod

    gen = torch.Generator().manual_seed(11)
    values, alpha, qpos = random_window(gen, h=4, g=2, t=9)
    stats = ValueStats(values)
    kv = torch.arange(4) // 2
    uni = causal(qpos, 9).expand(4, -1, -1)
    order = rule_order(alpha, stats.norms[kv], uni, "contribution", gen)
    c = window_constants(stats)
    one = certified_bounds(alpha, stats, kv, order, uni, [1, 3, 8], *c)
    monkeypatch.setattr(bounds_mod, "_CHUNK_BYTES", 1)
    many = certified_bounds(alpha, stats, kv, order, uni, [1, 3, 8], *c)
    for k in one:
        torch.testing.assert_close(one[k], many[k], equal_nan=True)



# ---------------------------------------------------------------- the fast bound itself


def loop_bounds(alpha, norms, order, universe, n_grid, mu, c_lo, c_hi):
    """SPEC 5's L, U and counts by plain loops over one row's keys in rule order, with
    the slack ``1e-10 (sum_u a_u)^2`` of ``core/bounds.py`` on both comparisons."""
    h, q, t = alpha.shape
    out = np.full((3, h, q, len(n_grid)), np.nan)
    for hi in range(h):
        m, lo, hi_c = float(mu[hi]), float(c_lo[hi]), float(c_hi[hi])
        for qi in range(q):
            keys = [int(j) for j in order[hi, qi] if universe[hi, qi, int(j)]]
            a = {j: float(alpha[hi, qi, j]) * float(norms[hi, j]) for j in keys}
            tol2 = 2.0 * 1e-10 * sum(a.values()) ** 2
            for c, n in enumerate(n_grid):
                if not 1 <= n < len(keys):
                    continue
                sel, uns = keys[:n], keys[n:]
                s = sum(a[i] for i in sel if i != 0)
                a0 = a[0] if 0 in sel else 0.0
                low = {i: (a[0] ** 2 + 2 * lo * a[0] * s) if i == 0 else
                       (1 + 2 * m) * a[i] ** 2 - 2 * a[i] * (m * s - lo * a0) for i in sel}
                up = {j: (2 * hi_c * a[0] * s - a[0] ** 2) if j == 0 else
                      2 * a[j] * (m * s + hi_c * a0) - a[j] ** 2 for j in uns}
                r = sum(low[i] > max(up.values()) + tol2 for i in sel) / n
                p = n / (n + sum(up[j] >= min(low.values()) - tol2 for j in uns))
                out[:, hi, qi, c] = p, r, (2 * p * r / (p + r) if p + r > 0 else 0.0)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bound_cases())
def test_fast_bounds_equal_the_loop_formulas(case) -> None:
    """``certified_bounds`` computes exactly SPEC 5's L, U and counts (a loop per key),
    with every N up to T and with a short grid, whose largest N leaves most universe
    keys outside the first keys the fast bound reads."""
    values, alpha, stats, kv, uni, full_grid, order = _loop_case(case)
    c = window_constants(stats)
    for grid in (full_grid, [2, 1]):
        b = certified_bounds(alpha.to(torch.float64), stats, kv, order, uni, grid, *c)
        want = loop_bounds(alpha.to(torch.float64), stats.norms[kv], order, uni, grid,
                           *(x[kv] for x in c))
        for i, name in enumerate(("precision_bound", "recall_bound", "f_bound")):
            np.testing.assert_allclose(b[name].numpy(), want[i], rtol=1e-12, atol=0,
                                       equal_nan=True, err_msg=name)


@pytest.mark.parametrize("t", [300, 40])
def test_compiled_bounds_equal_plain_bit_for_bit(t: int) -> None:
    """With compilation on, every N's step runs at once (six N a call: the 7-N grid
    makes two) as generated C++ and must round exactly as the plain operations, one N
    at a time, do; so must the broadcast form run uncompiled. Every bound equal, on rows
    with a sink, zero vectors, K random orders at once and, at T = 300, ties (integer
    alphas and values) and a short universe; at T = 40 (every query) the orders are
    narrower than the grid's largest N (whose column is then NaN in both)."""
    from attngeom.core import bounds as bounds_module
    from attngeom.core import kernels
    from attngeom.core.bounds import bounds_of_top
    from attngeom.core.geometry import top_keys

    gen = torch.Generator().manual_seed(5)
    h, g, k = 8, 2, 3
    values = torch.randn(g, t, 16, generator=gen)
    values[:, 0] *= 0.05
    values[:, 7] = 0.0
    values[:, 100:140] = values[:, 100:140].round()
    qpos = torch.arange(t - 40, t)
    vis = causal(qpos, t)
    logits = torch.randn(h, qpos.numel(), t, generator=gen) * 3
    logits[:, ::3] = logits[:, ::3].round()
    alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1).double()
    alpha[:2] = alpha[:2].clamp_min(1e-3)
    stats = ValueStats(values)
    kv = torch.arange(h) // (h // g)
    grid = (1, 2, 4, 8, 16, 32, 64)
    c = window_constants(stats)
    for exclude_sink in (False, True):
        uni = vis.expand(h, -1, -1).clone()
        uni[..., 0] &= not exclude_sink
        uni[1, :5, 200:] = False
        score = torch.rand(k, h, qpos.numel(), t, generator=gen)
        top = top_keys(score, uni[None].expand(k, -1, -1, -1), min(max(grid), t))
        plain = bounds_of_top(alpha, stats, kv, top, uni, grid, *c)
        with kernels.compiling(True):
            fast = bounds_of_top(alpha, stats, kv, top, uni, grid, *c)
        assert not kernels._STATE["broken"]
        with pytest.MonkeyPatch.context() as mp:  # the broadcast form, uncompiled
            mp.setattr(bounds_module, "compiled_float", lambda fn, fallback=None: fn)
            broadcast = bounds_of_top(alpha, stats, kv, top, uni, grid, *c)
        for name in plain:
            for other in (fast, broadcast):
                assert torch.equal(plain[name].nan_to_num(-1.0),
                                   other[name].nan_to_num(-1.0)), name
            assert not plain[name].isnan().all()


def test_no_bound_from_a_window_with_a_non_finite_value() -> None:
    """An overflowed value state makes the window's constants NaN; the bound of every row
    of that kv head is then undefined (NaN), not the P = 1 that NaN thresholds would
    give, while the other kv head keeps its bounds."""
    gen = torch.Generator().manual_seed(2)
    values, alpha, qpos = random_window(gen, h=4, g=2, t=10)
    values[0, 5] = float("inf")
    stats = ValueStats(values)
    kv = torch.arange(4) // 2
    uni = causal(qpos, 10).expand(4, -1, -1).clone()
    uni[:, :, 5:] = False  # no row sees the bad key, so the metrics stay valid
    order = rule_order(alpha, stats.norms[kv], uni, "attention", gen)
    c = window_constants(stats)
    assert torch.isnan(c.mu[0]) and torch.isfinite(c.mu[1])
    b = certified_bounds(alpha, stats, kv, order, uni, [1, 2], *c)
    for name in ("precision_bound", "recall_bound", "f_bound"):
        assert torch.isnan(b[name][:2]).all(), name
        assert torch.isfinite(b[name][2:, 2:]).all(), name


def test_bound_step_counts_masked_keys_as_the_masked_upper_bounds_would() -> None:
    """``_bound_step`` counts the unselected keys against the precision threshold on the
    unmasked upper bounds (so that a compiler need not store them); a masked key (a
    selected or non-universe one) must count exactly where -inf >= the threshold, as in
    the masked form: never for a finite threshold, always for -inf. Checked against the
    masked form on random steps, with some thresholds -inf (a lower bound of -inf)."""
    from attngeom.core.bounds import _bound_step

    gen = torch.Generator().manual_seed(7)
    k, r, w, t = 3, 4, 5, 23
    f64 = dict(dtype=torch.float64)
    a = torch.rand(r, t, generator=gen, **f64)
    a_top = torch.rand(k, r, w, generator=gen, **f64)
    low_base = a_top * a_top
    low_base[0, 0, 0] = -math.inf  # this row's threshold is -inf
    rank = torch.randint(0, w + 3, (k, r, t), generator=gen, dtype=torch.int32)
    open_keys = torch.rand(r, t, generator=gen) < 0.8
    slots = torch.arange(w, dtype=torch.int32)
    s = torch.rand(k, r, generator=gen, **f64)
    a0 = torch.rand(r, generator=gen, **f64).expand(k, r)
    has_sink = (torch.rand(r, generator=gen) < 0.5).expand(k, r)
    sink_slot = torch.randint(0, w + 1, (k, r), generator=gen)
    usize = torch.full((k, r), t)
    tol2 = torch.full((k, r), 1e-9, **f64)
    mu, c_lo, c_hi = (torch.full((k, r), x, **f64) for x in (0.3, -0.2, 0.4))
    n, kk = torch.tensor(3.0, **f64), torch.tensor(3, dtype=torch.int32)
    p, _, _ = _bound_step(low_base, 2 * a_top, 2 * a, a * a, open_keys, rank, slots, s, a0,
                          has_sink, sink_slot, usize, tol2, mu, c_lo, c_hi, n, kk)
    # the masked form, written out: U with -inf off the unselected keys, then counted
    sink_sel = has_sink & (sink_slot < n)
    a0_sel = torch.where(sink_sel, a0, 0.0)
    low = torch.where(slots < kk, low_base - 2 * a_top * (mu * s - c_lo * a0_sel)[..., None],
                      math.inf)
    min_low = torch.minimum(low.amin(-1), torch.where(sink_sel, a0 * a0 + 2 * c_lo * a0 * s,
                                                      math.inf))
    up = torch.where(open_keys & (rank >= kk), 2 * a * (mu * s + c_hi * a0_sel)[..., None]
                     - a * a, -math.inf)
    up_sink = 2 * c_hi * a0 * s - a0 * a0
    p_thr = min_low - tol2
    cnt = (up >= p_thr[..., None]).sum(-1) + (has_sink & ~sink_sel & (up_sink >= p_thr))
    assert bool((p_thr == -math.inf).any()) and bool((p_thr > -math.inf).any())
    assert torch.equal(p, n / (n + cnt.to(torch.float64)))


@settings(max_examples=80, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(0, 40)),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
       levels=st.integers(1, 6), seed=st.integers(0, 2**16), nan=st.booleans())
def test_sorted_descending_is_torch_sort(shape, dtype, levels, seed, nan):
    """NumPy's sort (float32, float64) or torch's (other dtypes) give torch.sort's values:
    ties (few distinct levels), NaN first as in torch's descending order, strided input."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, levels, shape, generator=gen).to(torch.float64) / levels).to(dtype)
    if nan and x.numel():
        x.view(-1)[0] = float("nan")
    wide = torch.cat([x, x], dim=-1)[..., ::2] if x.shape[-1] else x  # a strided view
    for v in (x, wide):
        got, want = sorted_descending(v), torch.sort(v, dim=-1, descending=True).values
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
