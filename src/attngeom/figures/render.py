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
from attngeom.figures.bounds import fig_bounds
from attngeom.figures.interventions import fig_head_scan, fig_pruning, fig_restrict
from attngeom.figures.runtables import RunTables, load_run
from attngeom.figures.separability import (
    fig_sink_variant,
    fig_topn_by_layer,
    fig_topn_curves,
    summary_from_metrics,
)
from attngeom.figures.sink import fig_sink_cosine, fig_sink_norm_ratio, fig_sink_split
from attngeom.figures.taxonomy import fig_regime_map, fig_regime_shares, fig_source_fractions

METRICS = ("precision", "recall", "f_score")


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

    >>> render_all("runs/demo", "runs/demo/figures")  # doctest: +SKIP
    [PosixPath('runs/demo/figures/topn_model.png'), ...]
    """
    result = render_figures(load_run(run_dir), out_dir)
    return [path for figure in result.figures for path in figure.files]


def render_figures(run: RunTables, out_dir, formats=("png", "pdf")) -> RenderResult:
    """Draw and save the figures of a loaded run (see ``render_all``)."""
    out_dir = Path(out_dir)
    figures: list[RenderedFigure] = []
    notes: list[str] = []
    summary = run.get("summary")
    if summary is None and run.get("metrics") is not None:
        summary = summary_from_metrics(run.get("metrics"))
        notes.append("summary.parquet is absent: separability curves are window means "
                     "from metrics.parquet, without bootstrap intervals")
    groups = _groups(run)
    for model, corpus in groups:
        suffix = "" if len(groups) == 1 else f"__{_slug(model)}__{_slug(corpus)}"
        where = f" ({model}, {corpus})" if len(groups) > 1 else ""
        for plan in _plans(run, summary, model, corpus):
            name, section, title, caption, tables, draw = plan
            figure = RenderedFigure(name=name + suffix, section=section, title=title + where,
                                    caption=caption, tables=tables)
            try:
                with style.context():
                    fig = draw()
                    figure.files = style.save(fig, out_dir, figure.name, formats)
            except ConfigError as exc:
                notes.append(f"figure {figure.name} not drawn: {exc}")
                continue
            figures.append(figure)
    return RenderResult(figures=figures, notes=notes)


def _shared_legend(fig, drawn) -> None:
    """One legend above a multi-panel figure, from the panel with the most labelled artists."""
    handles, labels = max((d.ax.get_legend_handles_labels() for d in drawn),
                          key=lambda hl: len(hl[0]))
    if handles:
        chars = sum(len(label) for label in labels)
        ncols = len(handles) if chars <= 80 else (len(handles) + 1) // 2
        fig.legend(handles, labels, loc="outside upper center", ncols=max(1, ncols))


def _groups(run: RunTables) -> list[tuple[str, str]]:
    pairs: set[tuple[str, str]] = set()
    for df in run.tables.values():
        if len(df) and {"model", "corpus"} <= set(df.columns):
            pairs |= set(map(tuple, df[["model", "corpus"]].drop_duplicates().astype(str)
                             .itertuples(index=False)))
    return sorted(pairs)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(text)).strip("-")[:40] or "x"


def _only(df, model, corpus):
    if df is None:
        return None
    out = df[(df["model"].astype(str) == model) & (df["corpus"].astype(str) == corpus)]
    return out if len(out) else None


def _first_nontrivial_n(summary) -> int | None:
    rows = summary[(summary["distance"] == "euclidean") & ~summary["trivial"].astype(bool)]
    if rows.empty:
        rows = summary[~summary["trivial"].astype(bool)]
    return int(rows["n"].min()) if len(rows) else None


def _representative_layers(layers, k: int = 4) -> list[int]:
    layers = sorted(set(int(x) for x in layers))
    if len(layers) <= k:
        return layers
    picks = [layers[round(i * (len(layers) - 1) / (k - 1))] for i in range(k)]
    return sorted(set(picks))


def _plans(run: RunTables, summary, model: str, corpus: str):
    """(name, section, title, caption, tables, draw) for each figure this group supports."""
    summary = _only(summary, model, corpus)
    sink = _only(run.get("sink"), model, corpus)
    taxonomy = _only(run.get("taxonomy"), model, corpus)
    bounds = _only(run.get("bounds"), model, corpus)
    metrics = _only(run.get("metrics"), model, corpus)
    pruning = _only(run.get("pruning"), model, corpus)
    head_scan = _only(run.get("head_scan"), model, corpus)
    restrict = _only(run.get("restrict"), model, corpus)
    nstar = _only(run.get("restrict_nstar"), model, corpus)
    sel = {"model": model, "corpus": corpus}
    summary_src = ("summary",) if run.get("summary") is not None else ("metrics",)
    plans = []

    if summary is not None:
        def topn_model():
            fig, axes = style.new_figure(style.PAGE_WIDTH, style.PANEL_HEIGHT, ncols=3)
            drawn = [fig_topn_curves(summary, metric=metric, ax=ax, legend=False, **sel)
                     for ax, metric in zip(axes, METRICS, strict=True)]
            _shared_legend(fig, drawn)
            return fig

        plans.append((
            "topn_model", "separability", "Top-N separability, whole model",
            "Precision, recall and F-score of the top-N set against N for attention-selected, "
            "contribution-ranked (where run) and random sets; mean over windows of the "
            "model-wide mean, band = 95% window-bootstrap interval; hollow markers are the "
            "trivial Euclidean N = 1.", summary_src, topn_model))

        layer_rows = summary[summary["scope"] == "layer"]
        n_pick = _first_nontrivial_n(layer_rows) if len(layer_rows) else None
        if n_pick is not None:
            def topn_by_layer():
                fig, axes = style.new_figure(style.PAGE_WIDTH, style.PANEL_HEIGHT, ncols=3)
                drawn = [fig_topn_by_layer(summary, n=n_pick, metric=metric, ax=ax,
                                           legend=False, **sel)
                         for ax, metric in zip(axes, METRICS, strict=True)]
                _shared_legend(fig, drawn)
                return fig

            plans.append((
                "topn_by_layer", "separability", f"Separability by layer depth at N = {n_pick}",
                f"P, R and F at N = {n_pick} (the smallest non-trivial N of the grid) for each "
                "layer, by selection rule; band = 95% window-bootstrap interval.",
                summary_src, topn_by_layer))

            depth_layers = _representative_layers(layer_rows["layer"])

            def topn_depth():
                fig, axes = style.new_figure(style.PAGE_WIDTH, 1.9 * len(METRICS),
                                             nrows=len(METRICS), ncols=len(depth_layers),
                                             sharex=True, sharey=True, squeeze=False)
                for r, metric in enumerate(METRICS):
                    for c, layer in enumerate(depth_layers):
                        ax = axes[r][c]
                        drawn = [fig_topn_curves(summary, metric=metric, layer=layer, ax=ax,
                                                 legend=False,
                                                 title=f"layer {layer}" if r == 0 else None,
                                                 **sel)]
                        if c:
                            ax.set_ylabel("")
                        if r < len(METRICS) - 1:
                            ax.set_xlabel("")
                _shared_legend(fig, drawn)
                return fig

            plans.append((
                "topn_depth", "separability", "Top-N curves at representative depths",
                "P (top row), R and F (bottom row) against N for layers "
                f"{', '.join(map(str, depth_layers))}: first, last and evenly spaced between.",
                summary_src, topn_depth))

    if sink is not None:
        def sink_maps():
            fig, axes = style.new_figure(style.PAGE_WIDTH, 2.6, ncols=2)
            fig_sink_norm_ratio(sink, ax=axes[0], **sel)
            fig_sink_cosine(sink, ax=axes[1], **sel)
            return fig

        plans.append((
            "sink_geometry", "sink", "Sink value norm and direction by layer and head",
            "Left: mean value norm of the non-sink tokens over the sink's value norm (log "
            "scale; above 1 means a compressed sink). Right: cosine of the sink's value with "
            "the mean non-sink value (blue = negative alignment).", ("sink",), sink_maps))

    has_variant = summary is not None and {"full", "no_sink"} <= set(summary["variant"]) and (
        (summary["scope"] == "model") & (summary["metric"] == "f_score")).any()
    if has_variant or sink is not None:
        def sink_effect():
            panels = int(has_variant) + int(sink is not None)
            fig, axes = style.new_figure(style.COLUMN_WIDTH * panels, style.PANEL_HEIGHT,
                                         ncols=panels, squeeze=False)
            i = 0
            if has_variant:
                fig_sink_variant(summary, ax=axes[0][i], **sel)
                i += 1
            if sink is not None:
                fig_sink_split(sink, ax=axes[0][i], **sel)
            return fig

        tables = (summary_src if has_variant else ()) + (("sink",) if sink is not None else ())
        plans.append((
            "sink_effect", "sink", "F-score with and without the sink",
            "F_N of the attention top-N set with the sink in the universe and with it "
            "excluded (bands: 95% bootstrap interval), and, from the sink table, split by "
            "whether the sink was among the selected tokens (mean over heads).",
            tables, sink_effect))

    if taxonomy is not None:
        def regimes():
            fig, axes = style.new_figure(style.PAGE_WIDTH, 2.6, ncols=2)
            drawn = fig_regime_map(taxonomy, ax=axes[0], legend=False, **sel)
            shares = fig_regime_shares(taxonomy, ax=axes[1], legend=False, **sel)
            handles, _ = axes[1].get_legend_handles_labels()
            if drawn.data["unstable"]:
                from matplotlib.patches import Patch

                handles.append(Patch(facecolor="white", edgecolor="0.25", hatch="////",
                                     label="unstable label (< 0.8)"))
            shares.legend = axes[1].legend(handles=handles, loc="upper left",
                                           bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
            return fig

        plans.append((
            "regimes", "taxonomy", "Head regimes",
            "Left: regime of every head by single-source plurality (Retriever: the current "
            "token wins most often; Mixer: the sink; Reset: no single privileged source); "
            "hatched, faded cells are labels kept in fewer than 80% of window-bootstrap "
            "resamples. Right: share of heads in each regime by layer.", ("taxonomy",),
            regimes))

        def sources():
            fig, ax = style.new_figure(style.PAGE_WIDTH, 2.0)
            fig_source_fractions(taxonomy, ax=ax, **sel)
            return fig

        plans.append((
            "source_fractions", "taxonomy", "Source winners per head",
            "For each head, the share of analysed queries whose largest contribution "
            "alpha * ||v|| comes from the token itself (self), the sink, or another token.",
            ("taxonomy",), sources))

    if bounds is not None:
        def bounds_fig():
            fig, axes = style.new_figure(style.PAGE_WIDTH, style.PANEL_HEIGHT, ncols=3)
            drawn = [fig_bounds(bounds, metrics, metric=metric, ax=ax, legend=False, **sel)
                     for ax, metric in zip(axes, METRICS, strict=True)]
            _shared_legend(fig, drawn)
            return fig

        plans.append((
            "bounds", "bounds", "Measured separability against certified bounds",
            "Measured P, R and F of the attention top-N set (mean over heads, band = "
            "interquartile range over heads) beside the certified lower bounds "
            "(where computed) and the fitted constant-norm envelope.",
            ("bounds",) + (("metrics",) if metrics is not None else ()), bounds_fig))

    if pruning is not None:
        def pruning_fig():
            fig, ax = style.new_figure(style.COLUMN_WIDTH, 2.6)
            fig_pruning(pruning, ax=ax, **sel)
            return fig

        plans.append((
            "pruning", "interventions", "Head pruning by ranker",
            "Held-out perplexity against the fraction of heads kept, for each ranker; the "
            "band spans the seeds of seeded rankers (min to max).", ("pruning",), pruning_fig))

    if head_scan is not None:
        def scan_fig():
            fig, ax = style.new_figure(style.COLUMN_WIDTH, 2.8)
            fig_head_scan(head_scan, ax=ax, **sel)
            return fig

        plans.append((
            "head_scan", "interventions", "Single-head removal scan",
            "Relative change in NLL when each head alone is removed (symmetric log colour "
            "scale); crosses mark heads above the critical threshold.", ("head_scan",),
            scan_fig))

    if restrict is not None:
        def restrict_fig():
            fig, ax = style.new_figure(style.COLUMN_WIDTH, 2.6)
            fig_restrict(restrict, nstar, ax=ax, **sel)
            return fig

        plans.append((
            "restrict", "interventions", "Top-N restriction of attention",
            "Relative change in NLL when every query keeps only its N largest attention "
            "entries, with and without renormalisation; diamonds mark the effective set size "
            "N*_tau at height tau.",
            ("restrict",) + (("restrict_nstar",) if nstar is not None else ()), restrict_fig))
    return plans
