"""The adaptive N*_tau search against an exhaustive scan of every integer N."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.errors import ConfigError
from attngeom.interventions.nstar import (
    bootstrap_nstar,
    grid_powers,
    nstar_from,
    search_nstar,
)

TAUS = (0.01, 0.05, 0.10)


def exhaustive(curve: dict[int, float], tau: float, length: int) -> int:
    """The definition: the smallest integer N >= 1 with delta <= tau (length passes)."""
    for n in range(1, length):
        if curve[n] <= tau:
            return n
    return length


class Recorder:
    def __init__(self, curve):
        self.curve, self.calls, self.asked = curve, [], []

    def __call__(self, ns):
        self.calls.append(list(ns))
        self.asked.extend(ns)
        return [self.curve[n] for n in ns]


@st.composite
def monotone_curves(draw, max_length=1024):
    length = draw(st.integers(2, max_length))
    # a nonincreasing curve: a start and non-negative steps, some flat stretches
    start = draw(st.floats(0.0, 3.0))
    knots = sorted(draw(st.lists(st.integers(1, length), min_size=1, max_size=8)))
    drops = draw(st.lists(st.floats(0.0, 1.0), min_size=len(knots), max_size=len(knots)))
    curve, value = {}, start
    for n in range(1, length):
        for k, d in zip(knots, drops, strict=True):
            if k == n:
                value = value * (1 - d)
        curve[n] = value / math.sqrt(n) if draw(st.booleans()) is False else value
    # force monotone whatever the draws did
    out, low = {}, math.inf
    for n in range(1, length):
        low = min(low, curve[n])
        out[n] = low
    return length, out


@st.composite
def bumpy_curves(draw, max_length=600):
    length = draw(st.integers(2, max_length))
    scale = draw(st.floats(0.5, 20.0))
    noise = draw(st.floats(0.0, 0.05))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    curve = {n: scale / n + noise * rng.standard_normal() for n in range(1, length)}
    return length, curve


@settings(max_examples=150, deadline=None)
@given(monotone_curves())
def test_equals_exhaustive_where_monotone(case):
    length, curve = case
    rec = Recorder(curve)
    found = search_nstar(rec, TAUS, length=length)
    assert found.monotone and not found.notes
    for tau in TAUS:
        assert found.nstar[tau] == exhaustive(curve, tau, length)
    # every N evaluated once, each in [1, length)
    assert len(rec.asked) == len(set(rec.asked)) == len(found.evaluations)
    assert all(1 <= n < length for n in rec.asked)
    assert rec.calls[0] == grid_powers(length)


@settings(max_examples=150, deadline=None)
@given(bumpy_curves())
def test_record_explains_non_monotone(case):
    length, curve = case
    found = search_nstar(Recorder(curve), TAUS, length=length)
    tried = found.evaluations
    for tau in TAUS:
        n = found.nstar[tau]
        truth = exhaustive(curve, tau, length)
        # N* passes (or is the endpoint) and every tried N below it fails
        assert n == length or tried[n] <= tau
        assert all(d > tau for m, d in tried.items() if m < n)
        assert n == nstar_from(tried, tau, length)
        if n != truth:
            # the search only misses a smaller passing N it never tried
            assert truth < n and truth not in tried
    # monotone is False exactly when some tau has a tried N failing above a tried pass
    broken = any(
        any(tried[m] > tau for m in tried if m > min((k for k in tried if tried[k] <= tau),
                                                     default=length))
        for tau in TAUS)
    assert found.monotone is (not broken)
    assert bool(found.notes) is (not found.monotone)


@settings(max_examples=200, deadline=None)
@given(st.one_of(monotone_curves(), bumpy_curves()), st.floats(0.0, 0.5))
def test_at_most_twelve_beyond_the_grid_per_tau(case, tau):
    # the Speed target: at most 12 N beyond the power-of-two grid for a ranking's
    # search of one tau at T <= 1024 (ceil(log2(1024 - 256)) = 10 bisections + 2)
    length, curve = case
    found = search_nstar(Recorder(curve), [tau], length=length)
    assert found.extra <= 12
    # several taus share the grid and what one tau's bisection found
    many = search_nstar(Recorder(curve), TAUS, length=length)
    assert many.extra <= 12 * len(TAUS)


def test_worked_case_matches_the_paper_rule():
    # L = 1024, nothing on the grid passes tau: bracket (256, 1024), bisect, refine
    curve = {n: (0.0 if n >= 283 else 1.0) for n in range(1, 1024)}
    rec = Recorder(curve)
    found = search_nstar(rec, [0.01], length=1024)
    assert found.nstar == {0.01: 283} and found.grid_nstar == {0.01: 1024}
    assert rec.calls[1:4] == [[640], [448], [352]]
    assert found.extra <= 12
    frame = found.to_frame()
    assert list(frame.columns) == ["n", "delta", "on_grid", "pass_0.01"]
    assert frame["n"].is_monotonic_increasing and len(frame) == len(found.evaluations)


def test_refinement_catches_a_pass_just_below():
    # 40 passes, 41..44 fail, 45 and up pass: bisection lands on h = 45, l = 44 and the
    # refinement 42, 43 (41 is never reached: max(1, 45 - 3) = 42) finds nothing; with a
    # pass at 43 the refinement accepts 43
    curve = {n: (0.0 if n >= 45 else 1.0) for n in range(1, 128)}
    assert search_nstar(Recorder(curve), [0.5], length=128).nstar[0.5] == 45
    curve[43] = 0.0
    found = search_nstar(Recorder(curve), [0.5], length=128)
    assert found.nstar[0.5] == 43
    assert not found.monotone and "tau=0.5" in found.notes[0]


def test_window_length_is_the_endpoint_not_a_grid_value():
    curve = {n: 1.0 for n in range(1, 24)}
    found = search_nstar(Recorder(curve), [0.05], length=24)
    assert found.nstar[0.05] == 24 and found.grid_nstar[0.05] == 24
    assert max(found.evaluations) == 23
    none = search_nstar(Recorder(curve), [0.05], length=24, endpoint=False)
    assert none.nstar[0.05] is None and none.grid_nstar[0.05] is None
    assert set(none.evaluations) == {1, 2, 4, 8, 16}


def test_bad_arguments_are_one_line():
    with pytest.raises(ConfigError, match="length"):
        search_nstar(lambda ns: ns, [0.1], length=0)
    with pytest.raises(ConfigError, match="taus"):
        search_nstar(lambda ns: ns, [-1.0], length=8)
    with pytest.raises(ConfigError, match="expected 3 deltas"):
        search_nstar(lambda ns: [0.0], [0.1], length=5)


def test_bootstrap_interval_brackets_the_estimate():
    rng = np.random.default_rng(0)
    docs = 40
    base = 3.0 + 0.1 * rng.standard_normal(docs)
    per_n = {}

    def evaluate(ns):
        out = []
        for n in ns:
            per_n[n] = base * (1 + 0.5 / n) + 0.01 * rng.standard_normal(docs)
            out.append(float((per_n[n].mean() - base.mean()) / base.mean()))
        return out

    found = search_nstar(evaluate, TAUS, length=256)
    ci = bootstrap_nstar(base, per_n, TAUS, length=256, replicates=400, seed=1)
    for tau in TAUS:
        low, high = ci[tau]
        assert low <= found.nstar[tau] <= high
        assert low in found.evaluations or low == 256
    assert ci == bootstrap_nstar(base, per_n, TAUS, length=256, replicates=400, seed=1)
    # one document: every replicate is the sample itself
    one = bootstrap_nstar(base[:1], {n: v[:1] for n, v in per_n.items()}, TAUS, length=256,
                          replicates=20)
    assert all(lo == hi for lo, hi in one.values())
