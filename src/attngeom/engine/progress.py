"""One progress line for every command: units done, rate and time left.

``attngeom analyze`` counts windows; the perplexity commands count forward passes
(one window batch under one setting), so a long ``restrict`` or ``scan-heads`` run
shows where it is. Lines go to stderr (tqdm); ``progress=False`` silences them. When
the bar closes it leaves one line: what was done, in how long, and how much of it was
resumed from shards or redone (``final_line``); ``say`` prints the lines between
(loading the model, aggregating the tables) so a long step is never silent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def say(enabled, text: str) -> None:
    """One status line on stderr when progress is shown (not with ``progress=False`` or a
    notebook's own bar factory)."""
    if enabled is True:
        print(text, file=sys.stderr, flush=True)


def plural(word: str, count: int = 2) -> str:
    """``word`` for one, its plural for any other count (``pass`` -> ``passes``).

    >>> plural("pass"), plural("window"), plural("window", 1)
    ('passes', 'windows', 'window')
    """
    if count == 1:
        return word
    return word + ("es" if word.endswith(("s", "x", "ch", "sh")) else "s")


def final_line(desc: str, done: int, unit: str, seconds: float, *, resumed: int = 0,
               redone: int = 0) -> str:
    """``analyze (32 tok/window): 24 windows in 12.3 s (4 resumed, 1 redone)``."""
    extra = [f"{resumed} resumed"] if resumed else []
    extra += [f"{redone} redone"] if redone else []
    more = f" ({', '.join(extra)})" if extra else ""
    return f"{desc}: {done} {plural(unit, done)} in {seconds:.1f} s{more}"


class Progress:
    """A progress reporter; ``enabled`` may be True, False or a factory
    ``f(total=..., desc=..., unit=...)`` returning an object with ``update(n)`` and
    ``close()`` (for notebooks that draw their own)."""

    def __init__(self, total: int, *, desc: str, unit: str, enabled: bool | Callable = True,
                 initial: int = 0, redone: int = 0) -> None:
        self._bar = None
        self._final = enabled is True
        self.desc, self.unit, self.total = desc, unit, total
        self.done, self.resumed, self.redone = initial, initial, redone
        self._t0 = time.perf_counter()
        if callable(enabled) and not isinstance(enabled, bool):
            self._bar = enabled(total=total, desc=desc, unit=unit)
        elif enabled:
            from tqdm.auto import tqdm

            shown = desc + (f", {initial} resumed" if initial else "")
            self._bar = tqdm(total=total, desc=shown, unit=unit, initial=initial, leave=False,
                             dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            if self._final:
                say(True, final_line(self.desc, self.done, self.unit,
                                     time.perf_counter() - self._t0, resumed=self.resumed,
                                     redone=self.redone))

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
