"""Where attention lives in a transformers model, found without per-architecture tables.

method §10 asks for any Hugging Face model whose attention goes through the
transformers attention interface. Such a model's attention modules are defined
in a ``modeling_<family>.py`` that also defines the family's own
``eager_attention_forward``; that function is the reference for the model's
scaling, softcapping, sliding windows and grouped-query heads (method §2), and the
innermost ``*Attention*`` module of such a file is the one that calls the
interface. Only the output projection needs names, and those are few
(method §9: o_proj / dense / c_proj / out_proj).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from attngeom.errors import ModelError

# Child names of the attention output projection, in the order tried. GPT-2
# keeps its attention projection at ``attn.c_proj`` (``mlp.c_proj`` is the MLP's
# and is never reached because the search starts from the attention module).
OUTPUT_PROJECTION_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "wo", "o")
# BERT-like encoders put the projection in a sibling ``output`` block of the
# self-attention module (``attention.output.dense``).
SIBLING_OUTPUT_NAMES = ("output",)


def model_class_name(model: object) -> str:
    return type(model).__name__


def family_eager_function(module: torch.nn.Module) -> Callable:
    """The ``eager_attention_forward`` of the modelling file that defines ``module``'s class.

    Raises ``ModelError`` naming the class when the file defines none (the model
    does not follow transformers' functional attention design).
    """
    source = sys.modules.get(type(module).__module__)
    function = getattr(source, "eager_attention_forward", None)
    if not callable(function):
        raise ModelError(
            f"{type(module).__name__} (from {type(module).__module__}) has no family "
            "eager_attention_forward; expected a model whose attention goes through "
            "transformers' AttentionInterface"
        )
    return function


def _is_attention_candidate(module: torch.nn.Module) -> bool:
    cls = type(module)
    if "Attention" not in cls.__name__:
        return False
    if getattr(module, "is_cross_attention", False):
        return False
    source = sys.modules.get(cls.__module__)
    return callable(getattr(source, "eager_attention_forward", None))


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention modules that call the attention interface, in layer order.

    The innermost ``*Attention*`` modules of files defining an
    ``eager_attention_forward`` (BERT: ``BertSelfAttention`` inside
    ``BertAttention``). Raises ``ModelError`` naming the class when none is found.
    """
    candidates = [m for m in model.modules() if _is_attention_candidate(m)]
    ids = {id(m) for m in candidates}
    innermost = [
        m for m in candidates if not any(id(c) in ids for c in m.modules() if c is not m)
    ]
    if not innermost:
        raise ModelError(
            f"{model_class_name(model)}: found no attention module that goes through "
            "transformers' AttentionInterface; expected a transformers model with an "
            "eager_attention_forward in its modelling file"
        )
    return innermost


def _input_features(module: torch.nn.Module) -> int | None:
    if isinstance(module, torch.nn.Linear):
        return module.in_features
    weight = getattr(module, "weight", None)
    # transformers' Conv1D (GPT-2) stores weight as (in_features, out_features).
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return None


def output_projection(
    model: torch.nn.Module, attention: torch.nn.Module, width: int
) -> torch.nn.Module:
    """The module whose input is the concatenation of ``attention``'s head outputs.

    ``width`` is ``num_heads * head_dim``; a candidate whose input size differs is
    rejected so that a same-named but unrelated layer is never returned.
    """
    for name in OUTPUT_PROJECTION_NAMES:
        child = getattr(attention, name, None)
        if isinstance(child, torch.nn.Module) and _input_features(child) == width:
            return child
    parent = _parent_of(model, attention)
    if parent is not None:
        for sibling_name in SIBLING_OUTPUT_NAMES:
            sibling = getattr(parent, sibling_name, None)
            if not isinstance(sibling, torch.nn.Module):
                continue
            for name in OUTPUT_PROJECTION_NAMES:
                child = getattr(sibling, name, None)
                if isinstance(child, torch.nn.Module) and _input_features(child) == width:
                    return child
    raise ModelError(
        f"{model_class_name(model)}: found no attention output projection for "
        f"{type(attention).__name__} (tried {', '.join(OUTPUT_PROJECTION_NAMES)} with "
        f"input width {width}, and parent.output.<same names>)"
    )


def _parent_of(model: torch.nn.Module, target: torch.nn.Module) -> torch.nn.Module | None:
    for module in model.modules():
        for child in module.children():
            if child is target:
                return module
    return None
