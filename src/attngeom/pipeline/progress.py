"""One progress line for every command: units done, rate and time left.

``attngeom analyze`` counts windows; the perplexity commands count forward passes
(one window batch under one setting), so a long ``restrict`` or ``scan-heads`` run
shows where it is. Lines go to stderr (tqdm); ``progress=False`` silences them.
"""

from __future__ import annotations

from collections.abc import Callable


class Progress:
    """A progress reporter; ``enabled`` may be True, False or a factory
    ``f(total=..., desc=..., unit=...)`` returning an object with ``update(n)`` and
    ``close()`` (for notebooks that draw their own)."""

    def __init__(self, total: int, *, desc: str, unit: str, enabled: bool | Callable = True,
                 initial: int = 0) -> None:
        self._bar = None
        if callable(enabled) and not isinstance(enabled, bool):
            self._bar = enabled(total=total, desc=desc, unit=unit)
        elif enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=False,
                             dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
