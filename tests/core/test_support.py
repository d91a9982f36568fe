"""Support statistics at the answer query against hand counts and a plain-loop reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.core.support import contribution_scores, support_statistics
from attngeom.errors import ConfigError


def reference(r, alpha, support, context, visible, top):
    """Plain loops over the definitions (follow-up App. D), float64."""
    t = len(r)
    s = [i for i in range(t) if support[i]]
    d_pos = [j for j in range(t) if context[j] and not support[j]]
    k, d = len(s), len(d_pos)
    disp = sum(1 for i in s for j in d_pos if r[j] >= r[i]) / k
    mass = sum(alpha[i] for i in s)
    order = sorted((j for j in range(t) if visible[j]), key=lambda j: (-r[j], j))
    chosen = set(order[:top])
    recall = sum(1 for i in s if i in chosen) / k
    return disp, mass, recall, disp / d


def test_hand_built_pattern() -> None:
    """Ten positions: 0 the initial token, 1-2 instruction, 3-8 context, 9 the question.

    Support = {5, 6}; D = {3, 4, 7, 8}. Scores (one head):
        pos  0    1    2    3    4    5    6    7    8    9
        r   .30  .02  .03  .10  .20  .15  .05  .05  .00  .10
    support 5 (.15): D at or above: 4 (.20) -> 1
    support 6 (.05): D at or above: 3 (.10), 4 (.20), 7 (.05, tie counts) -> 3
    Disp = (1 + 3) / 2 = 2; p = 2 / 4 = 0.5; mass = .15 + .05 = .20.
    Top-3 of all visible: 0 (.30), 4 (.20), 5 (.15) -> recall 1/2.
    Top-5: adds 3 (.10) and 9 (.10) (tie, 3 first) -> 6 is out, recall 1/2.
    Top-6: adds 6 (.05 ties with 7; 6 has the smaller index) -> recall 1.
    A second head has the support on top: Disp 0, recall 1 at top 2.
    """
    r = torch.tensor([[.30, .02, .03, .10, .20, .15, .05, .05, .00, .10],
                      [.05, .05, .05, .05, .05, .40, .30, .02, .02, .01]], dtype=torch.float64)
    support = torch.tensor([5, 6])
    context = torch.arange(3, 9)
    for top, rec in ((3, [0.5, 1.0]), (5, [0.5, 1.0]), (6, [1.0, 1.0])):
        s = support_statistics(r, support, context, top=top)
        assert s.recall.tolist() == rec
    s = support_statistics(r, support, context, top=2)
    assert s.displacement.tolist() == [2.0, 0.0]
    assert s.outranking.tolist() == [0.5, 0.0]
    assert s.mass.tolist() == pytest.approx([0.20, 0.70])
    assert s.recall.tolist() == [0.0, 1.0]
    assert (s.k, s.d) == (2, 4)


def test_contribution_scores_repeat_kv_heads() -> None:
    alpha = torch.tensor([[[0.5, 0.5]], [[0.25, 0.75]], [[1.0, 0.0]], [[0.0, 1.0]]]).squeeze(1)
    values = torch.tensor([[[3.0, 4.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 2.0]]])  # (G=2, T=2, d)
    r = contribution_scores(alpha, values)
    assert r.tolist() == [[2.5, 0.5], [1.25, 0.75], [1.0, 0.0], [0.0, 2.0]]


@st.composite
def cases(draw):
    t = draw(st.integers(3, 40))
    # few distinct values so that ties are common
    levels = draw(st.integers(1, 6))
    r = draw(st.lists(st.integers(0, levels), min_size=2 * t, max_size=2 * t))
    r = torch.tensor(r, dtype=torch.float64).view(2, t) / levels
    context = torch.tensor(draw(st.lists(st.booleans(), min_size=t, max_size=t)))
    idx = context.nonzero().squeeze(1).tolist()
    if len(idx) < 2:
        context[:2] = True
        idx = context.nonzero().squeeze(1).tolist()
    n_support = draw(st.integers(1, len(idx) - 1))
    chosen = draw(st.permutations(idx))[:n_support]
    support = torch.zeros(t, dtype=torch.bool)
    support[chosen] = True
    visible = torch.tensor(draw(st.lists(st.booleans(), min_size=t, max_size=t))) | support
    top = draw(st.integers(1, t + 2))
    return r, support, context, visible, top


@settings(max_examples=150, deadline=None)
@given(cases())
def test_against_loop_reference(case) -> None:
    r, support, context, visible, top = case
    alpha = r.softmax(-1)
    s = support_statistics(r, support, context, alpha=alpha, visible=visible, top=top)
    for row in range(r.shape[0]):
        disp, mass, recall, p = reference(r[row].tolist(), alpha[row].tolist(),
                                          support.tolist(), context.tolist(),
                                          visible.tolist(), top)
        assert s.displacement[row].item() == disp
        assert math.isclose(s.mass[row].item(), mass, rel_tol=1e-12)
        assert s.recall[row].item() == recall
        assert s.outranking[row].item() == p


def test_bad_input_one_line() -> None:
    r = torch.rand(2, 6)
    with pytest.raises(ConfigError, match="inside the context"):
        support_statistics(r, torch.tensor([0]), torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="k=1, d=0"):
        support_statistics(r, torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(ConfigError, match="k=0, d=2"):
        support_statistics(r, [], torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="positions in"):
        support_statistics(r, torch.tensor([7]), torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="top"):
        support_statistics(r, torch.tensor([1]), torch.tensor([1, 2]), top=0)
