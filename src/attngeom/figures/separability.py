"""Top-N separability curves (method §4): P_N, R_N, F_N against N by selection rule.

All functions read ``summary.parquet`` (columns ``model, corpus, scope, layer, head,
rule, variant, distance, n, metric, mean, ci_low, ci_high, trivial``): the mean over
windows and the window-bootstrap 95% interval, drawn as a line and a band.
Euclidean N = 1 is trivial (P = R = F = 1 for any rule); those points are drawn
hollow so that they are not read as a finding.
"""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from attngeom.errors import ConfigError
from attngeom.figures import style
from attngeom.figures._common import pick
from attngeom.figures.style import Drawn, styled
from attngeom.names import METRICS, RULES, SEPARABILITY

RULE_ORDER = RULES.names()
VARIANT_STYLES = {
    "full": {"color": "#0072B2", "linestyle": "-", "label": "sink in universe"},
    "no_sink": {"color": "#D55E00", "linestyle": "--", "label": "sink excluded"},
}


def _scope_filter(layer: int, head: int) -> dict:
    if layer is None or layer < 0:
        return {"scope": "model"}
    if head is None or head < 0:
        return {"scope": "layer", "layer": int(layer)}
    return {"scope": "head", "layer": int(layer), "head": int(head)}


def _draw_curve(ax, rows, *, key, color, linestyle, label, drawn: Drawn, marker="o"):
    rows = rows.sort_values("n")
    n = rows["n"].to_numpy(dtype=float)
    mean = rows["mean"].to_numpy(dtype=float)
    low = rows["ci_low"].to_numpy(dtype=float)
    high = rows["ci_high"].to_numpy(dtype=float)
    trivial = rows["trivial"].to_numpy(dtype=bool)
    (line,) = ax.plot(n, mean, color=color, linestyle=linestyle, marker=marker,
                      markevery=list(np.flatnonzero(~trivial)), label=label, zorder=3)
    drawn.lines[key] = line
    ok = np.isfinite(low) & np.isfinite(high)
    if ok.any():
        drawn.bands[key] = ax.fill_between(n[ok], low[ok], high[ok], color=color, alpha=0.18,
                                           linewidth=0, zorder=2)
    if trivial.any():
        drawn.markers.setdefault("trivial", [])
        drawn.markers["trivial"].append(
            ax.scatter(n[trivial], mean[trivial], s=16, facecolors="white", edgecolors=color,
                       linewidths=0.9, zorder=4))
    drawn.data[key] = rows[["n", "mean", "ci_low", "ci_high", "trivial"]].reset_index(drop=True)


def _finish_metric_axis(ax, metric: str, ns) -> None:
    style.set_n_axis(ax, ns)
    ax.set_ylabel(style.METRIC_LABELS.get(metric, metric))
    if metric in SEPARABILITY:
        ax.set_ylim(-0.02, 1.04)


@styled
def fig_topn_curves(summary, *, metric: str = "f_score", model=None, corpus=None,
                    layer: int = -1, head: int = -1, variant: str = "full",
                    distance: str = "euclidean", rules=None, ax=None, legend: bool = True,
                    title: str | None = None) -> Drawn:
    """``metric`` against N for each selection rule, with bootstrap bands (method §4).

    ``layer=-1`` draws the model-scope rows, ``layer=l`` the layer-scope rows of layer
    l and ``layer=l, head=h`` one head. ``Drawn.lines`` / ``bands`` are keyed by rule.

    ``fig_topn_curves(summary, metric="recall", layer=0).lines["attention"]`` is the
    attention rule's line of layer 0.
    """
    ax = style.axes_or_new(ax)
    rows = pick(summary, "summary", model=model, corpus=corpus, metric=metric,
                variant=variant, distance=distance, **_scope_filter(layer, head))
    present = [r for r in RULE_ORDER if r in set(rows["rule"])]
    present += sorted(set(rows["rule"]) - set(present))
    if rules is not None:
        present = [r for r in present if r in rules]
    if not present:
        raise ConfigError(f"expected rows for rules {list(rules)} in the summary table, got none")
    drawn = Drawn(ax=ax)
    for rule in present:
        _draw_curve(ax, rows[rows["rule"] == rule], key=rule,
                    color=style.RULE_COLORS.get(rule, "#CC79A7"),
                    linestyle=style.RULE_LINESTYLES.get(rule, ":"),
                    label=style.RULE_LABELS.get(rule, rule), drawn=drawn)
    _finish_metric_axis(ax, metric, rows["n"])
    if title is not None:
        ax.set_title(title)
    if legend:
        drawn.legend = ax.legend(loc="best")
    return drawn


@styled
def fig_topn_by_layer(summary, *, n: int, metric: str = "f_score", model=None, corpus=None,
                      variant: str = "full", distance: str = "euclidean", ax=None,
                      legend: bool = True) -> Drawn:
    """``metric`` at one N against layer depth, one line (and band) per rule.

    Reads the layer-scope rows of ``summary``; ``Drawn.lines`` keyed by rule.
    """
    ax = style.axes_or_new(ax)
    rows = pick(summary, "summary", model=model, corpus=corpus, metric=metric,
                variant=variant, distance=distance, scope="layer", n=int(n))
    drawn = Drawn(ax=ax)
    rules = [r for r in RULE_ORDER if r in set(rows["rule"])]
    rules += sorted(set(rows["rule"]) - set(rules))
    for rule in rules:
        sub = rows[rows["rule"] == rule].sort_values("layer")
        x = sub["layer"].to_numpy(dtype=float)
        color = style.RULE_COLORS.get(rule, "#CC79A7")
        (line,) = ax.plot(x, sub["mean"].to_numpy(dtype=float), color=color,
                          linestyle=style.RULE_LINESTYLES.get(rule, ":"), marker="o",
                          label=style.RULE_LABELS.get(rule, rule))
        drawn.lines[rule] = line
        low, high = sub["ci_low"].to_numpy(dtype=float), sub["ci_high"].to_numpy(dtype=float)
        ok = np.isfinite(low) & np.isfinite(high)
        if ok.any():
            drawn.bands[rule] = ax.fill_between(x[ok], low[ok], high[ok], color=color,
                                                alpha=0.18, linewidth=0)
        drawn.data[rule] = sub[["layer", "mean", "ci_low", "ci_high"]].reset_index(drop=True)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"{style.METRIC_LABELS.get(metric, metric)} at $N={int(n)}$")
    if metric in SEPARABILITY:
        ax.set_ylim(-0.02, 1.04)
    if legend:
        drawn.legend = ax.legend(loc="best")
    return drawn


@styled
def fig_sink_variant(summary, *, metric: str = "f_score", rule: str = "attention",
                     model=None, corpus=None, distance: str = "euclidean", ax=None,
                     legend: bool = True) -> Drawn:
    """``metric`` against N with the sink in the universe and with it excluded (method §6).

    Model-scope rows of ``summary`` for one rule; ``Drawn.lines`` keyed by variant
    (``full``, ``no_sink``).
    """
    ax = style.axes_or_new(ax)
    rows = pick(summary, "summary", model=model, corpus=corpus, metric=metric, rule=rule,
                distance=distance, scope="model")
    drawn = Drawn(ax=ax)
    for variant, spec in VARIANT_STYLES.items():
        sub = rows[rows["variant"] == variant]
        if len(sub):
            _draw_curve(ax, sub, key=variant, color=spec["color"], linestyle=spec["linestyle"],
                        label=spec["label"], drawn=drawn)
    if not drawn.lines:
        raise ConfigError("expected variant 'full' or 'no_sink' rows in the summary table, "
                          f"got {sorted(set(rows['variant']))}")
    _finish_metric_axis(ax, metric, rows["n"])
    if legend:
        drawn.legend = ax.legend(loc="best", title=style.RULE_LABELS.get(rule, rule))
    return drawn


def summary_from_metrics(metrics):
    """Model- and layer-scope means over windows from ``metrics.parquet``, without intervals.

    Used only when a run holds ``metrics`` but not ``summary``; ``ci_low`` and
    ``ci_high`` are NaN because the window bootstrap belongs to the pipeline.
    """
    import pandas as pd

    keys = ["model", "corpus", "rule", "variant", "distance", "n"]
    metric_cols = [c for c in METRICS if c in metrics.columns]
    frames = []
    for scope, extra in (("model", []), ("layer", ["layer"])):
        per_window = metrics.groupby([*keys, *extra, "window"], dropna=False)[metric_cols].mean()
        means = per_window.groupby(level=list(range(len(keys) + len(extra)))).mean()
        trivial = metrics.groupby([*keys, *extra], dropna=False)["trivial"].any()
        long = means.reset_index().melt(id_vars=[*keys, *extra], var_name="metric",
                                        value_name="mean")
        long = long.merge(trivial.reset_index(), on=[*keys, *extra])
        long["scope"] = scope
        if scope == "model":
            long["layer"] = -1
        long["head"] = -1
        frames.append(long)
    out = pd.concat(frames, ignore_index=True)
    out["ci_low"] = np.nan
    out["ci_high"] = np.nan
    return out
