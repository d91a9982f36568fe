"""Draw every figure a run directory's tables support, as PNG and PDF.

``render_all(run_dir, out_dir)`` is the entry point; ``render_figures`` returns the
same figures with their titles and captions, for the report. A figure whose
tables are absent is not drawn; one whose tables hold no usable rows (say, a
summary without model-scope rows) is skipped with a note instead of failing the
whole run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from attngeom.errors import ConfigError
from attngeom.figures import style
from attngeom.figures.catalog import CATALOG, Group
from attngeom.figures.runtables import RunTables, load_run
from attngeom.figures.separability import summary_from_metrics


@dataclass
class RenderedFigure:
    """One saved figure: a stable ``name``, what it shows, and its files."""

    name: str
    section: str
    title: str
    caption: str
    tables: tuple[str, ...]
    files: list[Path] = field(default_factory=list)

    @property
    def png(self) -> Path:
        return next(p for p in self.files if p.suffix == ".png")


@dataclass
class RenderResult:
    figures: list[RenderedFigure]
    notes: list[str]


def render_all(run_dir, out_dir) -> list[Path]:
    """Draw every figure the run's tables support into ``out_dir``; return the files.

    Each figure is written as ``<name>.png`` and ``<name>.pdf``.

    ``render_all("runs/demo/tinystories", "figures")`` returns
    ``[PosixPath('figures/topn_model.png'), PosixPath('figures/topn_model.pdf'), ...]``.
    """
    result = render_figures(load_run(run_dir), out_dir)
    return [path for figure in result.figures for path in figure.files]


def render_figures(run: RunTables, out_dir, formats=("png", "pdf")) -> RenderResult:
    """Draw and save every catalogue figure each (model, corpus) of a run supports."""
    out_dir = Path(out_dir)
    figures: list[RenderedFigure] = []
    notes: list[str] = []
    summary = run.get("summary")
    source = ("summary",)
    if summary is None and run.get("metrics") is not None:
        summary = summary_from_metrics(run.get("metrics"))
        source = ("metrics",)
        notes.append("summary.parquet is absent: separability curves are window means "
                     "from metrics.parquet, without bootstrap intervals")
    groups = run.groups()
    for model, corpus in groups:
        suffix = "" if len(groups) == 1 else f"__{_slug(model)}__{_slug(corpus)}"
        where = f" ({model}, {corpus})" if len(groups) > 1 else ""
        tables = {name: _only(df, model, corpus) for name, df in run.tables.items()}
        tables["summary"] = _only(summary, model, corpus)
        group = Group(model, corpus, {k: v for k, v in tables.items() if v is not None},
                      source)
        for spec in CATALOG.values():
            plot = spec.make(group)
            if plot is None:
                continue
            figure = RenderedFigure(name=spec.name + suffix, section=spec.section,
                                    title=plot.title + where, caption=plot.caption,
                                    tables=plot.tables)
            try:
                with style.context():
                    figure.files = style.save(plot.draw(), out_dir, figure.name, formats)
            except ConfigError as exc:
                notes.append(f"figure {figure.name} not drawn: {exc}")
                continue
            figures.append(figure)
    return RenderResult(figures=figures, notes=notes)




def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-")[:40] or "x"


def _only(df, model, corpus):
    if df is None or not len(df):
        return None
    if not {"model", "corpus"} <= set(df.columns):
        return df
    out = df[(df["model"].astype(str) == model) & (df["corpus"].astype(str) == corpus)]
    return out if len(out) else None
