"""model_layout and attention_output_projections on every tiny architecture (SPEC 6)."""

from __future__ import annotations

import pytest
import torch
from architectures import ARCHITECTURES, MAX_POSITIONS, make_inputs, make_model

from attngeom.capture import (
    attention_output_projections,
    capture_attention,
    model_layout,
    repeat_kv,
    tolerance_for,
)

TOL = tolerance_for(torch.float32)

EXPECTED_LAYOUT = {  # name: (layers, heads, kv heads, head dim, causal, class)
    "llama": (2, 4, 2, 8, True, "LlamaForCausalLM"),
    "mistral": (2, 4, 2, 8, True, "MistralForCausalLM"),
    "gemma": (2, 4, 2, 8, True, "GemmaForCausalLM"),
    "gemma2": (2, 4, 2, 8, True, "Gemma2ForCausalLM"),
    "qwen2": (2, 4, 2, 8, True, "Qwen2ForCausalLM"),
    "gpt2": (2, 4, 4, 8, True, "GPT2LMHeadModel"),
    "gpt_neox": (2, 4, 4, 8, True, "GPTNeoXForCausalLM"),
    "bert": (2, 4, 4, 8, False, "BertModel"),
}

EXPECTED_PROJECTION = {  # the suffix of the projection's qualified name
    "gpt2": "attn.c_proj",
    "gpt_neox": "attention.dense",
    "bert": "attention.output.dense",
}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_layout_matches_the_config(name):
    layout = model_layout(make_model(name))
    layers, heads, kv_heads, head_dim, causal, cls = EXPECTED_LAYOUT[name]
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads) == (layers, heads, kv_heads)
    assert (layout.head_dim, layout.is_causal, layout.model_class) == (head_dim, causal, cls)
    assert layout.max_positions == MAX_POSITIONS


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_output_projection_is_the_attention_projection(name):
    model = make_model(name)
    projections = attention_output_projections(model)
    names = {id(m): n for n, m in model.named_modules()}
    suffix = EXPECTED_PROJECTION.get(name, "self_attn.o_proj")
    assert [names[id(p)] for p in projections] == [
        n for n, _ in model.named_modules() if n.endswith(suffix)
    ]
    assert "mlp" not in " ".join(names[id(p)] for p in projections)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_projection_input_is_the_concatenated_head_outputs(name):
    """Its input equals sum_j alpha[t, j] v[j] per head, concatenated (SPEC 3's z_t, SPEC 6)."""
    model = make_model(name)
    inputs = make_inputs(name)
    layout = model_layout(model)
    seen = {}
    projections = attention_output_projections(model)
    handles = [
        p.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
        for i, p in enumerate(projections)
    ]
    caps = []
    try:
        with torch.no_grad(), capture_attention(model, caps.append):
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
    for c in caps:
        z = c.alpha @ repeat_kv(c.values, layout.group_size)  # (B, H, T, d)
        b, h, t, d = z.shape
        assert TOL.close(seen[c.layer], z.transpose(1, 2).reshape(b, t, h * d))
