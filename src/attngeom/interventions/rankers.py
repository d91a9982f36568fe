"""Head rankers: orders of heads from first-to-remove to last (SPEC 6).

SPEC 6 compares the geometric taxonomy (SPEC 4) as a pruning order with the
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

Ties go to the smaller (layer, head); NaN scores go last. Rankers that read data
take the *ranking* windows, which the sweep keeps disjoint from the evaluation
windows (SPEC 6).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from attngeom.capture import attention_output_projections, capture_attention, model_layout
from attngeom.errors import ConfigError, ModelError
from attngeom.interventions.gates import window_gates
from attngeom.interventions.perplexity import (
    check_batch_size,
    check_windows,
    head_removal_nll,
    window_nll,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALL_ORDERS",
    "DEFAULT_ORDER",
    "NO_ORDER",
    "NO_SEED",
    "RANKERS",
    "REGIMES",
    "HeadRanking",
    "check_ranker",
    "check_taxonomy_table",
    "entropy_ranking",
    "gradient_importance",
    "gradient_ranking",
    "magnitude_ranking",
    "order_name",
    "parse_order",
    "rank_heads",
    "random_ranking",
    "sensitivity_ranking",
    "taxonomy_ranking",
]

RANKERS = ("taxonomy", "magnitude", "entropy", "random", "gradient", "sensitivity")
REGIMES = ("Mixer", "Reset", "Retriever")
DEFAULT_ORDER = ("Mixer", "Reset", "Retriever")
ALL_ORDERS = tuple(itertools.permutations(REGIMES))
NO_ORDER = "-"  # the ``order`` column of rankers that have no regime order
NO_SEED = -1  # the ``seed`` column of rankers that use no randomness
TAXONOMY_COLUMNS = ("layer", "head", "regime", "mean_output_norm")


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

    Raises ConfigError unless it is a permutation of :data:`REGIMES`.
    """
    items = tuple(order.split(">")) if isinstance(order, str) else tuple(order)
    if sorted(items) != sorted(REGIMES):
        raise ConfigError(f"order: expected a permutation of {REGIMES}, got {order!r}")
    return items  # type: ignore[return-value]


def check_taxonomy_table(table: Any, num_layers: int, num_heads: int) -> None:
    """Raise ConfigError unless ``table`` has one row per head of an (L, H) model."""
    import pandas as pd

    if not isinstance(table, pd.DataFrame):
        raise ConfigError(f"taxonomy: expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in TAXONOMY_COLUMNS if c not in table.columns]
    if missing:
        raise ConfigError(f"taxonomy: expected columns {list(TAXONOMY_COLUMNS)}, missing {missing}")
    pairs = list(zip(table["layer"].astype(int), table["head"].astype(int), strict=True))
    expected = {(l, h) for l in range(num_layers) for h in range(num_heads)}
    if len(pairs) != len(set(pairs)) or set(pairs) != expected:
        raise ConfigError(
            f"taxonomy: expected one row per head of {num_layers} layers x {num_heads} heads, "
            f"got {len(pairs)} rows covering {len(set(pairs) & expected)} of {len(expected)} heads"
        )
    bad = sorted(set(table["regime"]) - set(REGIMES) - {"none"})
    if bad:
        raise ConfigError(f"taxonomy: expected regimes {REGIMES} or 'none', got {bad}")


def taxonomy_ranking(
    table: pd.DataFrame,
    *,
    order: Sequence[str] | str = DEFAULT_ORDER,
    num_layers: int | None = None,
    num_heads: int | None = None,
) -> HeadRanking:
    """Order heads by regime (in ``order``), then ascending mean output norm (SPEC 6).

    Args:
        table: per-head taxonomy rows (SPEC 4, ``taxonomy.parquet``) with columns
            ``layer, head, regime, mean_output_norm``; one row per head.
        order: the regime class order, first-removed first; a permutation of
            ("Mixer", "Reset", "Retriever"). Regime ``none`` always comes last.
        num_layers, num_heads: the model's shape; default: read off the table.

    Returns:
        A :class:`HeadRanking` with ``scores`` = mean output norm and ``order`` set.

    Example:
        >>> taxonomy_ranking(tax, order=("Reset", "Mixer", "Retriever")).heads[:3]  # doctest: +SKIP
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


# --------------------------------------------------------------------------- magnitude

# Leaf module names of value projections, separate or fused, by layout of their output.
_SEPARATE_V = ("v_proj", "value", "v_lin", "v")
_FUSED_BLOCKS = ("c_attn", "qkv_proj", "Wqkv")  # output [q (H*d) | k (G*d) | v (G*d)]
_FUSED_PER_HEAD = ("query_key_value",)  # GPT-NeoX / Bloom: output (H, [q | k | v] d)


def _weight_matrix(module: nn.Module, in_features: int) -> Tensor:
    """The (out, in) matrix of a linear map: Linear, GPT-2 Conv1D, or probed with an identity."""
    if isinstance(module, nn.Linear):
        return module.weight.detach()
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, Tensor) and weight.dim() == 2:
        return weight.detach().t()  # Conv1D stores (in, out)
    param = next(module.parameters())
    with torch.no_grad():
        eye = torch.eye(in_features, dtype=param.dtype, device=param.device)
        zero = torch.zeros(1, in_features, dtype=param.dtype, device=param.device)
        return (module(eye) - module(zero)).t()


def _find_value_projection(model: nn.Module, projection: nn.Module) -> tuple[str, nn.Module]:
    """The value projection serving the same attention block as ``projection``.

    Walks up from the output projection's qualified name and searches each
    enclosing module (nearest first) for a known value-projection leaf name, so
    Llama-style ``self_attn.v_proj``, BERT's ``attention.self.value`` (a sibling
    of ``attention.output.dense``) and fused GPT-2 / GPT-NeoX blocks all resolve.
    """
    names = {id(m): n for n, m in model.named_modules()}
    qualified = names.get(id(projection))
    if qualified is None:
        raise ModelError("magnitude: the output projection is not a submodule of the model")
    parts = qualified.split(".")
    wanted = _SEPARATE_V + _FUSED_BLOCKS + _FUSED_PER_HEAD
    for depth in range(len(parts) - 1, 0, -1):
        parent = model.get_submodule(".".join(parts[:depth]))
        for name in wanted:
            for sub_name, sub in parent.named_modules():
                if sub_name.split(".")[-1] == name and sub is not projection:
                    return name, sub
    raise ModelError(
        f"magnitude: no value projection ({', '.join(wanted)}) found near {qualified} "
        f"in {type(model).__name__}"
    )


def _value_rows(model: nn.Module, layer: int, projection: nn.Module, hidden: int) -> Tensor:
    """(G, d, hidden) value-projection rows of each kv head of one layer."""
    layout = model_layout(model)
    h, g, d = layout.num_heads, layout.num_kv_heads, layout.head_dim
    name, module = _find_value_projection(model, projection)
    w = _weight_matrix(module, hidden).to(torch.float64)
    if name in _SEPARATE_V:
        kv, expected = g, g * d
    elif name in _FUSED_BLOCKS:
        kv, expected = g, h * d + 2 * g * d
    else:
        kv, expected = h, 3 * h * d
    if w.shape[0] != expected:
        raise ModelError(
            f"magnitude: expected {name} in layer {layer} of {layout.model_class} to have "
            f"{expected} outputs, got {w.shape[0]}"
        )
    if name in _FUSED_BLOCKS:
        w = w[h * d + g * d :]
    elif name in _FUSED_PER_HEAD:
        w = w.view(h, 3, d, -1)[:, 2]
    return w.reshape(kv, d, -1)


def magnitude_ranking(model: nn.Module) -> HeadRanking:
    """Order heads by ascending ``||W_V[g]||_F * ||W_O[:, h]||_F`` (SPEC 6).

    ``W_V[g]`` are the value-projection rows of the kv head g that serves query
    head h (h // (H / G)); ``W_O[:, h]`` the output-projection columns fed by head
    h. Read from the weights (biases ignored): no data needed.

    Example:
        >>> magnitude_ranking(model).heads[0]  # doctest: +SKIP
    """
    layout = model_layout(model)
    h, d = layout.num_heads, layout.head_dim
    scores = torch.empty(layout.num_layers, h, dtype=torch.float64)
    for layer, projection in enumerate(attention_output_projections(model)):
        w_o = _weight_matrix(projection, h * d).to(torch.float64)  # (hidden, H*d)
        if w_o.shape[1] != h * d:
            raise ModelError(
                f"magnitude: expected the output projection of layer {layer} to take "
                f"{h * d} inputs, got {w_o.shape[1]}"
            )
        o_norm = w_o.view(w_o.shape[0], h, d).pow(2).sum(dim=(0, 2)).sqrt()  # (H,)
        v_rows = _value_rows(model, layer, projection, w_o.shape[0])
        v_norm = v_rows.pow(2).sum(dim=(1, 2)).sqrt()  # (G,) or (H,)
        group = h // v_norm.shape[0]
        scores[layer] = v_norm.repeat_interleave(group) * o_norm
    return HeadRanking("magnitude", _by_score(scores, descending=False), scores)


# --------------------------------------------------------------------------- data rankers


def _check_rank_ids(model: nn.Module, rank_ids: Tensor | None, ranker: str) -> Tensor:
    if rank_ids is None:
        raise ConfigError(f"rank_ids: the {ranker} ranker needs ranking windows (N, T), got None")
    return check_windows(model, rank_ids, what="rank_ids")


def entropy_ranking(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> HeadRanking:
    """Order heads by descending mean attention entropy over the ranking windows (SPEC 6).

    Entropy of a row is ``-sum_j alpha[t, j] ln alpha[t, j]`` (nats) over the visible
    keys, averaged over every query row of every window; diffuse heads go first.

    Args:
        rank_ids: (N, T) ranking windows.
    """
    if not isinstance(rank_ids, Tensor) or rank_ids.dim() != 2:
        raise ConfigError(f"rank_ids: expected token ids of shape (N, T), got {rank_ids!r}")
    batch_size = check_batch_size(batch_size)
    layout = model_layout(model)
    total = torch.zeros(layout.num_layers, layout.num_heads, dtype=torch.float64)
    rows = torch.zeros(layout.num_layers, dtype=torch.float64)

    def consumer(capture: Any) -> None:
        alpha = capture.alpha.to(torch.float64)
        visible = capture.visible.expand_as(alpha)
        plogp = torch.where(visible & (alpha > 0), alpha * alpha.clamp_min(1e-300).log(), 0.0)
        total[capture.layer] -= plogp.sum(dim=(0, 2, 3)).cpu()
        rows[capture.layer] += alpha.shape[0] * alpha.shape[2]

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # dropout would perturb the probabilities being ranked
    try:
        with torch.no_grad(), capture_attention(model, consumer):
            for start in range(0, rank_ids.shape[0], batch_size):
                model(input_ids=rank_ids[start : start + batch_size].to(device))
    finally:
        model.train(was_training)
    scores = total / rows[:, None]
    return HeadRanking("entropy", _by_score(scores, descending=True), scores)


def random_ranking(model: nn.Module, *, seed: int = 0) -> HeadRanking:
    """A uniformly random order of heads, reproducible from ``seed`` (SPEC 6 control).

    ``scores`` are the uniform draws the order sorts by (ascending).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"seed: expected an integer, got {seed!r}")
    layout = model_layout(model)
    gen = torch.Generator().manual_seed(int(seed))
    scores = torch.rand(layout.num_layers, layout.num_heads, generator=gen, dtype=torch.float64)
    return HeadRanking("random", _by_score(scores, descending=False), scores, seed=int(seed))


def gradient_importance(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> Tensor:
    """(L, H) mean over windows x of ``|dL(x) / d gate_h|`` at gates of one.

    ``L(x)`` is window x's mean next-token NLL. Each window gets its own gates
    (:func:`window_gates`), so one backward pass per batch yields every window's
    gradient; ``torch.autograd.grad`` leaves the parameters' ``.grad`` untouched.
    """
    rank_ids = check_windows(model, rank_ids, what="rank_ids")
    batch_size = check_batch_size(batch_size)
    layout = model_layout(model)
    total = torch.zeros(layout.num_layers, layout.num_heads, dtype=torch.float64)
    per_window = rank_ids.shape[1] - 1
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            for start in range(0, rank_ids.shape[0], batch_size):
                batch = rank_ids[start : start + batch_size]
                with window_gates(model, batch.shape[0]) as gates:
                    loss = (window_nll(model, batch) / per_window).sum()
                    (grad,) = torch.autograd.grad(loss, gates)
                total += grad.abs().to(torch.float64).sum(dim=0)
    finally:
        model.train(was_training)
    return total / rank_ids.shape[0]


def gradient_ranking(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> HeadRanking:
    """Order heads by ascending gradient importance ``|dL/d gate_h|`` (Michel et al. 2019).

    The expected-sensitivity baseline of SPEC 6; scores from :func:`gradient_importance`.
    """
    scores = gradient_importance(model, rank_ids, batch_size=batch_size)
    return HeadRanking("gradient", _by_score(scores, descending=False), scores)


def sensitivity_ranking(model: nn.Module, rank_ids: Tensor, *, batch_size: int = 8) -> HeadRanking:
    """Order heads by ascending single-head removal relative delta-NLL (SPEC 6 oracle).

    ``scores[l, h] = (nll without head (l, h) - nll) / nll`` on the ranking windows;
    costs L * H + 1 passes over them.
    """
    base, nll = head_removal_nll(model, rank_ids, batch_size=batch_size)
    scores = (nll - base.nll) / base.nll
    return HeadRanking("sensitivity", _by_score(scores, descending=False), scores)


def check_ranker(name: str) -> str:
    """Return ``name`` if it is a ranker, else raise ConfigError listing the valid ones."""
    if name not in RANKERS:
        raise ConfigError(f"ranker: expected one of {', '.join(RANKERS)}, got {name!r}")
    return name


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
    """Run the ranker called ``name`` (one of :data:`RANKERS`) on ``model`` (SPEC 6).

    ``rank_ids`` are needed by entropy, gradient and sensitivity; ``taxonomy`` and
    ``order`` by taxonomy; ``seed`` by random.

    Raises:
        ConfigError: for an unknown name (listing the valid ones) or a missing input.
    """
    check_ranker(name)
    if name == "taxonomy":
        if taxonomy is None:
            raise ConfigError("taxonomy: the taxonomy ranker needs the per-head table, got None")
        layout = model_layout(model)
        return taxonomy_ranking(
            taxonomy, order=order, num_layers=layout.num_layers, num_heads=layout.num_heads
        )
    if name == "magnitude":
        return magnitude_ranking(model)
    if name == "random":
        return random_ranking(model, seed=seed)
    if name == "entropy":
        if rank_ids is None:
            raise ConfigError("rank_ids: the entropy ranker needs ranking windows (N, T), got None")
        return entropy_ranking(model, rank_ids, batch_size=batch_size)
    rank_ids = _check_rank_ids(model, rank_ids, name)
    if name == "gradient":
        return gradient_ranking(model, rank_ids, batch_size=batch_size)
    return sensitivity_ranking(model, rank_ids, batch_size=batch_size)
