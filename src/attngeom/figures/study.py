"""Figures of a study: the models side by side, from the combined tables.

Each function takes one combined table (``model`` and ``corpus`` columns) and draws
every (model, corpus) it holds on shared axes, so that the models read against each
other: the top-N curves overlaid, the sink's geometry by relative depth, the regime
shares with their stability, the pruning curves and the restriction curves.
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from attngeom.figures import style
from attngeom.figures.policies import fig_study_policy_types, fig_study_qa_budget
from attngeom.figures.style import Drawn, styled
from attngeom.names import REGIMES, STABLE

_DASHES = ("-", "--", ":", "-.")


def _groups(df):
    keys = df[["model", "corpus"]].drop_duplicates().itertuples(index=False)
    return [(str(m), str(c)) for m, c in keys]


def _styles(groups, models=None, corpora=None):
    """One colour per model, one line style per corpus; ``models`` / ``corpora`` (the
    study's order) keep a model's colour the same in every figure of a report."""
    models = list(dict.fromkeys([*(models or ()), *(m for m, _ in groups)]))
    corpora = list(dict.fromkeys([*(corpora or ()), *(c for _, c in groups)]))
    return {(m, c): (style.color_cycle(models.index(m)), _DASHES[corpora.index(c) % 4])
            for m, c in groups}


@styled
def fig_study_topn(summary, *, metric: str = "f_score", distance: str = "euclidean",
                   models=None, corpora=None) -> Drawn:
    """Whole-model F_N against N for every model and corpus (attention rule), with the
    random control of the same run as a thin grey line beneath it."""
    fig, ax = style.new_figure(style.COLUMN_WIDTH * 1.6, style.PANEL_HEIGHT * 1.3)
    rows = summary[(summary["scope"] == "model") & (summary["metric"] == metric)
                   & (summary["variant"] == "full") & (summary["distance"] == distance)]
    drawn = Drawn(ax=ax)
    groups = _groups(rows)
    looks = _styles(groups, models, corpora)
    for key in groups:
        g = rows[(rows["model"] == key[0]) & (rows["corpus"] == key[1])]
        color, dash = looks[key]
        att = g[g["rule"] == "attention"].sort_values("n")
        rnd = g[g["rule"] == "random"].sort_values("n")
        label = f"{key[0]} / {key[1]}"
        if len(att):
            (line,) = ax.plot(att["n"], att["mean"], color=color, linestyle=dash,
                              marker="o", label=label)
            ax.fill_between(att["n"], att["ci_low"], att["ci_high"], color=color, alpha=0.15,
                            linewidth=0)
            drawn.lines[label] = line
            drawn.data[label] = att[["n", "mean", "ci_low", "ci_high"]].reset_index(drop=True)
        if len(rnd):
            ax.plot(rnd["n"], rnd["mean"], color="0.6", linestyle=dash, linewidth=0.8)
    style.set_n_axis(ax, rows["n"].unique())
    ax.set_ylabel(style.METRIC_LABELS.get(metric, metric))
    if drawn.lines:
        drawn.legend = ax.legend(fontsize="small", loc="best")
    ax.set_title("attention rule (colour, 95% CI) vs random control (grey)", fontsize="small")
    return drawn


@styled
def fig_study_sink(sink, *, models=None, corpora=None) -> Drawn:
    """Median over heads of the sink's value-norm ratio and of its attention mass, by
    relative depth (layer / (layers - 1)), every model and corpus."""
    fig, (a, b) = style.new_figure(style.COLUMN_WIDTH * 2, style.PANEL_HEIGHT * 1.2, ncols=2)
    rows = sink[sink["n"] == sink["n"].min()] if "n" in sink.columns else sink
    drawn = Drawn(ax=a)
    groups = _groups(rows)
    looks = _styles(groups, models, corpora)
    for key in groups:
        g = rows[(rows["model"] == key[0]) & (rows["corpus"] == key[1])]
        per = g.groupby("layer")[["norm_ratio", "sink_mass"]].median().sort_index()
        depth = per.index.to_numpy() / max(per.index.max(), 1)
        color, dash = looks[key]
        label = f"{key[0]} / {key[1]}"
        (line,) = a.plot(depth, per["norm_ratio"], color=color, linestyle=dash, marker=".",
                         label=label)
        b.plot(depth, per["sink_mass"], color=color, linestyle=dash, marker=".")
        drawn.lines[label] = line
        drawn.data[label] = per.reset_index()
    a.set_yscale("log")
    style.plain_log_ticks(a.yaxis)
    a.axhline(1.0, color="0.5", linewidth=0.6)
    a.set_xlabel("relative depth")
    b.set_xlabel("relative depth")
    a.set_ylabel("median value-norm ratio (others / sink)")
    b.set_ylabel("median attention mass on the sink")
    b.set_ylim(0, 1)
    if drawn.lines:
        drawn.legend = b.legend(handles=list(drawn.lines.values()), fontsize="small",
                                loc="upper left")
    return drawn


@styled
def fig_study_regimes(taxonomy, *, stable: float = STABLE, models=None, corpora=None) -> Drawn:
    """Share of heads in each regime per model and corpus; the hatched part of a bar is
    the heads whose label stability is below ``stable``."""
    groups = _groups(taxonomy)
    fig, ax = style.new_figure(style.COLUMN_WIDTH * 1.6,
                               max(style.PANEL_HEIGHT, 0.45 * len(groups) + 0.9))
    drawn = Drawn(ax=ax)
    rows = []
    for i, (m, c) in enumerate(groups):
        g = taxonomy[(taxonomy["model"] == m) & (taxonomy["corpus"] == c)]
        total = max(len(g), 1)
        left = 0.0
        for regime in REGIMES:
            r = g[g["regime"] == regime]
            firm = float((r["stability"] >= stable).sum()) if "stability" in r else len(r)
            weak = len(r) - firm
            color = style.REGIME_COLORS[regime]
            ax.barh(i, firm / total, left=left, color=color, edgecolor="white")
            ax.barh(i, weak / total, left=left + firm / total, color=color, alpha=0.45,
                    hatch="////", edgecolor="0.3", linewidth=0)
            rows.append({"model": m, "corpus": c, "regime": regime, "share": len(r) / total,
                         "unstable_share": weak / total})
            left += len(r) / total
    ax.set_yticks(range(len(groups)), [f"{m} / {c}" for m, c in groups])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of heads")
    handles = [Patch(facecolor=style.REGIME_COLORS[r], label=r) for r in REGIMES]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="////",
                         label=f"stability < {stable:g}"))
    drawn.legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                             fontsize="small")
    import pandas as pd

    drawn.data["shares"] = pd.DataFrame(rows)
    drawn.bars = {f"{m} / {c}": None for m, c in groups}
    return drawn


@styled
def fig_study_pruning(pruning, *, models=None, corpora=None) -> Drawn:
    """Perplexity relative to the full model against the fraction of heads kept, one
    panel per model and corpus, one line per ranker (mean over seeds)."""
    groups = _groups(pruning)
    fig, axes = style.new_figure(style.COLUMN_WIDTH * min(len(groups), 3) * 0.9,
                                 style.PANEL_HEIGHT * 1.2, ncols=len(groups), squeeze=False)
    drawn = Drawn(ax=axes[0, 0])
    for ax, (m, c) in zip(axes[0], groups, strict=True):
        g = pruning[(pruning["model"] == m) & (pruning["corpus"] == c)]
        full = g[np.isclose(g["keep_fraction"], 1.0)]["perplexity"].mean()
        for i, (ranker, r) in enumerate(g.groupby("ranker", sort=True)):
            mean = r.groupby("keep_fraction")["perplexity"].mean().sort_index()
            (line,) = ax.plot(mean.index, mean / full, marker="o",
                              color=style.color_cycle(i), label=ranker)
            drawn.lines[f"{m} / {c} / {ranker}"] = line
        ax.set_yscale("log")
        style.plain_log_ticks(ax.yaxis)
        ax.invert_xaxis()
        ax.set_xlabel("fraction of heads kept")
        ax.set_title(f"{m} / {c}", fontsize="small")
    axes[0, 0].set_ylabel("perplexity / full model")
    drawn.legend = axes[0, -1].legend(fontsize="small", loc="best")
    return drawn


_RANKING_MARKERS = {"attention": "o", "contribution": "s", "random": "^"}


@styled
def fig_study_restrict(restrict, *, models=None, corpora=None) -> Drawn:
    """Whole-model top-N restriction: relative delta-NLL against N for every model and
    corpus, one line per ranking (marker: o attention, s contribution, ^ random), deleted
    (solid markers) and renormalised (open markers); every N the search tried."""
    fig, ax = style.new_figure(style.COLUMN_WIDTH * 1.6, style.PANEL_HEIGHT * 1.3)
    rows = restrict[restrict["scope"] == "model"]
    if "ranking" not in rows.columns:
        rows = rows.assign(ranking="attention")
    drawn = Drawn(ax=ax)
    groups = _groups(rows)
    looks = _styles(groups, models, corpora)
    for key in groups:
        color, dash = looks[key]
        for ranking in dict.fromkeys(rows["ranking"]):
            for renorm in (False, True):
                g = rows[(rows["model"] == key[0]) & (rows["corpus"] == key[1])
                         & (rows["ranking"] == ranking)
                         & (rows["renormalize"] == renorm)].sort_values("n")
                if not len(g):
                    continue
                label = (f"{key[0]} / {key[1]} / {ranking}"
                         + (" (renormalised)" if renorm else ""))
                (line,) = ax.plot(g["n"], g["delta_nll_rel"].clip(lower=1e-4), color=color,
                                  linestyle=dash, marker=_RANKING_MARKERS.get(ranking, "o"),
                                  markersize=3.5, markerfacecolor="white" if renorm else color,
                                  label=label)
                drawn.lines[label] = line
                drawn.data[label] = g[["n", "delta_nll_rel"]].reset_index(drop=True)
    style.set_n_axis(ax, rows["n"].unique())
    ax.set_yscale("log")
    style.plain_log_ticks(ax.yaxis)
    ax.set_ylabel("relative delta-NLL (floored at 1e-4)")
    if drawn.lines:
        drawn.legend = ax.legend(fontsize="x-small", loc="best")
    return drawn


@styled
def fig_study_table1(geometry_loss, *, models=None, corpora=None) -> Drawn:
    """The follow-up's Table 1 as bars: Spearman of F_N against relative delta-NLL (both
    averaged over the corpora), per model, for N >= 1, 2 and 8, one panel per distance,
    attention (solid) and contribution (hatched) rankings."""
    rows = geometry_loss
    if "averaged" in rows.columns and rows["averaged"].any():
        rows = rows[rows["averaged"].astype(bool)]
    distances = list(dict.fromkeys(rows["distance"]))
    fig, axes = style.new_figure(style.COLUMN_WIDTH * 1.1 * len(distances),
                                 style.PANEL_HEIGHT * 1.2, ncols=len(distances),
                                 squeeze=False)
    drawn = Drawn(ax=axes[0, 0])
    n_mins = sorted(int(x) for x in rows["n_min"].unique()) if "n_min" in rows else [1]
    labels = list(dict.fromkeys(f"{m} / {c}" for m, c in zip(rows["model"], rows["corpus"],
                                                            strict=True)))
    rankings = [r for r in ("attention", "contribution") if r in set(rows["rule"])]
    width = 0.8 / max(len(n_mins) * len(rankings), 1)
    for ax, distance in zip(axes[0], distances, strict=True):
        d = rows[rows["distance"] == distance]
        for j, (ranking, n_min) in enumerate((r, n) for r in rankings for n in n_mins):
            g = d[(d["rule"] == ranking) & (d.get("n_min", 1) == n_min)]
            ys = [g[(g["model"] + " / " + g["corpus"]) == lab]["spearman"].mean()
                  for lab in labels]
            xs = np.arange(len(labels)) + (j - (len(n_mins) * len(rankings) - 1) / 2) * width
            bars = ax.bar(xs, np.nan_to_num(ys), width, color=style.color_cycle(
                n_mins.index(n_min)), hatch="////" if ranking == "contribution" else None,
                edgecolor="0.3", linewidth=0.4, label=f"{ranking}, N >= {n_min}")
            drawn.data[f"{distance} / {ranking} / N >= {n_min}"] = ys
            drawn.lines[f"{distance} / {ranking} / N >= {n_min}"] = bars
        ax.axhline(0.0, color="0.5", linewidth=0.6)
        ax.set_ylim(-1.05, 1.05)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize="small")
        ax.set_title(distance, fontsize="small")
    axes[0, 0].set_ylabel("Spearman of F_N and delta-NLL over N")
    drawn.legend = axes[0, -1].legend(fontsize="x-small", loc="lower left")
    return drawn


STUDY_FIGURES = (
    # (id, title, table, function, caption)
    ("study-topn", "Top-N separability, models side by side", "summary", fig_study_topn,
     "Whole-model F_N of the attention-selected set against N, every model and corpus "
     "(colour: model; line style: corpus; band: 95% window-bootstrap interval); grey: "
     "the seeded random control of the same run."),
    ("study-sink", "Sink geometry by depth", "sink", fig_study_sink,
     "Left: median over heads of the value-norm ratio of the other tokens to the sink "
     "(above 1: the sink's value is small). Right: median attention mass on the sink."),
    ("study-regimes", "Head regimes and their stability", "taxonomy", fig_study_regimes,
     "Share of heads per regime; the hatched part of each bar is the heads whose label "
     "the window bootstrap does not keep (stability below 0.8)."),
    ("study-pruning", "Pruning curves", "pruning", fig_study_pruning,
     "Perplexity on held-out windows relative to the full model as heads are removed in "
     "each ranker's order (random: mean over seeds)."),
    ("study-restrict", "Top-N restriction", "restrict", fig_study_restrict,
     "Relative delta-NLL when every head keeps only its N top-ranked keys (attention, "
     "contribution alpha ||v||, random, or a sparse-attention policy's keys), deleted or "
     "renormalised, at every N the adaptive N* search tried."),
    ("study-policy-types", "Sparse-attention policies by head type", "policy_head_types",
     fig_study_policy_types,
     "Mean relative delta-NLL of restricting one head alone, under each ranking, at the "
     "attention oracle's whole-model N*_tau, per head type of the atlas (untyped: heads of "
     "no type; all: every head); one panel per model, corpus and study part. Blank: a "
     "policy not defined at that N (below its fixed part)."),
    ("study-qa-budget", "qa accuracy against the budget", "qa_budget", fig_study_qa_budget,
     "Accuracy of the qa probe's answer when the final query keeps N keys under each "
     "ranking (deletion), one panel per background length: where a policy loses the "
     "answer the oracle keeps."),
    ("study-table1", "Geometry against loss (the follow-up's Table 1)", "geometry_loss",
     fig_study_table1,
     "Spearman correlation over N of F_N and the restriction's relative delta-NLL, both "
     "averaged over the corpora first, for N >= 1, 2 and 8 (colour), attention (solid) "
     "and contribution (hatched) ranking; one panel per distance."),
)
