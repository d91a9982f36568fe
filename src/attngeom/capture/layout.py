"""The shape of a model's attention: layers, heads, kv heads, head dimension.

SPEC notation (preamble): layers l = 0..L-1, query heads h = 0..H-1, kv heads
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
    """Attention geometry of a model (SPEC notation).

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

    >>> layout = model_layout(model)                      # doctest: +SKIP
    >>> layout.num_heads, layout.num_kv_heads             # doctest: +SKIP
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


def attention_output_projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Per layer, the module whose input is the concatenation of the heads' outputs.

    SPEC 6 (head removal): zeroing head h's slice ``[h * d, (h + 1) * d)`` of this
    module's input (a forward pre-hook) removes exactly that head. o_proj for
    Llama-like models, ``attn.c_proj`` for GPT-2 (not ``mlp.c_proj``),
    ``attention.dense`` for GPT-NeoX, ``attention.output.dense`` for BERT.
    Raises ``ModelError`` naming the class when a layer has none.
    """
    layout = model_layout(model)
    width = layout.num_heads * layout.head_dim
    return [output_projection(model, m, width) for m in attention_modules(model)]
