"""capture_attention on every tiny architecture (SPEC 1, SPEC 8; STYLE habits 5, 6, 9).

Each test compares a captured number with an independent route to the same
number: the model's own forward, the eager model's ``output_attentions``, a
forward hook on the value projection, or the mask pattern written from the
definition (causal, sliding window, padding).
"""

from __future__ import annotations

import pytest
import torch
from architectures import (
    ARCHITECTURES,
    CAUSAL,
    MISTRAL_WINDOW,
    SLIDING_WINDOW,
    make_inputs,
    make_model,
)

from attngeom.capture import (
    AttentionCall,
    LayerCapture,
    capture_attention,
    check_model,
    model_layout,
    override_attention,
    tolerance_for,
)
from attngeom.capture.checks import model_output

TOL = tolerance_for(torch.float32)


def run(model, inputs, **kwargs):
    with torch.no_grad():
        return model_output(model(**inputs, **kwargs))


def captured(model, inputs, **capture_kwargs) -> tuple[torch.Tensor, list[LayerCapture]]:
    out: list[LayerCapture] = []
    with capture_attention(model, out.append, **capture_kwargs):
        logits = run(model, inputs)
    return logits, out


def eager_attentions(name: str, inputs) -> tuple[torch.Tensor, ...]:
    """The full probabilities the eager path itself reports (same weights, seed 0)."""
    eager = make_model(name, attn_implementation="eager")
    with torch.no_grad():
        return eager(**inputs, output_attentions=True).attentions


def expected_visible(name: str, layer: int, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, T) key visibility written from the definition of each family's mask."""
    b, t = attention_mask.shape
    q = torch.arange(t)[:, None]
    k = torch.arange(t)[None, :]
    vis = torch.ones(t, t, dtype=torch.bool) if name not in CAUSAL else k <= q
    if name == "mistral":
        vis = vis & (q - k < MISTRAL_WINDOW)
    if name == "gemma2" and layer == 0:  # layer_types: sliding, then full
        vis = vis & (q - k < SLIDING_WINDOW)
    return vis[None] & attention_mask.bool()[:, None, :]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_logits_equal_own_forward_and_eager(name):
    model = make_model(name)
    inputs = make_inputs(name)
    own = run(model, inputs)
    logits, caps = captured(model, inputs, query_rows=[-1])
    # The output path is the model's own implementation with its own mask: exact.
    assert torch.equal(logits, own)
    # And the eager path of the same weights agrees within the float32 tolerance.
    eager = make_model(name, attn_implementation="eager")
    assert TOL.close(logits, run(eager, inputs))
    assert [c.layer for c in caps] == list(range(model_layout(model).num_layers))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_probabilities_sum_to_one_and_masked_keys_are_zero(name):
    model = make_model(name)
    inputs = make_inputs(name)
    _, caps = captured(model, inputs)
    for c in caps:
        expected = expected_visible(name, c.layer, inputs["attention_mask"])
        assert torch.equal(c.visible[:, 0], expected), f"layer {c.layer} visibility"
        vis = c.visible.expand_as(c.alpha)
        has_keys = vis.any(-1)
        sums = torch.where(vis, c.alpha, 0.0).sum(-1)
        assert TOL.close(sums[has_keys], torch.ones_like(sums[has_keys]))
        assert torch.all(c.alpha[~vis & has_keys[..., None]] == 0)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_rows_equal_eager_output_attentions(name):
    """Sliced, chunked rows equal the rows the eager model itself reports (SPEC 8)."""
    model = make_model(name)
    inputs = make_inputs(name)
    reference = eager_attentions(name, inputs)
    rows = [0, 5, 7, -1]
    _, caps = captured(model, inputs, query_rows=rows, chunk_size=3)
    t = inputs["input_ids"].shape[1]
    absolute = torch.tensor([r % t for r in rows])
    for layer in range(model_layout(model).num_layers):
        chunks = [c for c in caps if c.layer == layer]
        assert [len(c.query_rows) for c in chunks] == [3, 1]
        assert chunks[0].values is chunks[1].values
        got_rows = torch.cat([c.query_rows for c in chunks])
        assert torch.equal(got_rows, absolute)
        alpha = torch.cat([c.alpha for c in chunks], dim=2)
        assert alpha.dtype == torch.float32
        assert TOL.close(alpha, reference[layer][:, :, absolute])


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_sliced_eager_rows_equal_full_eager_rows(name):
    """The primitive itself: the family's eager function on sliced rows and mask rows."""
    model = make_model(name)
    inputs = make_inputs(name)
    rows = torch.tensor([1, 4, 11])
    pairs = []

    def handler(call: AttentionCall):
        full_out, full = call.eager()
        sliced_out, sliced = call.eager(rows)
        pairs.append((full[:, :, rows], sliced, full_out[:, rows], sliced_out))
        return call.previous()

    with override_attention(model, handler):
        run(model, inputs)
    assert len(pairs) == model_layout(model).num_layers
    for full_rows, sliced, full_out, sliced_out in pairs:
        assert TOL.close(sliced, full_rows)
        assert TOL.close(sliced_out, full_out)


def _value_states(name: str, model, inputs) -> torch.Tensor:
    """Layer-0 value states (B, G, T, d) read from the value projection by a hook."""
    layout = model_layout(model)
    b, t = inputs["input_ids"].shape
    d = layout.head_dim
    seen = {}

    def keep(_module, _args, output):
        seen["out"] = output

    if name == "gpt2":
        module = model.transformer.h[0].attn.c_attn
    elif name == "gpt_neox":
        module = model.gpt_neox.layers[0].attention.query_key_value
    elif name == "bert":
        module = model.encoder.layer[0].attention.self.value
    else:
        module = model.model.layers[0].self_attn.v_proj
    handle = module.register_forward_hook(keep)
    try:
        run(model, inputs)
    finally:
        handle.remove()
    out = seen["out"]
    if name == "gpt2":
        v = out.split(layout.num_heads * d, dim=2)[2]
        return v.view(b, t, layout.num_heads, d).transpose(1, 2)
    if name == "gpt_neox":
        qkv = out.view(b, t, layout.num_heads, 3 * d).transpose(1, 2)
        return qkv.chunk(3, dim=-1)[2]
    return out.view(b, t, layout.num_kv_heads, d).transpose(1, 2)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_values_are_the_value_projection_per_kv_head(name):
    model = make_model(name)
    inputs = make_inputs(name)
    layout = model_layout(model)
    _, caps = captured(model, inputs, query_rows=[-1])
    values = caps[0].values
    b, t = inputs["input_ids"].shape
    assert values.shape == (b, layout.num_kv_heads, t, layout.head_dim)
    assert values.dtype == torch.float32
    assert TOL.close(values, _value_states(name, model, inputs))
    assert caps[0].alpha.shape == (b, layout.num_heads, 1, t)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_previous_implementation_restored_bit_identical(name):
    model = make_model(name)
    inputs = make_inputs(name)
    before_impl = model.config._attn_implementation
    before = run(model, inputs)
    _, caps = captured(model, inputs)
    assert caps
    assert model.config._attn_implementation == before_impl
    assert torch.equal(run(model, inputs), before)
    # Also when the body raises.
    with pytest.raises(RuntimeError, match="boom"), capture_attention(model, lambda c: None):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before_impl
    assert torch.equal(run(model, inputs), before)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_chunks_concatenate_to_the_unchunked_capture(name):
    model = make_model(name)
    inputs = make_inputs(name)
    _, whole = captured(model, inputs)
    _, parts = captured(model, inputs, chunk_size=5)
    t = inputs["input_ids"].shape[1]
    for layer in range(2):
        chunks = [c for c in parts if c.layer == layer]
        assert [len(c.query_rows) for c in chunks] == [5, 5, t - 10]
        alpha = torch.cat([c.alpha for c in chunks], dim=2)
        assert TOL.close(alpha, whole[layer].alpha)  # matmul shapes differ: last bits may
        assert torch.equal(torch.cat([c.visible for c in chunks], 2), whole[layer].visible)


def test_gemma2_softcap_and_sliding_window_both_matter():
    """Captured rows are softmax(softcap * tanh(s / softcap) + window mask), not plain softmax."""
    model = make_model("gemma2")
    inputs = make_inputs("gemma2", batch=1)
    states = {}

    def handler(call: AttentionCall):
        states[call.layer] = (call.query, call.key, call.kwargs["scaling"], call.kwargs["softcap"])
        return call.previous()

    with override_attention(model, handler):
        run(model, inputs)
    _, caps = captured(model, inputs)
    t = inputs["input_ids"].shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for c in caps:
        query, key, scaling, softcap = states[c.layer]
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        scores = query @ key.transpose(-1, -2) * scaling
        vis = c.visible[0, 0]
        def probs(s, vis=vis):
            return torch.softmax(s.masked_fill(~vis, float("-inf")), -1)
        capped = probs(softcap * torch.tanh(scores / softcap))
        assert TOL.close(c.alpha, capped)
        assert not TOL.close(c.alpha, probs(scores)), "softcapping must change the rows"
        assert scores.abs().max() > softcap  # the cap is reached
        if c.layer == 0:
            assert not torch.equal(vis, causal), "the sliding window must hide keys"
            assert not TOL.close(c.alpha, torch.softmax(
                (softcap * torch.tanh(scores / softcap)).masked_fill(~causal, float("-inf")), -1
            ))
        else:
            assert torch.equal(vis, causal)


def test_bert_padding_hides_padded_keys_from_every_query():
    model = make_model("bert")
    inputs = make_inputs("bert")
    assert inputs["attention_mask"][1].sum() < inputs["attention_mask"].shape[1]
    _, caps = captured(model, inputs)
    pad = ~inputs["attention_mask"][1].bool()
    for c in caps:
        assert not c.visible[1, 0][:, pad].any()
        assert torch.all(c.alpha[1][:, :, pad] == 0)
        assert c.visible[0].all()  # bidirectional: the unpadded row sees every key
        assert torch.all(c.alpha[0] > 0)


def test_negative_rows_and_gqa_groups_on_llama():
    model = make_model("llama")
    inputs = make_inputs("llama")
    _, caps = captured(model, inputs, query_rows=torch.tensor([-1, 0]))
    assert caps[0].query_rows.tolist() == [11, 0]
    layout = model_layout(model)
    assert (layout.num_heads, layout.num_kv_heads, layout.group_size) == (4, 2, 2)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_bfloat16_capture_reads_its_tolerance_from_the_table(name):
    dtype = torch.bfloat16
    tol = tolerance_for(dtype)
    model = make_model(name).to(dtype)
    inputs = make_inputs(name)
    own = run(model, inputs)
    logits, caps = captured(model, inputs, query_rows=[2, -1])
    assert torch.equal(logits, own)
    eager = make_model(name, attn_implementation="eager").to(dtype)
    with torch.no_grad():
        reference = eager(**inputs, output_attentions=True).attentions
    for c in caps:
        assert c.alpha.dtype == torch.float32 and c.values.dtype == torch.float32
        assert tol.close(c.alpha, reference[c.layer][:, :, [2, 11]].float())
    assert check_model(model).tolerance == tol


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_bfloat16_rows_are_the_float32_softmax_of_the_models_scores(name):
    """SPEC 7: under bf16 the captured rows equal the float32 softmax of the scores the
    model computes (in bf16, scaled and masked as its eager function does), not the
    probabilities rounded to bf16, which tie more often (equal bf16 scores still tie)."""
    from attngeom.capture import override_attention, repeat_kv

    model = make_model(name).to(torch.bfloat16)
    inputs = make_inputs(name, batch=1, length=24)
    expected = {}

    def scores(call):
        q, k = call.query, repeat_kv(call.key, call.query.shape[1] // call.key.shape[1])
        s = torch.matmul(q, k.transpose(2, 3)) * call.kwargs.get("scaling", q.shape[-1] ** -0.5)
        s = s + call.additive_mask()[..., : k.shape[2]]
        expected[call.layer] = torch.softmax(s.float(), -1)
        return call.previous()

    with torch.no_grad(), override_attention(model, scores):
        model(**inputs)
    _, caps = captured(model, inputs)
    ties_rounded = ties_float32 = 0
    for c in caps:
        ref = expected[c.layer]
        assert c.alpha.dtype == torch.float32
        torch.testing.assert_close(c.alpha, ref, rtol=0, atol=0)
        assert (c.alpha != c.alpha.to(torch.bfloat16).float()).any()  # not rounded
        visible = c.visible.expand_as(c.alpha)
        for row, vis in zip(c.alpha.reshape(-1, c.alpha.shape[-1]),
                            visible.reshape(-1, visible.shape[-1]), strict=True):
            ties_float32 += int(vis.sum()) - row[vis].unique().numel()
            ties_rounded += int(vis.sum()) - row[vis].to(torch.bfloat16).unique().numel()
    assert ties_rounded > ties_float32


@pytest.mark.parametrize("kind", ["causal", "bidirectional", "bool", "additive", "broadcast"])
def test_visible_rows_equal_rows_of_the_whole_pattern(kind):
    """``visible(rows)`` builds only the asked rows; they equal the whole pattern's rows
    (the q < t case is the cached-prefix one: causal aligned to the last key)."""
    b, h, q, t, d = 2, 2, 5, 7, 3
    gen = torch.Generator().manual_seed(0)
    mask = None
    if kind in ("bool", "additive", "broadcast"):
        rows_q = 1 if kind == "broadcast" else q
        mask = torch.rand(b, 1, rows_q, t, generator=gen) > 0.3
        if kind == "additive":
            mask = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.is_causal = kind != "bidirectional"
    call = AttentionCall(module=module, layer=0, query=torch.zeros(b, h, q, d),
                         key=torch.zeros(b, 1, t, d), value=torch.zeros(b, 1, t, d),
                         attention_mask=mask, kwargs={}, _override=None)
    whole = call.visible()
    assert whole.dtype == torch.bool and whole.shape[-1] == t
    rows = torch.tensor([4, 0, 2])
    part = call.visible(rows)
    expected = whole if whole.shape[2] == 1 else whole[:, :, rows]
    assert torch.equal(part.expand(b, 1, 3, t) if part.shape[2] == 1 else part,
                       expected.expand(b, 1, 3, t))
    if kind == "causal":
        positions = torch.arange(q) + (t - q)
        assert torch.equal(whole[0, 0], torch.arange(t)[None, :] <= positions[:, None])
