"""Regime agreement between two runs (method §7: stability of the taxonomy across corpora).

Two runs' regimes are compared head by head (the inputs are aligned by (layer, head)):
the share of heads with the same regime and Cohen's kappa,
``kappa = (p_o - p_e) / (1 - p_e)`` with ``p_o`` the observed agreement and
``p_e = sum_k p_a(k) p_b(k)`` the agreement expected from the two runs' marginals.

Heads labelled ``none`` (no valid query) in either run are left out and counted in
``n_excluded``. Degenerate cases: with no head left, agreement and kappa are NaN; when
both runs put every head in one and the same class, ``p_e = 1`` and kappa is 0 / 0:
it is reported as NaN (undefined: perfect agreement that chance alone would also
give), while ``agreement`` is 1. This follows the usual convention of statistics
packages (e.g. scikit-learn's ``cohen_kappa_score``) rather than inventing a value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attngeom.errors import ConfigError
from attngeom.names import NO_REGIME, REGIMES


@dataclass(frozen=True)
class RegimeAgreement:
    """Agreement of two runs' regimes; ``confusion`` has columns regime_a, regime_b, count."""

    agreement: float
    kappa: float
    n_heads: int
    n_excluded: int
    confusion: dict[str, np.ndarray]


def cohens_kappa(labels_a: Sequence[str], labels_b: Sequence[str]) -> float:
    """Cohen's kappa of two equal-length label sequences (NaN if empty or p_e = 1).

    >>> round(cohens_kappa(["a", "a", "b", "b"], ["a", "b", "b", "b"]), 4)
    0.5
    """
    a = np.asarray(list(labels_a), dtype=object)
    b = np.asarray(list(labels_b), dtype=object)
    if a.shape != b.shape:
        raise ConfigError(f"expected label sequences of equal length, got {a.size} and {b.size}")
    if a.size == 0:
        return math.nan
    classes = sorted(set(a.tolist()) | set(b.tolist()))
    p_o = float((a == b).mean())
    p_e = sum(float((a == k).mean()) * float((b == k).mean()) for k in classes)
    if p_e >= 1.0:
        return math.nan
    return (p_o - p_e) / (1.0 - p_e)


def regime_agreement(regimes_a: Sequence[str], regimes_b: Sequence[str]) -> RegimeAgreement:
    """Share of heads with equal regime, Cohen's kappa and the confusion counts (method §7).

    ``regimes_a[i]`` and ``regimes_b[i]`` are the regimes of the same (layer, head) in two
    runs. The confusion table lists every pair of the three regimes (plus any other
    label seen), zero counts included, rows in the order Retriever, Mixer, Reset.

    >>> r = regime_agreement(["Mixer", "Mixer", "Reset", "none"],
    ...                      ["Mixer", "Reset", "Reset", "Mixer"])
    >>> r.agreement, r.n_heads, r.n_excluded, round(r.kappa, 4)
    (0.6666666666666666, 3, 1, 0.4)
    """
    a = [str(x) for x in regimes_a]
    b = [str(x) for x in regimes_b]
    if len(a) != len(b):
        raise ConfigError(f"expected regimes of the same heads in both runs, got {len(a)} and "
                          f"{len(b)} labels")
    keep = [i for i in range(len(a)) if a[i] != NO_REGIME and b[i] != NO_REGIME]
    ka = [a[i] for i in keep]
    kb = [b[i] for i in keep]
    extra = sorted((set(ka) | set(kb)) - set(REGIMES))
    classes = list(REGIMES) + extra
    rows_a, rows_b, counts = [], [], []
    for ca in classes:
        for cb in classes:
            rows_a.append(ca)
            rows_b.append(cb)
            counts.append(sum(1 for x, y in zip(ka, kb, strict=True) if x == ca and y == cb))
    n = len(keep)
    agreement = sum(1 for x, y in zip(ka, kb, strict=True) if x == y) / n if n else math.nan
    return RegimeAgreement(
        agreement=agreement,
        kappa=cohens_kappa(ka, kb),
        n_heads=n,
        n_excluded=len(a) - n,
        confusion={
            "regime_a": np.asarray(rows_a, dtype=object),
            "regime_b": np.asarray(rows_b, dtype=object),
            "count": np.asarray(counts, dtype=np.int64),
        },
    )
