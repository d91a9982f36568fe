"""Streaming state of the top-N geometry: per-window sums and counts (method §5).

The math lives in ``geometry.topn_metrics`` (and ``bounds``); this object only keeps
the sufficient statistics of each (window, layer, rule, variant, distance): sums of
every metric over valid (query, repeat) entries and their counts, per head and N.
Query chunks of one window add up; shards of a run (disjoint windows) merge by
adding, so a merged accumulator equals one that saw every window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.bounds import bounds_of_top, inversion_bounds, window_constants
from attngeom.core.geometry import TopNMetrics, topn_metrics_variants
from attngeom.core.kernels import stacked_windows, temp_bytes
from attngeom.core.protocol import Accumulator
from attngeom.errors import ConfigError
from attngeom.names import METRICS, RULES, VARIANTS

_BOUND_CHUNK_BYTES = 256 * 2**20  # the bound rows' own temporaries (kernels.temporaries)

BOUND_COLUMNS = (
    "precision_bound", "recall_bound", "f_bound", "precision_inv_bound", "recall_inv_bound",
)
SINK_EFFECT_COLUMNS = (
    "f_full_sink_selected", "f_full_sink_unselected",
    "f_nosink_sink_selected", "f_nosink_sink_unselected",
)


@dataclass(frozen=True)
class TopNConfig:
    """What the geometry pass computes; see method §4 for every choice."""

    n_grid: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    rules: tuple[str, ...] = RULES.names()
    distances: tuple[str, ...] = ("euclidean",)
    variants: tuple[str, ...] = VARIANTS
    repeats: int = 16
    seed: int = 0
    bounds: bool = True


@dataclass
class _Cell:
    """Sums over valid entries, per head and N (all (H, NN) float64 on the CPU)."""

    sums: dict[str, Tensor]
    counts: Tensor
    entries: Tensor
    bound_counts: Tensor | None = None
    nonfinite: Tensor | None = None  # (H,) rows skipped for non-finite input

    @property
    def nonfinite_rows(self) -> int:
        return 0 if self.nonfinite is None else int(self.nonfinite.sum())

    def windows(self, count: int) -> list[_Cell]:
        """The cells of the ``count`` windows stacked along the head rows, in order (one
        window: this fresh cell itself, not a copy)."""
        if count == 1:
            return [self]
        h = self.counts.shape[0] // count
        return [self.rows(slice(i * h, (i + 1) * h)) for i in range(count)]

    def rows(self, sl: slice) -> _Cell:
        """The cell of a range of head rows (one window of a stacked batch)."""
        return _Cell(
            sums={name: v[sl].clone() for name, v in self.sums.items()},
            counts=self.counts[sl].clone(),
            entries=self.entries[sl].clone(),
            bound_counts=None if self.bound_counts is None else self.bound_counts[sl].clone(),
            nonfinite=None if self.nonfinite is None else self.nonfinite[sl].clone(),
        )

    def add(self, other: _Cell) -> None:
        for name, value in other.sums.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value.clone()
        self.counts = self.counts + other.counts
        self.entries = self.entries + other.entries
        for name in ("bound_counts", "nonfinite"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None:
                setattr(self, name, theirs.clone() if mine is None else mine + theirs)


def _masked_sum(x: Tensor, mask: Tensor, dims: tuple[int, ...]) -> Tensor:
    return torch.where(mask, x, 0).sum(dims)  # a Python 0 keeps x's dtype


def _stacked_sums(names: tuple[str, ...], stack: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """{name: (H, NN) sum over the valid (K, Q) entries} of a (len(names), K, H, Q, NN)
    stack, in one pass and one copy to the CPU (``mask`` broadcasts to the stack). Each
    sum is its own tensor, not a view of the stack's: a pickled shard holds a view's
    whole storage."""
    total = _masked_sum(stack, mask, (1, 3)).cpu()
    return {name: x.clone() for name, x in zip(names, total, strict=True)}


@dataclass
class TopNAccumulator(Accumulator):
    """Accumulates method §4 metrics (and the method §8 per-query bounds) window by window.

    Tables: ``metrics`` (per window, layer, head, rule, variant, distance, N) and
    ``sink_effect`` (F_N split by whether the sink was selected, joined into ``sink``).
    """

    tables = ("metrics", "sink_effect")
    config: TopNConfig = field(default_factory=TopNConfig)
    cells: dict[tuple[int, int, str, str, str], _Cell] = field(default_factory=dict)
    sink_effect: dict[tuple[int, int], dict[str, Tensor]] = field(default_factory=dict)
    num_heads: int | None = None

    def update(self, batch: AttentionBatch) -> None:
        self.update_many([batch])

    def update_many(self, batches: list[AttentionBatch]) -> None:
        """Add several windows' batches of one layer in one pass.

        Batches with the same layer, shapes and query rows are stacked along the head
        dimension (each window's kv heads after the previous window's, so head h of
        window b reads stacked kv head b G + h // (H / G)), which turns B small kernel
        calls into one; the random control is seeded by each row's own window and head,
        so the tables equal those of one update per window.
        """
        groups: dict[tuple, list[AttentionBatch]] = {}
        for b in batches:
            key = (b.layer, tuple(b.alpha.shape), tuple(b.stats.values.shape),
                   tuple(b.query_positions.tolist()))
            groups.setdefault(key, []).append(b)
        for group in groups.values():
            with stacked_windows(len(group)):  # pieces per window, whatever the batch
                self._update_stacked(group)

    def _update_stacked(self, batches: list[AttentionBatch]) -> None:
        cfg = self.config
        first = batches[0]
        h, q, t = first.alpha.shape
        self.num_heads = h
        if len(batches) == 1:
            batch = first
        else:
            batch = AttentionBatch(
                window=first.window, layer=first.layer,
                alpha=torch.cat([b.alpha for b in batches]),
                visible=torch.cat([b.visible.expand(h, q, t) for b in batches]),
                query_positions=first.query_positions,
                stats=ValueStats.stack([b.stats for b in batches]),
            )
        device = batch.alpha.device
        windows = torch.tensor([b.window for b in batches], device=device)
        row_window = windows.repeat_interleave(h)
        row_head = torch.arange(h, device=device).repeat(len(batches))
        constants = None
        results: dict[tuple[str, str, str], TopNMetrics] = {}
        for distance in cfg.distances:
            # every rule in one pass (their orders are stacked as the K rows), and the
            # sink-excluded universe read off the full one where their first keys agree
            by_variant = topn_metrics_variants(
                batch.alpha, None, cfg.n_grid, rules=cfg.rules, variants=cfg.variants,
                distance=distance, visible=batch.visible,
                query_positions=batch.query_positions, repeats=cfg.repeats,
                seed=cfg.seed, window=row_window, layer=batch.layer,
                stats=batch.stats, head_index=row_head,
            )
            cells_of = {variant: {rule: self._cell(res) for rule, res in by_rule.items()}
                        for variant, by_rule in by_variant.items()}
            if cfg.bounds and distance == "euclidean":
                if constants is None:  # once per layer
                    constants = _window_constants(batch)
                alpha64 = torch.nan_to_num(batch.alpha.to(torch.float64), nan=0.0,
                                           posinf=0.0, neginf=0.0)
                self._add_bounds(cells_of, by_variant, batch, alpha64, constants)
            for variant, by_rule in by_variant.items():
                cells = cells_of[variant]
                if distance == "euclidean" and "attention" in by_rule:
                    results[(variant, "attention", distance)] = by_rule["attention"]
                for rule in cfg.rules:
                    for b, part in zip(batches, cells[rule].windows(len(batches)), strict=True):
                        key = (b.window, b.layer, rule, variant, distance)
                        if key in self.cells:
                            self.cells[key].add(part)
                        else:
                            self.cells[key] = part
        full = results.get(("full", "attention", "euclidean"))
        nosink = results.get(("no_sink", "attention", "euclidean"))
        if full is not None and nosink is not None:
            parts = self._sink_parts(full, nosink)
            for i, b in enumerate(batches):
                mine = {name: v[i * h : (i + 1) * h] for name, v in parts.items()}
                key = (b.window, b.layer)
                if key in self.sink_effect:
                    for name, value in mine.items():
                        self.sink_effect[key][name] += value
                else:
                    self.sink_effect[key] = {name: v.clone() for name, v in mine.items()}

    def _cell(self, res: TopNMetrics) -> _Cell:
        valid = res.valid
        k, h, q, nn = valid.shape
        return _Cell(
            sums=_stacked_sums(METRICS, res.stacked, valid),
            counts=valid.sum((0, 2)).to(torch.float64).cpu(),
            entries=torch.full((h, nn), float(k * q), dtype=torch.float64),
            nonfinite=res.nonfinite.sum(-1).cpu(),
        )

    def _add_bounds(
        self, cells_of: dict[str, dict[str, _Cell]], by_variant: dict[str, dict[str, TopNMetrics]],
        batch: AttentionBatch, alpha64: Tensor, constants,
    ) -> None:
        """Add the bound sums of every variant and rule. Every rule's orders go in one
        call (the K rows share the key-order terms); both variants' rows too, stacked
        along the heads, where the stack's query rows fit one chunk (``final`` queries):
        a row's bounds are computed on its own, and the chunks (whose key prefix can
        decide how a row's float sums round) are then those of a call per variant."""
        h, q, t = batch.alpha.shape
        k = sum(res.valid.shape[0] for res in next(iter(by_variant.values())).values())
        variants = list(by_variant)
        together = _bound_rows(k, len(variants) * h, t) >= q
        grid = torch.tensor(next(iter(by_variant[variants[0]].values())).n_grid,
                            dtype=torch.float64)
        for group in ([variants] if together else [[v] for v in variants]):
            bounds = self._bounds_of(group, by_variant, batch, alpha64, constants)
            for i, variant in enumerate(group):
                start = 0
                for rule, res in by_variant[variant].items():
                    sl = slice(start, start + res.valid.shape[0])
                    start = sl.stop
                    # the five bound columns (BOUND_COLUMNS order) in one tensor
                    cols = torch.cat([bounds[:, sl, i * h : (i + 1) * h],
                                      torch.stack(inversion_bounds(res.inversions, grid))])
                    ok = res.valid & torch.isfinite(cols)
                    cell = cells_of[variant][rule]
                    cell.sums.update(_stacked_sums(BOUND_COLUMNS, cols, ok))
                    cell.bound_counts = cell.counts.clone()  # the same valid entries

    @staticmethod
    def _bounds_of(group: list[str], by_variant: dict[str, dict[str, TopNMetrics]],
                   batch: AttentionBatch, alpha64: Tensor, constants) -> Tensor:
        """``bounds_of_top`` of the variants in ``group``, stacked along the heads (K
        rule orders, len(group) H head rows): (3, K, len(group) H, Q, NN), the bounds of
        precision, recall and F in that order."""
        firsts = [next(iter(by_variant[v].values())) for v in group]
        tops = [torch.cat([res.top for res in by_variant[v].values()]) for v in group]
        tops = tops[0] if len(group) == 1 else torch.cat(tops, dim=1)
        universe = (firsts[0].universe if len(group) == 1  # as the metrics'
                    else torch.cat([res.universe for res in firsts]))
        alpha = alpha64 if len(group) == 1 else alpha64.repeat(len(group), 1, 1)
        kv = batch.kv_of_head.repeat(len(group))
        k, hv, q, t = tops.shape[0], *alpha.shape
        # query rows in chunks; as in the metrics, each chunk stops at the last key its
        # rows can see (the first entries of ``top`` are then that prefix's own; later
        # ones are padding)
        step = max(1, _bound_rows(k, hv, t))
        last = torch.where(universe.any(0), torch.arange(t, device=universe.device), -1)
        parts = []
        for s in range(0, q, step):
            sl = slice(s, s + step)
            tk = max(1, int(last[sl].amax()) + 1)
            parts.append(bounds_of_top(
                alpha[:, sl, :tk], batch.stats.key_prefix(tk), kv,
                tops[:, :, sl, : min(tk, tops.shape[-1])], universe[:, sl, :tk],
                firsts[0].n_grid, *constants,
            ))
        names = BOUND_COLUMNS[:3]
        if len(parts) == 1:
            return torch.stack([parts[0][name] for name in names])
        return torch.stack([torch.cat([p[name] for p in parts], dim=2) for name in names])

    def _sink_parts(self, full: TopNMetrics, nosink: TopNMetrics) -> dict[str, Tensor]:
        """F sums and counts per head row and N, split by whether the sink was selected."""
        chosen = full.sink_selected[0]
        both = full.valid[0] & nosink.valid[0]
        parts = {}
        for name, res in (("full", full), ("nosink", nosink)):
            f = res.f_score[0]
            for tag, mask in (("selected", chosen & both), ("unselected", ~chosen & both)):
                parts[f"f_{name}_sink_{tag}"] = _masked_sum(f, mask, (1,)).cpu()
                parts[f"n_{name}_sink_{tag}"] = mask.sum(1).to(torch.float64).cpu()
        return parts

    def merge(self, other: TopNAccumulator) -> TopNAccumulator:
        """Add another accumulator's state (another shard, or other query chunks); self."""
        if not isinstance(other, TopNAccumulator) or other.config != self.config:
            raise ConfigError("cannot merge top-N accumulators with different configurations")
        for key, cell in other.cells.items():
            if key in self.cells:
                self.cells[key].add(cell)
            else:
                mine = _Cell(sums={}, counts=torch.zeros_like(cell.counts),
                             entries=torch.zeros_like(cell.entries))
                mine.add(cell)
                self.cells[key] = mine
        for key, parts in other.sink_effect.items():
            if key in self.sink_effect:
                for name, value in parts.items():
                    self.sink_effect[key][name] += value
            else:
                self.sink_effect[key] = {name: v.clone() for name, v in parts.items()}
        self.num_heads = self.num_heads or other.num_heads
        return self

    @property
    def nonfinite_rows(self) -> int:
        return sum(c.nonfinite_rows for c in self.cells.values())

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """Tables ``metrics`` (per window, layer, head, rule, variant, distance, n) and
        ``sink_effect`` (per window, layer, head, n), as numpy columns."""
        grid = np.asarray(self.config.n_grid, dtype=np.int64)
        metrics: dict[str, list] = {c: [] for c in _metric_table()}
        for (window, layer, rule, variant, distance), cell in sorted(self.cells.items()):
            h, nn = cell.counts.shape
            size = h * nn
            reps = self._repeats(rule)
            n_queries = (cell.counts / reps).round().numpy().reshape(-1)
            entries = (cell.entries / reps).round().numpy().reshape(-1)
            cols = {
                "window": np.full(size, window), "layer": np.full(size, layer),
                "head": np.repeat(np.arange(h), nn), "rule": np.full(size, rule, dtype=object),
                "variant": np.full(size, variant, dtype=object),
                "distance": np.full(size, distance, dtype=object), "n": np.tile(grid, h),
                "n_queries": n_queries.astype(np.int64),
                "n_skipped": (entries - n_queries).astype(np.int64),
                "trivial": np.tile((grid == 1) & (distance == "euclidean"), h),
            }
            for name in METRICS:
                cols[name] = _ratio(cell.sums[name], cell.counts).numpy().reshape(-1)
            for name in BOUND_COLUMNS:
                if cell.bound_counts is not None and name in cell.sums:
                    cols[name] = _ratio(cell.sums[name], cell.bound_counts).numpy().reshape(-1)
                else:
                    cols[name] = np.full(size, np.nan)
            for name in _metric_table():
                metrics[name].append(cols[name])
        effect: dict[str, list] = {c: [] for c in _EFFECT_TABLE}
        for (window, layer), parts in sorted(self.sink_effect.items()):
            h, nn = parts["n_full_sink_selected"].shape
            size = h * nn
            cols = {
                "window": np.full(size, window), "layer": np.full(size, layer),
                "head": np.repeat(np.arange(h), nn), "n": np.tile(grid, h),
                "n_sink_selected": parts["n_full_sink_selected"].numpy().reshape(-1),
                "n_sink_unselected": parts["n_full_sink_unselected"].numpy().reshape(-1),
            }
            for name in SINK_EFFECT_COLUMNS:
                cols[name] = _ratio(parts[name], parts["n_" + name[2:]]).numpy().reshape(-1)
            for name in _EFFECT_TABLE:
                effect[name].append(cols[name])
        return {
            "metrics": _concat(metrics),
            "sink_effect": _concat(effect),
        }

    def _repeats(self, rule: str) -> int:
        return self.config.repeats if rule == "random" else 1


def _metric_table() -> tuple[str, ...]:
    """The metrics table's columns; read when the table is made, so that a metric
    registered at run time (``core/metrics.py``) has its column."""
    return ("window", "layer", "head", "rule", "variant", "distance", "n", *METRICS,
            "n_queries", "n_skipped", "trivial", *BOUND_COLUMNS)


_EFFECT_TABLE = (
    "window", "layer", "head", "n", *SINK_EFFECT_COLUMNS, "n_sink_selected", "n_sink_unselected",
)


def _concat(columns: dict[str, list]) -> dict[str, np.ndarray]:
    return {
        name: (np.concatenate(parts) if parts else np.zeros(0)) for name, parts in columns.items()
    }


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))


def _bound_rows(orders: int, heads: int, t: int) -> int:
    """Query rows whose bound temporaries (about 48 bytes per order, head and key) fit
    the budget of one chunk (0 when not even one row does)."""
    return temp_bytes(_BOUND_CHUNK_BYTES) // max(1, 48 * orders * heads * t)


def _window_constants(batch: AttentionBatch):
    """(mu, c_lo, c_hi) per kv head, measured on the window itself (method §8)."""
    return window_constants(batch.stats)

