"""Next-token NLL and perplexity of a causal LM over windows (method §9).

Every intervention of method §9 is judged by the change of the mean next-token
negative log-likelihood on held-out windows. One window of T tokens predicts
T - 1 tokens (positions 1..T-1 from their prefixes), exactly the tokens that
``model(input_ids, labels=input_ids).loss`` averages over; over several windows
the mean is per predicted token (windows of equal length weigh equally).

The log-softmax runs in float64 over chunks of positions, so a large vocabulary
never needs a float64 copy of all the logits at once.

Shapes: ``input_ids`` (N, T) int64, N windows of T tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attngeom.capture import input_device, model_layout
from attngeom.errors import ConfigError
from attngeom.interventions.gates import head_gates

__all__ = [
    "NLLResult",
    "batch_nll_sum",
    "check_windows",
    "evaluate_nll",
    "head_removal_nll",
    "head_removal_sums",
    "relative_delta",
    "window_nll",
]

_POSITION_CHUNK = 256  # positions per float64 log-softmax (bounds the extra memory)


@dataclass(frozen=True)
class NLLResult:
    """Mean NLL per predicted token over all windows, its perplexity and the token count."""

    nll: float
    perplexity: float
    n_tokens: int

    @classmethod
    def from_sum(cls, total: float, n_tokens: int) -> NLLResult:
        nll = total / n_tokens
        return cls(nll=nll, perplexity=math.exp(nll), n_tokens=n_tokens)


def relative_delta(nll: float, base: float) -> float:
    """method §9 relative delta-NLL, ``(nll - base) / base``."""
    return (nll - base) / base


def check_windows(model: nn.Module, input_ids: Tensor, what: str = "input_ids") -> Tensor:
    """Validate (N, T) token windows for a causal model; return them as int64.

    Raises ConfigError (one line) for a non-causal model, a wrong shape or dtype,
    fewer than 2 tokens per window, or windows longer than the model's positions.
    """
    layout = model_layout(model)
    if not layout.is_causal:
        raise ConfigError(
            f"{what}: expected a causal language model for next-token NLL, "
            f"got {layout.model_class} (bidirectional)"
        )
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
        raise ConfigError(f"{what}: expected token ids of shape (N, T), got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ConfigError(f"{what}: expected integer token ids, got {input_ids.dtype}")
    n, t = input_ids.shape
    if n < 1 or t < 2:
        raise ConfigError(f"{what}: expected at least 1 window of at least 2 tokens, got {n}x{t}")
    if layout.max_positions and t > layout.max_positions:
        raise ConfigError(
            f"{what}: expected windows of at most {layout.max_positions} tokens for "
            f"{layout.model_class}, got {t}"
        )
    return input_ids.to(torch.long)


def _device(model: nn.Module) -> torch.device:
    return input_device(model)


def window_nll(model: nn.Module, batch: Tensor) -> Tensor:
    """(B,) float64 summed next-token NLL of each window of ``batch`` (B, T).

    Differentiable when called with gradients enabled (the gradient ranker uses it).
    """
    batch = batch.to(_device(model))
    logits = model(input_ids=batch, use_cache=False).logits
    targets = batch[:, 1:]
    total = torch.zeros(batch.shape[0], dtype=torch.float64, device=batch.device)
    for start in range(0, targets.shape[1], _POSITION_CHUNK):
        stop = min(start + _POSITION_CHUNK, targets.shape[1])
        chunk = logits[:, start:stop].to(torch.float64)
        nll = F.cross_entropy(
            chunk.reshape(-1, chunk.shape[-1]), targets[:, start:stop].reshape(-1), reduction="none"
        )
        total = total + nll.view(batch.shape[0], -1).sum(dim=1)
    return total


def _batches(input_ids: Tensor, batch_size: int) -> Iterator[Tensor]:
    for start in range(0, input_ids.shape[0], batch_size):
        yield input_ids[start : start + batch_size]


def _nll_sum(model: nn.Module, input_ids: Tensor, batch_size: int) -> float:
    total = 0.0
    for batch in _batches(input_ids, batch_size):
        total += batch_nll_sum(model, batch)
    return total


def evaluate_nll(model: nn.Module, input_ids: Tensor, *, batch_size: int = 8) -> NLLResult:
    """Mean next-token NLL per predicted token over windows, and its perplexity (method §9).

    Args:
        model: a causal LM (``model_layout(model).is_causal``), evaluated as it is
            (with whatever gates or restriction contexts are open).
        input_ids: (N, T) token ids, one window per row.
        batch_size: windows per forward call.

    Returns:
        ``NLLResult(nll, perplexity=exp(nll), n_tokens=N * (T - 1))``. For one window
        ``nll`` equals ``model(input_ids, labels=input_ids).loss`` (to float32 rounding).

    Raises:
        ConfigError: for a non-causal model or malformed windows.

    Example:
        >>> result = evaluate_nll(model, ids)
        >>> result.n_tokens, 1.0 < result.perplexity < 20.0
        (62, True)
    """
    input_ids = check_windows(model, input_ids)
    was_training = model.training
    model.eval()
    try:
        total = _nll_sum(model, input_ids, batch_size)
    finally:
        model.train(was_training)
    n_tokens = input_ids.shape[0] * (input_ids.shape[1] - 1)
    return NLLResult.from_sum(total, n_tokens)


def batch_nll_sum(model: nn.Module, batch: Tensor) -> float:
    """Summed next-token NLL of the windows of ``batch`` (B, T), without gradients."""
    with torch.no_grad():
        return float(window_nll(model, batch).sum())


def head_removal_sums(model: nn.Module, batch: Tensor) -> tuple[float, Tensor]:
    """Summed NLL of ``batch`` with all heads, and (L, H) float64 with each head removed.

    Costs L * H + 1 forward passes; one set of gates is edited in place.
    """
    layout = model_layout(model)
    base = batch_nll_sum(model, batch)
    removed = torch.empty(layout.num_layers, layout.num_heads, dtype=torch.float64)
    with head_gates(model) as gates:
        for layer in range(layout.num_layers):
            for head in range(layout.num_heads):
                gates.fill_(1.0)
                gates[layer, head] = 0.0
                removed[layer, head] = batch_nll_sum(model, batch)
    return base, removed


def head_removal_nll(
    model: nn.Module, input_ids: Tensor, *, batch_size: int = 8
) -> tuple[NLLResult, Tensor]:
    """NLL with all heads, and with each head removed alone (method §9 single-head scan).

    Returns:
        ``(base, nll)``: the unmodified model's :class:`NLLResult` and an (L, H)
        float64 tensor of mean NLL with head (l, h) removed and every other kept.

    Costs L * H + 1 passes over ``input_ids``.
    """
    input_ids = check_windows(model, input_ids)
    n_tokens = input_ids.shape[0] * (input_ids.shape[1] - 1)
    base_total, removed_total = 0.0, None
    was_training = model.training
    model.eval()
    try:
        for batch in _batches(input_ids, batch_size):
            base, removed = head_removal_sums(model, batch)
            base_total += base
            removed_total = removed if removed_total is None else removed_total + removed
    finally:
        model.train(was_training)
    return NLLResult.from_sum(base_total, n_tokens), removed_total / n_tokens
