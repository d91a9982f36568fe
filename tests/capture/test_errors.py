"""Rare paths of capture: unsupported models, bad arguments, failing self-checks.

STYLE habit 10 (errors name the thing and the fix) and "untested rare paths".
"""

from __future__ import annotations

import pytest
import torch
from architectures import make_inputs, make_model

from attngeom.capture import (
    attention_output_projections,
    capture_attention,
    check_model,
    model_layout,
)
from attngeom.capture import checks as checks_module
from attngeom.errors import ConfigError, ModelError, SelfCheckError
from capture.toy_bypass import BypassModel
from capture.toy_no_interface import PlainConfig, PlainModel


def test_model_without_the_interface_is_refused_naming_its_class():
    model = PlainModel(PlainConfig()).eval()
    with pytest.raises(ModelError, match="PlainModel"), capture_attention(model, lambda c: None):
        pytest.fail("capture must not start")
    assert model.config._attn_implementation == "eager"


def test_model_whose_layers_bypass_the_function_fails_at_the_first_forward():
    model = BypassModel(PlainConfig()).eval()
    before = model.config._attn_implementation
    with pytest.raises(ModelError, match="BypassModel.*no attention layer called"):  # noqa: SIM117
        with capture_attention(model, lambda c: None):
            model(torch.tensor([[1, 2, 3]]))
    assert model.config._attn_implementation == before


def test_plain_module_is_refused():
    with pytest.raises(ModelError, match="Linear"), capture_attention(
        torch.nn.Linear(2, 2), lambda c: None
    ):
        pass
    with pytest.raises(ModelError, match="Linear"):
        model_layout(torch.nn.Linear(2, 2))


def test_output_projection_missing_names_the_class():
    model = BypassModel(PlainConfig()).eval()
    # Its attention has o_proj, but a width that is not heads x head_dim is rejected.
    model.config.num_attention_heads = 3
    with pytest.raises(ModelError, match="BypassModel"):
        attention_output_projections(model)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query_rows": [[1, 2]]}, "query_rows"),
        ({"query_rows": []}, "query_rows"),
        ({"query_rows": [0.5]}, "query_rows"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": True}, "chunk_size"),
    ],
)
def test_bad_capture_arguments_raise_config_error_before_any_forward(kwargs, message):
    model = make_model("llama")
    with pytest.raises(ConfigError, match=message), capture_attention(
        model, lambda c: None, **kwargs
    ):
        pytest.fail("capture must not start")
    assert model.config._attn_implementation == "sdpa"


def test_query_row_out_of_range_for_the_forward():
    model = make_model("llama")
    inputs = make_inputs("llama")
    with pytest.raises(ConfigError, match=r"query_rows in \[-12, 12\)"):  # noqa: SIM117
        with capture_attention(model, lambda c: None, query_rows=[12]):
            model(**inputs)
    assert model.config._attn_implementation == "sdpa"


def test_check_model_passes_on_a_sound_model():
    report = check_model(make_model("gemma2"))
    assert report.model_class == "Gemma2ForCausalLM"
    assert report.layers_captured == report.num_layers == 2
    assert report.max_output_error <= report.tolerance.atol
    assert report.max_masked_probability == 0.0


def _corrupting(corrupt):
    """A capture_attention that corrupts what the consumer sees (to make a check fail)."""
    real = capture_attention

    def fake(model, consumer, **kwargs):
        return real(model, lambda c: consumer(corrupt(c)), **kwargs)

    return fake


def test_check_model_reports_mass_on_masked_keys(monkeypatch):
    def leak(c):
        alpha = torch.where(c.visible.expand_as(c.alpha), c.alpha, 1e-3)
        return type(c)(c.layer, alpha, c.values, c.visible, c.query_rows)

    monkeypatch.setattr(checks_module, "capture_attention", _corrupting(leak))
    with pytest.raises(SelfCheckError, match="LlamaForCausalLM: layer 0 .*masked keys"):
        check_model(make_model("llama"))


def test_check_model_reports_rows_not_summing_to_one(monkeypatch):
    def scale(c):
        return type(c)(c.layer, c.alpha * 0.9, c.values, c.visible, c.query_rows)

    monkeypatch.setattr(checks_module, "capture_attention", _corrupting(scale))
    with pytest.raises(SelfCheckError, match="GPT2LMHeadModel: layer 0 .*sum to 1"):
        check_model(make_model("gpt2"))


def test_check_model_reports_missing_layers(monkeypatch):
    real = capture_attention

    def only_layer_zero(model, consumer, **kwargs):
        return real(model, lambda c: consumer(c) if c.layer == 0 else None, **kwargs)

    monkeypatch.setattr(checks_module, "capture_attention", only_layer_zero)
    with pytest.raises(SelfCheckError, match="BertModel: expected every layer"):
        check_model(make_model("bert"))
