"""Regime agreement between two runs (SPEC 4): share, Cohen's kappa, confusion, 'none'."""

from __future__ import annotations

import math

import pytest

from attngeom.core.agreement import cohens_kappa, regime_agreement
from attngeom.errors import ConfigError


def test_kappa_by_hand() -> None:
    """Ten heads. Run A: 4 Mixer, 4 Reset, 2 Retriever; run B agrees on 7.

    pairs (a, b): (Mi, Mi) x3, (Mi, Re) x1, (Re, Re) x3, (Re, Mi) x1, (Rt, Rt) x1, (Rt, Mi) x1.
    p_o = 7/10. Marginals A: Mi .4, Re .4, Rt .2; B: Mi .5, Re .4, Rt .1.
    p_e = .4*.5 + .4*.4 + .2*.1 = .38; kappa = (.7 - .38) / (1 - .38) = .32 / .62.
    """
    a = ["Mixer"] * 4 + ["Reset"] * 4 + ["Retriever"] * 2
    b = (["Mixer"] * 3 + ["Reset"] + ["Reset"] * 3 + ["Mixer"] + ["Retriever", "Mixer"])
    r = regime_agreement(a, b)
    assert r.agreement == pytest.approx(0.7)
    assert r.kappa == pytest.approx(0.32 / 0.62)
    assert (r.n_heads, r.n_excluded) == (10, 0)
    counts = {(x, y): c for x, y, c in zip(r.confusion["regime_a"], r.confusion["regime_b"],
                                           r.confusion["count"], strict=True)}
    assert len(counts) == 9 and sum(counts.values()) == 10
    assert counts[("Mixer", "Mixer")] == 3 and counts[("Mixer", "Reset")] == 1
    assert counts[("Reset", "Mixer")] == 1 and counts[("Retriever", "Mixer")] == 1
    assert counts[("Retriever", "Reset")] == 0
    assert list(r.confusion["regime_a"][:3]) == ["Retriever"] * 3


def test_none_heads_are_excluded_and_counted() -> None:
    r = regime_agreement(["Mixer", "none", "Reset", "Mixer"], ["Mixer", "Mixer", "none", "Reset"])
    assert (r.n_heads, r.n_excluded) == (2, 2)
    assert r.agreement == 0.5
    # marginals A: Mixer 1; B: Mixer .5, Reset .5 -> p_e = .5, kappa = 0
    assert r.kappa == pytest.approx(0.0)


def test_degenerate_cases() -> None:
    """One shared class: agreement 1, kappa undefined (NaN); nothing left: both NaN."""
    r = regime_agreement(["Mixer"] * 3, ["Mixer"] * 3)
    assert r.agreement == 1.0 and math.isnan(r.kappa)
    r = regime_agreement(["none", "Mixer"], ["Reset", "none"])
    assert r.n_heads == 0 and math.isnan(r.agreement) and math.isnan(r.kappa)
    assert r.confusion["count"].sum() == 0
    # perfect agreement with two classes is kappa 1; systematic swap is negative
    assert regime_agreement(["Mixer", "Reset"], ["Mixer", "Reset"]).kappa == pytest.approx(1.0)
    assert regime_agreement(["Mixer", "Reset"], ["Reset", "Mixer"]).kappa == pytest.approx(-1.0)


def test_errors_and_generic_kappa() -> None:
    with pytest.raises(ConfigError, match="same heads"):
        regime_agreement(["Mixer"], ["Mixer", "Reset"])
    with pytest.raises(ConfigError, match="equal length"):
        cohens_kappa(["a"], [])
    assert math.isnan(cohens_kappa([], []))
    assert cohens_kappa(["a", "a", "b", "b"], ["a", "b", "b", "b"]) == pytest.approx(0.5)
