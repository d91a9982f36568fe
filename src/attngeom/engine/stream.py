"""Windows -> model -> accumulators: the streaming pass of every analysis.

Each batch of windows goes through the model once under ``capture_attention``; every
layer's attention rows and value states become ``AttentionBatch`` objects (one per
window and query chunk, sharing one ``ValueStats``) and are fed to the run's
``AnalysisSet``. Nothing of size T x T outlives its layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.kernels import compiling, resolve_compile, temporaries
from attngeom.core.queries import query_positions

# A captured query row costs about 48 bytes per (head, key) entry while its chunk is
# analysed: the probabilities and the eager recomputation that makes them (~16), the
# float64 copies and masks of the metrics (~24), those of the bounds (~9). The budget is
# split: half for these whole-chunk tensors, half for the kernels' own row-chunked
# temporaries (``kernels.temporaries``: gathers, closeness scores, selections).
_BYTES_PER_ENTRY = 48
_PIECE_FLOOR = 8 * 2**20  # the least kernel budget ``final`` queries get (kernel_budget)


def chunk_rows(config, num_heads: int, num_tokens: int) -> int:
    """Query rows per captured chunk: ``--chunk-size``, else what half the budget allows.

    The budget is per window of a forward batch, so the chunk (and with it the order
    in which per-row sums are added, which can move a float64 mean by an ulp) does not
    depend on the batch size, which a run may change without changing its tables.
    """
    if getattr(config, "chunk_size", None):
        return int(config.chunk_size)
    return max(1, half_budget(config) // (num_heads * num_tokens * _BYTES_PER_ENTRY))


def kernel_budget(config, layout, num_tokens: int) -> int:
    """The kernels' byte budget per window (``kernels.temporaries``): half of
    ``--memory-budget``; with ``final`` queries at most one float64 tensor the size of
    the window's attention outputs (T x heads x head_dim x 8 bytes), and not below 8 MB.
    One analysed row per window has 16 random repeats of every head, whose float64
    scores would otherwise sit at once on top of the forward's own peak; cut into
    pieces of this size they add about a fifth of it (docs/scale.md)."""
    half = half_budget(config)
    if getattr(config, "query_mode", "final") != "final":
        return half
    outputs = num_tokens * layout.num_heads * layout.head_dim * 8
    # not below 8 MB: smaller pieces only add calls (a small model's forward is cheap
    # next to them: stories260K ran 2.5x slower with pieces of one row)
    return max(1, min(half, max(outputs, _PIECE_FLOOR)))


def half_budget(config) -> int:
    """Half of ``--memory-budget`` in bytes, per window of a batch: the captured chunk's
    share, and the kernels' (``kernels.temporaries``)."""
    return max(1, int(float(getattr(config, "memory_budget", 1.0)) * 2**30 / 2))


@dataclass
class StreamStats:
    """Counts and timings of one streaming pass (they go to the manifest)."""

    windows: int = 0
    tokens: int = 0
    seconds: float = 0.0
    forward_calls: int = 0
    layers_seen: set = field(default_factory=set)

    def add(self, other: StreamStats) -> None:
        self.windows += other.windows
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.forward_calls += other.forward_calls
        self.layers_seen |= other.layers_seen


def window_rows(config, windows: Sequence, causal: bool, mode: str | None = None
                ) -> list[torch.Tensor]:
    """The analysed query positions of each window under ``mode`` (default the run's
    ``query_mode``): content positions only (method §4)."""
    num_tokens = int(windows[0].input_ids.shape[-1])
    return [query_positions(mode or config.query_mode, num_tokens, causal=causal,
                            special=getattr(w, "special", None)) for w in windows]


def stream_windows(
    model,
    layout,
    windows: Sequence,
    config,
    accumulators,
    *,
    progress: Callable[[int], None] | None = None,
    run_windows: int | None = None,
) -> StreamStats:
    """Run every window through the model once and feed each layer to the accumulators.

    Each window analyses its own content positions; a forward batch captures the union
    of its windows' rows and hands each window only its own. Analyses that read other
    rows (``AnalysisSet.query_modes``: the head scores' strided rows beside the final
    query) ride the same forward: the union covers every mode, and each analysis gets the
    batches of its own mode's rows. Value statistics live for
    one layer's attention call at a time: they are dropped with its last query chunk, so
    neither they nor anything of size T x T sits through the layer's MLP (method §11).
    ``accumulators`` has ``update_many`` (an ``AnalysisSet``); ``progress(n)`` is called
    with the number of windows each batch finished. ``run_windows`` (default: these
    windows) is how many windows this process streams in the whole run (its own units,
    less those resumed), which ``--compile auto`` weighs for ``final`` queries.
    """
    from attngeom.capture import capture_attention, input_device

    device = input_device(model)
    stats = StreamStats()
    modes = (accumulators.query_modes() if hasattr(accumulators, "query_modes")
             else {config.query_mode: None})
    feed = _Feeder(accumulators, stats)
    start = time.perf_counter()
    # query rows in chunks keep every T x T-sized temporary bounded (method §11)
    num_tokens = int(windows[0].input_ids.shape[-1]) if windows else 1
    chunk = chunk_rows(config, layout.num_heads, num_tokens)
    use_compile = resolve_compile(getattr(config, "compile", "off"), device=str(device),
                                  query_mode=getattr(config, "query_mode", "final"),
                                  run_windows=len(windows) if run_windows is None
                                  else run_windows)
    with torch.inference_mode(), compiling(use_compile), \
            temporaries(kernel_budget(config, layout, num_tokens)):
        for i in range(0, len(windows), config.batch_size):
            current = windows[i : i + config.batch_size]
            union = feed.start(current, {mode: window_rows(config, current, layout.is_causal,
                                                           mode) for mode in modes})
            if union.numel():
                ids = torch.stack([w.input_ids for w in current]).to(device)
                with capture_attention(model, feed, query_rows=union.to(device),
                                       chunk_size=chunk):
                    model(input_ids=ids, attention_mask=torch.ones_like(ids))
                feed.cache.clear()
                stats.forward_calls += 1
                if stats.forward_calls == 1:
                    _check_all_layers(stats, layout)  # fail on the first batch, not the last
                stats.tokens += ids.numel()
            stats.windows += len(current)
            if progress is not None:
                progress(len(current))
    stats.seconds = time.perf_counter() - start
    return stats


class _Feeder:
    """The capture consumer of one forward batch: each layer's captured rows become one
    ``AttentionBatch`` per window and query mode, fed to the analyses that read that
    mode's rows. A layer's value statistics are dropped with its last query chunk, not at
    the next layer (they would sit through this layer's MLP)."""

    def __init__(self, accumulators, stats: StreamStats) -> None:
        self.accumulators, self.stats = accumulators, stats
        self.current: list = []
        self.own_rows: dict[str, list[torch.Tensor]] = {}  # mode -> each window's rows
        self.cache: dict[str, object] = {}
        self.last_row = -1  # the batch's last analysed position: its chunk ends a layer

    def start(self, windows: list, own_rows: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        """A new batch; returns the union of its rows under every mode."""
        self.current, self.own_rows = list(windows), own_rows
        self.cache.clear()
        union = torch.unique(torch.cat([r for rows in own_rows.values() for r in rows]))
        self.last_row = int(union[-1]) if union.numel() else -1
        return union

    def __call__(self, cap) -> None:
        self.stats.layers_seen.add(cap.layer)
        key = (cap.layer, id(cap.values))
        if self.cache.get("key") != key:  # a new layer: the previous layer's stats go
            self.cache["key"] = key
            # one ValueStats per mode: its row count picks the metrics' path (direct or
            # Gram), which must be the same as in a run of that mode alone
            self.cache["stats"] = {
                mode: [ValueStats(cap.values[b].float(), queries=len(rows[b]))
                       for b in range(cap.values.shape[0])]
                for mode, rows in self.own_rows.items()}
        for mode, rows_of in self.own_rows.items():
            batches = self._batches(cap, rows_of, self.cache["stats"][mode])
            if batches and len(self.own_rows) == 1:
                self.accumulators.update_many(batches)
            elif batches:
                self.accumulators.update_many(batches, mode)
        if int(cap.query_rows[-1]) == self.last_row:  # the layer's last chunk
            self.cache.clear()

    def _batches(self, cap, rows_of: list[torch.Tensor], per_window: list) -> list:
        """Each window's own rows of the captured chunk, as ``AttentionBatch`` objects."""
        chunk = cap.query_rows
        batches = []
        for b, win in enumerate(self.current):
            rows = chunk
            alpha, visible = cap.alpha[b], cap.visible[b]
            mine = rows_of[b]
            if not torch.equal(mine, chunk):
                keep = torch.isin(chunk, mine)
                if not bool(keep.any()):
                    continue
                idx = torch.nonzero(keep).flatten()
                rows = chunk[idx]
                idx = idx.to(alpha.device)
                alpha = alpha.index_select(1, idx)
                if visible.shape[1] != 1:
                    visible = visible.index_select(1, idx)
            batches.append(AttentionBatch(
                window=int(win.index), layer=int(cap.layer), alpha=alpha.float(),
                visible=visible, query_positions=rows.to(alpha.device),
                stats=per_window[b], tokens=win.input_ids))
        return batches


def _check_all_layers(stats: StreamStats, layout) -> None:
    if len(stats.layers_seen) != layout.num_layers:
        from attngeom.errors import ModelError

        raise ModelError(
            f"{layout.model_class}: captured {len(stats.layers_seen)} of {layout.num_layers} "
            "layers; its attention does not all go through the transformers attention interface"
        )


def grid_report(n_grid: Sequence[int], num_tokens: int, query_mode: str, causal: bool) -> dict:
    """Which N of the grid can never be valid for these windows (reported, not averaged)."""
    rows = query_positions(query_mode, num_tokens, causal=causal)
    largest = int(rows.max()) + 1 if causal and rows.numel() else num_tokens
    never = [int(n) for n in n_grid if n >= largest]
    return {"largest_universe": largest, "never_valid_n": never}
