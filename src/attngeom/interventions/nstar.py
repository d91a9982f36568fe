"""N*_tau as an integer: the follow-up's adaptive search (arXiv 2609.37879, App. B.2).

N*_tau is the smallest positive integer N whose top-N restriction raises the loss by at
most tau. Scanning every integer costs a pass over the data per N, so the paper brackets
it: evaluate the powers of two below ``grid_max`` (and below the window length), then for
each tau take h = the smallest known passing N (the window length ``length`` when none
passes: restricting to ``length`` keys changes nothing, the exact zero-degradation
endpoint) and l = the largest known failing N below h (0 when none), evaluate
floor((l + h) / 2) until h - l = 1, and finally test max(1, h - refine) .. h - 1 upward,
accepting the first that passes (else h). Evaluations are shared across the taus: every
N is evaluated once, and each tau reads every evaluation so far.

The taus advance in lockstep: each round asks every unfinished tau for its next N, the
distinct ones go to ``evaluate`` in one call (so one pass over the data can evaluate
them together) and the round repeats. The result is the smallest passing N among those
tried (every tried N below it fails): where the loss is not monotone another tau's
later bisection can try a smaller N that passes a finished tau, and N*_tau, a minimum,
takes it. Where the loss is monotone in N that is the
exact N*_tau, and where it is not (a larger tried N fails after a smaller one passes)
``monotone`` is False and ``notes`` say where.

Cost: per tau at most ceil(log2(gap)) bisection steps, gap the widest bracket (768 for a
1024-token window above 256), plus ``refine - 1`` refinements (h - 1 = l is known):
12 beyond the grid for one tau at T = 1024, fewer where the taus share brackets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attngeom.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NStarSearch", "bootstrap_nstar", "grid_powers", "nstar_from", "search_nstar",
           "search_rounds"]


def grid_powers(length: int, grid_max: int = 256) -> list[int]:
    """The powers of two 1, 2, 4, .. up to ``grid_max`` and below ``length``."""
    out, n = [], 1
    while n <= grid_max and n < length:
        out.append(n)
        n *= 2
    return out


def _passes(delta: float, tau: float) -> bool:
    return bool(delta <= tau)  # NaN never passes


@dataclass(frozen=True)
class NStarSearch:
    """Everything one adaptive search tried and found.

    ``evaluations``: every N evaluated -> its delta (relative delta-NLL, or nats for an
    answer loss), in the order tried. ``nstar``: tau -> the integer N*_tau (the window
    length when nothing shorter passes; ``None`` only without an endpoint, when nothing
    tried passes). ``grid_nstar``: tau -> the smallest passing power of two (the grid
    estimate; the endpoint, or ``None``, when none passes). ``monotone``: False when,
    for some tau, a larger tried N fails after a smaller one passes. ``notes``: where.
    """

    evaluations: dict[int, float]
    nstar: dict[float, int | None]
    grid_nstar: dict[float, int | None]
    monotone: bool
    notes: tuple[str, ...]
    grid: tuple[int, ...] = ()
    length: int = 0
    rounds: int = 0

    @property
    def extra(self) -> int:
        """How many N were evaluated beyond the power-of-two grid."""
        return len(set(self.evaluations) - set(self.grid))

    def to_frame(self) -> pd.DataFrame:
        """One row per N tried, in increasing N: ``n, delta, on_grid`` and, per tau,
        ``pass_<tau>`` (delta <= tau)."""
        import pandas as pd

        ns = sorted(self.evaluations)
        frame = pd.DataFrame({"n": np.asarray(ns, dtype=np.int64),
                              "delta": [float(self.evaluations[n]) for n in ns],
                              "on_grid": [n in self.grid for n in ns]})
        for tau in self.nstar:
            frame[f"pass_{tau:g}"] = [_passes(self.evaluations[n], tau) for n in ns]
        return frame


def _bracket(known: Mapping[int, float], tau: float, top: int | None) -> tuple[int, int | None]:
    """(l, h): h the smallest known passing N (``top`` if none), l the largest known
    failing N below h (0 if none)."""
    passing = [n for n, d in known.items() if _passes(d, tau)]
    h = min(passing) if passing else top
    failing = [n for n, d in known.items() if not _passes(d, tau) and (h is None or n < h)]
    return (max(failing) if failing else 0), h


def _check(taus: Sequence[float], length: int, grid_max: int, refine: int) -> list[float]:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ConfigError(f"length: expected a positive integer, got {length!r}")
    if isinstance(grid_max, bool) or not isinstance(grid_max, (int, np.integer)) or grid_max < 1:
        raise ConfigError(f"grid_max: expected a positive integer, got {grid_max!r}")
    if isinstance(refine, bool) or not isinstance(refine, (int, np.integer)) or refine < 0:
        raise ConfigError(f"refine: expected an integer >= 0, got {refine!r}")
    out = [float(t) for t in taus]
    if not out or any(not math.isfinite(t) or t < 0 for t in out):
        raise ConfigError(f"taus: expected finite thresholds >= 0, got {list(taus)!r}")
    return list(dict.fromkeys(out))


def search_nstar(evaluate: Callable[[Sequence[int]], Sequence[float]], taus: Sequence[float],
                 *, length: int, grid_max: int = 256, refine: int = 3,
                 endpoint: bool = True, grid: Sequence[int] | None = None) -> NStarSearch:
    """The paper's adaptive search for the integer N*_tau of every tau at once.

    ``evaluate(ns)`` returns the delta of each N of ``ns`` (distinct, each in
    [1, length)); it is called once for the grid and once per round after. ``length``
    is the window length: N >= length restricts nothing, so ``length`` passes by
    definition (delta 0, never evaluated) unless ``endpoint`` is False, in which case
    nothing above the grid is tried and a tau no grid N passes gets ``None`` (the
    answer-loss protocol's "> 256"). Pass means delta <= tau. ``grid``: the first
    round's Ns instead of the powers of two up to ``grid_max`` (those >= length are
    dropped).

    >>> curve = lambda ns: [1.0 / n for n in ns]          # monotone: N* = ceil(1 / tau)
    >>> search_nstar(curve, [0.05, 0.3], length=64).nstar
    {0.05: 20, 0.3: 4}
    """
    steps = search_rounds(taus, length=length, grid_max=grid_max, refine=refine,
                          endpoint=endpoint, grid=grid)
    ns = next(steps)
    while True:
        values = list(evaluate(ns))
        try:
            ns = steps.send(values)
        except StopIteration as done:
            return done.value


def search_rounds(taus: Sequence[float], *, length: int, grid_max: int = 256, refine: int = 3,
                  endpoint: bool = True, grid: Sequence[int] | None = None,
                  adaptive: bool = True,
                  ) -> Generator[list[int], Sequence[float], NStarSearch]:
    """``search_nstar`` as a generator, for callers that run many searches in lockstep
    (one pass over the data per round for all of them): it yields each round's Ns, is
    sent their deltas in the same order, and returns the ``NStarSearch``
    (``StopIteration.value``). The grid round may be empty (a window of one token).
    ``adaptive=False`` stops after the grid: N*_tau is then the grid estimate."""
    taus = _check(taus, length, grid_max, refine)
    length = int(length)
    known: dict[int, float] = {}

    def record(ns: list[int], values: Sequence[float]) -> None:
        values = list(values)
        if len(values) != len(ns):
            raise ConfigError(f"evaluate: expected {len(ns)} deltas, got {len(values)}")
        for n, d in zip(ns, values, strict=True):
            known[n] = float(d)

    if grid is None:
        grid = grid_powers(length, grid_max)
    else:
        grid = sorted({int(n) for n in grid if 1 <= int(n) < length})
    record(grid, (yield list(grid)))
    top = length if endpoint else None
    grid_nstar: dict[float, int | None] = {}
    for tau in taus:
        passing = [n for n in grid if _passes(known[n], tau)]
        grid_nstar[tau] = min(passing) if passing else top
    # per tau: None (bisecting), or the refinement's base h (then the candidates
    # max(1, h - refine) .. h - 1 are tried upward); result once decided
    base: dict[float, int | None] = dict.fromkeys(taus)
    result: dict[float, int | None] = {} if adaptive else dict(grid_nstar)
    rounds = 1
    while len(result) < len(taus):
        asked: list[int] = []
        for tau in taus:
            if tau in result:
                continue
            if base[tau] is None:
                low, high = _bracket(known, tau, top)
                if high is None:  # no endpoint and nothing passes
                    result[tau] = None
                    continue
                if high - low > 1:
                    asked.append((low + high) // 2)
                    continue
                base[tau] = high
            h = base[tau]
            for n in range(max(1, h - refine), h):
                if n not in known:
                    asked.append(n)
                    break
                if _passes(known[n], tau):
                    result[tau] = n
                    break
            else:
                result[tau] = h
        asked = [n for n in dict.fromkeys(asked) if n not in known]
        if asked:
            record(asked, (yield asked))
            rounds += 1
    # a later round (another tau's bisection) may have tried a smaller N that passes
    # this tau where the loss is not monotone: N*_tau is a minimum, so it counts
    nstar = {t: result[t] if result[t] is None else min(result[t], nstar_from(known, t, top))
             for t in taus}
    notes = _monotone_notes(known, taus)
    return NStarSearch(evaluations=dict(known), nstar=nstar, grid_nstar=grid_nstar,
                       monotone=not notes, notes=tuple(notes), grid=tuple(grid),
                       length=length, rounds=rounds)


def _monotone_notes(known: Mapping[int, float], taus: Sequence[float]) -> list[str]:
    """One note per tau where a larger tried N fails after a smaller one passes."""
    ns = sorted(known)
    notes = []
    for tau in taus:
        passing = [n for n in ns if _passes(known[n], tau)]
        if not passing:
            continue
        first = passing[0]
        later = [n for n in ns if n > first and not _passes(known[n], tau)]
        if later:
            shown = ", ".join(f"{n} ({known[n]:.4g})" for n in later[:4])
            more = f" and {len(later) - 4} more" if len(later) > 4 else ""
            notes.append(f"tau={tau:g}: N={first} passes ({known[first]:.4g}) but larger N "
                         f"fail: {shown}{more}; N*_tau is the smallest passing N tried, not "
                         "a certified minimum")
    return notes


def nstar_from(evaluations: Mapping[int, float], tau: float, length: int | None) -> int | None:
    """The smallest evaluated N with delta <= tau, else ``length`` (the endpoint; ``None``
    without one). On a search's own evaluations this is its N*_tau."""
    passing = [n for n, d in evaluations.items() if _passes(d, tau)]
    return min(passing) if passing else length


def bootstrap_nstar(base: Sequence[float], restricted: Mapping[int, Sequence[float]],
                    taus: Sequence[float], *, length: int | None, relative: bool = True,
                    replicates: int = 1000, seed: int = 0,
                    level: float = 0.95) -> dict[float, tuple[float, float]]:
    """Percentile interval of N*_tau over document bootstrap replicates.

    ``base`` (D,) is each document's NLL under the unmodified model and ``restricted``
    maps every evaluated N to its documents' NLL (D,), same order. A replicate draws D
    documents with replacement (``numpy.random.default_rng(seed)``; the same draws for
    every N and tau), recomputes each N's delta from the resampled means (relative:
    ``(mean_N - mean_base) / mean_base``; else in nats) and takes N* from the evaluated
    Ns only: the smallest passing one, else ``length``. The model is not run again, so
    an interval end can only be an N the search tried (dense near the estimate, the
    grid or the bisection points further away).
    """
    base = np.asarray(base, dtype=np.float64)
    ns = sorted(restricted)
    if base.ndim != 1 or base.size < 1:
        raise ConfigError(f"base: expected per-document values (D,), got shape {base.shape}")
    if not ns:
        return {float(t): (math.nan, math.nan) for t in taus}
    table = np.stack([np.asarray(restricted[n], dtype=np.float64) for n in ns])
    if table.shape[1] != base.size:
        raise ConfigError(f"restricted: expected {base.size} documents per N, got "
                          f"{table.shape[1]}")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, base.size, size=(int(replicates), base.size))
    mean_base = base[draws].mean(axis=1)  # (R,)
    mean_n = table[:, draws].mean(axis=2)  # (len(ns), R)
    delta = mean_n - mean_base if not relative else (mean_n - mean_base) / mean_base
    ns_arr = np.asarray(ns, dtype=np.float64)
    fallback = math.nan if length is None else float(length)
    out = {}
    for tau in taus:
        ok = delta <= float(tau)  # (len(ns), R)
        first = np.where(ok.any(axis=0), ns_arr[np.argmax(ok, axis=0)], fallback)
        low, high = np.nanquantile(first, [(1 - level) / 2, (1 + level) / 2]) \
            if not np.all(np.isnan(first)) else (math.nan, math.nan)
        out[float(tau)] = (float(low), float(high))
    return out
