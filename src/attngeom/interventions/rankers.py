"""Head rankers: orders of heads from first-to-remove to last (method §9), and their registry.

method §9 compares the geometric taxonomy (method §7) as a pruning order with the
usual baselines. Every ranker returns a :class:`HeadRanking`: all L * H heads,
first to remove first, and the per-head score the order came from.

- ``taxonomy``: by regime in a given class order (default Mixer, Reset,
  Retriever: a sink-dominated head mostly writes the sink's small value), then
  by ascending mean head-output norm; regime ``none`` (no valid query) last;
- ``magnitude``: ascending ``||W_V[g]||_F * ||W_O[:, h]||_F`` from the weights;
- ``entropy``: descending mean attention entropy (diffuse heads first);
- ``random``: a seeded uniform order (the control);
- ``gradient``: ascending ``|dL/d gate_h|`` averaged over windows (Michel et al. 2019);
- ``sensitivity``: ascending single-head removal delta-NLL (an oracle).

``RANKERS`` registers each one (``Ranker``): whether it reads the ranking windows,
whether it is seeded or ordered, its per-batch statistics (summed over the window
batches, so a run can stream, resume and shard them) and the ranking made from them.
Adding a ranker is one function and one ``register`` call here
(``docs/extending.md``). Ties go to the smaller (layer, head); NaN scores go last.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from attngeom.capture import capture_attention, head_weights, input_device, model_layout
from attngeom.errors import ConfigError
from attngeom.interventions.gates import window_gates
from attngeom.interventions.perplexity import check_windows, head_removal_sums, window_nll
from attngeom.names import NO_REGIME, RANKER_REGIMES, RANKERS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALL_ORDERS",
    "DEFAULT_ORDER",
    "NO_ORDER",
    "NO_SEED",
    "RANKERS",
    "HeadRanking",
    "Ranker",
    "add_stats",
    "check_taxonomy_table",
    "entropy_ranking",
    "gradient_importance",
    "gradient_ranking",
    "magnitude_ranking",
    "order_name",
    "parse_order",
    "rank_heads",
    "random_ranking",
    "ranking_stats",
    "sensitivity_ranking",
    "taxonomy_ranking",
]

DEFAULT_ORDER = RANKER_REGIMES
ALL_ORDERS = tuple(itertools.permutations(RANKER_REGIMES))
NO_ORDER = "-"  # the ``order`` column of rankers that have no regime order
NO_SEED = -1  # the ``seed`` column of rankers that use no randomness
READ_COLUMNS = ("layer", "head", "regime", "mean_output_norm")  # of the taxonomy table


@dataclass(frozen=True)
class HeadRanking:
    """All heads from first-to-remove to last, with the scores that ordered them.

    Attributes:
        ranker: one of :data:`RANKERS`.
        heads: ``(layer, head)`` pairs, first to remove first; a permutation of all heads.
        scores: (L, H) float64 per-head score (its meaning is the ranker's).
        seed: the random ranker's seed, :data:`NO_SEED` otherwise.
        order: the taxonomy regime order as ``"Mixer>Reset>Retriever"``, else :data:`NO_ORDER`.
    """

    ranker: str
    heads: tuple[tuple[int, int], ...]
    scores: Tensor
    seed: int = NO_SEED
    order: str = NO_ORDER

    def to_frame(self) -> pd.DataFrame:
        """The rankings table rows: ``ranker, seed, order, rank, layer, head, score``."""
        import pandas as pd

        return pd.DataFrame(
            {
                "ranker": self.ranker,
                "seed": self.seed,
                "order": self.order,
                "rank": np.arange(len(self.heads), dtype=np.int64),
                "layer": np.array([h[0] for h in self.heads], dtype=np.int64),
                "head": np.array([h[1] for h in self.heads], dtype=np.int64),
                "score": np.array([float(self.scores[h]) for h in self.heads], dtype=np.float64),
            }
        )


def _heads_in_order(keys: Sequence[np.ndarray], num_heads: int) -> tuple[tuple[int, int], ...]:
    """Heads sorted by ``keys`` (most significant first), ties to the smaller (layer, head)."""
    flat = np.arange(len(keys[0]))
    order = np.lexsort((flat, *reversed([np.asarray(k) for k in keys])))
    return tuple((int(i) // num_heads, int(i) % num_heads) for i in order)


def _by_score(scores: Tensor, *, descending: bool) -> tuple[tuple[int, int], ...]:
    values = scores.detach().to(torch.float64).cpu().numpy().ravel()
    nan = np.isnan(values)
    key = np.where(nan, 0.0, -values if descending else values)
    return _heads_in_order([nan, key], scores.shape[1])


# --------------------------------------------------------------------------- taxonomy


def order_name(order: Sequence[str]) -> str:
    """``("Mixer", "Reset", "Retriever")`` -> ``"Mixer>Reset>Retriever"`` (the order column)."""
    return ">".join(order)


def parse_order(order: Sequence[str] | str) -> tuple[str, str, str]:
    """A regime order as a tuple; accepts a sequence or ``"Mixer>Reset>Retriever"``.

    Raises ConfigError unless it is a permutation of ``names.RANKER_REGIMES``.
    """
    items = tuple(order.split(">")) if isinstance(order, str) else tuple(order)
    if sorted(items) != sorted(RANKER_REGIMES):
        raise ConfigError(f"order: expected a permutation of {RANKER_REGIMES}, got {order!r}")
    return items  # type: ignore[return-value]


def check_taxonomy_table(table: Any, num_layers: int, num_heads: int) -> None:
    """Raise ConfigError unless ``table`` has one row per head of an (L, H) model."""
    import pandas as pd

    if not isinstance(table, pd.DataFrame):
        raise ConfigError(f"taxonomy: expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in READ_COLUMNS if c not in table.columns]
    if missing:
        raise ConfigError(f"taxonomy: expected columns {list(READ_COLUMNS)}, missing {missing}")
    pairs = list(zip(table["layer"].astype(int), table["head"].astype(int), strict=True))
    expected = {(l, h) for l in range(num_layers) for h in range(num_heads)}
    if len(pairs) != len(set(pairs)) or set(pairs) != expected:
        raise ConfigError(
            f"taxonomy: expected one row per head of {num_layers} layers x {num_heads} heads, "
            f"got {len(pairs)} rows covering {len(set(pairs) & expected)} of {len(expected)} heads"
        )
    bad = sorted(set(table["regime"]) - set(RANKER_REGIMES) - {NO_REGIME})
    if bad:
        raise ConfigError(f"taxonomy: expected regimes {RANKER_REGIMES} or 'none', got {bad}")


def taxonomy_ranking(
    table: pd.DataFrame,
    *,
    order: Sequence[str] | str = DEFAULT_ORDER,
    num_layers: int | None = None,
    num_heads: int | None = None,
) -> HeadRanking:
    """Order heads by regime (in ``order``), then ascending mean output norm (method §9).

    Args:
        table: per-head taxonomy rows (method §7, ``taxonomy.parquet``) with columns
            ``layer, head, regime, mean_output_norm``; one row per head.
        order: the regime class order, first-removed first; a permutation of
            ("Mixer", "Reset", "Retriever"). Regime ``none`` always comes last.
        num_layers, num_heads: the model's shape; default: read off the table.

    Returns:
        A :class:`HeadRanking` with ``scores`` = mean output norm and ``order`` set.

    Example: ``taxonomy_ranking(tax, order=("Reset", "Mixer", "Retriever")).heads[:3]``
    are the three Reset heads with the smallest outputs.
    """
    order = parse_order(order)
    if num_layers is None or num_heads is None:
        if not len(table):
            raise ConfigError("taxonomy: expected one row per head, got an empty table")
        num_layers = int(table["layer"].max()) + 1 if num_layers is None else num_layers
        num_heads = int(table["head"].max()) + 1 if num_heads is None else num_heads
    check_taxonomy_table(table, num_layers, num_heads)
    rank_of = {regime: i for i, regime in enumerate(order)} | {"none": len(order)}
    layers = table["layer"].to_numpy(dtype=np.int64)
    heads = table["head"].to_numpy(dtype=np.int64)
    flat = layers * num_heads + heads
    regime_rank = np.empty(num_layers * num_heads, dtype=np.int64)
    norms = np.empty(num_layers * num_heads, dtype=np.float64)
    regime_rank[flat] = [rank_of[r] for r in table["regime"]]
    norms[flat] = table["mean_output_norm"].to_numpy(dtype=np.float64)
    nan = np.isnan(norms)
    ordered = _heads_in_order([regime_rank, nan, np.where(nan, 0.0, norms)], num_heads)
    scores = torch.from_numpy(norms.reshape(num_layers, num_heads).copy())
    return HeadRanking("taxonomy", ordered, scores, order=order_name(order))


# --------------------------------------------------------------------------- weights only


def magnitude_ranking(model: nn.Module) -> HeadRanking:
    """Order heads by ascending ``||W_V[g]||_F * ||W_O[:, h]||_F`` (method §9).

    ``W_V[g]`` are the value-projection rows of the kv head g that serves query
    head h (h // (H / G)); ``W_O[:, h]`` the output-projection columns fed by head
    h (``capture.head_weights``). Read from the weights (biases ignored): no data.
    """
    layout = model_layout(model)
    scores = torch.empty(layout.num_layers, layout.num_heads, dtype=torch.float64)
    for layer, (w_v, w_o) in enumerate(head_weights(model)):
        o_norm = w_o.pow(2).sum(dim=(0, 2)).sqrt()  # (H,)
        v_norm = w_v.pow(2).sum(dim=(1, 2)).sqrt()  # (G,) or (H,)
        group = layout.num_heads // v_norm.shape[0]
        scores[layer] = v_norm.repeat_interleave(group) * o_norm
    return HeadRanking("magnitude", _by_score(scores, descending=False), scores)


def random_ranking(model: nn.Module, *, seed: int = 0) -> HeadRanking:
    """A uniformly random order of heads, reproducible from ``seed`` (method §9 control).

    ``scores`` are the uniform draws the order sorts by (ascending).
    """
    layout = model_layout(model)
    gen = torch.Generator().manual_seed(int(seed))
    scores = torch.rand(layout.num_layers, layout.num_heads, generator=gen, dtype=torch.float64)
    return HeadRanking("random", _by_score(scores, descending=False), scores, seed=int(seed))


# --------------------------------------------------------------------------- data: per batch
# Each returns sums over the batch's windows; ``add_stats`` adds batches in order.


def entropy_stats(model: nn.Module, batch: Tensor) -> dict[str, Tensor]:
    """Summed attention entropy of every query row (nats), per (layer, head), and rows."""
    layout = model_layout(model)
    total = torch.zeros(layout.num_layers, layout.num_heads, dtype=torch.float64)
    rows = torch.zeros(layout.num_layers, dtype=torch.float64)

    def consumer(capture: Any) -> None:
        alpha = capture.alpha.to(torch.float64)
        visible = capture.visible.expand_as(alpha)
        plogp = torch.where(visible & (alpha > 0), alpha * alpha.clamp_min(1e-300).log(), 0.0)
        total[capture.layer] -= plogp.sum(dim=(0, 2, 3)).cpu()
        rows[capture.layer] += alpha.shape[0] * alpha.shape[2]

    device = input_device(model)
    with torch.no_grad(), capture_attention(model, consumer):
        model(input_ids=batch.to(device))
    return {"entropy": total, "rows": rows}


def gradient_stats(model: nn.Module, batch: Tensor) -> dict[str, Tensor]:
    """Summed ``|dL(x) / d gate_h|`` over the batch's windows x at gates of one.

    ``L(x)`` is window x's mean next-token NLL; each window gets its own gates
    (:func:`window_gates`), so one backward pass gives every window's gradient;
    ``torch.autograd.grad`` leaves the parameters' ``.grad`` untouched.
    """
    per_window = batch.shape[1] - 1
    with torch.enable_grad(), window_gates(model, batch.shape[0]) as gates:
        loss = (window_nll(model, batch) / per_window).sum()
        (grad,) = torch.autograd.grad(loss, gates)
    return {"gradient": grad.abs().to(torch.float64).sum(dim=0),
            "windows": torch.tensor(float(batch.shape[0]), dtype=torch.float64)}


def sensitivity_stats(model: nn.Module, batch: Tensor) -> dict[str, Tensor]:
    """Summed NLL with all heads and with each head removed alone, and the token count."""
    base, removed = head_removal_sums(model, batch)
    return {"base": torch.tensor(base, dtype=torch.float64), "removed": removed,
            "tokens": torch.tensor(float(batch.shape[0] * (batch.shape[1] - 1)),
                                   dtype=torch.float64)}


def add_stats(total: dict[str, Tensor] | None, part: dict[str, Tensor]) -> dict[str, Tensor]:
    """Add one batch's statistics to the running sums (in batch order)."""
    if total is None:
        return {k: v.clone() for k, v in part.items()}
    return {k: total[k] + part[k] for k in total}


def _entropy_rank(model, *, stats, **_):
    scores = stats["entropy"] / stats["rows"][:, None]
    return HeadRanking("entropy", _by_score(scores, descending=True), scores)


def _gradient_rank(model, *, stats, **_):
    scores = stats["gradient"] / stats["windows"]
    return HeadRanking("gradient", _by_score(scores, descending=False), scores)


def _sensitivity_rank(model, *, stats, **_):
    # the same divisions as the scan: NLL per token first, then the relative change
    base = float(stats["base"]) / float(stats["tokens"])
    nll = stats["removed"] / float(stats["tokens"])
    scores = (nll - base) / base
    return HeadRanking("sensitivity", _by_score(scores, descending=False), scores)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Ranker:
    """One head ranker.

    ``batch_stats(model, batch)`` (rankers that read the ranking windows) returns
    per-batch sums; ``rank(model, stats=..., seed=..., order=..., taxonomy=...)`` makes
    the ranking, reading only what it needs. ``seeded`` rankers give one ranking per
    seed, ``ordered`` ones one per regime order; ``needs_taxonomy`` ones read the
    taxonomy table of the ranking windows.
    """

    name: str
    rank: Callable[..., HeadRanking]
    batch_stats: Callable[[nn.Module, Tensor], dict[str, Tensor]] | None = None
    seeded: bool = False
    ordered: bool = False
    needs_taxonomy: bool = False
    needs_loss: bool = False  # reads next-token NLL: a causal LM only

    def make(self, model: nn.Module, *, stats=None, taxonomy=None, seed: int = 0,
             order: Sequence[str] | str = DEFAULT_ORDER) -> HeadRanking:
        """The ranking from what this ranker reads (the rest is ignored)."""
        if self.needs_taxonomy and taxonomy is None:
            raise ConfigError(f"taxonomy: the {self.name} ranker needs the per-head table, "
                              "got None")
        if self.batch_stats is not None and stats is None:
            raise ConfigError(f"rank_ids: the {self.name} ranker needs ranking windows (N, T), "
                              "got None")
        return self.rank(model, stats=stats, seed=seed, order=parse_order(order),
                         taxonomy=taxonomy)


def register(ranker: Ranker) -> Ranker:
    return RANKERS.register(ranker.name, ranker)


def _taxonomy_rank(model, *, taxonomy, order=DEFAULT_ORDER, **_):
    layout = model_layout(model)
    return taxonomy_ranking(taxonomy, order=order, num_layers=layout.num_layers,
                            num_heads=layout.num_heads)


register(Ranker("taxonomy", _taxonomy_rank, ordered=True, needs_taxonomy=True))
register(Ranker("magnitude", lambda model, **_: magnitude_ranking(model)))
register(Ranker("entropy", _entropy_rank, batch_stats=entropy_stats))
register(Ranker("random", lambda model, seed=0, **_: random_ranking(model, seed=seed),
                seeded=True))
register(Ranker("gradient", _gradient_rank, batch_stats=gradient_stats, needs_loss=True))
register(Ranker("sensitivity", _sensitivity_rank, batch_stats=sensitivity_stats,
                needs_loss=True))


def ranker(name: str) -> Ranker:
    """The registered ranker ``name`` (a did-you-mean ``ConfigError`` otherwise)."""
    return RANKERS[name]


def ranking_stats(name: str, model: nn.Module, rank_ids: Tensor, *,
                  batch_size: int = 8) -> dict[str, Tensor]:
    """The summed statistics of a data ranker over ``rank_ids`` (N, T), batch by batch."""
    spec = ranker(name)
    if spec.needs_loss:
        rank_ids = check_windows(model, rank_ids, what="rank_ids")
    total = None
    was_training = model.training
    model.eval()  # dropout would perturb what is being ranked
    try:
        for start in range(0, rank_ids.shape[0], batch_size):
            total = add_stats(total, spec.batch_stats(model, rank_ids[start : start + batch_size]))
    finally:
        model.train(was_training)
    return total


def entropy_ranking(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> HeadRanking:
    """Order heads by descending mean attention entropy over the ranking windows (method §9).

    Entropy of a row is ``-sum_j alpha[t, j] ln alpha[t, j]`` (nats) over the visible
    keys, averaged over every query row of every window; diffuse heads go first.
    """
    return _entropy_rank(model, stats=ranking_stats("entropy", model, rank_ids,
                                                    batch_size=batch_size))


def gradient_importance(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> Tensor:
    """(L, H) mean over windows x of ``|dL(x) / d gate_h|`` at gates of one."""
    stats = ranking_stats("gradient", model, rank_ids, batch_size=batch_size)
    return stats["gradient"] / stats["windows"]


def gradient_ranking(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> HeadRanking:
    """Order heads by ascending gradient importance ``|dL/d gate_h|`` (Michel et al. 2019)."""
    return _gradient_rank(model, stats=ranking_stats("gradient", model, rank_ids,
                                                     batch_size=batch_size))


def sensitivity_ranking(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> HeadRanking:
    """Order heads by ascending single-head removal relative delta-NLL (method §9 oracle).

    ``scores[l, h] = (nll without head (l, h) - nll) / nll`` on the ranking windows;
    costs L * H + 1 passes over them.
    """
    return _sensitivity_rank(model, stats=ranking_stats("sensitivity", model, rank_ids,
                                                        batch_size=batch_size))


def rank_heads(
    name: str,
    model: nn.Module,
    rank_ids: Tensor | None = None,
    *,
    seed: int = 0,
    taxonomy: pd.DataFrame | None = None,
    order: Sequence[str] | str = DEFAULT_ORDER,
    batch_size: int = 8,
) -> HeadRanking:
    """Run the ranker called ``name`` (one of ``RANKERS``) on ``model`` (method §9).

    ``rank_ids`` are read by the rankers with per-batch statistics (entropy, gradient,
    sensitivity); ``taxonomy`` and ``order`` by taxonomy; ``seed`` by random.
    """
    spec = ranker(name)
    stats = None
    if spec.batch_stats is not None and rank_ids is not None:
        stats = ranking_stats(name, model, rank_ids, batch_size=batch_size)
    return spec.make(model, stats=stats, seed=seed, order=order, taxonomy=taxonomy)
