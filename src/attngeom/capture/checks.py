"""Load-time self-checks of a model under capture (STYLE habit 7).

Before any analysis trusts captured probabilities, check on a short input that
(a) the visible probabilities of every row sum to one, (b) keys the mask hides
have probability exactly zero (in rows that see at least one key), (c) the
model's output under capture equals its own forward, and (d) every layer was
captured. A failure raises
``SelfCheckError`` naming the model class and what failed. Users run the same
checks on their own model with ``check_model(model, tokenizer)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngeom.capture.capture import LayerCapture, capture_attention
from attngeom.capture.layout import input_device, model_layout
from attngeom.capture.tolerances import Tolerance, tolerance_for
from attngeom.errors import SelfCheckError

CHECK_TEXTS = (
    "Once upon a time there was a little girl who loved the sea.",
    "The cat sat.",
)
CHECK_LENGTH = 16


@dataclass(frozen=True)
class CheckReport:
    """What ``check_model`` measured; every field passed its check."""

    model_class: str
    num_layers: int
    layers_captured: int
    max_output_error: float
    max_sum_error: float
    max_masked_probability: float
    tolerance: Tolerance


def model_output(output) -> torch.Tensor:
    """The tensor a forward's result is compared on: logits, else the last hidden state."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise SelfCheckError(f"cannot find logits or hidden states in {type(output).__name__}")


def check_inputs(model: torch.nn.Module, tokenizer=None) -> dict[str, torch.Tensor]:
    """A padded batch of two short inputs: real text if a tokenizer is given, else seeded ids."""
    device = input_device(model)
    layout = model_layout(model)
    length = min(CHECK_LENGTH, layout.max_positions or CHECK_LENGTH)
    if tokenizer is not None:
        if getattr(tokenizer, "pad_token", None) is None:
            pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        else:
            pad_id = tokenizer.pad_token_id
        encoded = [tokenizer(t)["input_ids"][:length] for t in CHECK_TEXTS]
        width = max(len(e) for e in encoded)
        ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, e in enumerate(encoded):
            ids[i, : len(e)] = torch.tensor(e)
            mask[i, : len(e)] = 1
    else:
        vocab = int(model.config.vocab_size)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (2, length), generator=gen)
        mask = torch.ones_like(ids)
        mask[1, length - length // 4 :] = 0  # right padding: some keys masked
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def check_model(model: torch.nn.Module, tokenizer=None) -> CheckReport:
    """Run the self-checks on ``model``; raise ``SelfCheckError`` on the first failure.

    >>> report = check_model(model, tokenizer)
    >>> report.layers_captured, report.max_sum_error < 1e-5
    (5, True)
    """
    layout = model_layout(model)
    name = layout.model_class
    dtype = next(model.parameters()).dtype
    tol = tolerance_for(dtype)
    inputs = check_inputs(model, tokenizer)
    captured: list[LayerCapture] = []
    with torch.no_grad():
        own = model_output(model(**inputs))
        with capture_attention(model, captured.append):
            under = model_output(model(**inputs))

    output_error = float((under.float() - own.float()).abs().max())
    if not tol.close(under.float(), own.float()):
        raise SelfCheckError(
            f"{name}: output under capture differs from the model's own forward by "
            f"{output_error:.3g} (tolerance atol={tol.atol}, rtol={tol.rtol})"
        )
    layers = sorted({c.layer for c in captured})
    if layers != list(range(layout.num_layers)):
        raise SelfCheckError(
            f"{name}: expected every layer 0..{layout.num_layers - 1} captured, got {layers}"
        )
    sum_error = 0.0
    masked = 0.0
    for c in captured:
        visible = c.visible.expand_as(c.alpha)
        rows_with_keys = visible.any(-1)
        sums = torch.where(visible, c.alpha, 0.0).sum(-1)
        err = (sums - 1.0).abs()[rows_with_keys]
        sum_error = max(sum_error, float(err.max()) if err.numel() else 0.0)
        # A row that sees no key at all (a padded query inside a sliding window)
        # has no universe; the model's softmax spreads it uniformly, so skip it.
        hidden = c.alpha[~visible & rows_with_keys[..., None]]
        masked = max(masked, float(hidden.abs().max()) if hidden.numel() else 0.0)
        if sum_error > tol.atol * 10 + tol.rtol:
            raise SelfCheckError(
                f"{name}: layer {c.layer} visible probabilities sum to 1 within "
                f"{sum_error:.3g}, expected within {tol.atol * 10 + tol.rtol:.3g}"
            )
        if masked != 0.0:
            raise SelfCheckError(
                f"{name}: layer {c.layer} gives masked keys probability {masked:.3g}, "
                "expected exactly 0"
            )
    return CheckReport(
        model_class=name,
        num_layers=layout.num_layers,
        layers_captured=len(layers),
        max_output_error=output_error,
        max_sum_error=sum_error,
        max_masked_probability=masked,
        tolerance=tol,
    )
