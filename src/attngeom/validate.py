"""One check per kind of value: what a configuration field accepts (a leaf, no torch).

The configurations (``attngeom.config``) call these when they are built, so a bad value
fails in a second with one line, before any model or corpus work; the kernels then
trust their arguments and check shapes only. Each function returns the value in its
normal form (a sorted tuple, a float, ...) or raises ``ConfigError`` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from attngeom.errors import ConfigError


def as_tuple(value, name: str) -> tuple:
    """A list given as a sequence or as text (``"1,2,4"`` or ``"1 2 4"``)."""
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if value is None:
        return ()
    try:
        return tuple(value)
    except TypeError:
        raise ConfigError(f"{name}: expected a list, got {value!r}") from None


def choices(name: str, given: Iterable, allowed: Sequence) -> tuple:
    """A non-empty selection from ``allowed``, duplicates dropped, order kept.

    >>> choices("rules", "attention,random", ("attention", "contribution", "random"))
    ('attention', 'random')
    """
    items = as_tuple(given, name)
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ConfigError(
            f"{name}: expected a non-empty subset of {', '.join(map(str, allowed))}, "
            f"got {', '.join(map(str, items)) or 'nothing'}"
        )
    return tuple(dict.fromkeys(items))


def one_of(name: str, value, allowed: Sequence):
    if value not in allowed:
        raise ConfigError(
            f"{name}: expected one of {', '.join(map(str, allowed))}, got {value!r}"
        )
    return value


def integer(name: str, value, *, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
        if not as_float.is_integer():
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        value = int(as_float)
    if low is not None and value < low:
        raise ConfigError(f"{name}: expected an integer >= {low}, got {value}")
    return int(value)


def number(name: str, value, *, low: float | None = None, high: float | None = None,
           low_open: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    below = low is not None and (x <= low if low_open else x < low)
    if below or (high is not None and x > high):
        lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f"<= {high:g}"
        raise ConfigError(f"{name}: expected a number {' and '.join(p for p in (lo, hi) if p)}, "
                          f"got {value!r}")
    return x


def n_grid(values, name: str = "n_grid") -> tuple[int, ...]:
    """Set sizes N: integers >= 1, sorted, duplicates dropped (at least one).

    >>> n_grid("8,2,2,1")
    (1, 2, 8)
    """
    items = as_tuple(values, name)
    if not items:
        raise ConfigError(f"{name}: expected at least one N")
    grid = tuple(integer(name, v) for v in items)
    if min(grid) < 1:
        raise ConfigError(f"{name}: expected every N >= 1, got {list(grid)}")
    return tuple(sorted(set(grid)))


def fractions(name: str, values, *, low_open: bool = True, high: float = 1.0) -> tuple:
    """Numbers in (0, ``high``], duplicates dropped, order kept (at least one)."""
    items = as_tuple(values, name)
    if not items:
        raise ConfigError(f"{name}: expected at least one value")
    out = tuple(number(name, v, low=0.0, high=high, low_open=low_open) for v in items)
    return tuple(dict.fromkeys(out))


def thresholds(name: str, values) -> tuple[float, ...]:
    """Relative delta-NLL thresholds: finite numbers >= 0 (at least one)."""
    items = as_tuple(values, name)
    if not items:
        raise ConfigError(f"{name}: expected at least one threshold")
    return tuple(dict.fromkeys(number(name, v, low=0.0) for v in items))


def integers(name: str, values, *, low: int | None = None, allow_empty: bool = False):
    items = as_tuple(values, name)
    if not items and not allow_empty:
        raise ConfigError(f"{name}: expected at least one integer")
    return tuple(dict.fromkeys(integer(name, v, low=low) for v in items))


def flags(name: str, values) -> tuple[bool, ...]:
    """Booleans given as bools or as text (true / false), at least one."""
    items = as_tuple(values, name)
    out = []
    for v in items:
        if isinstance(v, bool):
            out.append(v)
        elif str(v).lower() in ("true", "1", "yes"):
            out.append(True)
        elif str(v).lower() in ("false", "0", "no"):
            out.append(False)
        else:
            raise ConfigError(f"{name}: expected true or false, got {v!r}")
    if not out:
        raise ConfigError(f"{name}: expected true, false or both")
    return tuple(dict.fromkeys(out))


def head_pairs(name: str, values) -> tuple[tuple[int, int], ...] | None:
    """(layer, head) pairs given as pairs or as text ``"0:3,1:2"``; None for none given."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [v for v in values.replace(",", " ").split() if v]
    out = []
    for item in values:
        try:
            layer, head = item.split(":") if isinstance(item, str) else item
            out.append((integer(name, layer, low=0), integer(name, head, low=0)))
        except (TypeError, ValueError):
            raise ConfigError(
                f"{name}: expected (layer, head) pairs or LAYER:HEAD,LAYER:HEAD, got {item!r}"
            ) from None
    if not out:
        raise ConfigError(f"{name}: expected at least one (layer, head) pair, or none at all")
    return tuple(dict.fromkeys(out))


def parse_query_mode(mode: str) -> tuple[str, int]:
    """Split ``final`` / ``all`` / ``stride:k`` into (kind, k); k is 1 unless strided.

    >>> parse_query_mode("stride:16")
    ('stride', 16)
    """
    if mode in ("final", "all"):
        return mode, 1
    if isinstance(mode, str) and mode.startswith("stride:"):
        try:
            k = int(mode.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return "stride", k
    raise ConfigError(
        f"query_mode: expected 'final', 'all' or 'stride:k' with k >= 1, got {mode!r}"
    )


def boundary_options(doc_boundary: str, boundary_token: str | None) -> None:
    """A document-boundary override: a known kind, and a token only where one is used."""
    from attngeom.names import DOC_BOUNDARIES

    one_of("doc_boundary", doc_boundary, DOC_BOUNDARIES)
    if boundary_token is not None:
        text("boundary_token", boundary_token)
        if doc_boundary in ("auto", "none"):
            raise ConfigError(
                "boundary_token: expected --doc-boundary bos, eos or sep with a boundary "
                f"token, got doc_boundary {doc_boundary!r}"
            )


def text(name: str, value, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: expected a non-empty string, got {value!r}")
    return value
