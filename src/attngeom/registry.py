"""One registry shape for every kind of name (STYLE habit 13).

Metrics, analyses, head rankers, restriction rankings, head types, probes, figures,
commands and tables are each a ``Registry``: an ordered mapping from a name to its entry
with ``register`` (also a decorator), ``unregister``, lookup that fails with a
did-you-mean line, and ``names()`` in order. Every list a user sees (CLI choices, docs
tables, test parameters, the configuration's checks) is read from one.

A registry knows its built-in names before their entries are imported: it is declared in
``attngeom.names`` (a leaf: no torch) with the names and the module whose import registers
their entries (``builtins=``, ``module=``), so a configuration can check a name in a
second and only the run imports the heavy code. Each built-in may also carry plain
``meta`` (what the configuration needs to check an option against it, such as a ranking's
fixed part), read with ``meta(name)`` without importing anything.

>>> r = Registry("colour", option="colours", builtins=("red", "green"))
>>> _ = r.register("red", 1), r.register("green", 2)
>>> r.names()
('red', 'green')
>>> r.get("gren")
Traceback (most recent call last):
...
attngeom.registry.UnknownName: colours: unknown colour 'gren'; did you mean 'green'? \
(known: red, green)
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from attngeom.errors import ConfigError

T = TypeVar("T")


class UnknownName(ConfigError, KeyError):
    """A name no registry entry has: a ``ConfigError`` (one line for the user) that is also
    a ``KeyError``, so ``name in registry`` and ``registry.get(name, default)`` work as on a
    dict."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T], Generic[T]):
    """An ordered name -> entry mapping of one kind of name (module docstring).

    ``kind`` names one entry in messages ("restriction ranking"), ``option`` the option or
    field that takes these names ("rankings"). ``builtins``: names known before their
    entries are registered, in their order (each a name, or a (name, meta) pair);
    ``module``: the module whose import registers them (imported on the first lookup of
    an entry not yet registered).
    """

    def __init__(self, kind: str, *, option: str | None = None,
                 builtins: Iterable = (), module: str | None = None) -> None:
        self.kind = kind
        self.option = option or kind
        self.module = module
        self._order: list[str] = []
        self._meta: dict[str, Any] = {}
        self._entries: dict[str, T] = {}
        self._builtin: set[str] = set()
        for item in builtins:
            name, meta = (item, None) if isinstance(item, str) else item
            self._declare(name, meta)
            self._builtin.add(name)

    # ------------------------------------------------------------------ declaring

    def _declare(self, name: str, meta: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.option}: expected a non-empty name for a {self.kind}, "
                              f"got {name!r}")
        if name not in self._order:
            self._order.append(name)
        if meta is not None:
            self._meta[name] = meta

    def register(self, name: str, entry: T | None = None, *, meta: Any = None,
                 replace: bool = False):
        """Register ``entry`` under ``name`` (after every name declared before it). Used as
        ``@registry.register("name")`` on a function or class when ``entry`` is omitted.
        A built-in name's first registration fills it in; any other taken name is refused
        unless ``replace``."""
        if entry is None:
            def decorate(obj):
                self.register(name, obj, meta=meta, replace=replace)
                return obj

            return decorate
        if name in self._entries and not replace:
            raise ConfigError(f"{self.option}: a {self.kind} named {name!r} is already "
                              "registered (unregister it first, or pass replace=True)")
        self._declare(name, meta)
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Take ``name`` out (a test's or a notebook's clean-up); built-ins stay."""
        if name in self._builtin:
            raise ConfigError(f"{self.option}: the built-in {self.kind} {name!r} cannot be "
                              "unregistered")
        if name not in self._order:
            raise self._unknown(name)
        self._order.remove(name)
        self._entries.pop(name, None)
        self._meta.pop(name, None)

    @contextlib.contextmanager
    def registered(self, name: str, entry: T, *, meta: Any = None) -> Iterator[T]:
        """``entry`` registered under ``name`` inside the block only."""
        self.register(name, entry, meta=meta)
        try:
            yield entry
        finally:
            self.unregister(name)

    # ------------------------------------------------------------------ reading

    def names(self) -> tuple[str, ...]:
        """Every name, built-ins first in their declared order, then registrations."""
        return tuple(self._order)

    def meta(self, name: str) -> Any:
        """The plain metadata declared with ``name`` (``None`` without), read without
        importing the entry's module."""
        self.check(name)
        return self._meta.get(name)

    def check(self, name: object, option: str | None = None) -> str:
        """``name`` if it is known (its entry need not be imported), else one line with the
        closest known names."""
        if not isinstance(name, str) or name not in self._order:
            raise self._unknown(name, option)
        return name

    def choices(self, given, option: str | None = None) -> tuple[str, ...]:
        """A non-empty selection of known names, given as a sequence or as text
        (``"a,b"``), duplicates dropped and order kept."""
        from attngeom.validate import as_tuple

        option = option or self.option
        items = as_tuple(given, option)
        if not items:
            raise ConfigError(f"{option}: expected at least one of {', '.join(self._order)}")
        return tuple(dict.fromkeys(self.check(x, option) for x in items))

    def get(self, name: str, default: Any = ...) -> T:
        """The entry of ``name``, importing the built-ins' module if it is not registered
        yet; an unknown name is one did-you-mean line (``default`` given: that instead)."""
        try:
            return self[name]
        except UnknownName:
            if default is ...:
                raise
            return default

    def __getitem__(self, name: str) -> T:
        if name not in self._entries and name in self._order and self.module:
            importlib.import_module(self.module)
        if name not in self._entries:
            if name in self._order:
                raise ConfigError(f"{self.option}: the {self.kind} {name!r} is declared but "
                                  f"{self.module or 'nothing'} registers no entry for it")
            raise self._unknown(name)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._order

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._order)})"

    def _unknown(self, name: object, option: str | None = None) -> UnknownName:
        option = option or self.option
        close = difflib.get_close_matches(str(name), self._order, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return UnknownName(f"{option}: unknown {self.kind} {name!r}{hint} "
                           f"(known: {', '.join(self._order) or 'none'})")
