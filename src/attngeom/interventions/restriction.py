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

The kept keys are the n of highest *score* (the follow-up, arXiv 2609.37879): the
attention probability (``attention``), the contribution alpha_i ||v_i|| (per query head,
before W_O, with the GQA-aligned value of that head's kv head: ``contribution``), or a
seeded random order (``random``: one permutation per (seed, window, layer, head, query),
the keys ordered by a counter-based hash of (seed, window, layer, head, t, key), so the
kept sets are nested in n and reproducible whatever the batch; ties, about one row in
ten thousand at T = 1024, go to the smaller position). Selection is recomputed at every
layer from the activations as the restriction has changed them.

A sparse-attention policy (``interventions.policies``: StreamingLLM, H2O, TOVA, Quest,
SnapKV, K-norm) is a ranking too: its keep mask replaces the top-n one, and the same
deletion or renormalisation (``_drop_in_place``) and output recomputation follow.
``final_only`` restricts each sequence's last query row alone (a prompt's final query).
``observe`` (a ``KeptRow``) hands the keys kept at one query row to a consumer at every
restricted layer, read before the deletion (the qa probe's support recall of the kept set).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from attngeom.capture import (
    AttentionCall,
    has_override,
    model_layout,
    override_attention,
    repeat_kv,
)
from attngeom.core.kernels import ORDER_MIN, hash32_rows, hashed_positions
from attngeom.core.random_control import row_states
from attngeom.errors import ConfigError
from attngeom.interventions.policies import POLICIES, check_policy, policy_keep
from attngeom.names import RANKINGS, RULES

SCORED = RULES.names()  # the rankings that keep the n keys of highest score


@dataclass(frozen=True)
class Ranked:
    """A restriction ranking that is not a policy: the n keys of highest ``score`` (one
    of the geometry's rules), or the follow-up's positional control (``interventions
    .selection.positional_restriction``)."""

    score: str | None = None


for _rule in SCORED:
    RANKINGS.register(_rule, Ranked(_rule))
RANKINGS.register("positional", Ranked(None))


@dataclass(frozen=True)
class KeptRow:
    """What a restriction keeps at one query row, handed to ``consumer(layer, keep)`` at
    every layer it restricts: ``keep`` (B, H, T) bool, a fresh tensor, the visible keys the
    selection keeps at query row ``row`` (negative: from the end) where that row is
    restricted, and every visible key where it is not (a head outside ``heads``, a row
    other than the last under ``final_only``, n >= T). Read before the deletion, so it
    changes nothing that is kept; layers outside the selection are not reported (their
    rows keep every visible key)."""

    consumer: Callable[[int, torch.Tensor], None]
    row: int = -1

    def report(self, layer: int, keep: torch.Tensor, visible: torch.Tensor,
               allowed: torch.Tensor | None, shape: torch.Size) -> None:
        """``keep`` and ``visible`` broadcastable to ``shape`` (B, H, Q, T); ``allowed``
        the rows that may change, bool (H,) or broadcastable to (B, H, Q, 1)."""
        r = self.row % shape[2]
        seen = visible.expand(shape)[:, :, r]
        kept = keep.expand(shape)[:, :, r] & seen
        if allowed is not None:
            mine = (allowed[None, :] if allowed.dim() == 1
                    else allowed.expand(shape[0], shape[1], shape[2], 1)[:, :, r, 0])
            kept = torch.where(mine[..., None], kept, seen)
        self.consumer(layer, kept.clone())

# query rows per ``topk`` block when rows say how far their visible keys reach: a causal
# block of 128 rows at T = 1024 reads on average 56% of the columns a full row would
_TOPK_ROWS = 128


def _nth_values(score: torch.Tensor, n: int, reach: torch.Tensor | None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The n-th and (n + 1)-th largest value of each row of ``score`` (…, Q, T), T > n.

    ``reach`` (broadcastable to (…, Q)): one past each row's last visible key, whose
    later columns hold the invisible mark, the smallest value; a block of rows then
    reads only the columns below its largest reach (at least n + 1: the values found
    are the full row's, the rest being marks). An unsorted topk, then the two smallest
    of its n + 1 values in order, cost less than a sorted topk or a sort of the n + 1."""
    q, t = score.shape[-2:]
    spans = [(0, q, t)]
    if reach is not None and q > _TOPK_ROWS:
        top = torch.broadcast_to(reach, score.shape[:-1]).reshape(-1, q).amax(0)
        spans = []
        for a in range(0, q, _TOPK_ROWS):
            b = min(a + _TOPK_ROWS, q)
            spans.append((a, b, min(t, max(int(top[a:b].max()), n + 1))))
    kth, after = [], []
    for a, b, cols in spans:
        block = score[..., a:b, :cols]
        top = block.topk(n + 1, dim=-1, sorted=False).values
        ends = top.topk(2, dim=-1, largest=False).values  # the (n + 1)-th, the n-th
        after.append(ends[..., 0:1])
        kth.append(ends[..., 1:2])
    if len(spans) == 1:
        return kth[0], after[0]
    return torch.cat(kth, dim=-2), torch.cat(after, dim=-2)


def topn_keep(probs: torch.Tensor, visible: torch.Tensor, n: int, *,
              masked: bool = False, out: torch.Tensor | None = None,
              reach: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean (…, T) mask of the n largest visible entries of each row.

    Ties go to the smaller position, as a stable descending sort orders them: every
    entry above the n-th largest value is kept, and of the entries equal to it the
    first ones in position order fill the rest. One ``topk`` per row finds the n-th
    value (a full sort of every row cost a quarter of a restricted forward); only rows
    where equal values straddle the n-th place pay for a cumulative count. Invisible
    keys are never kept; a row with at most n visible keys keeps all of them.
    ``masked``: ``probs`` already holds the invisible mark at every invisible key (the
    restriction's own score buffer), so no masked copy is made; ``out``: a bool buffer
    for the mask. Scores are >= 0 (probabilities, contributions, hash words; the mark is
    -1) or int32 order words (``core.kernels.hash32_rows(order=True)``; the mark is
    ``ORDER_MIN``, which is also hash word 0's order word: see below). ``reach``: one
    past each row's last visible key (broadcastable to ``probs.shape[:-1]``), which lets
    a causal mask's early rows skip the columns they cannot see (``_nth_values``).
    """
    return _topn(probs, visible, n, masked=masked, out=out, reach=reach)[0]


def _topn(probs: torch.Tensor, visible: torch.Tensor, n: int, *, masked: bool = False,
          out: torch.Tensor | None = None, reach: torch.Tensor | None = None,
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``topn_keep``'s mask and each row's (n + 1)-th largest score (the mark where the
    row has at most n visible keys; None where n >= T)."""
    if n >= probs.shape[-1]:
        return visible.expand_as(probs).clone(), None
    words = probs.dtype == torch.int32
    mark = ORDER_MIN if words else -1
    score = probs if masked else probs.masked_fill(~visible, mark)
    # the n-th and (n+1)-th values: equal (and visible) only where a tie straddles the
    # n-th place, the rows that need the count (no pass over every row for it)
    kth, after = _nth_values(score, n, reach)
    if words:
        # the mark equals word 0's order word: a row whose n-th value is the mark (a
        # ``low`` row) has fewer than n keys above it, so it keeps its visible keys,
        # unless more than n are visible (two visible words 0, about 2**-64 a row), when
        # the tie count settles it among the visible keys
        low = kth == mark
        crowded = (after == kth) & (~low | (visible.sum(-1, keepdim=True) > n))
    else:
        # scores are >= 0 and invisible keys -1: the n-th value clamped at 0 never keeps
        # one, and a row with at most n visible keys (whose n-th value is -1 or its
        # smallest) keeps exactly those
        crowded = (after == kth) & (kth >= 0)
        kth = kth.clamp_min(0)
    crowded = crowded[..., 0]
    keep = torch.ge(score, kth, out=out) if out is not None else score >= kth
    if words:
        few = low[..., 0] & ~crowded  # rows with at most n visible keys: exactly those
        if bool(few.any()):
            keep[few] = visible.expand_as(score)[few]
    if bool(crowded.any()):
        s, k = score[crowded], kth[crowded]
        tie = (s == k) & visible.expand_as(score)[crowded]
        room = n - (s > k).sum(-1, keepdim=True)
        keep[crowded] = (s > k) | (tie & (tie.cumsum(-1) <= room))
    return keep, after


def contribution_scores(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """alpha_i ||v_i|| per query head: ``probs`` (B, H, Q, T) float32, ``values`` the
    GQA-aligned value states (B, H, T, d); float32."""
    norms = torch.linalg.vector_norm(values.to(torch.float32), dim=-1)
    return probs * norms[:, :, None, :]


def random_scores(seed: int, windows: Sequence[int], layer: int, num_heads: int,
                  num_queries: int, num_keys: int, device,
                  out: torch.Tensor | None = None,
                  limit: torch.Tensor | None = None, order: bool = False) -> torch.Tensor:
    """(B, H, Q, T) int64 in [0, 2**32): the random ranking's key order, one hash per
    (seed, window, layer, head, query position, key position); with ``order``, int32
    order words (word - 2**31, ``hash32_rows``), the same order at half the cost.

    Query row q sits at position ``q + T - Q`` (queries aligned to the last keys, as a
    causal mask reads them). The row's state is ``core.random_control.row_states``'s
    first chain (the geometry control's coordinates) and each key's score the lowbias32
    hash of the state with the key's hashed position; sorting a row by it is a uniformly
    random permutation whose first n are the kept set. ``out``: a contiguous (B, H, Q,
    T) int64 buffer to write into. ``limit`` (B, Q): row (b, q) needs only its first
    ``limit[b, q]`` words (one past its last visible key); the rest of its row is left
    unwritten, for a caller that masks the invisible keys anyway.
    """
    heads = torch.arange(num_heads, device=device)
    positions = torch.arange(num_queries, device=device) + (num_keys - num_queries)
    keys = hashed_positions(torch.arange(num_keys, dtype=torch.int64, device=device))
    if out is None:
        out = torch.empty((len(windows), num_heads, num_queries, num_keys),
                          dtype=torch.int32 if order else torch.int64, device=device)
    for b, window in enumerate(windows):
        state, _ = row_states(int(seed), int(window), int(layer), heads, positions, 1)
        reach = None if limit is None else limit[b][None, :]
        hash32_rows(state[0][..., 0], keys, out=out[b], limit=reach, order=order)  # (H, Q, T)
    return out


def restrict_probabilities(
    probs: torch.Tensor, visible: torch.Tensor, n: int, renormalize: bool,
    scores: torch.Tensor | None = None,
) -> torch.Tensor:
    """Zero all but the top-n visible probabilities per row; optionally renormalise.

    ``probs`` (B, H, Q, T), ``visible`` broadcastable to it. The kept entries are the
    n of highest ``scores`` (same shape; default the probabilities themselves). A row
    is restricted only where it loses probability (a visible key outside the kept n
    with p > 0); every other row is returned unchanged, bit for bit (so n >= |U_t| is
    exactly the identity, and a row whose dropped keys all had p = 0 is not rescaled
    by a sum that differs from one only by rounding). A row with no visible key stays
    as it was. This is the restriction's definition; ``restrict_topn`` computes the
    same in place on its own buffers.
    """
    probs = probs.clone()
    _restrict_in_place(probs, probs if scores is None else scores, visible, n, renormalize,
                       by_probs=scores is None)
    return probs


def _restrict_in_place(probs: torch.Tensor, scores: torch.Tensor, visible: torch.Tensor,
                       n: int, renormalize: bool, *, heads: torch.Tensor | None = None,
                       masked: bool = False, scratch: _Scratch | None = None,
                       reach: torch.Tensor | None = None, by_probs: bool = False,
                       observe: Callable[[torch.Tensor], None] | None = None,
                       ) -> torch.Tensor:
    """Restrict ``probs`` in place (see ``restrict_probabilities``); returns the (B, H,
    Q, 1) rows that lost probability. ``heads``: the rows allowed to change, bool (H,)
    (those heads) or broadcastable to (B, H, Q, 1). ``masked``: ``scores`` holds the
    invisible mark already. ``scratch`` lends the (B, H, Q, T) bool buffers; ``reach``
    as in ``topn_keep``. ``by_probs``: the scores are the probabilities (the attention
    ranking), so a row loses probability exactly where its (n + 1)-th largest visible
    one is positive (more than n positive keys, all ranked above the zeros): no pass
    over the row to find out. ``observe(keep)`` sees the kept mask before the deletion
    overwrites its buffer."""
    scratch = scratch or _Scratch()
    shape = probs.shape
    keep, after = _topn(scores, visible, n, masked=masked, reach=reach,
                        out=scratch.get("keep", shape, torch.bool, probs.device))
    if observe is not None:
        observe(keep)
    rows = None
    if after is None:  # n >= T: no row can lose a key
        rows = torch.zeros((*shape[:-1], 1), dtype=torch.bool, device=probs.device)
    elif by_probs:
        rows = after > 0
    return _drop_in_place(probs, keep, visible, renormalize, rows=rows, heads=heads,
                          scratch=scratch)


def _drop_in_place(probs: torch.Tensor, keep: torch.Tensor, visible: torch.Tensor,
                   renormalize: bool, *, rows: torch.Tensor | None = None,
                   heads: torch.Tensor | None = None, scratch: _Scratch | None = None,
                   ) -> torch.Tensor:
    """Zero ``probs`` outside ``keep`` (bool, broadcastable to ``probs``) in the rows that
    lose probability by it, optionally renormalise them; returns those (B, H, Q, 1) rows.

    ``rows``: the rows that lose probability when the caller knows them already
    (otherwise a row loses where a visible key it does not keep has p > 0); ``heads``
    as in ``_restrict_in_place``. The one place deletion and renormalisation happen, for
    the top-n rankings and the sparse-attention policies alike."""
    scratch = scratch or _Scratch()
    shape = probs.shape
    out = scratch.get("keep", shape, torch.bool, probs.device)
    drop = torch.logical_not(keep if keep is out else keep.expand(shape), out=out)
    if rows is None:
        # a row loses probability where a visible key it does not keep has p > 0
        lost = scratch.get("lost", shape, torch.bool, probs.device)
        torch.gt(probs, 0, out=lost)
        lost.logical_and_(drop).logical_and_(visible)
        # ``any`` over a bool row is a scalar loop on CPU; the maximum of its bytes is not
        rows = lost.view(torch.uint8).amax(-1, keepdim=True).view(torch.bool)
    if heads is not None:
        rows &= heads[None, :, None, None] if heads.dim() == 1 else heads
    drop.logical_and_(rows)  # only the rows that lose probability change
    torch.where(drop, probs.new_zeros(()), probs, out=probs)  # half masked_fill_'s time
    if renormalize:
        total = probs.sum(-1, keepdim=True)
        probs.div_(torch.where(rows & (total > 0), total, torch.ones_like(total)))
    return rows


class _Scratch:
    """(B, H, Q, T) buffers lent across layers and forwards: on CPU a fresh tensor of
    that size pays page faults that cost about as much as the pass that fills it."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, shape, dtype: torch.dtype, device) -> torch.Tensor:
        key = (name, dtype, torch.device(device))
        buf = self.buffers.get(key)
        if buf is None or buf.shape != tuple(shape):
            buf = self.buffers[key] = torch.empty(tuple(shape), dtype=dtype, device=device)
        return buf


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


def _output(call: AttentionCall, probs: torch.Tensor, values: torch.Tensor,
            rows: torch.Tensor, eager_out: torch.Tensor, reuse: bool,
            final_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention output from the restricted ``probs``: recomputed in the heads whose
    rows lost probability, the model's own in the others (bit for bit); ``final_only``:
    only the last row of a (batch row, head) that lost probability is recomputed, every
    other row is the model's own, bit for bit."""
    changed = rows.flatten(2).any(-1).any(0)
    if not bool(changed.any()):
        return call.previous()
    if final_only:
        base = eager_out if reuse else call.previous()[0]  # (B, Q, H, d)
        last = torch.matmul(probs[:, :, -1:].to(values.dtype), values)[:, :, 0]  # (B, H, d)
        output = base.clone()
        output[:, -1] = torch.where(rows[:, :, -1], last.to(base.dtype), base[:, -1])
        return output.contiguous(), probs
    new = torch.matmul(probs.to(values.dtype), values).transpose(1, 2)
    if bool(changed.all()):  # the usual case: no head keeps its own output
        return new.to(call.query.dtype).contiguous(), probs
    base = eager_out if reuse else call.previous()[0]
    output = torch.where(changed[None, None, :, None], new.to(base.dtype), base)
    return output.contiguous(), probs


class WindowIds:
    """The window index of each batch row, read by the random ranking at every layer;
    ``set`` it before each forward (default: the batch positions 0..B-1)."""

    def __init__(self, ids: Sequence[int] | None = None) -> None:
        self.ids = None if ids is None else [int(i) for i in ids]

    def set(self, ids: Sequence[int] | None) -> None:
        self.ids = None if ids is None else [int(i) for i in ids]

    def of(self, batch: int) -> list[int]:
        if self.ids is None:
            return list(range(batch))
        if len(self.ids) != batch:
            raise ConfigError(f"windows: expected {batch} window indices for the batch, got "
                              f"{len(self.ids)}")
        return self.ids


@contextlib.contextmanager
def restrict_topn(
    model: torch.nn.Module,
    n: int,
    *,
    layers: Iterable[int] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
    renormalize: bool = True,
    ranking: str = "attention",
    seed: int = 0,
    windows: Sequence[int] | WindowIds | None = None,
    params: Mapping[str, object] | None = None,
    final_only: bool = False,
    observe: KeptRow | None = None,
) -> Iterator[None]:
    """Keep only the top-``n`` attention entries per query row in the selected heads.

    ``layers``: layer indices (``None``: all); ``heads``: ``(layer, head)``
    pairs (``None``: all heads of the selected layers). ``renormalize``: rescale
    the kept probabilities to sum to one (otherwise the dropped mass is lost).
    ``ranking``: which n are kept, ``attention``, ``contribution`` or ``random``
    (``seed`` and the batch rows' window indices ``windows`` pick its order; a
    ``WindowIds`` can be re-set between forwards), or a sparse-attention policy of
    ``attngeom.interventions.policies.POLICIES`` (``window``, ``h2o``, ``tova``,
    ``quest``, ``snapkv``, ``knorm``; ``params`` overrides its defaults), whose kept
    keys are then deleted or renormalised the same way. ``final_only``: only each
    sequence's last query row is restricted (a prompt's final query, the only row the
    prefill policies ``snapkv`` and ``knorm`` accept); every other row keeps the
    model's own output. ``observe``: a ``KeptRow`` that sees the keys kept at one query
    row of every restricted layer (nothing kept changes). Bad arguments raise
    ``ConfigError`` before any forward.

    >>> with torch.no_grad(), restrict_topn(model, 1, layers=[0, 1]):
    ...     nll = model(ids, labels=ids).loss
    >>> float(nll) > float(model(ids, labels=ids).loss.detach())
    True
    """
    n = _check_int(n, "n", 1)
    if not isinstance(renormalize, bool):
        raise ConfigError(f"expected renormalize to be True or False, got {renormalize!r}")
    if not isinstance(final_only, bool):
        raise ConfigError(f"expected final_only to be True or False, got {final_only!r}")
    policy = None
    if RANKINGS.check(ranking, "ranking") in POLICIES:
        policy = check_policy(ranking, n, params, final_only=final_only)
    elif ranking not in SCORED:
        raise ConfigError(f"ranking: restrict_topn keeps the top-n keys of a score or a "
                          f"policy's ({', '.join((*SCORED, *POLICIES))}); {ranking} is "
                          "interventions.selection.restriction's")
    elif params:
        raise ConfigError(f"params: only a policy ranking ({', '.join(POLICIES)}) takes "
                          f"parameters, got {dict(params)!r} for {ranking!r}")
    if observe is not None and not isinstance(observe, KeptRow):
        raise ConfigError(f"observe: expected a KeptRow or None, got {observe!r}")
    seed = _check_int(seed, "seed", -(2**63))
    ids = windows if isinstance(windows, WindowIds) else WindowIds(windows)
    selection = _selection(model, layers, heads)
    if has_override(model):
        # an enclosing capture would never see the restricted layers' probabilities
        raise ConfigError(
            "restrict_topn: expected no attngeom override open on the model; open the "
            "restriction first and capture_attention inside it"
        )

    scratch = _Scratch()

    def handler(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        if call.layer not in selection:
            return call.previous()
        chosen = selection[call.layer]
        # the model's own output is needed below only where some heads keep it and it
        # is the eager function's (else ``previous`` gives it): then the eager call
        # computes it once, otherwise only the probabilities are computed
        reuse = ((chosen is not None or final_only) and call.previous_is_eager
                 and not call.nested)
        # top-N chosen on float32 probabilities: a bf16 model's rounded ones tie often
        eager_out, _, probs = call.eager_float32(output=reuse)
        if n >= probs.shape[-1]:
            if observe is not None:  # every visible key is kept
                observe.report(call.layer, call.visible(), call.visible(), None, probs.shape)
            return call.previous()  # no row can lose a key
        groups = probs.shape[1] // call.value.shape[1]
        values = repeat_kv(call.value, groups)
        visible = call.visible()
        shape, device = probs.shape, probs.device
        head_mask = torch.zeros(shape[1], dtype=torch.bool, device=device)
        head_mask[slice(None) if chosen is None else chosen] = True
        allowed = head_mask
        if final_only:  # the last query row of each sequence only
            last_row = torch.arange(shape[2], device=device) == shape[2] - 1
            allowed = head_mask[None, :, None, None] & last_row[None, None, :, None]
        if policy is not None:
            # the policy reads the unrestricted probabilities, then they are cut in place
            keep = policy_keep(ranking, n, policy, visible=visible, probs=probs,
                               query=call.query, key=call.key, final_only=final_only)
            if observe is not None:
                observe.report(call.layer, keep, visible, allowed, shape)
            rows = _drop_in_place(probs, keep, visible, renormalize, heads=allowed,
                                  scratch=scratch)
            return _output(call, probs, values, rows, eager_out, reuse, final_only)
        # one past each row's last visible key: the random words and the top-n
        # selection skip the columns beyond it
        last = torch.where(visible, torch.arange(shape[3], device=device), -1)
        reach = (last.amax(-1).amax(1) + 1).expand(shape[0], -1)  # (B, Q), a mask of batch 1 too
        if ranking == "attention":
            scores = torch.where(visible, probs, probs.new_tensor(-1.0),
                                 out=scratch.get("score", shape, torch.float32, device))
        elif ranking == "contribution":
            norms = torch.linalg.vector_norm(values.to(torch.float32), dim=-1)
            scores = torch.mul(probs, norms[:, :, None, :],
                               out=scratch.get("score", shape, torch.float32, device))
            scores.masked_fill_(~visible, -1)
        else:
            # a row's words past its last visible key are never read: not hashed
            scores = random_scores(seed, ids.of(shape[0]), call.layer, shape[1], shape[2],
                                   shape[3], device, limit=reach, order=True,
                                   out=scratch.get("words", shape, torch.int32, device))
            scores.masked_fill_(~visible, ORDER_MIN)
        # restricted in place (the probabilities are this call's own): only rows that
        # lose probability change, so every other head keeps the model's own output
        # bit for bit (N >= |U| is the identity)
        seen = None if observe is None else (
            lambda keep: observe.report(call.layer, keep, visible, allowed, shape))
        rows = _restrict_in_place(probs, scores, visible, n, renormalize, heads=allowed,
                                  masked=True, scratch=scratch, reach=reach[:, None],
                                  by_probs=ranking == "attention", observe=seen)
        return _output(call, probs, values, rows, eager_out, reuse, final_only)

    with override_attention(model, handler):
        yield
