"""The geometry of a given kept set (core/kept.py) against the slow reference (SPEC 2).

The reference reads the kept set as the first |I| keys of an order (the set first, then
the rest of the universe) and computes every metric by the loops of
``tests/reference_geometry.py``; the random control is the reference's textbook
Fisher-Yates shuffle of the row's universe with the control's own draws. Alphas are k/64
and values small integers, so every float64 sum is exact and ties (equal alphas,
duplicate and zero vectors) are decided the same way in both.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from tests.reference_geometry import random_draws, row_metrics, shuffled, universe_of_row
except ImportError:  # tests/ itself is on sys.path when it is not a package
    from reference_geometry import random_draws, row_metrics, shuffled, universe_of_row

from attngeom.core.kept import kept_metrics, overlap  # noqa: E402
from attngeom.errors import ConfigError  # noqa: E402
from attngeom.names import METRICS  # noqa: E402


@st.composite
def cases(draw):
    h = draw(st.integers(1, 4))
    g = draw(st.sampled_from([x for x in range(1, h + 1) if h % x == 0]))
    t = draw(st.integers(2, 10))
    q = draw(st.integers(1, min(3, t)))
    d = draw(st.integers(1, 3))
    weights = np.array(draw(st.lists(st.integers(0, 6), min_size=h * q * t,
                                     max_size=h * q * t)), dtype=np.float64)
    alpha = torch.tensor(weights / 64.0).reshape(h, q, t)
    values = torch.tensor(draw(st.lists(st.integers(-3, 3), min_size=g * t * d,
                                        max_size=g * t * d)), dtype=torch.float64)
    values = values.reshape(g, t, d)
    positions = torch.arange(t - q, t)
    if draw(st.booleans()):  # causal
        visible = (torch.arange(t)[None, :] <= positions[:, None])[None]
    else:  # any mask, per head (padding, windows)
        bits = draw(st.lists(st.booleans(), min_size=h * q * t, max_size=h * q * t))
        visible = torch.tensor(bits).reshape(h, q, t)
    keep_bits = draw(st.lists(st.booleans(), min_size=h * q * t, max_size=h * q * t))
    kept = torch.tensor(keep_bits).reshape(h, q, t) & visible.expand(h, q, t)
    seed = draw(st.integers(0, 2**31))
    return alpha, values, kept, visible, positions, seed


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(1, 3))
def test_kept_set_metrics_equal_the_reference(case, repeats) -> None:
    alpha, values, kept, visible, positions, seed = case
    h, q, t = alpha.shape
    group = h // values.shape[0]
    got = kept_metrics(alpha, values, kept, visible=visible, query_positions=positions,
                       repeats=repeats, seed=seed, window=3, layer=1)
    assert torch.equal(got.size, kept.sum(-1))
    for hh in range(h):
        for qq in range(q):
            vis = visible[hh if visible.shape[0] > 1 else 0, qq].tolist()
            universe = universe_of_row(vis, exclude_sink=False)
            chosen = [j for j in universe if bool(kept[hh, qq, j])]
            m = len(chosen)
            valid = 1 <= m < len(universe)
            assert bool(got.valid[hh, qq]) == valid
            if not valid:
                for name in METRICS:
                    assert torch.isnan(got.metrics[name][hh, qq])
                    assert torch.isnan(got.random[name][:, hh, qq]).all()
                continue
            order = chosen + [j for j in universe if j not in chosen]
            ref = row_metrics(order, m, alpha[hh, qq].numpy(), values[hh // group].numpy(),
                              "euclidean")
            draws = random_draws(seed, 3, 1, hh, int(positions[qq]), repeats, universe)
            for name in ("precision", "recall", "f_score", "inversions"):
                assert float(got.metrics[name][hh, qq]) == pytest.approx(
                    float(ref.values[name]), abs=1e-12), name
            for k in range(repeats):
                rorder = shuffled(universe, draws[k])
                rref = row_metrics(rorder, m, alpha[hh, qq].numpy(),
                                   values[hh // group].numpy(), "euclidean")
                for name in ("precision", "recall", "f_score", "inversions"):
                    assert float(got.random[name][k, hh, qq]) == pytest.approx(
                        float(rref.values[name]), abs=1e-12), (name, k)


def test_the_oracle_set_equals_the_attention_rule_and_the_control_the_random_rule() -> None:
    """The top-N set of the attention rule measured as a set gives the geometry's own
    attention metrics, and its random control the random rule's, draw for draw."""
    from attngeom.core.geometry import topn_metrics_rules

    gen = torch.Generator().manual_seed(3)
    alpha = torch.softmax(torch.randn(4, 2, 40, generator=gen), -1)
    values = torch.randn(2, 40, 8, generator=gen)
    for n in (3, 8):
        ref = topn_metrics_rules(alpha, values, [n], rules=("attention", "random"),
                                 repeats=5, seed=9, window=2, layer=4)
        top = ref["attention"].top[0, ..., :n]
        kept = torch.zeros_like(alpha, dtype=torch.bool).scatter_(-1, top, True)
        got = kept_metrics(alpha, values, kept, repeats=5, seed=9, window=2, layer=4)
        for name in ("precision", "recall", "f_score"):
            assert torch.equal(got.metrics[name], ref["attention"].metric(name)[0, ..., 0])
            assert torch.equal(got.random[name], ref["random"].metric(name)[..., 0])


def test_golden_overlap_and_bad_input() -> None:
    """Kept {0, 1, 3}, oracle {0, 2, 3} at n = 3: two shared keys, overlap 2/3."""
    kept = torch.tensor([True, True, False, True])
    oracle = torch.tensor([True, False, True, True])
    assert float(overlap(kept, oracle, 3)) == pytest.approx(2 / 3)
    alpha = torch.full((1, 1, 4), 0.25)
    values = torch.ones(1, 4, 2)
    with pytest.raises(ConfigError, match="kept: expected a bool mask"):
        kept_metrics(alpha, values, kept[None, None].float())
    with pytest.raises(ConfigError, match="outside a row's universe"):
        kept_metrics(alpha, values, torch.ones(1, 1, 4, dtype=torch.bool),
                     visible=torch.tensor([[[True, True, True, False]]]))
    with pytest.raises(ConfigError, match="n: expected an integer >= 1, got 0"):
        overlap(kept, oracle, 0)
