"""restrict_topn: top-N attention restriction (SPEC 6) on the registered attention function."""

from __future__ import annotations

import itertools

import pytest
import torch
from architectures import ARCHITECTURES, make_inputs, make_model
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.capture import (
    attention_output_projections,
    capture_attention,
    model_layout,
    repeat_kv,
    tolerance_for,
)
from attngeom.capture.checks import model_output
from attngeom.errors import ConfigError
from attngeom.interventions.restriction import (
    restrict_probabilities,
    restrict_topn,
    topn_keep,
)

TOL = tolerance_for(torch.float32)


def run(model, inputs):
    with torch.no_grad():
        return model_output(model(**inputs))


def test_topn_keep_ties_go_to_the_smaller_position():
    """Row [0.2, 0.3, 0.2, 0.3, 0.0(masked)]: top-1 is position 1, top-3 adds position 0."""
    probs = torch.tensor([[0.2, 0.3, 0.2, 0.3, 0.0]])
    visible = torch.tensor([[True, True, True, True, False]])
    assert topn_keep(probs, visible, 1).tolist() == [[False, True, False, False, False]]
    assert topn_keep(probs, visible, 3).tolist() == [[True, True, False, True, False]]
    # n beyond the visible keys keeps every visible key and never a masked one.
    assert topn_keep(probs, visible, 9).tolist() == [[True, True, True, True, False]]


def test_restrict_probabilities_renormalises_only_rows_it_changed():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.4, 0.0]])
    visible = torch.tensor([[True, True, True], [True, True, False]])
    kept = restrict_probabilities(probs, visible, 2, renormalize=True)
    assert torch.allclose(kept[0], torch.tensor([0.625, 0.375, 0.0]))
    assert torch.equal(kept[1], probs[1])  # nothing dropped: bit-identical
    lost = restrict_probabilities(probs, visible, 2, renormalize=False)
    assert torch.equal(lost[0], torch.tensor([0.5, 0.3, 0.0]))
    # more visible keys than n, but only zeros dropped: no probability lost, no rescaling
    # of a row that sums to a little less than one
    short = torch.tensor([[0.5, 0.499, 0.0, 0.0]])
    everywhere = torch.ones(1, 4, dtype=torch.bool)
    for n in (2, 3):
        assert torch.equal(restrict_probabilities(short, everywhere, n, renormalize=True),
                           short)
    scores = torch.tensor([[0.1, 0.2, 0.3, 0.4]])  # another ranking drops the 0.5 at n = 3
    kept = restrict_probabilities(short, everywhere, 3, renormalize=True, scores=scores)
    assert torch.equal(kept, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))


def _restricted_reference(probs, visible, n, renormalize, scores=None):
    """The definition row by row: keep the first n visible keys by descending score
    (ties to the smaller position); a row that loses a visible key with p > 0 has
    every other entry zeroed (and rescaled to sum to one), any other row is unchanged."""
    keep = _sorted_keep(probs if scores is None else scores, visible, n)
    out = probs.clone()
    vis = visible.expand_as(probs)
    for index in itertools.product(*map(range, probs.shape[:-1])):
        p, k = probs[index], keep[index]
        if bool((vis[index] & ~k & (p > 0)).any()):
            row = torch.where(k, p, torch.zeros_like(p))
            if renormalize and float(row.sum()) > 0:
                row = row / row.sum(-1, keepdim=True)
            out[index] = row
    return out


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 5), t=st.integers(1, 16), n=st.integers(1, 18),
       levels=st.integers(1, 4), renormalize=st.booleans(), by=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_restrict_probabilities_equals_the_definition(rows, t, n, levels, renormalize, by,
                                                       seed):
    # ties, zero probabilities among the visible keys, invisible keys at 0 except in rows
    # with no visible key (softmax over a fully masked row is uniform), and an explicit
    # score (another ranking) or the probabilities themselves
    g = torch.Generator().manual_seed(seed)
    visible = torch.rand(rows, t, generator=g) < 0.7
    visible[0] = False
    raw = torch.randint(0, levels + 1, (rows, t), generator=g).to(torch.float32)
    probs = torch.where(visible, raw, torch.zeros(()))
    probs[0] = 1.0
    # rows summing to a little less than one, as softmax's rounding leaves them: a row
    # rescaled that should not have been shows
    probs = 0.999 * probs / probs.sum(-1, keepdim=True).clamp_min(1)
    scores = torch.rand(rows, t, generator=g).round(decimals=1) if by else None
    got = restrict_probabilities(probs, visible, n, renormalize, scores=scores)
    assert torch.equal(got, _restricted_reference(probs, visible, n, renormalize, scores))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_n_at_least_the_window_is_the_identity(name):
    model = make_model(name)
    inputs = make_inputs(name)
    own = run(model, inputs)
    t = inputs["input_ids"].shape[1]
    with restrict_topn(model, t):
        same = run(model, inputs)
    assert torch.equal(same, own)  # nothing dropped: the model's own output, bit for bit


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_n_one_changes_the_output_and_exit_restores_it(name):
    model = make_model(name)
    inputs = make_inputs(name)
    before_impl = model.config._attn_implementation
    own = run(model, inputs)
    with restrict_topn(model, 1):
        renormalised = run(model, inputs)
    with restrict_topn(model, 1, renormalize=False):
        unnormalised = run(model, inputs)
    assert not TOL.close(renormalised, own)
    assert not TOL.close(unnormalised, renormalised)
    assert model.config._attn_implementation == before_impl
    assert torch.equal(run(model, inputs), own)


@pytest.mark.parametrize("name", ["llama", "gemma2", "bert"])
def test_head_output_is_recomputed_from_the_restricted_probabilities(name):
    """Layer 0 only, head (0, 1) only: the projection input equals restricted alpha @ v."""
    model = make_model(name)
    inputs = make_inputs(name)
    layout = model_layout(model)
    caps = []
    with torch.no_grad(), capture_attention(model, caps.append):
        model(**inputs)
    layer0 = caps[0]
    n = 2
    restricted = restrict_probabilities(layer0.alpha, layer0.visible, n, renormalize=True)
    alpha = layer0.alpha.clone()
    alpha[:, 1] = restricted[:, 1]
    z = alpha @ repeat_kv(layer0.values, layout.group_size)
    b, h, t, d = z.shape
    expected = z.transpose(1, 2).reshape(b, t, h * d)

    seen = {}
    projection = attention_output_projections(model)[0]
    handle = projection.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0]))
    try:
        with restrict_topn(model, n, heads=[(0, 1)]):
            run(model, inputs)
    finally:
        handle.remove()
    assert TOL.close(seen["z"], expected)
    # The other heads of layer 0 are untouched, head 1 changed.
    unrestricted = (layer0.alpha @ repeat_kv(layer0.values, layout.group_size)).transpose(1, 2)
    got = seen["z"].view(b, t, h, d)
    others = [i for i in range(h) if i != 1]
    assert TOL.close(got[:, :, others], unrestricted[:, :, others])
    assert not TOL.close(got[:, :, 1], unrestricted[:, :, 1])


def test_unselected_layers_keep_the_model_output_exactly():
    model = make_model("llama")
    inputs = make_inputs("llama")
    seen = {}
    projection = attention_output_projections(model)[0]
    handle = projection.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0]))
    try:
        run(model, inputs)
        own = seen["z"]
        with restrict_topn(model, 1, layers=[1]):
            run(model, inputs)
    finally:
        handle.remove()
    assert torch.equal(seen["z"], own)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n >= 1"),
        ({"n": 1.5}, "n to be an integer"),
        ({"n": True}, "n to be an integer"),
        ({"n": 1, "layers": [2]}, r"layer in \[0, 2\), got 2"),
        ({"n": 1, "layers": []}, "layers"),
        ({"n": 1, "heads": [(0, 4)]}, r"head index in \[0, 4\), got 4"),
        ({"n": 1, "heads": [(5, 0)]}, r"head layer in \[0, 2\), got 5"),
        ({"n": 1, "heads": [3]}, r"\(layer, head\) pairs"),
        ({"n": 1, "layers": [0], "heads": [(1, 0)]}, "layers=\\[0\\]"),
        ({"n": 1, "renormalize": "yes"}, "renormalize"),
    ],
)
def test_bad_arguments_raise_config_error_before_any_model_work(kwargs, message):
    model = make_model("llama")
    n = kwargs.pop("n")
    with pytest.raises(ConfigError, match=message), restrict_topn(model, n, **kwargs):
        pytest.fail("restriction must not start")
    assert model.config._attn_implementation == "sdpa"


def test_capture_nested_inside_restriction_keeps_the_restricted_output():
    """Overrides nest: capture's output path is then the enclosing restriction."""
    model = make_model("qwen2")
    inputs = make_inputs("qwen2")
    own = run(model, inputs)
    with restrict_topn(model, 2):
        restricted = run(model, inputs)
        caps = []
        with capture_attention(model, caps.append, query_rows=[-1]):
            nested = run(model, inputs)
        assert model.config._attn_implementation != "sdpa"  # still restricted
        again = run(model, inputs)
    assert torch.equal(nested, restricted) and torch.equal(again, restricted)
    assert [c.layer for c in caps] == [0, 1]
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(run(model, inputs), own)


def test_capture_inside_restriction_reports_the_restricted_probabilities():
    """SPEC 1: the probabilities exactly as the (restricted) model computes them."""
    model = make_model("llama")
    inputs = make_inputs("llama")
    caps = []
    with restrict_topn(model, 2, layers=[0]), capture_attention(model, caps.append):
        run(model, inputs)
    by_layer = {c.layer: c for c in caps}
    kept = (by_layer[0].alpha > 0).sum(-1)
    assert int(kept.max()) == 2  # every row of the restricted layer keeps at most 2 keys
    assert int((by_layer[1].alpha > 0).sum(-1).max()) > 2  # the other layer is untouched


def test_restriction_inside_capture_is_refused():
    """An enclosing capture would never see the restricted layers: refuse, say why."""
    model = make_model("llama")
    with capture_attention(model, lambda c: None), pytest.raises(ConfigError, match="inside"):
        restrict_topn(model, 2).__enter__()
    assert model.config._attn_implementation == "sdpa"



def _sorted_keep(probs, visible, n):
    """The rule written as a stable sort: the first n visible entries by descending p."""
    visible = visible.expand_as(probs)
    score = torch.where(visible, probs, torch.full_like(probs, -1.0))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(visible)
    keep.scatter_(-1, order[..., :n], True)
    return keep & visible


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 6), t=st.integers(1, 24), n=st.integers(1, 30),
       levels=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_topn_keep_equals_the_stable_sort(rows, t, n, levels, seed):
    g = torch.Generator().manual_seed(seed)
    # few distinct values: ties everywhere, across the n-th place too
    probs = torch.randint(0, levels, (rows, t), generator=g).to(torch.float32) / levels
    visible = torch.rand(rows, t, generator=g) < 0.8
    assert torch.equal(topn_keep(probs, visible, n), _sorted_keep(probs, visible, n))
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    p = torch.rand(rows, t, t, generator=g)
    assert torch.equal(topn_keep(p, causal, n), _sorted_keep(p, causal, n))



# words whose order words sit at the ends and across the sign bit; 0's is the mark
EDGE_WORDS = [0, 1, 2**31 - 1, 2**31, 2**32 - 1]


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 6), t=st.integers(1, 24), n=st.integers(1, 30),
       levels=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_topn_keep_on_order_words_equals_the_stable_sort_of_words(rows, t, n, levels, seed):
    # the random ranking's int32 order words (word - 2**31) keep what the words keep,
    # though word 0's order word is also the invisible keys' mark: few distinct words,
    # 0 among them, so rows with more than n visible words 0 come up often
    g = torch.Generator().manual_seed(seed)
    words = torch.tensor(EDGE_WORDS[:levels])[torch.randint(0, levels, (rows, t), generator=g)]
    order = (words - 2**31).to(torch.int32)
    visible = torch.rand(rows, t, generator=g) < 0.8
    expected = _sorted_keep(words, visible, n)
    assert torch.equal(topn_keep(order, visible, n), expected)
    marked = order.masked_fill(~visible, -(2**31))
    assert torch.equal(topn_keep(marked, visible, n, masked=True), expected)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    square = torch.tensor(EDGE_WORDS)[torch.randint(0, 5, (rows, t, t), generator=g)]
    assert torch.equal(topn_keep((square - 2**31).to(torch.int32), causal, n),
                       _sorted_keep(square, causal, n))


def _reach(visible):
    """One past each row's last visible key."""
    t = visible.shape[-1]
    return torch.where(visible, torch.arange(t), -1).amax(-1) + 1


@settings(max_examples=200, deadline=None)
@given(q=st.integers(1, 40), extra=st.integers(0, 12), n=st.integers(1, 20),
       levels=st.integers(1, 5), block=st.integers(1, 9), pad=st.integers(0, 6),
       words=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_topn_keep_reading_only_each_blocks_reach_keeps_the_same(q, extra, n, levels, block,
                                                                    pad, words, seed):
    # rows read in blocks up to their largest reach (causal, queries aligned to the last
    # keys, some left padding): the same keep as the stable sort, floats and order words
    from unittest import mock

    from attngeom.interventions import restriction

    t = q + extra
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(q)[:, None] + extra
    visible = (torch.arange(t)[None, :] <= rows) & (torch.arange(t)[None, :] >= pad)
    visible = visible[None, None].expand(2, 1, q, t)
    pick = torch.randint(0, levels, (2, 3, q, t), generator=g)
    if words:
        value = torch.tensor(EDGE_WORDS[:levels])[pick]
        score = (value - 2**31).to(torch.int32)
    else:
        value = score = pick.to(torch.float32) / levels
    expected = _sorted_keep(value, visible, n)
    with mock.patch.object(restriction, "_TOPK_ROWS", block):
        got = topn_keep(score, visible, n, reach=_reach(visible))
    assert torch.equal(got, expected)


def test_topn_keep_with_reach_at_full_size():
    # the default block of 128 rows on a 300-key causal window
    g = torch.Generator().manual_seed(0)
    visible = torch.ones(300, 300, dtype=torch.bool).tril()[None, None]
    score = torch.rand(1, 2, 300, 300, generator=g)
    for n in (1, 64, 200, 299):
        assert torch.equal(topn_keep(score, visible, n, reach=_reach(visible)),
                           _sorted_keep(score, visible, n))

# --------------------------------------------------------------------------- rankings


def _layer0_input(model, inputs, **kwargs):
    """The input of layer 0's output projection inside ``restrict_topn(model, **kwargs)``."""
    seen = {}
    projection = attention_output_projections(model)[0]
    handle = projection.register_forward_pre_hook(lambda m, a: seen.__setitem__("z", a[0]))
    try:
        with restrict_topn(model, **kwargs):
            run(model, inputs)
    finally:
        handle.remove()
    return seen["z"]


def _reference_keep(alpha, values, visible, n, ranking):
    """Slow reference from SPEC 6: per row, sort keys by score descending (stable, so
    ties go to the smaller index), keep the first n visible ones."""
    b, h, q, t = alpha.shape
    keep = torch.zeros_like(alpha, dtype=torch.bool)
    vis = visible.expand_as(alpha)
    for i in range(b):
        for j in range(h):
            norms = values[i, j].norm(dim=-1)
            for r in range(q):
                score = alpha[i, j, r] * norms if ranking == "contribution" else alpha[i, j, r]
                order = [k for k in sorted(range(t), key=lambda k: (-float(score[k]), k))
                         if vis[i, j, r, k]]
                keep[i, j, r, order[:n]] = True
    return keep


@pytest.mark.parametrize("renormalize", [False, True])
def test_contribution_ranking_keeps_alpha_times_value_norm(renormalize):
    """GQA model (4 query heads on 2 kv heads): head h scores with kv head h // 2's values."""
    model = make_model("llama")
    inputs = make_inputs("llama")
    layout = model_layout(model)
    assert layout.group_size > 1
    caps = []
    with torch.no_grad(), capture_attention(model, caps.append):
        model(**inputs)
    cap = caps[0]
    values = repeat_kv(cap.values, layout.group_size)
    n = 3
    keep = _reference_keep(cap.alpha, values, cap.visible, n, "contribution")
    kept = torch.where(keep, cap.alpha, torch.zeros_like(cap.alpha))
    if renormalize:
        kept = kept / kept.sum(-1, keepdim=True)
    rows_few = cap.visible.expand_as(cap.alpha).sum(-1, keepdim=True) <= n
    kept = torch.where(rows_few, cap.alpha, kept)
    b, h, t, d = values.shape
    expected = (kept @ values).transpose(1, 2).reshape(b, t, h * d)
    got = _layer0_input(model, inputs, n=n, layers=[0], ranking="contribution",
                        renormalize=renormalize)
    assert TOL.close(got, expected)
    # differs from the attention ranking somewhere (values of unequal norms)
    by_attention = _layer0_input(model, inputs, n=n, layers=[0], renormalize=renormalize)
    assert not torch.equal(got, by_attention)


def _kept_pattern(model, inputs, **kwargs):
    caps = []
    with restrict_topn(model, **kwargs), capture_attention(model, caps.append):
        run(model, inputs)
    return {c.layer: c.alpha > 0 for c in caps}


def test_random_ranking_is_seeded_nested_and_per_window():
    model = make_model("llama")
    inputs = make_inputs("llama", batch=2, length=12)
    common = {"layers": [0], "ranking": "random", "renormalize": True}
    small = _kept_pattern(model, inputs, n=2, seed=5, windows=[7, 8], **common)[0]
    large = _kept_pattern(model, inputs, n=4, seed=5, windows=[7, 8], **common)[0]
    again = _kept_pattern(model, inputs, n=2, seed=5, windows=[7, 8], **common)[0]
    assert torch.equal(small, again)  # reproducible
    assert bool((small <= large).all())  # nested over N: the first N of one permutation
    assert int(small.sum(-1).max()) == 2
    other_seed = _kept_pattern(model, inputs, n=2, seed=6, windows=[7, 8], **common)[0]
    assert not torch.equal(small, other_seed)
    # a window's order is its own: window 8 alone in a batch gives its row of before
    alone = make_inputs("llama", batch=2, length=12)
    alone = {k: v[1:] for k, v in alone.items()}
    single = _kept_pattern(model, alone, n=2, seed=5, windows=[8], **common)[0]
    assert torch.equal(single[0], small[1])
    # the order ignores the activations: other tokens, same window index, same keys
    shuffled = {k: v.flip(0) for k, v in inputs.items()}
    same = _kept_pattern(model, shuffled, n=2, seed=5, windows=[7, 8], **common)[0]
    assert torch.equal(same, small)


@pytest.mark.parametrize("n", [1, 2, 5, 11])
def test_random_ranking_keeps_the_first_n_by_word_under_left_padding(n):
    """The restricted forward's kept keys (int32 order words inside) are the first n
    visible keys of each row by descending hash word (int64, the definition), ties to
    the smaller position, with invisible keys (left padding) before the visible ones."""
    from attngeom.interventions.restriction import random_scores

    model = make_model("llama")
    inputs = make_inputs("llama", batch=2, length=12)
    inputs["attention_mask"][1, :3] = 0
    caps = []
    with restrict_topn(model, n, layers=[0], ranking="random", seed=9, windows=[4, 2],
                       renormalize=False), capture_attention(model, caps.append):
        run(model, inputs)
    cap = next(c for c in caps if c.layer == 0)
    b, h, q, t = cap.alpha.shape
    words = random_scores(9, [4, 2], 0, h, q, t, "cpu")
    visible = cap.visible.expand_as(cap.alpha)
    expected = _sorted_keep(words, visible, n)
    real = inputs["attention_mask"].bool()[:, None, :, None].expand_as(expected)
    assert torch.equal((cap.alpha > 0) & real, expected & real)
    # and the order words are those words less 2**31
    order = random_scores(9, [4, 2], 0, h, q, t, "cpu", order=True)
    assert order.dtype == torch.int32 and torch.equal(order.to(torch.int64), words - 2**31)


def test_random_order_matches_its_definition():
    """The kept set is the first n keys of the row's hash order (ties to the smaller)."""
    from attngeom.core.kernels import hash32, hashed_positions
    from attngeom.core.random_control import row_states
    from attngeom.interventions.restriction import random_scores

    scores = random_scores(3, [11], 2, 4, 5, 9, "cpu")
    assert scores.shape == (1, 4, 5, 9)
    for head in range(4):
        for q in range(5):
            state, _ = row_states(3, 11, 2, torch.tensor([head]), torch.tensor([q + 4]), 1)
            row = [int(hash32(int(state.reshape(-1)[0]) ^ int(hashed_positions(
                torch.tensor([k]))[0]))) for k in range(9)]
            assert scores[0, head, q].tolist() == row


def test_unknown_ranking_is_one_line():
    model = make_model("llama")
    with pytest.raises(ConfigError, match="attention, contribution, random"), \
            restrict_topn(model, 2, ranking="gradient"):
        pytest.fail("restriction must not start")
