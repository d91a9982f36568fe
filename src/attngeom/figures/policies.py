"""Sparse-attention policies against the top-N oracle (issue 39): N* per ranking beside
the oracle's (a run figure), and, across a study's models, the policy x head-type maps
and the qa accuracy against the budget.

Each function takes the tables it names and returns a ``Drawn`` (``style.Drawn``: the
artists and the exact numbers plotted), so tests read what was drawn.
"""

from __future__ import annotations

import numpy as np

from attngeom.figures import style
from attngeom.figures._common import pick
from attngeom.figures.style import Drawn, styled
from attngeom.names import HEAD_TYPES, ORACLE, RANKINGS

_TAU_MARKERS = ("o", "s", "^", "D")


def ranking_order(name: str) -> tuple[int, str]:
    """Rankings in the registry's order (the oracle first), then any other name."""
    names = RANKINGS.names()
    return (names.index(name) if name in names else len(names), name)


def _order(rankings) -> list[str]:
    return sorted(set(rankings), key=ranking_order)


@styled
def fig_policy_nstar(nstar, *, model=None, corpus=None, renormalize: bool | None = None,
                     ax=None) -> Drawn:
    """Whole-model N*_tau of every ranking, with its document-bootstrap interval, one
    marker per tau; the attention oracle's N* of the same tau as a dashed line.

    ``restrict_nstar`` rows of one model and corpus and one treatment (default: deletion
    where the run has it). ``Drawn.markers`` and ``Drawn.data`` keyed ``"tau=<tau>"``,
    ``Drawn.lines`` ``"oracle tau=<tau>"``; log N axis.
    """
    ax = style.axes_or_new(ax, style.COLUMN_WIDTH * 1.2, style.PANEL_HEIGHT)
    rows = pick(nstar, "restrict_nstar", model=model, corpus=corpus)
    rows = rows[rows["scope"] == "model"]
    if renormalize is None:
        renormalize = bool(rows["renormalize"].astype(bool).all())
    rows = rows[rows["renormalize"].astype(bool) == renormalize]
    rankings = _order(rows["ranking"])
    x = {r: i for i, r in enumerate(rankings)}
    drawn = Drawn(ax=ax)
    taus = sorted(rows["tau"].unique())
    for k, tau in enumerate(taus):
        g = rows[rows["tau"] == tau].set_index("ranking").loc[rankings]
        shift = (k - (len(taus) - 1) / 2) * 0.12
        xs = np.array([x[r] for r in rankings], dtype=float) + shift
        color = style.color_cycle(k)
        low = (g["n_star"] - g["n_star_low"]).clip(lower=0).to_numpy(float)
        high = (g["n_star_high"] - g["n_star"]).clip(lower=0).to_numpy(float)
        ax.errorbar(xs, g["n_star"].to_numpy(float), yerr=[np.nan_to_num(low),
                                                           np.nan_to_num(high)],
                    fmt="none", ecolor=color, elinewidth=0.8, capsize=2)
        key = f"tau={tau:g}"
        drawn.markers[key] = ax.scatter(xs, g["n_star"].to_numpy(float), color=color, s=18,
                                        marker=_TAU_MARKERS[k % len(_TAU_MARKERS)],
                                        zorder=3, label=rf"$N^*_{{{100 * tau:g}\%}}$")
        drawn.data[key] = g[["n_star", "n_star_low", "n_star_high"]].reset_index()
        if ORACLE in g.index and np.isfinite(g.loc[ORACLE, "n_star"]):
            drawn.lines[f"oracle {key}"] = ax.axhline(float(g.loc[ORACLE, "n_star"]),
                                                      color=color, linestyle="--",
                                                      linewidth=0.7)
    ax.set_xticks(range(len(rankings)), rankings, rotation=20, ha="right")
    ax.set_yscale("log", base=2)
    style.plain_log_ticks(ax.yaxis)
    ax.set_ylabel(r"$N^*_\tau$ (keys kept per query)")
    ax.set_title(f"whole model, {'renormalised' if renormalize else 'deleted'}; dashed: "
                 f"the {ORACLE} oracle", fontsize="small")
    drawn.legend = ax.legend(fontsize="small", loc="best")
    return drawn


def type_order(name: str) -> tuple[int, str]:
    """Head types in the registry's order, then the step's ``untyped`` and ``all``."""
    names = [*HEAD_TYPES.names(), "untyped", "all"]
    return (names.index(name) if name in names else len(names), name)


def _groups(df, *keys) -> list[tuple]:
    return list(df[["model", "corpus", *keys]].drop_duplicates().itertuples(index=False,
                                                                              name=None))


@styled
def fig_study_policy_types(types, *, models=None, corpora=None) -> Drawn:
    """Head type x ranking maps of the mean relative delta-NLL of restricting one head
    alone at the oracle's N*_tau (``policy_head_types``), one panel per model, corpus
    and study part (deletion where it ran, the smallest tau). Blank: a ranking not
    defined at that N. ``Drawn.data`` keyed ``"model / corpus / part"`` (head types x
    rankings)."""
    groups = _groups(types, "part")
    fig, axes = style.new_figure(style.COLUMN_WIDTH * 1.1 * len(groups),
                                 style.PANEL_HEIGHT * 1.3, ncols=len(groups), squeeze=False)
    drawn = Drawn(ax=axes[0][0])
    for ax, (model, corpus, part) in zip(axes[0], groups, strict=True):
        rows = pick(types, "policy_head_types", model=model, corpus=corpus, part=part)
        deleted = rows[~rows["renormalize"].astype(bool)]
        rows = deleted if len(deleted) else rows
        rows = rows[rows["tau"] == rows["tau"].min()]
        rankings = _order(rows["ranking"])
        kinds = sorted(set(rows["head_type"]), key=type_order)
        grid = (rows.pivot_table(index="head_type", columns="ranking",
                                 values="mean_delta_nll_rel", aggfunc="first", dropna=False)
                .reindex(index=kinds, columns=rankings))
        image = ax.imshow(grid.to_numpy(float), aspect="auto", cmap="viridis")
        ax.grid(False)
        fig.colorbar(image, ax=ax, label=r"mean relative $\Delta$NLL")
        drawn.images.append(image)
        ax.set_xticks(range(len(rankings)), rankings, rotation=20, ha="right")
        ax.set_yticks(range(len(kinds)), [k.replace("_", "-") for k in kinds])
        r = rows.iloc[0]
        ax.set_title(f"{model} / {corpus} ({part}): one head alone at N = {int(r['n'])}",
                     fontsize="small")
        drawn.data[f"{model} / {corpus} / {part}"] = grid
    return drawn


@styled
def fig_study_qa_budget(budget, *, models=None, corpora=None, mode: str = "deletion"
                        ) -> Drawn:
    """qa accuracy against the budget N, one line per ranking; a row of panels per
    model and corpus, a panel per background (``qa_budget``, ``mode`` rows; the rows at
    the probe's budgets where the table says which). ``Drawn.lines`` keyed
    ``"model / corpus / <ranking> bg=<background>"``."""
    rows = budget[budget["mode"] == mode] if mode in set(budget["mode"]) else budget
    if "budget" in rows.columns:
        rows = rows[rows["budget"].astype(bool)]
    groups = _groups(rows)
    backgrounds = sorted(rows["background"].unique())
    fig, axes = style.new_figure(style.COLUMN_WIDTH * 0.8 * len(backgrounds),
                                 style.PANEL_HEIGHT * len(groups), nrows=len(groups),
                                 ncols=len(backgrounds), squeeze=False, sharey=True)
    drawn = Drawn(ax=axes[0][0])
    rankings = _order(rows["ranking"])
    for line, (model, corpus) in zip(axes, groups, strict=True):
        mine = rows[(rows["model"] == model) & (rows["corpus"] == corpus)]
        for ax, background in zip(line, backgrounds, strict=True):
            for i, ranking in enumerate(rankings):
                g = mine[(mine["background"] == background)
                         & (mine["ranking"] == ranking)].sort_values("n")
                if not len(g):
                    continue
                key = f"{model} / {corpus} / {ranking} bg={int(background)}"
                (drawn.lines[key],) = ax.plot(g["n"], g["accuracy"], marker="o",
                                              markersize=3, color=style.color_cycle(i),
                                              label=ranking)
                drawn.data[key] = g[["n", "accuracy"]].reset_index(drop=True)
            style.set_n_axis(ax, rows["n"])
            ax.set_title(f"{model} / {corpus}, {int(background)} tokens of background",
                         fontsize="small")
        line[0].set_ylabel("qa accuracy")
    drawn.legend = axes[0][-1].legend(fontsize="small", loc="best")
    return drawn
