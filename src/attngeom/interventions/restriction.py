"""Top-N attention restriction, a geometry-aware sparsification (method §9).

Inside ``restrict_topn(model, n, ...)`` each selected head keeps only the n
largest visible attention probabilities of every query row (ties to the
smaller position, as every method §4 rule), optionally renormalised to sum to one,
and its output is recomputed from the modified probabilities. It runs on the
same registered attention function as capture (``attngeom.capture
.override_attention``): the probabilities come from the model family's own
eager function, so scaling, softcapping, windows and GQA are the model's;
unselected layers keep the model's own implementation. On exit the model is
bit-identical to before (STYLE habit 6).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from attngeom.capture import (
    AttentionCall,
    has_override,
    model_layout,
    override_attention,
    repeat_kv,
)
from attngeom.errors import ConfigError


def topn_keep(probs: torch.Tensor, visible: torch.Tensor, n: int) -> torch.Tensor:
    """Boolean (…, T) mask of the n largest visible entries of each row.

    Ties go to the smaller position, as a stable descending sort orders them: every
    entry above the n-th largest value is kept, and of the entries equal to it the
    first ones in position order fill the rest. One ``topk`` per row finds the n-th
    value (a full sort of every row cost a quarter of a restricted forward); only rows
    where equal values straddle the n-th place pay for a cumulative count. Invisible
    keys are never kept; a row with at most n visible keys keeps all of them.
    """
    visible = visible.expand_as(probs)
    if n >= probs.shape[-1]:
        return visible.clone()
    score = torch.where(visible, probs, torch.full_like(probs, -1.0))
    kth = score.topk(n, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    few = (visible.sum(-1) <= n)[..., None]
    keep = torch.where(few, visible, score >= kth)
    crowded = keep.sum(-1) > n
    if bool(crowded.any()):
        s, k = score[crowded], kth[crowded]
        tie = s == k
        room = n - (s > k).sum(-1, keepdim=True)
        keep[crowded] = (s > k) | (tie & (tie.cumsum(-1) <= room))
    return keep & visible


def restrict_probabilities(
    probs: torch.Tensor, visible: torch.Tensor, n: int, renormalize: bool
) -> torch.Tensor:
    """Zero all but the top-n visible probabilities per row; optionally renormalise.

    ``probs`` (B, H, Q, T), ``visible`` broadcastable to it. Rows where nothing
    was dropped are returned unchanged (so n >= |U_t| is exactly the identity on
    the probabilities); a row with no visible key stays as it was.
    """
    keep = topn_keep(probs, visible, n)
    dropped = (visible.expand_as(probs) & ~keep).any(-1, keepdim=True)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    if renormalize:
        total = kept.sum(-1, keepdim=True)
        kept = torch.where(total > 0, kept / total.clamp_min(torch.finfo(probs.dtype).tiny), kept)
    return torch.where(dropped, kept, probs)


def _check_int(value: object, what: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected {what} to be an integer, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ConfigError(f"expected {what} {bound}, got {value}")
    return value


def _selection(
    model: torch.nn.Module,
    layers: Iterable[int] | None,
    heads: Iterable[tuple[int, int]] | None,
) -> dict[int, list[int] | None]:
    """layer -> selected heads (``None``: all heads of the layer)."""
    layout = model_layout(model)
    chosen_layers = None
    if layers is not None:
        chosen_layers = sorted(
            {_check_int(i, "layer", 0, layout.num_layers) for i in layers}
        )
        if not chosen_layers:
            raise ConfigError("expected layers to be None or a non-empty list, got []")
    if heads is None:
        targets = range(layout.num_layers) if chosen_layers is None else chosen_layers
        return {layer: None for layer in targets}
    selected: dict[int, list[int]] = {}
    for item in heads:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError(f"expected heads as (layer, head) pairs, got {item!r}")
        layer = _check_int(item[0], "head layer", 0, layout.num_layers)
        head = _check_int(item[1], "head index", 0, layout.num_heads)
        if chosen_layers is not None and layer not in chosen_layers:
            raise ConfigError(
                f"expected every head's layer in layers={chosen_layers}, got ({layer}, {head})"
            )
        selected.setdefault(layer, [])
        if head not in selected[layer]:
            selected[layer].append(head)
    if not selected:
        raise ConfigError("expected heads to be None or a non-empty list, got []")
    return {layer: sorted(h) for layer, h in sorted(selected.items())}


@contextlib.contextmanager
def restrict_topn(
    model: torch.nn.Module,
    n: int,
    *,
    layers: Iterable[int] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
    renormalize: bool = True,
) -> Iterator[None]:
    """Keep only the top-``n`` attention entries per query row in the selected heads.

    ``layers``: layer indices (``None``: all); ``heads``: ``(layer, head)``
    pairs (``None``: all heads of the selected layers). ``renormalize``: rescale
    the kept probabilities to sum to one (otherwise the dropped mass is lost).
    Bad arguments raise ``ConfigError`` before any forward.

    >>> with torch.no_grad(), restrict_topn(model, 1, layers=[0, 1]):
    ...     nll = model(ids, labels=ids).loss
    >>> float(nll) > float(model(ids, labels=ids).loss.detach())
    True
    """
    n = _check_int(n, "n", 1)
    if not isinstance(renormalize, bool):
        raise ConfigError(f"expected renormalize to be True or False, got {renormalize!r}")
    selection = _selection(model, layers, heads)
    if has_override(model):
        # an enclosing capture would never see the restricted layers' probabilities
        raise ConfigError(
            "restrict_topn: expected no attngeom override open on the model; open the "
            "restriction first and capture_attention inside it"
        )

    def handler(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        if call.layer not in selection:
            return call.previous()
        # top-N chosen on float32 probabilities: a bf16 model's rounded ones tie often
        _, _, probs = call.eager_float32()
        restricted = restrict_probabilities(probs, call.visible(), n, renormalize)
        chosen = selection[call.layer]
        head_mask = torch.zeros(probs.shape[1], dtype=torch.bool, device=probs.device)
        head_mask[slice(None) if chosen is None else chosen] = True
        # heads whose probabilities actually changed get the restricted output; every
        # other head keeps the model's own output bit for bit (N >= |U| is the identity)
        changed = head_mask & (restricted != probs).flatten(2).any(-1).any(0)
        if not bool(changed.any()):
            return call.previous()
        restricted = torch.where(changed[None, :, None, None], restricted, probs)
        base, _ = call.previous()
        groups = probs.shape[1] // call.value.shape[1]
        values = repeat_kv(call.value, groups)
        new = torch.matmul(restricted.to(values.dtype), values).transpose(1, 2)
        output = torch.where(changed[None, None, :, None], new.to(base.dtype), base)
        return output.contiguous(), restricted

    with override_attention(model, handler):
        yield
