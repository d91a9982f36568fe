"""Read a report as a reader does and recompute every number it shows from the run's tables.

``read_report(html)`` parses the page with the standard library: each key table under
its caption (the ``<h3>`` before it), with its row labels (header cells, rowspans
expanded) and its cells, and each finding (``<li>``). ``check_report(report, tables,
CHECKS)`` then recomputes, from the source tables alone, what every cell and finding
should say, written from the definitions and not from the report code:

- a table cell is named by its row labels and its column header; together they must pick
  out exactly **one** row of the source table (after the setting the caption states),
  unless the check states a reduction (a mean over heads, over seeds). A table that
  averages rankings, renormalisations or corpora it does not name therefore fails: its
  labels pick several rows;
- a check may require every value of a source key to be shown (``complete``: a dropped
  column fails) and a score no head has a value for to read "not measured" (never 0);
- a finding must match one of the known sentences, which names its setting (ranking,
  treatment, scope, probe, background), and its numbers are recomputed in that setting;
  a sentence no check knows fails, and so does a setting with no sentence.

The result is a list of problems, one line each; empty means consistent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser

import numpy as np
import pandas as pd

from attngeom.report.html import fmt

# --------------------------------------------------------------------------- reading


@dataclass
class ShownTable:
    caption: str
    index: list[str]  # names of the row-label columns
    columns: list[str]  # data column headers
    rows: list[tuple[list[str], list[str]]]  # (row labels, cells), as shown


@dataclass
class Report:
    tables: list[ShownTable]
    findings: list[str]
    headings: list[str]


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.headings, self.findings, self.tables = [], [], []
        self._caption = ""
        self._text: list[str] | None = None
        self._table: dict | None = None
        self._row: list | None = None
        self._cell: dict | None = None
        self._in = None  # "h2", "h3", "li"
        self._wrap_id = ""  # the id of the table's wrapper, named "#id" without a caption

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("h2", "h3", "li") and self._table is None:
            self._in, self._text = tag, []
        elif tag == "div" and "tablewrap" in (a.get("class") or ""):
            self._wrap_id = a.get("id") or ""
        elif tag == "table":
            caption = self._caption or (f"#{self._wrap_id}" if self._wrap_id else "")
            self._table = {"head": [], "body": [], "part": None, "caption": caption}
            self._caption, self._wrap_id = "", ""
        elif self._table is not None and tag in ("thead", "tbody"):
            self._table["part"] = tag
        elif self._table is not None and tag == "tr":
            self._row = []
        elif self._row is not None and tag in ("th", "td"):
            self._cell = {"tag": tag, "text": [], "rowspan": int(a.get("rowspan", 1)),
                          "colspan": int(a.get("colspan", 1))}

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._cell is not None:
            self._cell["text"] = "".join(self._cell["text"]).strip()
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table["head" if self._table["part"] == "thead" else "body"].append(self._row)
            self._row = None
        elif tag == "table" and self._table is not None:
            self.tables.append(_shown(self._table))
            self._table = None
        elif tag == self._in and self._text is not None:
            text = " ".join("".join(self._text).split())
            if tag == "h3":
                self._caption = text
            elif tag == "h2":
                self.headings.append(text)
            else:
                self.findings.append(text)
            self._in, self._text = None, None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"].append(data)
        elif self._text is not None:
            self._text.append(data)


def _shown(table: dict) -> ShownTable:
    head, body = table["head"], table["body"]
    n_cols = sum(1 for c in body[0] if c["tag"] == "td") if body else 0
    top = [c["text"] for c in head[0]] if head else []
    n_index = len(top) - n_cols
    names = ([c["text"] for c in head[-1]][:n_index] if len(head) > 1
             else top[:n_index])
    carry: list[tuple[str, int]] = [("", 0)] * n_index
    rows = []
    for tr in body:
        ths = [c for c in tr if c["tag"] == "th"]
        labels = []
        for level in range(n_index):
            text, left = carry[level]
            if left > 0:
                carry[level] = (text, left - 1)
                labels.append(text)
                continue
            cell = ths.pop(0)
            carry[level] = (cell["text"], cell["rowspan"] - 1)
            labels.append(cell["text"])
        rows.append((labels, [c["text"] for c in tr if c["tag"] == "td"]))
    return ShownTable(table["caption"], names, top[n_index:], rows)


def read_report(html: str) -> Report:
    reader = _Reader()
    reader.feed(html)
    return Report(reader.tables, reader.findings, reader.headings)


# --------------------------------------------------------------------------- values


def same(label: str, value) -> bool:
    """Whether a shown label names a source value (numbers compared as numbers)."""
    if isinstance(value, (bool, np.bool_)):
        return label in (str(bool(value)), fmt(bool(value)))
    if isinstance(value, (int, float, np.integer, np.floating)):
        try:
            return math.isclose(float(label), float(value), rel_tol=1e-9, abs_tol=1e-12)
        except ValueError:
            return label == fmt(value)
    return label == str(value)


def text(value) -> str:
    """What a cell holding ``value`` shows (``report.html.fmt``'s format)."""
    if isinstance(value, np.bool_):
        value = bool(value)
    return fmt(value) if not isinstance(value, str) else value


def treatment(renormalize) -> str:
    return "renormalised" if bool(renormalize) else "deleted"


def one(column: str) -> Callable:
    def value(rows: pd.DataFrame) -> str | None:
        return text(rows[column].iloc[0]) if len(rows) == 1 else None
    value.single = True
    return value


def reduced(column: str, how: str) -> Callable:
    """A stated reduction over the rows a cell names (its caption says over what)."""
    def value(rows: pd.DataFrame) -> str | None:
        if not len(rows):
            return None
        x = rows[column]
        return text({"mean": x.mean, "median": x.median, "sum": x.sum,
                     "nunique": x.nunique, "first": lambda: x.iloc[0],
                     "count": lambda: len(x)}[how]())
    return value


def ci_text(rows: pd.DataFrame) -> str | None:
    if len(rows) != 1:
        return None
    r = rows.iloc[0]
    if not (np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"])):
        return fmt(r["mean"])
    return f"{fmt(r['mean'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"


ci_text.single = True


# --------------------------------------------------------------------------- table checks


@dataclass
class Cells:
    """A shown table whose cells are rows (or stated reductions) of one source table.

    ``labels``: shown row-label name -> (source column, how a source value is shown,
    ``None``: as itself). ``columns(header)`` -> (source filter as {column: value},
    value function) or ``None`` for a header this check does not read. ``where(df,
    match)``: the setting the caption states. ``complete(df)``: the headers that must
    be shown. ``unmeasured(df)``: headers that must read ``not measured``.
    """

    caption: str
    source: str
    labels: dict[str, tuple[str, Callable | None]]
    columns: Callable[[str], tuple[dict, Callable] | None]
    where: Callable = lambda df, m: df
    complete: Callable | None = None
    unmeasured: Callable | None = None
    every_key: tuple[str, ...] = ()  # source key combinations that must each be a row


@dataclass
class Problems:
    lines: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=lambda: {"cells": 0, "unread": [], "tables": 0,
                                                  "findings": 0})

    def add(self, line: str) -> None:
        self.lines.append(line)


def select(df: pd.DataFrame, wanted: dict) -> pd.DataFrame:
    """The rows of ``df`` whose columns hold the wanted values (numbers as numbers, text
    as shown); none where a column is missing."""
    for column, want in wanted.items():
        if column not in df.columns:
            return df.iloc[0:0]
        df = df[[same(str(want), v) if isinstance(want, str) else close(v, want)
                 for v in df[column]]]
    return df


def close(a, b) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return a == b


def check_cells(spec: Cells, shown: ShownTable, match, tables: dict, out: Problems) -> None:
    name = f"table {shown.caption[:60]!r}"
    src = tables.get(spec.source)
    if src is None:
        out.add(f"{name}: no source table {spec.source}")
        return
    src = spec.where(src, match)
    for label in shown.index:
        if label and label not in spec.labels:
            out.add(f"{name}: row label {label!r} is not a key of {spec.source}")
            return
    if spec.complete is not None:
        missing = sorted(set(spec.complete(src)) - set(shown.columns), key=str)
        if missing:
            out.add(f"{name}: columns {missing} of {spec.source} are not shown")
    gone = set(spec.unmeasured(src)) if spec.unmeasured is not None else set()
    for header in gone:
        if not re.search(rf"{re.escape(header)}: not measured: ", shown.caption):
            out.add(f"{name}: caption does not say why {header} is not measured")
    seen = set()
    for labels, cells in shown.rows:
        key = {}
        for label_name, label in zip(shown.index, labels, strict=True):
            column, how = spec.labels[label_name]
            key[column] = (label, how)
        rows = src
        for column, (label, how) in key.items():
            if how is None:
                rows = rows[[same(label, v) for v in rows[column]]]
            else:
                rows = rows[[how(v) == label for v in rows[column]]]
        if spec.every_key:
            seen |= set(map(tuple, rows[list(spec.every_key)].drop_duplicates()
                            .astype(str).itertuples(index=False)))
        for header, cell in zip(shown.columns, cells, strict=True):
            if header in gone:
                if cell != "not measured":
                    out.add(f"{name}: {header} at {labels} reads {cell!r}, not "
                            "'not measured' (no head has a value)")
                continue
            got = spec.columns(header)
            if got is None:
                if header not in out.counts["unread"]:
                    out.counts["unread"].append(header)
                continue
            out.counts["cells"] += 1
            wanted, value = got
            sub = select(rows, wanted)
            if getattr(value, "single", False) and len(sub) != 1:
                out.add(f"{name}: row {labels} column {header!r} names {len(sub)} rows of "
                        f"{spec.source} (a cell must be one setting)")
                continue
            expected = value(sub)
            if expected is None or expected != cell:
                out.add(f"{name}: row {labels} column {header!r} shows {cell!r}, the "
                        f"source gives {expected!r}")
    if spec.every_key:
        every = set(map(tuple, src[list(spec.every_key)].drop_duplicates().astype(str)
                        .itertuples(index=False)))
        if every - seen:
            out.add(f"{name}: settings {sorted(every - seen)} of {spec.source} have no row")


# --------------------------------------------------------------------------- finding checks


@dataclass
class Sentence:
    """A finding: ``pattern`` (a full-sentence regex naming its setting) and ``check(m,
    tables)`` -> problems; ``cover(tables)`` -> the settings that each need a sentence
    (matched against ``key(m)``)."""

    pattern: str
    check: Callable
    cover: Callable | None = None
    key: Callable | None = None


def check_findings(checks: list[Sentence], findings: list[str], tables: dict,
                   out: Problems) -> None:
    covered: dict[int, set] = {i: set() for i in range(len(checks))}
    for sentence in findings:
        for i, c in enumerate(checks):
            m = re.fullmatch(c.pattern, sentence)
            if m:
                out.counts["findings"] += 1
                for line in c.check(m, tables):
                    out.add(f"finding {sentence[:70]!r}: {line}")
                if c.key is not None:
                    covered[i].add(c.key(m))
                break
        else:
            out.add(f"finding {sentence[:80]!r}: no check knows this sentence (does it "
                    "name its setting?)")
    for i, c in enumerate(checks):
        if c.cover is not None:
            missing = set(c.cover(tables)) - covered[i]
            if missing:
                out.add(f"findings: no sentence for {sorted(missing, key=str)} "
                        f"({c.pattern[:40]!r})")


def expect(label: str, shown: str, value) -> list[str]:
    """A problem where the shown number is not the recomputed one."""
    want = text(value) if value is not None else None
    return [] if want == shown else [f"{label} shows {shown!r}, the source gives {want!r}"]


# --------------------------------------------------------------------------- the check


SKIPPED = ("", "#table-list", "#run-list", "Runs")  # lists of files and runs, no numbers


def check_report(report: Report, tables: dict, checks, sentences=(), counts=None
                 ) -> list[str]:
    """Every key table of ``report`` against the first check whose caption matches
    (``Cells``, or a callable ``(shown, tables, problems)`` under ``.caption``), every
    finding against ``sentences``; a table no check knows is a problem too. ``counts``
    (a dict) receives how many tables, cells and findings were recomputed and the
    headers no check reads (``unread``)."""
    out = Problems()
    for shown in report.tables:
        if shown.caption in SKIPPED:
            continue
        for spec in checks:
            m = re.search(spec.caption, shown.caption)
            if m:
                if isinstance(spec, Cells):
                    check_cells(spec, shown, m, tables, out)
                else:
                    spec.check(shown, tables, out)
                    out.counts["cells"] += sum(len(c) for _, c in shown.rows)
                out.counts["tables"] += 1
                break
        else:
            out.add(f"table {shown.caption[:70]!r}: no check knows this table")
    check_findings(list(sentences), report.findings, tables, out)
    if counts is not None:
        counts.update(out.counts)
    return out.lines
