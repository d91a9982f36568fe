"""One check per kind of value: what a configuration field accepts (a leaf: no torch, and
no attngeom module but ``errors``).

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


def boundary_options(doc_boundary: str, boundary_token: str | None,
                     kinds: Sequence[str]) -> None:
    """A document-boundary override: a known kind (of ``kinds``, ``names.DOC_BOUNDARIES``),
    and a token only where one is used."""
    one_of("doc_boundary", doc_boundary, kinds)
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


# --------------------------------------------------------------------------- constraints
# What each option accepts is declared beside it (``config.option(check=...)``), in the
# spirit of scikit-learn's ``_parameter_constraints``: ``clean`` gives the value's normal
# form or one line naming the option and the valid range, in a second, when a
# configuration is built (CLI, API and study files alike); ``against`` checks what
# depends on the model (its positions, layers and heads, read from its configuration
# without loading weights: ``ModelShape``) before any weight is read.


class ModelShape:
    """What the checks need of a model, read from its configuration (no weights):
    ``layers``, ``heads``, ``kv_heads``, ``max_positions`` (``None``: not stated),
    ``is_causal``, and the class or name to say in messages."""

    def __init__(self, *, layers: int, heads: int, kv_heads: int | None = None,
                 max_positions: int | None = None, is_causal: bool = True,
                 name: str = "the model") -> None:
        self.layers, self.heads = int(layers), int(heads)
        self.kv_heads = int(kv_heads or heads)
        self.max_positions = int(max_positions) if max_positions else None
        self.is_causal = bool(is_causal)
        self.name = name

    @classmethod
    def from_dict(cls, facts: dict, name: str = "the model") -> ModelShape:
        """From ``capture.inspect_model``'s dictionary."""
        return cls(layers=facts["layers"], heads=facts["heads"], kv_heads=facts.get("kv_heads"),
                   max_positions=facts.get("max_positions"),
                   is_causal=facts.get("is_causal", True), name=name)


class Check:
    """An option's constraint: ``clean(name, value)`` -> the normal form (or one
    ``ConfigError`` line); ``against(name, value, shape, config)`` checks what depends on
    the model. ``describe()`` says what is valid, for the docs and the messages."""

    def clean(self, name: str, value):
        return value

    def against(self, name: str, value, shape: ModelShape, config) -> None:
        return None

    def describe(self) -> str:
        return ""


class Integer(Check):
    """An integer in [low, high]; ``none``: ``None`` is accepted (unset); ``zero_none``:
    0 means unset too (``--n-windows 0``: every window)."""

    def __init__(self, low: int | None = None, high: int | None = None, *,
                 none: bool = False, zero_none: bool = False) -> None:
        self.low, self.high, self.none, self.zero_none = low, high, none or zero_none, zero_none

    def clean(self, name, value):
        if value is None and self.none:
            return None
        out = integer(name, value, low=0 if self.zero_none else self.low)
        if self.zero_none and out == 0:
            return None
        if self.zero_none and self.low is not None and out < self.low:
            raise ConfigError(f"{name}: expected 0 or an integer >= {self.low}, got {out}")
        if self.high is not None and out > self.high:
            raise ConfigError(f"{name}: expected an integer <= {self.high}, got {out}")
        return out

    def describe(self) -> str:
        return " and ".join(p for p in (f">= {self.low}" if self.low is not None else "",
                                        f"<= {self.high}" if self.high is not None else "") if p)


class Number(Check):
    """A finite number in [low, high] (``low_open``/``high_open``: excluded)."""

    def __init__(self, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def clean(self, name, value):
        x = number(name, value, low=self.low, high=self.high, low_open=self.low_open)
        if self.high_open and self.high is not None and x >= self.high:
            raise ConfigError(f"{name}: expected a number < {self.high:g}, got {value!r}")
        return x


class OneOf(Check):
    """One name of ``allowed`` (a sequence, or a ``Registry``: did-you-mean errors)."""

    def __init__(self, allowed, *, none: bool = False) -> None:
        self.allowed, self.none = allowed, none

    def clean(self, name, value):
        if value is None and self.none:
            return None
        if hasattr(self.allowed, "check"):
            return self.allowed.check(value, name)
        return one_of(name, value, self.allowed)

    def describe(self) -> str:
        return "one of " + ", ".join(map(str, self.allowed))


class SubsetOf(Check):
    """A non-empty selection of ``allowed`` (sequence or ``Registry``), order kept."""

    def __init__(self, allowed) -> None:
        self.allowed = allowed

    def clean(self, name, value):
        if hasattr(self.allowed, "choices"):
            return self.allowed.choices(value, name)
        return choices(name, value, self.allowed)


class Text(Check):
    def __init__(self, *, optional: bool = False) -> None:
        self.optional = optional

    def clean(self, name, value):
        return text(name, value, optional=self.optional)


class Flag(Check):
    """One boolean, given as a bool or as text (true / false)."""

    def clean(self, name, value):
        given = flags(name, (value,) if isinstance(value, bool) else value)
        if len(given) != 1:
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return given[0]


class Flags(Check):
    """True, false or both (``both``), as bools or text; order kept."""

    def clean(self, name, value):
        items = as_tuple(value, name)
        if any(isinstance(x, str) and x.strip().lower() == "both" for x in items):
            items = (False, True)
        return flags(name, items)


class Sizes(Check):
    """Set sizes N (integers >= 1, sorted, duplicates dropped). ``within_window``: no N
    given above the window length (a query sees at most T keys); N = T itself, and the
    default grid's N above a short window, are kept, reported as never valid and counted
    as skipped, so the default grid fits any window."""

    def __init__(self, *, within_window: bool = False) -> None:
        self.within_window = within_window

    def clean(self, name, value):
        return n_grid(value, name)

    def against(self, name, value, shape, config) -> None:
        if _is_default(config, name, value):
            return  # the default grid fits any window: its N above T count as skipped
        if self.within_window and value and max(value) > config.window_length:
            bad = [n for n in value if n > config.window_length]
            raise ConfigError(f"{name}: expected every N at most the window length "
                              f"{config.window_length} (a query sees at most T keys; valid: "
                              f"1..{config.window_length}), got {bad[0]}")


def _is_default(config, name: str, value) -> bool:
    """Whether option ``name`` of ``config`` holds its declared default."""
    from dataclasses import MISSING, fields

    for f in fields(config):
        if f.name == name:
            default = f.default if f.default is not MISSING else f.default_factory()
            return value == default
    return False


class Lengths(Check):
    """Token counts (integers >= ``low``); ``increasing``: given in increasing order
    (duplicates refused); ``empty``: none allowed. Every one must fit the model's
    positions (``positions``, checked against the model)."""

    def __init__(self, low: int = 1, *, increasing: bool = False, empty: bool = False,
                 positions: bool = True, extra: int = 0, none: bool = False) -> None:
        self.low, self.increasing, self.empty = low, increasing, empty
        self.positions, self.extra, self.none = positions, extra, none

    def clean(self, name, value):
        if value is None and self.none:
            return None
        items = as_tuple(value, name)
        if not items and not self.empty:
            raise ConfigError(f"{name}: expected at least one length")
        out = tuple(integer(name, x, low=self.low) for x in items)
        if self.increasing and any(b <= a for a, b in zip(out, out[1:], strict=False)):
            raise ConfigError(f"{name}: expected increasing lengths, got "
                              f"{','.join(map(str, out))}")
        if not self.increasing and len(set(out)) != len(out):
            out = tuple(dict.fromkeys(out))
        return out

    def against(self, name, value, shape, config) -> None:
        limit = shape.max_positions
        if self.positions and limit is not None and value:
            top = max(value) + self.extra
            if top > limit:
                raise ConfigError(f"{name}: expected lengths that fit {shape.name}'s {limit} "
                                  f"positions (valid: up to {limit - self.extra}), got "
                                  f"{max(value)}")


class WindowLength(Integer):
    """The window length T: an integer >= 2 within the model's positions."""

    def __init__(self) -> None:
        super().__init__(2)

    def against(self, name, value, shape, config) -> None:
        limit = shape.max_positions
        if limit is not None and value > limit:
            raise ConfigError(f"{name}: expected at most {shape.name}'s {limit} positions "
                              f"(valid: 2..{limit}), got {value}")


class Layers(Check):
    """Layer indices (sorted, distinct), each below the model's layer count; ``None``:
    every layer."""

    def clean(self, name, value):
        if value is None:
            return None
        return tuple(sorted(integers(name, value, low=0)))

    def against(self, name, value, shape, config) -> None:
        bad = [x for x in value or () if x >= shape.layers]
        if bad:
            raise ConfigError(f"{name}: expected layers in 0..{shape.layers - 1} "
                              f"({shape.name} has {shape.layers}), got {bad[0]}")


class HeadPairs(Check):
    """(layer, head) pairs, each inside the model; ``None``: every head."""

    def clean(self, name, value):
        return head_pairs(name, value)

    def against(self, name, value, shape, config) -> None:
        for layer, head in value or ():
            if layer >= shape.layers or head >= shape.heads:
                raise ConfigError(f"{name}: expected LAYER:HEAD within {shape.layers} layers "
                                  f"and {shape.heads} heads of {shape.name} (valid: "
                                  f"0..{shape.layers - 1}:0..{shape.heads - 1}), got "
                                  f"{layer}:{head}")


def check_config(config, shape: ModelShape) -> None:
    """Every model-dependent constraint of ``config``'s options, then its own
    ``check_model`` (the checks that read several options at once)."""
    from dataclasses import fields

    for f in fields(config):
        chk = f.metadata.get("check")
        if chk is not None:
            chk.against(f.name, getattr(config, f.name), shape, config)
    extra = getattr(config, "check_model", None)
    if extra is not None:
        extra(shape)
