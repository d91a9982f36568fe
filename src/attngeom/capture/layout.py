"""The shape of a model's attention: layers, heads, kv heads, head dimension.

Notation (docs/method.md §1): layers l = 0..L-1, query heads h = 0..H-1, kv heads
g = 0..G-1 with query head h reading kv head h // (H / G), head dimension d.
Everything downstream (accumulators, interventions, manifests) sizes its state
from this one record.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngeom.capture.architectures import (
    attention_modules,
    model_class_name,
    output_projection,
)
from attngeom.errors import ModelError


@dataclass(frozen=True)
class Layout:
    """Attention geometry of a model (docs/method.md §1).

    ``is_causal``: keys after the query are invisible (decoders); ``False`` for
    bidirectional encoders. ``max_positions``: the longest window the model's
    position embeddings allow, ``None`` where the config does not say.
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    is_causal: bool
    model_class: str
    max_positions: int | None

    @property
    def group_size(self) -> int:
        """Query heads per kv head (H / G)."""
        return self.num_heads // self.num_kv_heads


def _config(model: torch.nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise ModelError(
            f"{model_class_name(model)}: expected a transformers PreTrainedModel with a "
            "config, got a module without one"
        )
    return config


def model_layout(model: torch.nn.Module) -> Layout:
    """Read the attention layout of ``model`` from its config and attention modules.

    >>> layout = model_layout(model)
    >>> layout.num_heads, layout.num_kv_heads
    (8, 4)
    """
    config = _config(model)
    modules = attention_modules(model)
    first = modules[0]
    num_heads = getattr(config, "num_attention_heads", None)
    if not num_heads:
        raise ModelError(f"{model_class_name(model)}: config has no num_attention_heads")
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = (
        getattr(first, "head_dim", None)
        or getattr(first, "head_size", None)
        or getattr(first, "attention_head_size", None)
        or getattr(config, "head_dim", None)
        or config.hidden_size // num_heads
    )
    is_causal = getattr(first, "is_causal", None)
    if not isinstance(is_causal, bool):
        is_causal = not getattr(config, "is_encoder_decoder", False)
    max_positions = getattr(config, "max_position_embeddings", None)
    return Layout(
        num_layers=len(modules),
        num_heads=int(num_heads),
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        is_causal=bool(is_causal),
        model_class=model_class_name(model),
        max_positions=int(max_positions) if max_positions else None,
    )


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's input ids go: its input embedding's device (a model spread over
    several GPUs with ``device_map`` takes its inputs on the first one)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.device
    return next(model.parameters()).device


def attention_output_projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Per layer, the module whose input is the concatenation of the heads' outputs.

    method §9 (head removal): zeroing head h's slice ``[h * d, (h + 1) * d)`` of this
    module's input (a forward pre-hook) removes exactly that head. o_proj for
    Llama-like models, ``attn.c_proj`` for GPT-2 (not ``mlp.c_proj``),
    ``attention.dense`` for GPT-NeoX, ``attention.output.dense`` for BERT.
    Raises ``ModelError`` naming the class when a layer has none.
    """
    layout = model_layout(model)
    width = layout.num_heads * layout.head_dim
    return [output_projection(model, m, width) for m in attention_modules(model)]


# Leaf module names of value projections, separate or fused, by layout of their output.
_SEPARATE_V = ("v_proj", "value", "v_lin", "v")
_FUSED_BLOCKS = ("c_attn", "qkv_proj", "Wqkv")  # output [q (H*d) | k (G*d) | v (G*d)]
_FUSED_PER_HEAD = ("query_key_value",)  # GPT-NeoX / Bloom: output (H, [q | k | v] d)


def _weight_matrix(module: torch.nn.Module, in_features: int) -> torch.Tensor:
    """The (out, in) matrix of a linear map: Linear, GPT-2 Conv1D, or probed with an identity."""
    if isinstance(module, torch.nn.Linear):
        return module.weight.detach()
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return weight.detach().t()  # Conv1D stores (in, out)
    param = next(module.parameters())
    with torch.no_grad():
        eye = torch.eye(in_features, dtype=param.dtype, device=param.device)
        zero = torch.zeros(1, in_features, dtype=param.dtype, device=param.device)
        return (module(eye) - module(zero)).t()


def _find_value_projection(
    model: torch.nn.Module, projection: torch.nn.Module
) -> tuple[str, torch.nn.Module]:
    """The value projection serving the same attention block as ``projection``.

    Walks up from the output projection's qualified name and searches each
    enclosing module (nearest first) for a known value-projection leaf name, so
    Llama-style ``self_attn.v_proj``, BERT's ``attention.self.value`` (a sibling
    of ``attention.output.dense``) and fused GPT-2 / GPT-NeoX blocks all resolve.
    """
    names = {id(m): n for n, m in model.named_modules()}
    qualified = names.get(id(projection))
    if qualified is None:
        raise ModelError("the attention output projection is not a submodule of the model")
    parts = qualified.split(".")
    wanted = _SEPARATE_V + _FUSED_BLOCKS + _FUSED_PER_HEAD
    for depth in range(len(parts) - 1, 0, -1):
        parent = model.get_submodule(".".join(parts[:depth]))
        for name in wanted:
            for sub_name, sub in parent.named_modules():
                if sub_name.split(".")[-1] == name and sub is not projection:
                    return name, sub
    raise ModelError(
        f"no value projection ({', '.join(wanted)}) found near {qualified} in "
        f"{type(model).__name__}"
    )


def head_weights(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(W_V, W_O)``: value-projection rows and output-projection columns.

    ``W_V`` is (G or H, d, hidden) float64, the rows of each kv head (H for fused
    per-head layouts such as GPT-NeoX, where every query head has its own value);
    ``W_O`` is (hidden, H, d) float64, the output-projection columns fed by each head.
    Biases are left out. Works for separate (``v_proj``), fused (GPT-2 ``c_attn``) and
    per-head fused (``query_key_value``) projections, Linear or GPT-2 Conv1D.
    """
    layout = model_layout(model)
    h, g, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    out = []
    for layer, projection in enumerate(attention_output_projections(model)):
        w_o = _weight_matrix(projection, h * d).to(torch.float64)  # (hidden, H*d)
        if w_o.shape[1] != h * d:
            raise ModelError(
                f"expected the output projection of layer {layer} to take {h * d} inputs, got "
                f"{w_o.shape[1]}"
            )
        name, module = _find_value_projection(model, projection)
        w = _weight_matrix(module, w_o.shape[0]).to(torch.float64)
        if name in _SEPARATE_V:
            kv, expected = g, g * d
        elif name in _FUSED_BLOCKS:
            kv, expected = g, h * d + 2 * g * d
        else:
            kv, expected = h, 3 * h * d
        if w.shape[0] != expected:
            raise ModelError(
                f"expected {name} in layer {layer} of {layout.model_class} to have {expected} "
                f"outputs, got {w.shape[0]}"
            )
        if name in _FUSED_BLOCKS:
            w = w[h * d + g * d :]
        elif name in _FUSED_PER_HEAD:
            w = w.view(h, 3, d, -1)[:, 2]
        out.append((w.reshape(kv, d, -1), w_o.view(w_o.shape[0], h, d)))
    return out
