"""Which keys a competition probe keeps: a top-N ranking, or the positional control.

The probes of issue 31 evaluate the model with only N keys per query row. Two kinds of
selection:

- a **ranking** (``"attention"``, ``"contribution"``): the top-N restriction of
  ``attngeom.interventions.restrict_topn`` (method §9), deletion (the dropped mass is
  lost) or renormalisation;
- the **positional control** (``"positional"``, follow-up App. E.5): the initial token
  and the N - 1 most recent visible keys, whatever their scores. It runs on the same
  registered attention function (``attngeom.capture.override_attention``) as the
  restriction, through the family's own eager probabilities, and a row with at most N
  visible keys is left exactly as it was.

``restriction(model, n, ranking=..., renormalize=...)`` is the one entry point.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from attngeom.capture import AttentionCall, has_override, override_attention, repeat_kv
from attngeom.errors import ConfigError
from attngeom.interventions.eviction import latest
from attngeom.names import RANKINGS


@dataclass(frozen=True)
class Selection:
    """One way of keeping N keys: a ranking and deletion or renormalisation."""

    ranking: str = "attention"
    renormalize: bool = False

    @property
    def mode(self) -> str:
        return "renormalisation" if self.renormalize else "deletion"

    @property
    def label(self) -> str:
        return f"{self.ranking}/{self.mode}"


def positional_keep(visible: torch.Tensor, n: int) -> torch.Tensor:
    """Boolean (..., T): position 0 and the n - 1 latest visible keys of each row.

    ``visible`` (..., T) bool. A row with at most n visible keys keeps them all; the
    initial token is kept only where it is visible (a sliding window may hide it). On
    a causal mask this is StreamingLLM's ``window`` policy with one sink
    (``policies.window_keep``), which takes the first *visible* key instead.

    >>> positional_keep(torch.tensor([[True, True, True, True, True, False]]), 3).tolist()
    [[True, False, False, True, True, False]]
    """
    first = torch.zeros_like(visible)
    first[..., 0] = True
    keep = latest(visible, n - 1) | (visible & first)
    few = (visible.sum(-1, keepdim=True) <= n)
    return torch.where(few, visible, keep)


@contextlib.contextmanager
def positional_restriction(model: torch.nn.Module, n: int, *, renormalize: bool = False,
                           observe=None) -> Iterator[None]:
    """Every head of every layer attends only to the initial token and the n - 1 latest keys.

    Deletion (``renormalize=False``) zeroes the other probabilities; renormalisation
    divides the kept ones by their sum. ``observe``: a ``restriction.KeptRow`` that sees
    the keys kept at one query row of every layer. On exit the model is as before.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"expected n to be an integer >= 1, got {n!r}")
    if has_override(model):
        raise ConfigError("positional_restriction: expected no attngeom override open on "
                          "the model; open the restriction first and capture inside it")

    def handler(call: AttentionCall):
        _, _, probs = call.eager_float32()
        visible = call.visible().expand_as(probs)
        keep = positional_keep(visible, n)
        if observe is not None:
            observe.report(call.layer, keep, visible, None, probs.shape)
        if bool((keep == visible).all()):
            return call.previous()
        kept = torch.where(keep, probs, torch.zeros_like(probs))
        if renormalize:
            total = kept.sum(-1, keepdim=True)
            kept = torch.where(total > 0, kept / total.clamp_min(torch.finfo(kept.dtype).tiny),
                               kept)
        base, _ = call.previous()
        values = repeat_kv(call.value, probs.shape[1] // call.value.shape[1])
        out = torch.matmul(kept.to(values.dtype), values).transpose(1, 2)
        return out.to(base.dtype).contiguous(), kept

    with override_attention(model, handler):
        yield


def check_ranking(ranking: str) -> str:
    """``ranking`` if it is a registered restriction ranking (``names.RANKINGS``)."""
    return RANKINGS.check(ranking, "ranking")


@contextlib.contextmanager
def restriction(model: torch.nn.Module, n: int, *, ranking: str = "attention",
                renormalize: bool = False, seed: int = 0,
                windows: Sequence[int] | object | None = None,
                final_only: bool | None = None, observe=None) -> Iterator[None]:
    """Open the selection ``ranking`` keeps at size ``n`` (see the module docstring);
    ``seed`` and ``windows`` (the batch rows' indices, or a ``restriction.WindowIds``)
    order the random ranking. ``final_only``: restrict only each prompt's final query
    row (default: for the prefill-only policies, SnapKV and K-norm, which compress a
    prompt once for its answer query; every row otherwise). ``observe``: a
    ``restriction.KeptRow`` that sees the keys kept at one query row of every restricted
    layer (the qa probe's support recall)."""
    check_ranking(ranking)
    if final_only is None:
        final_only = bool((RANKINGS.meta(ranking) or {}).get("prefill_only"))
    if ranking == "positional":
        with positional_restriction(model, n, renormalize=renormalize, observe=observe):
            yield
        return
    from attngeom.interventions.restriction import restrict_topn

    with restrict_topn(model, n, renormalize=renormalize, ranking=ranking, seed=seed,
                       windows=windows, final_only=final_only, observe=observe):
        yield
