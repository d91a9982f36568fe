"""The accumulator protocol every analysis follows: update, merge, compute (torchmetrics-like).

An accumulator holds only sufficient statistics (sums, counts, per-window rows the
bootstrap needs) and calls pure kernels on each ``AttentionBatch``:

- ``update(batch)``: add one chunk of query rows of one (window, layer); chunks of a
  window may arrive in any number and order;
- ``update_many(batches)``: the windows of one forward batch at one layer (an
  accumulator that can stack them overrides it; by default a loop over ``update``);
- ``merge(other)``: add another shard's state (disjoint windows) exactly, return self,
  so that shards merged equal one run over all of them; the other shard's windows are
  finished, so state kept per window only to finish it (the sink's per-key flags) is
  folded into summaries there, and a run's merged state does not grow as windows x T;
- ``compute()``: ``{table name: {column: array}}`` for every name in ``tables``.

``engine/analyses.py`` registers one accumulator per analysis; ``docs/extending.md``
shows how to add one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from attngeom.core.batch import AttentionBatch
from attngeom.errors import ConfigError

Columns = dict[str, np.ndarray]


class Accumulator:
    """Base class of the streaming analyses (module docstring)."""

    tables: ClassVar[tuple[str, ...]] = ()

    def update(self, batch: AttentionBatch) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def update_many(self, batches: Iterable[AttentionBatch]) -> None:
        for batch in batches:
            self.update(batch)

    def merge(self, other: Accumulator) -> Accumulator:  # pragma: no cover - abstract
        raise NotImplementedError

    def compute(self) -> dict[str, Columns]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _layer_state(self, layer: int, num_heads: int, make):
        """The per-layer state in ``self._layers`` (created by ``make(num_heads)``), checking
        that every update of a layer has the same number of heads."""
        layers = self.__dict__.setdefault("_layers", {})
        state = layers.get(layer)
        if state is None:
            state = layers[layer] = make(num_heads)
        elif state.num_heads != num_heads:
            raise ConfigError(f"layer {layer}: expected {state.num_heads} heads, got {num_heads}")
        return state

    def _check_mergeable(self, other: Accumulator, **settings) -> None:
        """Raise unless ``other`` is the same kind of accumulator with equal settings."""
        if type(other) is not type(self):
            raise ConfigError(f"expected a {type(self).__name__}, got {type(other).__name__}")
        mine = tuple(settings.values())
        theirs = tuple(getattr(other, name) for name in settings)
        if mine != theirs:
            raise ConfigError(
                f"expected equal {', '.join(settings)}, got {mine} and {theirs}"
            )


def check_disjoint(mine: Iterable, theirs: Iterable, what: str = "(layer, window)") -> None:
    """Raise when two shards share a window (merging would count it twice)."""
    overlap = set(mine) & set(theirs)
    if overlap:
        raise ConfigError(
            f"expected disjoint windows across shards, got {what} {sorted(overlap)[0]} in both"
        )
