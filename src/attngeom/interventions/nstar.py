"""N*_tau as an integer: the follow-up's adaptive search (arXiv 2609.37879, App. B.2).

N*_tau is the smallest positive integer N whose top-N restriction raises the loss by at
most tau. Scanning every integer costs a pass over the data per N, so the paper brackets
it: evaluate the powers of two below ``grid_max`` (and below the window length), then for
each tau take h = the smallest known passing N (the window length ``length`` when none
passes: restricting to ``length`` keys changes nothing, the exact zero-degradation
endpoint) and l = the largest known failing N below h (0 when none), narrow (l, h) until
h - l = 1, and finally test max(1, h - refine) .. h - 1 upward, accepting the first that
passes (else h). Evaluations are shared across the taus: every N is evaluated once, and
each tau reads every evaluation so far.

Narrowing (``step``): ``bisect`` evaluates floor((l + h) / 2), the paper's rule.
``interpolate`` (the default) evaluates the N where a curve through the nearest known
points in log N vs log delta reaches tau (delta curves are close to power laws): a
parabola inside a bracket with both ends known; past the last known N (the bracket up to
the window, whose end has no delta) a blend of a parabola and a shifted power law
a (N + s)^-b, each weighted by how far the other misses the next known point, since a
single form extrapolated 3x past the grid lands 1-2% off and the N* - 3 .. N* that
the refinement needs anyway are about half a percent wide there. The N is clamped
strictly inside (l, h), with bisection's midpoint whenever none can be predicted or
two steps in a row did not halve the bracket. Any N strictly inside the bracket keeps the
answer exact, so where the loss is monotone both steps give the same N*_tau; they differ
only in which N they try.

The taus advance in lockstep: each round asks every unfinished tau for its next N, the
distinct ones go to ``evaluate`` in one call (so one pass over the data can evaluate
them together) and the round repeats. The result is the smallest passing N among those
tried (every tried N below it fails): where the loss is not monotone another tau's
later narrowing can try a smaller N that passes a finished tau, and N*_tau, a minimum,
takes it. Where the loss is monotone in N that is the
exact N*_tau, and where it is not (a larger tried N fails after a smaller one passes)
``monotone`` is False and ``notes`` say where.

Cost beyond the grid, per tau: bisection takes ceil(log2(gap)) steps, gap the widest
bracket (768 for a 1024-token window above 256), plus ``refine - 1`` refinements
(h - 1 = l is known): 12 for one tau at T = 1024, and three taus in different brackets
took a median of 18 (up to 30) on smooth curves. Four is the floor for a tau whose N* is
not next to the grid (N*, N* - 1 to confirm it, two refinements), which interpolation
reaches when its first prediction lands in N* - 3 .. N*: so at most 12 for three taus.
On smooth near-power-law curves (``tests/interventions/test_nstar.py``: power laws,
shifted, summed and log-log-curved ones, 400 per window length and seed) every curve
costs exactly that floor: a median of 9-10 (T = 256) and 10-11 (T = 1024) for three
taus, at most 12, in a median of 5 rounds (grid included), against bisection's median
of 14-18, up to 30, in 8-9 rounds.
Far from a power law (a cliff to 0 and a tiny tau) predictions can miss again and again,
so a budget guard caps each tau: its narrowing asks at most ``GAMBLE`` (2) Ns more than
bisection's worst case from its bracket after the grid, and an N is asked only where
bisection could still close whatever bracket it leaves within that budget (else the N
nearest the prediction that can, the midpoint at the last): at most ceil(log2(h - l))
+ 2 + ``refine - 1`` per tau on any curve. ``GAMBLE = 0`` would give bisection's own
bound, but a power-of-two bracket then admits only its midpoint: interpolation would be
bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from attngeom.errors import ConfigError
from attngeom.names import STEPS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NStarSearch", "both_rules", "bootstrap_nstar", "grid_powers", "lockstep",
           "nstar_from", "nstar_replicates",
           "search_nstar", "search_rounds", "stable_nstar"]


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


def _log_point(known: Mapping[int, float], n: int) -> tuple[float, float] | None:
    """(log N, log delta) of a known N, or None where delta is not positive and finite."""
    d = known.get(n)
    if d is None or n < 1 or not (math.isfinite(d) and d > 0):
        return None
    return math.log(n), math.log(d)


def _inverse(points: Sequence[tuple[float, float]], y: float) -> float | None:
    """The polynomial through ``points`` (log N as a function of log delta) at ``y``,
    as an N; None where two deltas are equal."""
    ys = [q for _, q in points]
    if len(points) < 2 or len(set(ys)) < len(ys):
        return None
    lx = 0.0
    for i, (xi, yi) in enumerate(points):
        weight = 1.0
        for j, yj in enumerate(ys):
            if j != i:
                weight *= (y - yj) / (yi - yj)
        lx += weight * xi
    return math.exp(lx) if math.isfinite(lx) and lx < 700 else None


def _crossing(known: Mapping[int, float], tau: float, low: int, high: int) -> float | None:
    """The predicted N where delta reaches tau, at most ``high``; None where there is none.

    Delta curves are close to power laws, straight lines in log N vs log delta, with a
    bend. Inside a bracket with both ends known: log delta as the parabola in log N
    through the ends and the known N nearest them, where it falls through tau. Where
    ``high`` has no usable delta (the endpoint, never evaluated, or a delta <= 0) the
    crossing is extrapolated from ``low`` and the two known Ns nearest it, and the bend
    decides it: the parabola (a slope that keeps turning) and a shifted power law
    a (N + s)^-b (a slope that levels off, a correction that dies away) each predict
    one, weighted by how far the other misses the fourth nearest point (a curve of
    either form gets its own exactly; others a blend). A fit that never falls through tau
    in the bracket predicts ``high``. Where fewer than three points are usable, log N
    along the straight line through two (the caller clamps the N it gets)."""
    if low < 1 or not tau > 0 or _log_point(known, low) is None:
        return None
    ends = [low] + ([high] if _log_point(known, high) is not None else [])
    centre = sum(math.log(n) for n in ends) / len(ends)
    others = sorted((n for n in known if n not in ends and _log_point(known, n) is not None),
                    key=lambda n: (abs(math.log(n) - centre), n))
    near = [_log_point(known, n) for n in [*ends, *others][:4]]
    y, ulow = math.log(tau), math.log(low)
    if len(near) < 3 or near[0][1] == near[1][1] == near[2][1]:  # a flat curve: no clue
        return _inverse(near[:2], y)
    fits: list[_Parabola | _Shifted] = [_Parabola(near[:3])]
    if len(ends) == 1 and len(near) == 4:
        fits.append(_Shifted(near[:3]))
    guesses = [(fit, min(math.exp(min(u, 700.0)), high))
               for fit in fits if (u := fit.crossing(y, ulow)) is not None]
    if len(guesses) == 2:
        (f0, x0), (f1, x1) = guesses
        m0, m1 = f0.miss(*near[3]), f1.miss(*near[3])
        if m0 == m1 or math.isinf(m0 + m1):
            return x0 if m0 <= m1 else x1
        return (m1 * x0 + m0 * x1) / (m0 + m1)
    return guesses[0][1] if guesses else _inverse(near[:2], y)


class _Parabola:
    """log delta as the parabola in log N through three points."""

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        (u0, y0), (u1, y1), (u2, y2) = points
        slope = (y1 - y0) / (u1 - u0)
        c = ((y2 - y1) / (u2 - u1) - slope) / (u2 - u0)
        # y0 + slope (u - u0) + c (u - u0)(u - u1) as c u^2 + b u + a
        self.c, self.b, self.a = c, slope - c * (u0 + u1), y0 - slope * u0 + c * u0 * u1

    def miss(self, u: float, y: float) -> float:
        return abs((self.c * u + self.b) * u + self.a - y)

    def crossing(self, y: float, ulow: float) -> float:
        """The smallest u > ulow where the parabola falls through y (inf where it never
        does: it turns up first)."""
        a, b, c = self.a - y, self.b, self.c
        if abs(c) < 1e-12:
            roots = [-a / b] if b else []
        else:
            disc = b * b - 4 * c * a
            roots = [] if disc < 0 else [(-b + sign * math.sqrt(disc)) / (2 * c)
                                         for sign in (1, -1)]
        return min((u for u in roots if u > ulow and 2 * c * u + b < 0), default=math.inf)


class _Shifted:
    """log delta = A - b log(N + s) through three points, b > 0 and s > -N of each;
    ``fit`` None where no such curve passes through them."""

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        (n0, y0), (n1, y1), (n2, y2) = sorted((math.exp(u), y) for u, y in points)
        self.fit: tuple[float, float, float] | None = None
        if y0 == y1 or y1 == y2:
            return
        ratio = (y1 - y0) / (y2 - y1)

        def shape(t: float) -> float:  # that ratio for the shift s = n0 (e^t - 1)
            base = n0 * math.exp(t)  # n0 + s
            return math.log1p((n1 - n0) / base) / math.log1p((n2 - n1) / (base + n1 - n0))

        lo, hi = -30.0, 30.0  # shape falls from ~inf to (n1 - n0) / (n2 - n1)
        if not shape(hi) < ratio < shape(lo):
            return
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if shape(mid) > ratio else (lo, mid)
        base = n0 * math.exp((lo + hi) / 2)
        b = (y0 - y1) / math.log1p((n1 - n0) / base)
        if b > 0 and math.isfinite(b):
            self.fit = y0 + b * math.log(base), b, base - n0

    def miss(self, u: float, y: float) -> float:
        if self.fit is None or math.exp(u) + self.fit[2] <= 0:
            return math.inf
        a, b, s = self.fit
        return abs(a - b * math.log(math.exp(u) + s) - y)

    def crossing(self, y: float, ulow: float) -> float | None:
        """log N where the fit reaches y (it falls through every y), None without a fit
        or where that is not above ulow."""
        if self.fit is None:
            return None
        a, b, s = self.fit
        lx = (a - y) / b
        if lx > 700:
            return math.inf
        x = math.exp(lx) - s
        return math.log(x) if x > 0 and math.log(x) > ulow else None


def _narrow(known: Mapping[int, float], tau: float, low: int, high: int, step: str,
            slow: int, first: bool) -> list[int]:
    """The Ns to try next inside the bracket (low, high), high - low > 1.

    ``bisect``: the midpoint. ``interpolate``: the predicted N* (``_crossing``, rounded
    up, clamped strictly inside the bracket). The first prediction (from grid points a
    factor of two apart, or extrapolated to the endpoint) is rough: one N, one below it,
    since the refinement evaluates N* - 3 .. N* - 1 anyway and landing a little low
    costs nothing. Later ones lean on a nearby point and are close: the prediction and
    the N below it, so a right one closes the bracket in that round. The midpoint where
    nothing can be predicted or where the last two steps (``slow``) each failed to halve
    the bracket (one near miss leaves the far end where it was; two in a row means the
    curve is not near a power law), which bounds the rounds on any curve."""
    mid = (low + high) // 2
    if step == "bisect" or slow >= 2:
        return [mid]
    x = _crossing(known, tau, low, high)
    if x is None or not math.isfinite(x):
        return [mid]
    guess = min(max(math.ceil(x) - int(first), low + 1), high - 1)
    return [guess] if first or guess - 1 <= low else [guess, guess - 1]


def _halvings(gap: int) -> int:
    """ceil(log2(gap)) for gap >= 1: the midpoints bisection needs to close (l, l + gap)."""
    return (int(gap) - 1).bit_length()


# Ns a tau's interpolation may spend beyond bisection's worst case (ITP's n0): with
# none, a power-of-two bracket (every grid bracket but the endpoint's) admits only the
# midpoint, and interpolation would be bisection; two pays for one missed prediction pair
GAMBLE = 2


def _guarded(low: int, high: int, ns: list[int], spare: int) -> list[int]:
    """``ns`` if bisection could still close whatever bracket they leave within
    ``spare`` Ns after them, else the one N nearest ``ns[0]`` that keeps it so (the
    midpoint where nothing does): the Ns a tau may ask without its total passing its
    budget, whatever the curve."""
    cuts = [low, *sorted(ns), high]
    if len(ns) + _halvings(max(b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True))) \
            <= spare:
        return ns
    if _halvings(high - low) > spare:  # another tau's N reopened the bracket
        return [(low + high) // 2]
    reach = 1 << (spare - 1)  # both pieces at most this wide: spare - 1 midpoints close them
    return [min(max(ns[0], high - reach, low + 1), low + reach, high - 1)]


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
                 endpoint: bool = True, grid: Sequence[int] | None = None,
                 step: str = "interpolate") -> NStarSearch:
    """The paper's adaptive search for the integer N*_tau of every tau at once.

    ``evaluate(ns)`` returns the delta of each N of ``ns`` (distinct, each in
    [1, length)); it is called once for the grid and once per round after. ``length``
    is the window length: N >= length restricts nothing, so ``length`` passes by
    definition (delta 0, never evaluated) unless ``endpoint`` is False, in which case
    nothing above the grid is tried and a tau no grid N passes gets ``None`` (the
    answer-loss protocol's "> 256"). Pass means delta <= tau. ``grid``: the first
    round's Ns instead of the powers of two up to ``grid_max`` (those >= length are
    dropped). ``step``: how a bracket narrows, ``interpolate`` (predict N* from the
    log-log curve) or ``bisect`` (the paper's midpoint); the same N* where the loss is
    monotone, interpolation with fewer evaluations on power-law-like curves.

    >>> curve = lambda ns: [1.0 / n for n in ns]          # monotone: N* = ceil(1 / tau)
    >>> found = search_nstar(curve, [0.05, 0.3], length=64)
    >>> found.nstar, sorted(set(found.evaluations) - set(found.grid))
    ({0.05: 20, 0.3: 4}, [3, 17, 18, 19, 20])
    >>> bisected = search_nstar(curve, [0.05, 0.3], length=64, step="bisect")
    >>> bisected.nstar, sorted(set(bisected.evaluations) - set(bisected.grid))
    ({0.05: 20, 0.3: 4}, [3, 17, 18, 19, 20, 24])
    """
    steps = search_rounds(taus, length=length, grid_max=grid_max, refine=refine,
                          endpoint=endpoint, grid=grid, step=step)
    ns = next(steps)
    while True:
        values = list(evaluate(ns))
        try:
            ns = steps.send(values)
        except StopIteration as done:
            return done.value


def search_rounds(taus: Sequence[float], *, length: int, grid_max: int = 256, refine: int = 3,
                  endpoint: bool = True, grid: Sequence[int] | None = None,
                  adaptive: bool = True, step: str = "interpolate",
                  ) -> Generator[list[int], Sequence[float], NStarSearch]:
    """``search_nstar`` as a generator, for callers that run many searches in lockstep
    (one pass over the data per round for all of them): it yields each round's Ns, is
    sent their deltas in the same order, and returns the ``NStarSearch``
    (``StopIteration.value``). The grid round may be empty (a window of one token).
    ``adaptive=False`` stops after the grid: N*_tau is then the grid estimate. ``step``
    as in ``search_nstar``."""
    taus = _check(taus, length, grid_max, refine)
    if step not in STEPS:
        raise ConfigError(f"step: expected one of {', '.join(STEPS)}, got {step!r}")
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
    # per tau: how many Ns its narrowing may still ask: bisection's worst case from the
    # bracket after the grid (the refinement's refine - 1 come on top), plus GAMBLE for
    # interpolation (bisection never spends the GAMBLE: its midpoints always fit)
    spare: dict[float, int] = {}
    for tau in taus:
        low, high = _bracket(known, tau, top)
        spare[tau] = 0 if high is None else _halvings(high - low) + (GAMBLE if step ==
                                                                    "interpolate" else 0)
    state = _Narrowing(taus, refine, step, spare,
                       result={} if adaptive else dict(grid_nstar))
    rounds = 1
    while len(state.result) < len(taus):
        asked: list[int] = []
        for tau in taus:
            if tau not in state.result:
                asked.extend(state.ask(tau, known, top))
        asked = [n for n in dict.fromkeys(asked) if n not in known]
        if asked:
            record(asked, (yield asked))
            rounds += 1
    result = state.result
    # a later round (another tau's bisection) may have tried a smaller N that passes
    # this tau where the loss is not monotone: N*_tau is a minimum, so it counts
    nstar = {t: result[t] if result[t] is None else min(result[t], nstar_from(known, t, top))
             for t in taus}
    notes = _monotone_notes(known, taus)
    return NStarSearch(evaluations=dict(known), nstar=nstar, grid_nstar=grid_nstar,
                       monotone=not notes, notes=tuple(notes), grid=tuple(grid),
                       length=length, rounds=rounds)


class _Narrowing:
    """Where each tau's search stands: ``base`` None while its bracket narrows, else the
    refinement's base h (the candidates max(1, h - refine) .. h - 1 are tried upward);
    ``width`` the bracket before the last narrowing step and ``slow`` how many steps in a
    row did not halve it; ``spare`` the Ns its narrowing may still ask; ``result`` tau ->
    N*_tau once decided."""

    def __init__(self, taus, refine: int, step: str, spare: dict, result: dict) -> None:
        self.refine, self.step, self.spare, self.result = refine, step, spare, result
        self.base: dict[float, int | None] = dict.fromkeys(taus)
        self.width: dict[float, int] = {}
        self.slow: dict[float, int] = dict.fromkeys(taus, 0)

    def ask(self, tau: float, known: Mapping[int, float], top: int | None) -> list[int]:
        """The Ns tau needs next (none once it is decided: ``result[tau]`` is then set)."""
        if self.base[tau] is None:
            low, high = _bracket(known, tau, top)
            if high is None:  # no endpoint and nothing passes
                self.result[tau] = None
                return []
            if high - low > 1:
                if tau in self.width:  # did the last step at least halve the bracket?
                    self.slow[tau] = (0 if 2 * (high - low) <= self.width[tau] + 1
                                      else self.slow[tau] + 1)
                ns = _guarded(low, high, _narrow(known, tau, low, high, self.step,
                                                 self.slow.get(tau, 0), tau not in self.width),
                              self.spare[tau])
                self.spare[tau] -= len(ns)
                self.width[tau] = high - low
                return ns
            self.base[tau] = high
        h = self.base[tau]
        for n in range(max(1, h - self.refine), h):
            if n not in known:
                return [n]
            if _passes(known[n], tau):
                self.result[tau] = n
                return []
        self.result[tau] = h
        return []


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


def lockstep(searches: Mapping[Hashable, Generator[list[int], Sequence[float], NStarSearch]],
             measure: Callable[[int, list[tuple[Hashable, int]]], Mapping], *,
             start: int = 0) -> dict[Hashable, NStarSearch]:
    """Run many searches (``search_rounds`` generators, by key) in lockstep: each round
    gathers every unfinished search's next Ns as ``(key, n)`` pairs, and one call of
    ``measure(round, pairs)`` (one pass over the data for all of them: round 0 is every
    search's grid) returns ``{(key, n): delta}``. The one driver of every N* search:
    ``restrict``'s settings, the qa probe's (background, selection) pairs and the
    context sweep's (length, selection, scoring) triples. ``start``: the first round's
    number (rounds of a later set of searches go on from an earlier one's)."""
    asked = {key: next(gen) for key, gen in searches.items()}
    done: dict[Hashable, NStarSearch] = {}
    rnd = start
    while asked:
        pairs = [(key, n) for key, ns in asked.items() for n in ns]
        deltas = measure(rnd, pairs)
        following = {}
        for key, ns in asked.items():
            try:
                following[key] = searches[key].send([deltas[(key, n)] for n in ns])
            except StopIteration as finished:
                done[key] = finished.value
        asked, rnd = following, rnd + 1
    return {key: done[key] for key in searches}


def both_rules(make: Callable[[Hashable, str], Generator], keys: Sequence[Hashable],
               measure: Callable[[int, list[tuple[Hashable, int]]], Mapping], step: str,
               ) -> tuple[dict[Hashable, NStarSearch], dict[Hashable, dict[str, dict]]]:
    """The searches of ``keys`` narrowed by ``step`` (``make(key, step)`` gives one
    ``search_rounds`` generator) in lockstep; then, where a curve proved non-monotone, the
    other rule's search of the same key in rounds after them, on the same evaluations
    (``measure`` must answer an N it has evaluated without evaluating it again: only the
    Ns the other rule adds cost a pass). Returns the searches, and per key each rule's
    N*_tau (``{step: {tau: N}}``; where the curve is monotone both rules give the same N,
    so the other is not run). Where the loss is not monotone N* depends on the rule: the
    follow-up's is ``bisect``."""
    found = lockstep({key: make(key, step) for key in keys}, measure)
    other = next(s for s in STEPS if s != step)
    redo = [key for key in keys if not found[key].monotone]
    start = max((found[key].rounds for key in keys), default=0)
    alt = lockstep({key: make(key, other) for key in redo}, measure, start=start) if redo else {}
    rules = {key: {step: dict(found[key].nstar),
                   other: dict((alt[key] if key in alt else found[key]).nstar)}
             for key in keys}
    return found, rules


def stable_nstar(deltas: Mapping[int, float], tau: float, endpoint: int | None) -> int | None:
    """The smallest tried N from which every larger tried N passes (delta <= tau).

    The paper's second reading of a non-monotone curve (App. C.4: "smallest size with
    all larger tested passing"); ``endpoint`` (passing by definition) when the largest
    tried N fails, ``None`` without one.

    >>> stable_nstar({1: 2.0, 2: 0.05, 4: 1.1, 8: -0.1, 16: 0.0}, 0.1, 32)
    8
    """
    best = endpoint
    for n in sorted(deltas, reverse=True):
        if not deltas[n] <= tau:
            break
        best = n
    return best


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
    reps = nstar_replicates(base, restricted, taus, length=length, relative=relative,
                            replicates=replicates, seed=seed)
    out = {}
    for tau, first in reps.items():
        low, high = np.nanquantile(first, [(1 - level) / 2, (1 + level) / 2]) \
            if not np.all(np.isnan(first)) else (math.nan, math.nan)
        out[tau] = (float(low), float(high))
    return out


def nstar_replicates(base: Sequence[float], restricted: Mapping[int, Sequence[float]],
                     taus: Sequence[float], *, length: int | None, relative: bool = True,
                     replicates: int = 1000, seed: int = 0) -> dict[float, np.ndarray]:
    """tau -> (R,) N*_tau of each bootstrap replicate (``bootstrap_nstar``'s draws). The
    draws depend only on ``seed``, ``replicates`` and the number of documents, so two
    searches over the same documents get the same draws: their replicates pair (a ratio
    of two N* has an interval of its own)."""
    base = np.asarray(base, dtype=np.float64)
    ns = sorted(restricted)
    table = np.stack([np.asarray(restricted[n], dtype=np.float64) for n in ns])
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
        out[float(tau)] = np.where(ok.any(axis=0), ns_arr[np.argmax(ok, axis=0)], fallback)
    return out
