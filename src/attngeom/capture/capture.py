"""Attention probabilities and value states, layer by layer (method §2, method §11).

``capture_attention`` hands every layer's post-softmax probabilities at the
analysed query rows, the value states per kv head and the key visibility to a
consumer, while the model's output stays that of its own implementation:

- **output path**: the implementation the model had before (sdpa with the very
  mask sdpa would have built) computes the head outputs, so the logits under
  capture equal the model's own forward. Where that implementation cannot
  reproduce the model (softcapping, which sdpa cannot do; flash or flex with a
  materialised mask), the family's eager function does, and its probabilities
  are reused.
- **probability path**: the family's own ``eager_attention_forward`` runs on the
  analysed query rows only, with the same rows of the same mask, so scaling,
  softcapping, sliding windows, padding and GQA are exactly the model's
  ("probabilities only where analysed", method §11). ``chunk_size`` bounds the
  memory to chunk x T per head. Probabilities are float32 before any rounding to
  a bf16/fp16 model's dtype (method §10, ``AttentionCall.eager_float32``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from attngeom.capture.interface import AttentionCall, AttentionOutput, override_attention
from attngeom.errors import ConfigError


@dataclass(frozen=True)
class LayerCapture:
    """What one layer hands to the consumer (method §2).

    ``alpha`` (B, H, Q, T) float32: post-softmax probabilities at ``query_rows``
    (Q,) int64; ``values`` (B, G, T, d) float32: value states per kv head, before
    ``repeat_kv`` and the output projection (query head h reads kv head
    h // (H / G)); ``visible`` (B, 1 or H, Q, T) bool: the keys each analysed
    query may see, from the mask the model built (the universe of method §2/2).
    """

    layer: int
    alpha: torch.Tensor
    values: torch.Tensor
    visible: torch.Tensor
    query_rows: torch.Tensor


Consumer = Callable[[LayerCapture], None]


def _check_rows(query_rows: Sequence[int] | torch.Tensor | None) -> torch.Tensor | None:
    if query_rows is None:
        return None
    rows = torch.as_tensor(query_rows)
    integer = not rows.dtype.is_floating_point and rows.dtype != torch.bool
    if rows.dim() != 1 or rows.numel() == 0 or not integer:
        raise ConfigError(
            "expected query_rows to be None or a non-empty 1-D sequence of integer "
            f"positions, got {query_rows!r}"
        )
    return rows.to(torch.long)


def _check_chunk(chunk_size: int | None) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"expected chunk_size to be None or an integer >= 1, got {chunk_size!r}")
    return chunk_size


def resolve_rows(rows: torch.Tensor | None, num_queries: int) -> torch.Tensor:
    """Absolute query positions (Q,) int64 in 0..num_queries-1; negatives count from the end."""
    if rows is None:
        return torch.arange(num_queries, dtype=torch.long)
    if bool(((rows < -num_queries) | (rows >= num_queries)).any()):
        raise ConfigError(
            f"expected query_rows in [-{num_queries}, {num_queries}) for a forward with "
            f"{num_queries} query positions, got {rows.tolist()}"
        )
    return torch.remainder(rows, num_queries)


def _capture_handler(
    consumer: Consumer, rows: torch.Tensor | None, chunk_size: int | None
) -> Callable[[AttentionCall], AttentionOutput]:
    def handler(call: AttentionCall) -> AttentionOutput:
        analysed = resolve_rows(rows, call.num_queries).to(call.query.device)
        chunks = [analysed] if chunk_size is None else list(torch.split(analysed, chunk_size))
        values = call.value.detach().to(torch.float32)
        if call.previous_is_eager:
            # The eager function is the output path anyway: its full probabilities
            # are the model's, and slicing them costs nothing extra.
            output, weights, probs = call.eager_float32()
            for chunk in chunks:
                alpha = probs.index_select(2, chunk).detach()
                _emit(consumer, call, alpha, values, chunk)
            return output, weights
        output = call.previous()
        nested = call.nested and output[1] is not None
        for chunk in chunks:
            # inside another override (a top-N restriction): report the probabilities
            # the model actually used, which that override returned
            weights = (output[1].index_select(2, chunk) if nested
                       else call.eager_float32(chunk)[2])
            _emit(consumer, call, weights.detach().to(torch.float32), values, chunk)
        return output

    return handler


def _emit(
    consumer: Consumer,
    call: AttentionCall,
    alpha: torch.Tensor,
    values: torch.Tensor,
    chunk: torch.Tensor,
) -> None:
    visible = call.visible(chunk)
    if visible.shape[0] != alpha.shape[0]:
        visible = visible.expand(alpha.shape[0], *visible.shape[1:])
    consumer(
        LayerCapture(
            layer=call.layer,
            alpha=alpha,
            values=values,
            visible=visible,
            query_rows=chunk.detach().to(device="cpu", dtype=torch.long),
        )
    )


@contextlib.contextmanager
def capture_attention(
    model: torch.nn.Module,
    consumer: Consumer,
    *,
    query_rows: Sequence[int] | torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> Iterator[None]:
    """Hand each layer's ``LayerCapture`` to ``consumer`` during every forward inside.

    ``query_rows``: the analysed query positions (``None``: all; negatives count
    from the end, so ``[-1]`` is the method's ``final`` mode). ``chunk_size``: split
    the analysed rows into chunks of at most this many rows; the consumer is
    then called once per chunk, in order, with the same ``values`` tensor.
    Logits are those of the model's own forward; the previous attention
    implementation is restored on exit. Raises ``ModelError`` naming the class
    for a model whose attention does not go through transformers' interface,
    ``ConfigError`` for bad arguments.

    >>> captured = []
    >>> with capture_attention(model, captured.append, query_rows=[-1]):
    ...     _ = model(input_ids)
    >>> captured[0].alpha.shape, captured[0].values.shape
    (torch.Size([2, 8, 1, 32]), torch.Size([2, 4, 32, 8]))
    """
    rows = _check_rows(query_rows)
    size = _check_chunk(chunk_size)
    if not callable(consumer):
        raise ConfigError(f"expected a callable consumer, got {consumer!r}")
    with override_attention(model, _capture_handler(consumer, rows, size)):
        yield
