"""The catalogue of run figures: one registered function per figure (the report's order).

Each ``@figure(name, section)`` function receives a ``Group`` (one model and corpus of
a run, its tables) and returns a ``Plot`` (title, caption, the tables it reads and a
``draw()`` that makes the matplotlib figure) or ``None`` when the group lacks what
the figure needs. ``render.render_figures`` draws the catalogue in order. Adding a
figure is one function here (``docs/extending.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attngeom.figures import style
from attngeom.figures.atlas import fig_atlas_contingency, fig_atlas_depth, unmeasured_types
from attngeom.figures.bounds import fig_bounds
from attngeom.figures.competition import (
    fig_nstar_vs_length,
    fig_support_recall_map,
    fig_support_vs_background,
)
from attngeom.figures.interventions import (
    fig_head_scan,
    fig_pruning,
    fig_restrict,
    fig_restrict_heads,
    fig_restrict_layers,
)
from attngeom.figures.policies import fig_policy_nstar
from attngeom.figures.separability import fig_sink_variant, fig_topn_by_layer, fig_topn_curves
from attngeom.figures.sink import fig_sink_cosine, fig_sink_norm_ratio, fig_sink_split
from attngeom.figures.taxonomy import fig_regime_map, fig_regime_shares, fig_source_fractions
from attngeom.names import (
    MIXER,
    ORACLE,
    RANKINGS,
    RESET,
    RETRIEVER,
    SEPARABILITY,
    STABLE,
    VARIANTS,
)
from attngeom.registry import Registry


@dataclass
class Group:
    """The tables of one (model, corpus) of a run; a missing table is ``None``."""

    model: str
    corpus: str
    tables: dict
    summary_source: tuple[str, ...]  # ("summary",), or ("metrics",) when it is rebuilt

    def get(self, name: str):
        return self.tables.get(name)

    @property
    def sel(self) -> dict:
        return {"model": self.model, "corpus": self.corpus}


@dataclass
class Plot:
    title: str
    caption: str
    tables: tuple[str, ...]
    draw: Callable


@dataclass(frozen=True)
class FigureSpec:
    name: str
    section: str
    make: Callable[[Group], Plot | None]


# the run figures in report order (``FigureSpec`` entries)
CATALOG: Registry[FigureSpec] = Registry("figure", option="figures")


def figure(name: str, section: str):
    """Register ``make(group) -> Plot | None`` as figure ``name`` of report ``section``."""

    def register(make):
        CATALOG.register(name, FigureSpec(name, section, make))
        return make

    return register


def _shared_legend(fig, drawn) -> None:
    """One legend above a multi-panel figure, from the panel with the most labelled artists."""
    handles, labels = max((d.ax.get_legend_handles_labels() for d in drawn),
                          key=lambda hl: len(hl[0]))
    if handles:
        chars = sum(len(label) for label in labels)
        ncols = len(handles) if chars <= 80 else (len(handles) + 1) // 2
        fig.legend(handles, labels, loc="outside upper center", ncols=max(1, ncols))


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


def _three_panels(draw_one):
    """A page-wide figure with one panel per separability metric and one legend."""
    fig, axes = style.new_figure(style.PAGE_WIDTH, style.PANEL_HEIGHT, ncols=3)
    drawn = [draw_one(metric, ax) for ax, metric in zip(axes, SEPARABILITY, strict=True)]
    _shared_legend(fig, drawn)
    return fig


# --------------------------------------------------------------------------- separability


@figure("topn_model", "separability")
def topn_model(g: Group):
    summary = g.get("summary")
    if summary is None:
        return None
    return Plot(
        "Top-N separability, whole model",
        "Precision, recall and F-score of the top-N set against N for attention-selected, "
        "contribution-ranked (where run) and random sets; mean over windows of the "
        "model-wide mean, band = 95% window-bootstrap interval; hollow markers are the "
        "trivial Euclidean N = 1.", g.summary_source,
        lambda: _three_panels(lambda metric, ax: fig_topn_curves(
            summary, metric=metric, ax=ax, legend=False, **g.sel)))


def _layer_rows(g: Group):
    summary = g.get("summary")
    if summary is None:
        return None, None
    rows = summary[summary["scope"] == "layer"]
    n_pick = _first_nontrivial_n(rows) if len(rows) else None
    return rows, n_pick


@figure("topn_by_layer", "separability")
def topn_by_layer(g: Group):
    rows, n_pick = _layer_rows(g)
    if n_pick is None:
        return None
    summary = g.get("summary")
    return Plot(
        f"Separability by layer depth at N = {n_pick}",
        f"P, R and F at N = {n_pick} (the smallest non-trivial N of the grid) for each "
        "layer, by selection rule; band = 95% window-bootstrap interval.", g.summary_source,
        lambda: _three_panels(lambda metric, ax: fig_topn_by_layer(
            summary, n=n_pick, metric=metric, ax=ax, legend=False, **g.sel)))


@figure("topn_depth", "separability")
def topn_depth(g: Group):
    rows, n_pick = _layer_rows(g)
    if n_pick is None:
        return None
    summary = g.get("summary")
    depth_layers = _representative_layers(rows["layer"])

    def draw():
        fig, axes = style.new_figure(style.PAGE_WIDTH, 1.9 * len(SEPARABILITY),
                                     nrows=len(SEPARABILITY), ncols=len(depth_layers),
                                     sharex=True, sharey=True, squeeze=False)
        drawn = []
        for r, metric in enumerate(SEPARABILITY):
            for c, layer in enumerate(depth_layers):
                ax = axes[r][c]
                drawn = [fig_topn_curves(summary, metric=metric, layer=layer, ax=ax,
                                         legend=False, title=f"layer {layer}" if r == 0 else None,
                                         **g.sel)]
                if c:
                    ax.set_ylabel("")
                if r < len(SEPARABILITY) - 1:
                    ax.set_xlabel("")
        _shared_legend(fig, drawn)
        return fig

    return Plot(
        "Top-N curves at representative depths",
        "P (top row), R and F (bottom row) against N for layers "
        f"{', '.join(map(str, depth_layers))}: first, last and evenly spaced between.",
        g.summary_source, draw)


# --------------------------------------------------------------------------- sink


@figure("sink_geometry", "sink")
def sink_geometry(g: Group):
    sink = g.get("sink")
    if sink is None:
        return None

    def draw():
        fig, axes = style.new_figure(style.PAGE_WIDTH, 2.6, ncols=2)
        fig_sink_norm_ratio(sink, ax=axes[0], **g.sel)
        fig_sink_cosine(sink, ax=axes[1], **g.sel)
        return fig

    return Plot(
        "Sink value norm and direction by layer and head",
        "Left: mean value norm of the non-sink tokens over the sink's value norm (log "
        "scale; above 1 means a compressed sink). Right: cosine of the sink's value with "
        "the mean non-sink value (blue = negative alignment).", ("sink",), draw)


@figure("sink_effect", "sink")
def sink_effect(g: Group):
    summary, sink = g.get("summary"), g.get("sink")
    has_variant = summary is not None and set(VARIANTS) <= set(summary["variant"]) and (
        (summary["scope"] == "model") & (summary["metric"] == "f_score")).any()
    if not has_variant and sink is None:
        return None

    def draw():
        panels = int(has_variant) + int(sink is not None)
        fig, axes = style.new_figure(style.COLUMN_WIDTH * panels, style.PANEL_HEIGHT,
                                     ncols=panels, squeeze=False)
        i = 0
        if has_variant:
            fig_sink_variant(summary, ax=axes[0][i], **g.sel)
            i += 1
        if sink is not None:
            fig_sink_split(sink, ax=axes[0][i], **g.sel)
        return fig

    tables = (g.summary_source if has_variant else ()) + (("sink",) if sink is not None else ())
    return Plot(
        "F-score with and without the sink",
        "F_N of the attention top-N set with the sink in the universe and with it "
        "excluded (bands: 95% bootstrap interval), and, from the sink table, split by "
        "whether the sink was among the selected tokens (mean over heads).", tables, draw)


# --------------------------------------------------------------------------- taxonomy


@figure("regimes", "taxonomy")
def regimes(g: Group):
    taxonomy = g.get("taxonomy")
    if taxonomy is None:
        return None

    def draw():
        from matplotlib.patches import Patch

        fig, axes = style.new_figure(style.PAGE_WIDTH, 2.6, ncols=2)
        drawn = fig_regime_map(taxonomy, ax=axes[0], legend=False, **g.sel)
        shares = fig_regime_shares(taxonomy, ax=axes[1], legend=False, **g.sel)
        handles, _ = axes[1].get_legend_handles_labels()
        if drawn.data["unstable"]:
            handles.append(Patch(facecolor="white", edgecolor="0.25", hatch="////",
                                 label=f"unstable label (< {STABLE:g})"))
        shares.legend = axes[1].legend(handles=handles, loc="upper left",
                                       bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        return fig

    return Plot(
        "Head regimes",
        f"Left: regime of every head by single-source plurality ({RETRIEVER}: the current "
        f"token wins most often; {MIXER}: the sink; {RESET}: no single privileged source); "
        f"hatched, faded cells are labels kept in fewer than {STABLE:.0%} of window-bootstrap "
        "resamples. Right: share of heads in each regime by layer.", ("taxonomy",), draw)


@figure("source_fractions", "taxonomy")
def source_fractions(g: Group):
    taxonomy = g.get("taxonomy")
    if taxonomy is None:
        return None

    def draw():
        fig, ax = style.new_figure(style.PAGE_WIDTH, 2.0)
        fig_source_fractions(taxonomy, ax=ax, **g.sel)
        return fig

    return Plot(
        "Source winners per head",
        "For each head, the share of counted queries whose largest contribution "
        "alpha * ||v|| comes from the token itself (self), the sink, or another token.",
        ("taxonomy",), draw)


# --------------------------------------------------------------------------- bounds


@figure("bounds", "bounds")
def bounds(g: Group):
    table, metrics = g.get("bounds"), g.get("metrics")
    if table is None:
        return None
    return Plot(
        "Measured separability against certified bounds",
        "Measured P, R and F of the attention top-N set (mean over heads, band = "
        "interquartile range over heads) beside the certified lower bounds "
        "(where computed) and the fitted constant-norm envelope.",
        ("bounds",) + (("metrics",) if metrics is not None else ()),
        lambda: _three_panels(lambda metric, ax: fig_bounds(
            table, metrics, metric=metric, ax=ax, legend=False, **g.sel)))


# --------------------------------------------------------------------------- interventions


def _single(fig_fn, width, height, *args, **kwargs):
    def draw():
        fig, ax = style.new_figure(width, height)
        fig_fn(*args, ax=ax, **kwargs)
        return fig

    return draw


@figure("pruning", "interventions")
def pruning(g: Group):
    table = g.get("pruning")
    if table is None:
        return None
    return Plot(
        "Head pruning by ranker",
        "Held-out perplexity against the fraction of heads kept, for each ranker; the "
        "band spans the seeds of seeded rankers (min to max).", ("pruning",),
        _single(fig_pruning, style.COLUMN_WIDTH, 2.6, table, **g.sel))


@figure("head_scan", "interventions")
def head_scan(g: Group):
    table = g.get("head_scan")
    if table is None:
        return None
    return Plot(
        "Single-head removal scan",
        "Relative change in NLL when each head alone is removed (symmetric log colour "
        "scale); crosses mark heads above the critical threshold.", ("head_scan",),
        _single(fig_head_scan, style.COLUMN_WIDTH, 2.8, table, **g.sel))


@figure("restrict", "interventions")
def restrict(g: Group):
    table, nstar = g.get("restrict"), g.get("restrict_nstar")
    if table is None:
        return None
    rankings = (list(dict.fromkeys(table["ranking"].astype(str)))
                if "ranking" in table.columns else ["attention"])
    order = RANKINGS.names()
    rankings = sorted(rankings, key=lambda r: (order.index(r) if r in order else 99, r))

    def draw():
        fig, axes = style.new_figure(style.COLUMN_WIDTH * len(rankings), 2.6,
                                     ncols=len(rankings), squeeze=False)
        for ax, ranking in zip(axes[0], rankings, strict=True):
            fig_restrict(table, nstar, ranking=ranking if len(rankings) > 1 else None,
                         ax=ax, **g.sel)
            ax.set_title(f"top-N by {ranking}", fontsize="small")
        return fig

    return Plot(
        "Top-N restriction of attention",
        "Relative change in NLL when every query keeps only its N highest-ranked keys, one "
        "panel per ranking (attention weight, contribution alpha ||v||, a seeded random "
        "order, or the keys a sparse-attention policy keeps), deleted (the rest set to zero) "
        "or renormalised; diamonds mark the "
        "effective set size N*_tau at height tau.",
        ("restrict",) + (("restrict_nstar",) if nstar is not None else ()), draw)


@figure("policy_nstar", "policies")
def policy_nstar(g: Group):
    nstar = g.get("restrict_nstar")
    if nstar is None or "ranking" not in nstar.columns:
        return None
    model_rows = nstar[nstar["scope"] == "model"]
    if model_rows["ranking"].nunique() < 2 or ORACLE not in set(model_rows["ranking"]):
        return None
    return Plot(
        "Each ranking's N* beside the oracle's",
        "Whole-model effective set size N*_tau of every ranking (the sparse-attention "
        "policies and the scores) with its document-bootstrap interval, one marker per "
        "tau; the dashed line of the same colour is the attention oracle's N*_tau (the "
        "top-N keys by probability). Log scale.", ("restrict_nstar",),
        _single(fig_policy_nstar, style.COLUMN_WIDTH * 1.2, 2.6, model_rows, **g.sel))


@figure("restrict_local", "local_restriction")
def restrict_local(g: Group):
    table = g.get("restrict_local")
    if table is None:
        return None
    heads = bool((table["scope"] == "head").any())

    def draw():
        fig, axes = style.new_figure(style.COLUMN_WIDTH * (2 if heads else 1), 2.6,
                                     ncols=2 if heads else 1, squeeze=False)
        fig_restrict_layers(table, ax=axes[0][0], **g.sel)
        if heads:
            fig_restrict_heads(table, ax=axes[0][1], **g.sel)
        return fig

    return Plot(
        "Localised top-N restriction",
        "Mean over windows of each window's relative NLL increase when only one layer "
        "(bars; dark: the layers whose heads were scanned) or only one head (map) keeps "
        "its top-N keys; attention ranking and deletion where the run has them.",
        ("restrict_local",), draw)


# --------------------------------------------------------------------------- issue 31-32


@figure("atlas_contingency", "atlas")
def atlas_contingency(g: Group):
    table = g.get("atlas_contingency")
    if table is None or not len(table):
        return None
    missing = unmeasured_types(g.get("head_scores"))
    return Plot(
        "Head types by regime",
        "Share of each regime's heads that are of each head type (the field's "
        "previous-token, duplicate-token, induction, echo, sink, streaming and retrieval "
        "heads at their published thresholds), the number of heads in each cell; a head "
        "can be of several types or of none." + _unmeasured_words(missing),
        ("atlas_contingency",),
        _single(fig_atlas_contingency, style.COLUMN_WIDTH * 1.3, 2.6, table,
                exclude=missing))


def _unmeasured_words(missing) -> str:
    if not missing:
        return ""
    names = ", ".join(m.replace("_", "-") for m in missing)
    return f" Not drawn: {names} (no head could be scored; see the head-score table)."


@figure("atlas_depth", "atlas")
def atlas_depth(g: Group):
    table = g.get("atlas_depth")
    if table is None or not len(table):
        return None
    missing = unmeasured_types(g.get("head_scores"))
    return Plot(
        "Head types and regimes by depth",
        "Per layer, the share of heads of each head type (solid) and of each regime "
        "(dashed)." + _unmeasured_words(missing), ("atlas_depth",),
        _single(fig_atlas_depth, style.COLUMN_WIDTH * 1.3, 2.6, table, exclude=missing))


@figure("competition_nstar_length", "competition")
def competition_nstar_length(g: Group):
    table = g.get("context_nstar")
    if table is None or not len(table):
        return None

    def draw():
        scorings = [s for s in ("tail", "all") if s in set(table["scoring"])]
        fig, axes = style.new_figure(style.COLUMN_WIDTH * len(scorings), 2.6,
                                     ncols=len(scorings), squeeze=False)
        for ax, scoring in zip(axes[0], scorings, strict=True):
            fig_nstar_vs_length(table, scoring=scoring, ax=ax, **g.sel)
        return fig

    return Plot(
        "N* against the context length",
        "Effective set size N*_tau at each context length L of the nested windows "
        "(log-log; bars: document-bootstrap intervals), scoring the final targets "
        "shared by every L (tail) and every token (all).", ("context_nstar",), draw)


@figure("competition_support", "competition")
def competition_support(g: Group):
    table = g.get("qa_support_summary")
    if table is None or not len(table):
        return None
    stats = [s for s in ("mass", "displacement") if s in set(table["statistic"])]
    if not stats:
        return None

    def draw():
        fig, axes = style.new_figure(style.COLUMN_WIDTH * len(stats), 2.6, ncols=len(stats),
                                     squeeze=False)
        for ax, stat in zip(axes[0], stats, strict=True):
            fig_support_vs_background(table, statistic=stat, ax=ax, model=g.model)
        return fig

    return Plot(
        "Support under competition",
        "At the answer query of the qa probe: the attention mass on the supporting "
        "sentence and its displacement (non-support tokens ranked at or above a support "
        "token by attention weight) against the tokens of background text, over all, "
        "correctly and incorrectly answered episodes (mean over heads; bootstrap "
        "intervals over episodes).", ("qa_support_summary",), draw)


@figure("competition_recall_map", "competition")
def competition_recall_map(g: Group):
    table = g.get("qa_support")
    if table is None or not len(table):
        return None
    rows = table[table["statistic"] == "recall"]
    if rows.empty:
        return None
    backgrounds = sorted(int(b) for b in rows["background"].unique())
    shown = sorted({backgrounds[0], backgrounds[-1]})

    def draw():
        fig, axes = style.new_figure(style.COLUMN_WIDTH * len(shown), 2.6, ncols=len(shown),
                                     squeeze=False)
        for ax, background in zip(axes[0], shown, strict=True):
            fig_support_recall_map(table, background=background, ax=ax, model=g.model)
        return fig

    return Plot(
        "Support recall by layer and head",
        "Share of the supporting sentence's tokens among each head's top 64 keys by "
        "attention weight at the answer query (all episodes), with the least and the most "
        "background.", ("qa_support",), draw)
