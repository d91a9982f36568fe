"""Which query positions of a window are analysed (method §3)."""

from __future__ import annotations

import torch
from torch import Tensor

from attngeom.errors import ConfigError
from attngeom.validate import parse_query_mode


def query_positions(
    mode: str, num_tokens: int, *, causal: bool = True, special: Tensor | None = None
) -> Tensor:
    """(Q,) int64 analysed positions of a window of ``num_tokens`` tokens (method §4).

    Queries are content positions: ``special`` (T,) bool marks positions that are
    never analysed (frame and document-boundary tokens; they stay keys). ``final`` is
    the last content position (the papers' protocol: for an encoder the last token
    before the closing ``[SEP]``); ``all`` is every content position whose universe
    can hold a valid N (t >= 1 for causal models, every content row for an encoder);
    ``stride:k`` keeps the positions t = f, f-k, f-2k, ... of ``all`` with f the
    final position, so the final query is always among them.

    >>> query_positions("stride:3", 8).tolist()
    [1, 4, 7]
    >>> query_positions("final", 6, special=torch.tensor([1, 0, 0, 0, 0, 1]).bool()).tolist()
    [4]
    """
    kind, k = parse_query_mode(mode)
    if num_tokens < 2:
        raise ConfigError(f"window length: expected at least 2 tokens, got {num_tokens}")
    content = torch.ones(num_tokens, dtype=torch.bool)
    if special is not None:
        if tuple(special.shape) != (num_tokens,):
            raise ConfigError(
                f"special: expected shape ({num_tokens},), got {tuple(special.shape)}"
            )
        content &= ~special.to(device="cpu", dtype=torch.bool)
    if causal:
        content[0] = False
    positions = torch.nonzero(content).flatten()
    if positions.numel() == 0:
        return positions
    last = positions[-1]
    if kind == "final":
        return last.reshape(1)
    if kind == "stride":
        positions = positions[(last - positions) % k == 0]
    return positions
