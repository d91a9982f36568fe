"""Head gates (SPEC 6): removal is exactly the head's contribution, and scoped.

Each property is compared with an independent construction written from the
definition: a pre-hook that zeros the projection input by hand, the head's
contribution x_h @ W_O[:, h]^T subtracted by hand, and central finite
differences for the gate gradient.
"""

from __future__ import annotations

import pytest
import torch

from attngeom.capture import attention_output_projections, model_layout
from attngeom.errors import ConfigError, ModelError, SelfCheckError
from attngeom.interventions import gates as gates_module
from attngeom.interventions.gates import (
    check_gates,
    gates_for_heads,
    head_gates,
    remove_heads,
    window_gates,
)
from attngeom.interventions.perplexity import window_nll

try:
    from tests.architectures import ARCHITECTURES, CAUSAL, make_inputs, make_model
except ImportError:  # pytest run from inside tests/
    from architectures import ARCHITECTURES, CAUSAL, make_inputs, make_model


def _output(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).clone()


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _no_hooks(model) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("differentiable", [False, True])
def test_gates_of_one_change_nothing_and_restore(name, differentiable):
    model = make_model(name)
    inputs = make_inputs(name)
    state = _state(model)
    plain = _output(model, inputs)
    with head_gates(model, differentiable=differentiable) as g:
        assert g.shape == (2, 4)
        gated = _output(model, inputs)
    assert torch.equal(plain, gated)
    assert torch.equal(plain, _output(model, inputs))
    assert _no_hooks(model)
    after = _state(model)
    assert all(torch.equal(state[k], after[k]) for k in state)


@pytest.mark.parametrize("name", CAUSAL)
def test_zero_layer_gates_equal_zeroing_the_projection_input(name):
    """Gating a whole layer to 0 equals a hand-written hook that zeros o_proj's input."""
    model = make_model(name)
    inputs = make_inputs(name)
    layer = 1
    projection = attention_output_projections(model)[layer]
    handle = projection.register_forward_pre_hook(lambda m, args: (torch.zeros_like(args[0]),))
    try:
        reference = _output(model, inputs)
    finally:
        handle.remove()
    gates = torch.ones(2, 4)
    gates[layer] = 0.0
    with head_gates(model, gates):
        gated = _output(model, inputs)
    torch.testing.assert_close(gated, reference, rtol=0, atol=0)
    assert not torch.equal(gated, _output(model, inputs))


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_removing_one_head_subtracts_its_contribution(name):
    """o_proj(x with slice h zeroed) = o_proj(x) - x_h @ W_O[:, h]^T, by hand (SPEC 6)."""
    model = make_model(name)
    inputs = make_inputs(name)
    layout = model_layout(model)
    d = layout.head_dim
    projection = attention_output_projections(model)[0]
    seen = {}

    def record(module, args, output):
        seen.setdefault("x", args[0].detach().clone())
        seen.setdefault("y", output.detach().clone())

    handle = projection.register_forward_hook(record)
    try:
        _output(model, inputs)
        full_x, full_y = seen.pop("x"), seen.pop("y")
        head = 2
        with remove_heads(model, [(0, head)]):
            _output(model, inputs)
    finally:
        handle.remove()
    # Conv1D (GPT-2) stores (in, out); Linear stores (out, in).
    w = projection.weight.t() if name == "gpt2" else projection.weight
    x_h = full_x[..., head * d : (head + 1) * d]
    manual = full_y - x_h @ w[:, head * d : (head + 1) * d].t()
    torch.testing.assert_close(seen["y"], manual, rtol=1e-5, atol=1e-5)
    # The layer's own attention is untouched: only the slice of head 2 is zeroed.
    zeroed = full_x.clone()
    zeroed[..., head * d : (head + 1) * d] = 0.0
    assert torch.equal(seen["x"], zeroed)


def test_gate_scales_the_named_head_slice_only():
    """A gate of 0.25 on (1, 3) multiplies features 3d..4d of layer 1's o_proj input."""
    model = make_model("llama")
    inputs = make_inputs("llama")
    d = model_layout(model).head_dim
    projection = attention_output_projections(model)[1]
    seen = []
    # A forward hook receives the arguments after every pre-hook (ours) has run.
    handle = projection.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    gates = torch.ones(2, 4)
    gates[1, 3] = 0.25
    try:
        _output(model, inputs)
        with head_gates(model, gates):
            _output(model, inputs)
    finally:
        handle.remove()
    plain, gated = seen
    expected = plain.clone()
    expected[..., 3 * d :] *= 0.25
    assert torch.equal(gated, expected)
    assert not torch.equal(gated, plain)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_removal_is_the_same_under_every_attention_implementation(implementation):
    reference_model = make_model("llama", attn_implementation="eager")
    model = make_model("llama", attn_implementation=implementation)
    inputs = make_inputs("llama")
    with remove_heads(reference_model, [(0, 1), (1, 2)]):
        reference = _output(reference_model, inputs)
    with remove_heads(model, [(0, 1), (1, 2)]):
        removed = _output(model, inputs)
    torch.testing.assert_close(removed, reference, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(removed, _output(model, inputs), atol=1e-3)


def test_hooks_are_removed_on_exceptions():
    model = make_model("llama")
    inputs = make_inputs("llama")
    plain = _output(model, inputs)
    with pytest.raises(RuntimeError, match="boom"), remove_heads(model, [(0, 0)]):
        raise RuntimeError("boom")
    assert _no_hooks(model)
    assert torch.equal(plain, _output(model, inputs))


def test_gates_edited_in_place_take_effect():
    model = make_model("llama")
    inputs = make_inputs("llama")
    with remove_heads(model, [(1, 1)]):
        reference = _output(model, inputs)
    with head_gates(model) as g:
        g[1, 1] = 0.0
        edited = _output(model, inputs)
    assert torch.equal(edited, reference)


def test_gradient_of_gates_matches_finite_differences():
    """dL/d gate from autograd equals a central difference of L.

    GPT-2 in float64 (its LayerNorm stays in float64; Llama-style RMSNorms compute
    in float32 whatever the dtype, which would drown a 1e-5 step in rounding).
    """
    model = make_model("gpt2").to(torch.float64)
    ids = make_inputs("gpt2", batch=2)["input_ids"]
    leaf = torch.ones(2, 4, dtype=torch.float64, requires_grad=True)
    with head_gates(model, leaf, differentiable=True) as g:
        assert g is leaf
        loss = window_nll(model, ids).sum()
        (grad,) = torch.autograd.grad(loss, g)
    assert all(p.grad is None for p in model.parameters())
    eps = 1e-5
    numeric = torch.empty(2, 4, dtype=torch.float64)
    for layer in range(2):
        for head in range(4):
            values = []
            for sign in (1, -1):
                gates = torch.ones(2, 4, dtype=torch.float64)
                gates[layer, head] += sign * eps
                with torch.no_grad(), head_gates(model, gates):
                    values.append(float(window_nll(model, ids).sum()))
            numeric[layer, head] = (values[0] - values[1]) / (2 * eps)
    torch.testing.assert_close(grad, numeric, rtol=1e-6, atol=1e-8)
    assert numeric.abs().min() > 1e-4  # every head matters a little: the check is not vacuous


def test_differentiable_gates_default_to_a_float32_leaf_copy():
    model = make_model("llama")
    given = torch.ones(2, 4, dtype=torch.float64)
    with head_gates(model, given, differentiable=True) as g:
        assert g is not given and g.is_leaf and g.requires_grad and g.dtype == torch.float32
    assert not given.requires_grad


def test_window_gates_give_each_window_its_own_gradient():
    model = make_model("llama").to(torch.float64)
    ids = make_inputs("llama", batch=3)["input_ids"]
    with window_gates(model, 3) as g:
        (batched,) = torch.autograd.grad(window_nll(model, ids).sum(), g)
    for b in range(3):
        with head_gates(model, differentiable=True) as g1:
            (single,) = torch.autograd.grad(window_nll(model, ids[b : b + 1]).sum(), g1)
        torch.testing.assert_close(batched[b].to(torch.float64), single.to(torch.float64))
    assert not torch.allclose(batched[0], batched[1])


def test_bad_gates_and_heads_raise_one_line_config_errors():
    model = make_model("llama")
    cases = [
        lambda: head_gates(model, torch.ones(3, 4)).__enter__(),
        lambda: head_gates(model, torch.ones(2, 4, dtype=torch.long)).__enter__(),
        lambda: head_gates(model, [[1.0] * 4] * 2).__enter__(),
        lambda: gates_for_heads(model, [(2, 0)]),
        lambda: gates_for_heads(model, [(0, 4)]),
        lambda: gates_for_heads(model, [(0, -1)]),
        lambda: gates_for_heads(model, [(0, 1, 2)]),
        lambda: remove_heads(model, [(5, 5)]).__enter__(),
    ]
    for case in cases:
        with pytest.raises(ConfigError) as info:
            case()
        assert "\n" not in str(info.value) and "expected" in str(info.value)
    assert _no_hooks(model)
    assert gates_for_heads(model, [(1, 2), (0, 0)]).tolist() == [[0, 1, 1, 1], [1, 1, 0, 1]]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_check_gates_passes(name):
    check_gates(make_model(name))


def test_check_gates_names_the_model_when_gates_do_nothing(monkeypatch):
    model = make_model("gpt_neox")
    unused = [torch.nn.Linear(32, 32) for _ in range(2)]
    monkeypatch.setattr(gates_module, "attention_output_projections", lambda m: unused)
    with pytest.raises(SelfCheckError, match="GPTNeoXForCausalLM.*did not change"):
        check_gates(model)


def test_wrong_projection_width_is_a_model_error(monkeypatch):
    model = make_model("llama")
    wrong = [model.model.layers[i].mlp.down_proj for i in range(2)]  # input width 64, not 32
    monkeypatch.setattr(gates_module, "attention_output_projections", lambda m: wrong)
    with pytest.raises(ModelError, match="num_heads \\* head_dim"), remove_heads(model, [(0, 0)]):
        _output(model, make_inputs("llama"))
    assert _no_hooks(model)
