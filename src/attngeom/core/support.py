"""How supporting tokens fare at one query under competition (method, "Competition probes").

At the answer query of a QA prompt every head ranks the visible positions by a score
r (the attention probability alpha, or the contribution ||alpha_i v_i||). With S the
support positions (the tokens of the sentence that answers the question, k = |S|),
T_x the positions of the context field and D = T_x minus S its non-support tokens
(d = |D|), the follow-up paper (arXiv 2609.37879, App. D) measures per layer and head:

    displacement  Disp = (1/k) sum_{i in S} sum_{j in D} 1{r_j >= r_i}   (weak: ties count)
    mass          M    = sum_{i in S} alpha_i
    recall@64     R64  = |S ∩ Top64(r over every visible position)| / k
    outranking    p    = Disp / d

Top64 keeps the 64 highest scores of all visible positions (instruction, question and
the initial token included), ties to the smaller position, as every top-N rule here.
A row with at most 64 visible positions keeps them all (recall 1).

Displacement counts, for each support token, the non-support tokens at or above it;
it is computed from the sorted non-support scores with one ``searchsorted`` (the count
of r_j >= r_i is d minus the number strictly below r_i), so nothing of size k x T is
made. Recall compares each support token's rank (positions with a larger score, plus
those with an equal score and a smaller index) with the budget.

Shapes: scores and alpha (..., T) with any leading dimensions (e.g. (L, H) for every
layer and head of one prompt); support, context and visible (T,) bool; results (...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attngeom.errors import ConfigError

RECALL_TOP = 64
STATISTICS = ("displacement", "mass", "recall", "outranking")


@dataclass(frozen=True)
class SupportStatistics:
    """The four statistics of one prompt, each (...) float64, and the set sizes.

    ``k`` support positions, ``d`` non-support context positions, ``top`` the recall
    budget. ``mass`` is always of the attention probabilities, whatever the ranking.
    """

    displacement: Tensor
    mass: Tensor
    recall: Tensor
    outranking: Tensor
    k: int
    d: int
    top: int

    def as_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in STATISTICS}


def _mask(value: Tensor, t: int, what: str) -> Tensor:
    value = torch.as_tensor(value)
    if value.numel() == 0 and value.dim() == 1:  # an empty position list
        return torch.zeros(t, dtype=torch.bool)
    if value.dtype != torch.bool:
        # a list of positions
        if value.dtype.is_floating_point or value.dim() != 1:
            raise ConfigError(f"{what}: expected a (T,) bool mask or 1-D positions, got "
                              f"{value.dtype} of shape {tuple(value.shape)}")
        if value.numel() and (int(value.min()) < 0 or int(value.max()) >= t):
            raise ConfigError(f"{what}: expected positions in [0, {t}), got {value.tolist()}")
        mask = torch.zeros(t, dtype=torch.bool)
        mask[value.long()] = True
        return mask
    if value.shape != (t,):
        raise ConfigError(f"{what}: expected a mask of shape ({t},), got {tuple(value.shape)}")
    return value.cpu()


def contribution_scores(alpha: Tensor, values: Tensor) -> Tensor:
    """r_contr = ||alpha_i v_i|| = alpha_i ||v_i|| per query head (before W_O).

    ``alpha`` (..., H, T), ``values`` (G, T, d) per kv head with H % G == 0 (query
    head h reads kv head h // (H // G)). Returns (..., H, T) float64.
    """
    h, g = alpha.shape[-2], values.shape[0]
    if h % g:
        raise ConfigError(f"expected query heads divisible by kv heads, got {h} and {g}")
    norms = torch.linalg.vector_norm(values.to(torch.float64), dim=-1)  # (G, T)
    norms = norms.repeat_interleave(h // g, dim=0)  # (H, T)
    return alpha.to(torch.float64) * norms.to(alpha.device)


def support_statistics(
    scores: Tensor,
    support: Tensor,
    context: Tensor,
    *,
    alpha: Tensor | None = None,
    visible: Tensor | None = None,
    top: int = RECALL_TOP,
) -> SupportStatistics:
    """Displacement, support mass, recall@top and outranking probability per row.

    ``scores`` (..., T): the ranking score r of every position at the answer query;
    ``alpha`` (..., T): the attention probabilities (default: ``scores``), whose
    support sum is the mass; ``support`` S and ``context`` T_x: (T,) bool masks or
    1-D position lists (support outside the context is an error); ``visible``: the
    positions Top-``top`` ranks (default all T). Needs k >= 1 and d >= 1.

    >>> r = torch.tensor([0.1, 0.4, 0.2, 0.3])  # positions 1..3 are context, 3 the support
    >>> s = support_statistics(r, torch.tensor([3]), torch.tensor([1, 2, 3]), top=1)
    >>> s.displacement.item(), s.mass.item(), s.recall.item(), s.outranking.item()
    (1.0, 0.30000001192092896, 0.0, 0.5)
    """
    if scores.dim() < 1:
        raise ConfigError(f"scores: expected shape (..., T), got {tuple(scores.shape)}")
    t = scores.shape[-1]
    s_mask = _mask(support, t, "support")
    x_mask = _mask(context, t, "context")
    v_mask = torch.ones(t, dtype=torch.bool) if visible is None else _mask(visible, t, "visible")
    if bool((s_mask & ~x_mask).any()):
        raise ConfigError("support: expected every support position inside the context")
    if bool((s_mask & ~v_mask).any()):
        raise ConfigError("support: expected every support position to be visible")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"top: expected an integer >= 1, got {top!r}")
    d_mask = x_mask & ~s_mask
    k, d = int(s_mask.sum()), int(d_mask.sum())
    if k == 0 or d == 0:
        raise ConfigError(
            f"expected at least one support and one non-support context position, "
            f"got k={k}, d={d}")
    alpha = scores if alpha is None else alpha
    if alpha.shape != scores.shape:
        raise ConfigError(f"alpha: expected shape {tuple(scores.shape)}, got {tuple(alpha.shape)}")
    device = scores.device
    s_idx = s_mask.nonzero().squeeze(1).to(device)
    d_idx = d_mask.nonzero().squeeze(1).to(device)
    r = scores.to(torch.float64)
    r_s = r.index_select(-1, s_idx)  # (..., k)
    r_d = r.index_select(-1, d_idx).sort(dim=-1).values  # (..., d) ascending
    below = torch.searchsorted(r_d.contiguous(), r_s.contiguous(), side="left")
    displacement = (d - below).to(torch.float64).sum(-1) / k
    mass = alpha.to(torch.float64).index_select(-1, s_idx).sum(-1)
    recall = _recall(r, r_s, s_idx, v_mask.to(device), top) / k
    return SupportStatistics(displacement=displacement, mass=mass, recall=recall,
                             outranking=displacement / d, k=k, d=d, top=top)


def _recall(r: Tensor, r_s: Tensor, s_idx: Tensor, visible: Tensor, top: int) -> Tensor:
    """(...,) count of support positions among the ``top`` best visible (ties to smaller index)."""
    if int(visible.sum()) <= top:
        return torch.full(r.shape[:-1], float(s_idx.numel()), dtype=torch.float64,
                          device=r.device)
    vis_r = torch.where(visible, r, torch.full_like(r, float("-inf")))[..., None, :]  # (...,1,T)
    above = (vis_r > r_s[..., None]).sum(-1)  # (..., k)
    position = torch.arange(r.shape[-1], device=r.device)
    earlier = (position[None, :] < s_idx[:, None]) & visible[None, :]  # (k, T)
    tied = ((vis_r == r_s[..., None]) & earlier).sum(-1)
    return ((above + tied) < top).sum(-1).to(torch.float64)
