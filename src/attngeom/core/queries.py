"""Which query positions of a window are analysed (SPEC 2, "Query positions")."""

from __future__ import annotations

import torch
from torch import Tensor

from attngeom.errors import ConfigError

QUERY_MODES = ("final", "all", "stride:k")


def parse_query_mode(mode: str) -> tuple[str, int]:
    """Split ``final`` / ``all`` / ``stride:k`` into (kind, k); k is 1 unless strided."""
    if mode in ("final", "all"):
        return mode, 1
    if isinstance(mode, str) and mode.startswith("stride:"):
        try:
            k = int(mode.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return "stride", k
    raise ConfigError(
        f"query mode: expected 'final', 'all' or 'stride:k' with k >= 1, got {mode!r}"
    )


def query_positions(mode: str, num_tokens: int, *, causal: bool = True) -> Tensor:
    """(Q,) int64 analysed positions of a window of ``num_tokens`` tokens.

    ``final`` is the last position (the papers' protocol); ``all`` is every position
    whose universe can hold a valid N (t >= 1 for causal models, every row for an
    encoder); ``stride:k`` keeps the positions t = T-1, T-1-k, ... of ``all``, so the
    final query is always among them.

    >>> query_positions("stride:3", 8).tolist()
    [1, 4, 7]
    """
    kind, k = parse_query_mode(mode)
    if num_tokens < 2:
        raise ConfigError(f"window length: expected at least 2 tokens, got {num_tokens}")
    last = num_tokens - 1
    if kind == "final":
        return torch.tensor([last], dtype=torch.int64)
    first = 1 if causal else 0
    positions = torch.arange(first, num_tokens, dtype=torch.int64)
    if kind == "stride":
        positions = positions[(last - positions) % k == 0]
    return positions
