"""Sparse-attention policies (issue 39): each equals its slow reference, and restricts a
model through ``restrict_topn`` as the reference-based restriction does."""

from __future__ import annotations

import pytest
import reference_policies as ref
import torch
from architectures import make_inputs, make_model
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.capture import capture_attention, override_attention, repeat_kv, tolerance_for
from attngeom.capture.checks import model_output
from attngeom.errors import ConfigError
from attngeom.interventions.policies import POLICIES, check_policy, policy_keep, window_keep
from attngeom.interventions.restriction import restrict_topn
from attngeom.interventions.selection import positional_keep

TOL = tolerance_for(torch.float32)
MASKS = ("causal", "padded", "holes", "sliding", "arbitrary")


def _visible(kind: str, b: int, q: int, t: int, g: torch.Generator) -> torch.Tensor:
    """(B, 1, Q, T) visibility: causal (rows aligned to the last keys), left padding of a
    few keys per batch row, keys masked anywhere (an attention mask with holes: each
    batch row's recent keys start at a different position), a sliding window, or
    arbitrary bits (keys seen, lost, seen again; rows with none)."""
    rows = torch.arange(q)[:, None] + (t - q)
    keys = torch.arange(t)[None, :]
    causal = keys <= rows
    if kind == "causal":
        vis = causal[None].expand(b, q, t)
    elif kind == "padded":
        pads = torch.randint(0, max(t // 2, 1), (b, 1, 1), generator=g)
        vis = causal[None] & (keys[None] >= pads)
    elif kind == "holes":
        vis = causal[None] & (torch.rand(b, 1, t, generator=g) < 0.7)
    elif kind == "sliding":
        width = int(torch.randint(1, t + 1, (1,), generator=g))
        vis = (causal & (keys > rows - width))[None].expand(b, q, t)
    else:
        vis = torch.rand(b, q, t, generator=g) < 0.6
    return vis[:, None].contiguous()


@st.composite
def cases(draw, square: bool = False):
    """Shapes, a mask, dyadic probabilities of few levels (ties; sums exact in float64)
    and small integer queries and keys (page bounds and norms exact, ties among them)."""
    b = draw(st.integers(1, 2))
    g = draw(st.integers(1, 2))
    h = g * draw(st.sampled_from([1, 2, 4]))
    t = draw(st.integers(1, 20))
    q = t if square else draw(st.integers(1, t))
    d = draw(st.integers(1, 3))
    levels = draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(MASKS))
    if draw(st.booleans()):  # one visibility row per batch row, as models build them
        visible = _visible(kind, b, q, t, gen)
    else:  # or one per head
        visible = torch.cat([_visible(kind, b, q, t, gen) for _ in range(h)], dim=1)
    probs = torch.randint(0, levels + 1, (b, h, q, t), generator=gen).float() / 16
    query = torch.randint(-2, 3, (b, h, q, d), generator=gen).float()
    key = torch.randint(-2, 3, (b, g, t, d), generator=gen).float()
    n = draw(st.one_of(st.integers(1, t + 2), st.just(int(visible.sum(-1).max()))))
    return {"probs": probs, "query": query, "key": key, "visible": visible, "n": max(n, 1)}


def _run(name, case, params, final_only=False):
    return policy_keep(name, case["n"], params, visible=case["visible"], probs=case["probs"],
                       query=case["query"], key=case["key"], final_only=final_only)


@settings(max_examples=150, deadline=None)
@given(case=cases(), sinks=st.integers(0, 5))
def test_window_equals_reference(case, sinks):
    case["n"] = max(case["n"], sinks)  # n = sinks at the boundary, below it refused
    h = case["probs"].shape[1]
    expected = ref.window(case["visible"], case["n"], h, sinks=sinks)
    assert torch.equal(_run("window", case, {"sinks": sinks}), expected)


@settings(max_examples=150, deadline=None)
@given(case=cases(square=True), heavy=st.sampled_from([0.0, 0.25, 0.5, 0.75]),
       accumulate=st.sampled_from(["cache", "full"]))
def test_h2o_equals_reference(case, heavy, accumulate):
    params = {"heavy": heavy, "accumulate": accumulate}
    expected = ref.h2o(case["probs"], case["visible"], case["n"], heavy, accumulate)
    assert torch.equal(_run("h2o", case, params), expected)


@settings(max_examples=150, deadline=None)
@given(case=cases(square=True), heads=st.sampled_from(["layer", "head"]))
def test_tova_equals_reference(case, heads):
    if heads == "layer" and case["visible"].shape[1] > 1:  # one cache needs one mask
        with pytest.raises(ConfigError, match="heads='layer'"):
            _run("tova", case, {"heads": heads})
        return
    expected = ref.tova(case["probs"], case["visible"], case["n"], heads)
    assert torch.equal(_run("tova", case, {"heads": heads}), expected)


@settings(max_examples=150, deadline=None)
@given(case=cases(), page_size=st.integers(1, 6))
def test_quest_equals_reference(case, page_size):
    case["n"] = max(case["n"], page_size)
    expected = ref.quest(case["query"], case["key"], case["visible"], case["n"], page_size)
    assert torch.equal(_run("quest", case, {"page_size": page_size}), expected)


@settings(max_examples=150, deadline=None)
@given(case=cases(), window=st.integers(1, 6), kernel=st.sampled_from([1, 3, 5, 7]),
       pooling=st.sampled_from(["avgpool", "maxpool"]))
def test_snapkv_equals_reference(case, window, kernel, pooling):
    case["n"] = max(case["n"], window)
    params = {"window": window, "kernel": kernel, "pooling": pooling}
    expected = ref.snapkv(case["probs"], case["visible"], case["n"], window, kernel, pooling)
    assert torch.equal(_run("snapkv", case, params, final_only=True), expected)


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_knorm_equals_reference(case):
    h = case["probs"].shape[1]
    expected = ref.knorm(case["key"], case["visible"], case["n"], h)
    assert torch.equal(_run("knorm", case, {}, final_only=True), expected)


@settings(max_examples=60, deadline=None)
@given(case=cases(square=True), name=st.sampled_from(["window", "h2o", "tova", "quest"]))
def test_every_policy_keeps_at_most_n_visible_and_final_only_touches_the_last_row(case,
                                                                                 name):
    n = max(case["n"], 4)
    case["n"] = n
    params = {"quest": {"page_size": 2}, "tova": {"heads": "head"}}.get(name, {})
    keep = _run(name, case, params)
    visible = case["visible"].expand_as(keep)
    assert not bool((keep & ~visible).any())
    counts = visible.sum(-1)
    assert bool(((keep.sum(-1) <= n) | (counts <= n)).all())
    assert torch.equal(keep[counts <= n], visible[counts <= n])  # few keys: all kept
    last = _run(name, case, params, final_only=True)
    assert torch.equal(last[:, :, :-1], visible[:, :, :-1])
    assert torch.equal(last[:, :, -1], keep[:, :, -1])


def test_golden_h2o_by_hand():
    """One head, n = 2 (one recent slot, one heavy), 4 keys, causal; probabilities

        row 0: [1]             row 1: [.5 .5]
        row 2: [.25 .5 .25]    row 3: [.25 .25 .25 .25]

    Rows 0, 1 keep everything (scores, cache-renormalised: key 0 1 + .5, key 1 .5).
    Row 2: cache {0, 1} + key 2 (recent) = 3 > 2; of the non-recent keys, key 1 (.5)
    has less than key 0 (1.5): it leaves. Row 2 keeps {0, 2} and renormalises over them
    (.25/.5, .25/.5): key 0 2.0, key 2 .5. Row 3: {0, 2} + 3, evict among {0, 2} the
    smaller score: key 2. Row 3 keeps {0, 3}."""
    probs = torch.tensor([[1, 0, 0, 0], [.5, .5, 0, 0], [.25, .5, .25, 0],
                          [.25, .25, .25, .25]])[None, None]
    visible = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    keep = policy_keep("h2o", 2, visible=visible, probs=probs)
    assert keep[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0],
                                         [1, 0, 0, 1]]


def test_golden_tova_by_hand():
    """Two heads, one cache for the layer, n = 2, causal. Row 2: candidates {0, 1, 2};
    head 0 [.5 .25 .25], head 1 [.2 .6 .2] (over the candidates already): mean .35, .425,
    .225: key 2 leaves. Row 3: {0, 1, 3} with head 0 [.1 .1 .2 .6] (key 2 not a
    candidate: over {0, 1, 3} .125 .125 .75) and head 1 [.3 .3 .1 .3] (.333 .333 .333):
    means .229, .229, .542: keys 0 and 1 tie at the bottom, the larger (1) leaves."""
    probs = torch.tensor([
        [[1, 0, 0, 0], [.5, .5, 0, 0], [.5, .25, .25, 0], [.1, .1, .2, .6]],
        [[1, 0, 0, 0], [.5, .5, 0, 0], [.2, .6, .2, 0], [.3, .3, .1, .3]]])[None]
    visible = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    keep = policy_keep("tova", 2, visible=visible, probs=probs)
    assert keep[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0],
                                         [1, 0, 0, 1]]
    assert torch.equal(keep[0, 0], keep[0, 1])  # one cache for the layer


def test_golden_quest_by_hand():
    """d = 2, pages of 2, 6 keys, the last row (own page 2 = keys 4, 5), n = 4: two
    pages. q = (1, -1); page 0 keys (1, 0), (3, 2): M = (3, 2), m = (1, 0), bound
    3 - 0 = 3; page 1 keys (0, -1), (2, 1): M = (2, 1), m = (0, -1), bound 2 + 1 = 3:
    a tie, the smaller page (0) wins."""
    key = torch.tensor([[1., 0], [3, 2], [0, -1], [2, 1], [9, 9], [9, 9]])[None, None]
    query = torch.tensor([1., -1]).expand(6, 2)[None, None]
    visible = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]
    keep = policy_keep("quest", 4, {"page_size": 2}, visible=visible, query=query, key=key)
    assert keep[0, 0, -1].int().tolist() == [1, 1, 0, 0, 1, 1]


def test_window_with_one_sink_at_zero_is_the_positional_control():
    """App. E.5's control: the initial token and the n - 1 latest keys."""
    visible = torch.ones(1, 1, 9, 9, dtype=torch.bool).tril()
    for n in range(1, 10):
        assert torch.equal(window_keep(visible, n, sinks=1), positional_keep(visible, n))


def test_policy_table_is_the_one_declaration():
    assert list(POLICIES) == ["window", "h2o", "tova", "quest", "snapkv", "knorm"]
    assert {k for k, p in POLICIES.items() if p.prefill_only} == {"snapkv", "knorm"}
    for name, policy in POLICIES.items():
        defaults = {k: p.default for k, p in policy.params.items()}
        assert check_policy(name, 64, final_only=True) == defaults
    assert POLICIES["window"].params["sinks"].default == 4
    assert POLICIES["quest"].params["page_size"].default == 16
    assert {k: p.default for k, p in POLICIES["snapkv"].params.items()} == {
        "window": 32, "kernel": 5, "pooling": "avgpool"}


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("name", "n", "params", "final_only", "message"), [
    ("window", 3, None, False, r"window: expected n >= sinks \(4\), got n = 3"),
    ("window", 1, {"sinks": 2}, False, r"n >= sinks \(2\)"),
    ("quest", 64, {"page_size": 0}, False, "quest: expected page_size a positive integer"),
    ("quest", 64, {"page_size": 2.5}, False, "page_size a positive integer, got 2.5"),
    ("quest", 64, {"page_size": True}, False, "page_size a positive integer, got True"),
    ("quest", 8, None, False, r"quest: expected n >= page_size \(16\)"),
    ("snapkv", 64, None, False, "snapkv: prefill compression .* final_only=True"),
    ("knorm", 64, None, False, "knorm: prefill compression"),
    ("snapkv", 16, None, True, r"snapkv: expected n >= window \(32\)"),
    ("snapkv", 64, {"kernel": 4}, True, "kernel an odd positive integer"),
    ("h2o", 8, {"heavy": 1.0}, False, r"heavy a fraction of the budget in \[0, 1\)"),
    ("tova", 8, {"heads": "kv"}, False, "heads one of 'layer', 'head', got 'kv'"),
    ("tova", 8, {"page_size": 4}, False, "tova: unknown parameter 'page_size'; expected heads"),
    ("sparse", 8, None, False, "policy: expected one of window, h2o, tova, quest, snapkv"),
])
def test_bad_policy_input_is_one_line(name, n, params, final_only, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_policy(name, n, params, final_only=final_only)
    assert "\n" not in str(err.value)


def test_greedy_policies_need_every_earlier_row_and_policies_their_inputs():
    visible = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    probs = torch.full((1, 2, 3, 5), 0.2)
    for name in ("h2o", "tova"):
        with pytest.raises(ConfigError, match="got 3 rows for 5 keys"):
            policy_keep(name, 2, visible=visible, probs=probs)
    with pytest.raises(ConfigError, match="quest: expected query for the policy"):
        policy_keep("quest", 16, visible=visible, probs=probs)
    with pytest.raises(ConfigError, match="expected probs or query"):
        policy_keep("window", 4, visible=visible)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"ranking": "snapkv"}, "final_only=True"),
    ({"ranking": "window", "n": 2}, r"expected n >= sinks \(4\)"),
    ({"ranking": "quest", "params": {"page_size": -1}}, "page_size a positive integer"),
    ({"ranking": "attention", "params": {"sinks": 2}}, "only a policy ranking"),
    ({"ranking": "streaming"}, "ranking: unknown restriction ranking 'streaming' "
                               r"\(known: attention, contribution, random, positional, window, "),
    ({"ranking": "h2o", "final_only": 1}, "final_only to be True or False"),
])
def test_restriction_refuses_bad_policy_input_before_any_forward(kwargs, message):
    model = make_model("llama")
    kwargs.setdefault("n", 8)
    with pytest.raises(ConfigError, match=message) as err, restrict_topn(model, **kwargs):
        pytest.fail("restriction must not start")
    assert "\n" not in str(err.value)
    assert model.config._attn_implementation == "sdpa"


# ------------------------------------------------------------------------ on a model


def _policy_reference(name: str, n: int, params: dict, final_only: bool):
    """The reference policy's kept keys for one attention call."""
    def keep(probs, query, key, visible):
        full = check_policy(name, n, params, final_only=final_only)
        if name == "window":
            out = ref.window(visible, n, probs.shape[1], **full)
        elif name in ("h2o", "tova", "snapkv"):
            out = ref.REFERENCES[name](probs.double(), visible, n, **full)
        elif name == "quest":
            out = ref.quest(query.double(), key.double(), visible, n, **full)
        else:
            out = ref.knorm(key.double(), visible, n, probs.shape[1])
        if final_only:
            out[:, :, :-1] = visible.expand_as(out)[:, :, :-1]
        return out
    return keep


def _reference_logits(model, inputs, keep_of, renormalize, final_only):
    """The restriction from its definition: the kept keys from the reference, the other
    probabilities zeroed, the kept ones divided by their sum when renormalising, the
    output the new probabilities times the values; ``final_only``: the last row's output
    so where it lost probability, every other row's the model's own."""
    def handler(call):
        _, _, probs = call.eager_float32()
        visible = call.visible()
        keep = keep_of(probs, call.query, call.key, visible)
        kept = torch.where(keep, probs, torch.zeros_like(probs))
        lost = ((probs > 0) & visible & ~keep).any(-1, keepdim=True)
        if renormalize:
            total = kept.sum(-1, keepdim=True)
            kept = torch.where(total > 0, kept / total, kept)
        kept = torch.where(lost, kept, probs)
        values = repeat_kv(call.value, probs.shape[1] // call.value.shape[1])
        out = (kept.to(values.dtype) @ values).transpose(1, 2)
        if final_only:  # the last row alone (its product alone, as the restriction's)
            base = call.previous()[0].clone()
            last = (kept[:, :, -1:].to(values.dtype) @ values)[:, :, 0]
            base[:, -1] = torch.where(lost[:, :, -1], last, base[:, -1])
            out = base
        return out.to(call.query.dtype).contiguous(), kept

    with torch.no_grad(), override_attention(model, handler):
        return model_output(model(**inputs))


@pytest.fixture(scope="module")
def smollm():
    from architectures import WIKITEXT_PATH, smollm_path

    from attngeom.capture import load_model

    model, tokenizer = load_model(str(smollm_path()))
    ids = tokenizer(WIKITEXT_PATH.read_text(encoding="utf-8")[:4000])["input_ids"][:128]
    assert len(ids) == 128
    return model, {"input_ids": torch.tensor([ids])}


SMOLLM_CASES = [  # (policy, n, params, final_only, renormalize)
    ("window", 16, {}, False, False),
    ("h2o", 16, {}, False, True),
    ("h2o", 16, {"accumulate": "full"}, False, False),
    ("tova", 16, {}, False, False),
    ("tova", 16, {"heads": "head"}, False, True),
    ("quest", 48, {}, False, True),
    ("snapkv", 48, {}, True, False),
    ("knorm", 48, {}, True, True),
]


@pytest.mark.parametrize(("name", "n", "params", "final_only", "renormalize"), SMOLLM_CASES)
def test_smollm_window_restricted_by_each_policy_equals_the_reference(smollm, name, n,
                                                                     params, final_only,
                                                                     renormalize):
    """SmolLM2-135M (GQA: 9 query heads on 3 kv heads), one 128-token window, all 30
    layers: the restricted logits equal those of the reference-based restriction, and
    differ from the model's own."""
    model, inputs = smollm
    with torch.no_grad():
        own = model_output(model(**inputs))
    with torch.no_grad(), restrict_topn(model, n, ranking=name, params=params,
                                        final_only=final_only, renormalize=renormalize):
        got = model_output(model(**inputs))
    expected = _reference_logits(model, inputs, _policy_reference(name, n, params,
                                                                  final_only),
                                 renormalize, final_only)
    assert TOL.close(got, expected)
    assert not TOL.close(got[:, -1], own[:, -1])
    if final_only:  # every position but the last keeps the model's own logits
        assert torch.equal(got[:, :-1], own[:, :-1])


@pytest.mark.parametrize("name", list(POLICIES))
def test_budget_at_the_window_is_the_identity_and_exit_restores(name):
    model = make_model("llama")
    inputs = make_inputs("llama", batch=2, length=12)
    inputs["attention_mask"][1, :3] = 0  # left padding in the second row
    with torch.no_grad():
        own = model_output(model(**inputs))
    final = POLICIES[name].prefill_only
    params = {"quest": {"page_size": 4}, "snapkv": {"window": 4}}.get(name, {})
    with torch.no_grad(), restrict_topn(model, 12, ranking=name, params=params,
                                        final_only=final):
        same = model_output(model(**inputs))
    assert torch.equal(same, own)
    n = {"window": 5, "quest": 8, "snapkv": 8}.get(name, 3)
    caps = []
    with torch.no_grad(), restrict_topn(model, n, ranking=name, params=params,
                                        final_only=final, layers=[0]), \
            capture_attention(model, caps.append):
        model(**inputs)
    cap = next(c for c in caps if c.layer == 0)
    kept = (cap.alpha > 0) & cap.visible  # padded rows see no key: they stay as they were
    rows = kept[:, :, -1:] if final else kept
    assert int(rows.sum(-1).max()) == n
    with torch.no_grad():
        assert torch.equal(model_output(model(**inputs)), own)
