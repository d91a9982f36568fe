"""A run's result as plain text: what ``attngeom COMMAND`` prints when it finishes.

Each run command names its summary function in its declaration
(``config.COMMANDS``: ``summary``); ``api.summary(result)`` calls it and the CLI only
prints the text. Tables show human column names and one precision per column, and
every caveat a reader needs (fewer windows than asked for, intervals from very few
windows, no bootstrap) is a line of the text, not a silent NaN.
"""

from __future__ import annotations

import math

from attngeom.names import NO_REGIME, REGIMES

# raw table column -> the name a table shows
COLUMN_NAMES = {
    "ranker": "ranker", "seed": "seed", "order": "order", "keep_fraction": "kept fraction",
    "heads_kept": "heads kept", "perplexity": "perplexity", "nll": "NLL",
    "delta_nll_rel": "rel. delta-NLL", "critical": "critical", "layer": "layer",
    "head": "head", "norm_ratio": "value-norm ratio", "sink_cos_mean": "sink cosine",
    "sink_mass": "sink mass", "stability": "label stability", "tau": "tau",
    "n_star": "N*", "n": "N", "renormalize": "renormalised",
}
FEW_WINDOWS = 10  # below this many windows the intervals and stabilities are rough
DIGITS = 4  # decimals of every float column


def human(column: str) -> str:
    return COLUMN_NAMES.get(column, column.replace("_", " "))


def format_table(df, columns=None, *, digits: int = DIGITS) -> str:
    """``df`` (its ``columns`` where given) with human column names, each float shown
    with ``digits`` decimals, no index."""
    if columns:
        df = df[[c for c in columns if c in df.columns]]
    df = df.rename(columns={c: human(c) for c in df.columns})
    return df.to_string(index=False, float_format=lambda x: f"{x:.{digits}f}")


def _windows(res) -> int | None:
    n = res.manifest.get("counts", {}).get("windows")
    if n is None:
        n = res.manifest.get("corpus", {}).get("n_windows")
    return None if n is None else int(n)


def caveats(res) -> list[str]:
    """Warning lines about how far the numbers can be trusted."""
    out = []
    counts = res.manifest.get("counts", {})
    config = res.manifest.get("config", {})
    n = _windows(res)
    asked = counts.get("windows_requested")
    if asked is not None and n is not None and n < asked:
        out.append(f"warning: {n} windows analysed, {asked} asked for: the corpus gives no "
                   "more at this window length")
    if n is not None and n < FEW_WINDOWS and config.get("bootstrap", 0):
        what = ("the window-bootstrap intervals and label stabilities"
                if res.manifest.get("command") in ("analyze", "atlas")
                else "the bootstrap intervals (of N* and its ratio)")
        out.append(f"caveat: only {n} window{'s' if n != 1 else ''}: {what} resample these "
                   "few windows and are not reliable 95% intervals")
    return out


def format_headline(df, *, bootstrap: bool = True) -> str:
    """F_N by N (rows) and rule (columns) as 'mean [low, high]' (the mean alone without
    a bootstrap, whose intervals are NaN)."""
    has_ci = bootstrap and not df[["ci_low", "ci_high"]].isna().all().all()
    head = ("F_N over all heads (mean over windows, 95% window-bootstrap interval)" if has_ci
            else "F_N over all heads (mean over windows; no bootstrap, no interval)")
    width = 26 if has_ci else 12
    lines = [head]
    rules = list(dict.fromkeys(df["rule"]))
    lines.append("   N  " + "".join(f"{r:>{width}}" for r in rules))
    for n, part in df.groupby("n"):
        cells = []
        for r in rules:
            row = part[part["rule"] == r]
            if row.empty or row["mean"].isna().all():
                cells.append(f"{'(skipped)':>{width}}")
                continue
            m, lo, hi = row.iloc[0][["mean", "ci_low", "ci_high"]]
            text = f"{m:.3f} [{lo:.3f}, {hi:.3f}]" if has_ci and not math.isnan(lo) else (
                f"{m:.3f}")
            cells.append(f"{text:>{width}}")
        flag = "  (trivial)" if bool(part["trivial"].iloc[0]) else ""
        lines.append(f"{n:>4}  " + "".join(cells) + flag)
    return "\n".join(lines)


def format_sink_and_regimes(res) -> str:
    """Per layer: sink value-norm ratio, sink cosine, sink mass, regimes and stability."""
    import pandas as pd

    parts = []
    if "sink" in res.tables:
        sink = res["sink"]
        n = int(sink["n"].min())
        parts.append(sink[sink["n"] == n].groupby("layer")[
            ["norm_ratio", "sink_cos_mean", "sink_mass"]].median())
    if "taxonomy" in res.tables:
        tax = res["taxonomy"]
        counts = tax.groupby("layer")["regime"].value_counts().unstack(fill_value=0)
        counts = counts[[r for r in (*REGIMES, NO_REGIME) if r in counts.columns]]
        counts["stability"] = tax.groupby("layer")["stability"].median()
        parts.append(counts)
    if not parts:
        return ""
    table = pd.concat(parts, axis=1)
    table = table.rename(columns={c: human(c) for c in table.columns})
    lines = ["per layer: median sink geometry over heads, heads per regime and median "
             "label stability", table.to_string(float_format=lambda x: f"{x:.2f}")]
    if "sink_tokens" in res.tables:
        st = res["sink_tokens"]
        found = st[(st["position"] != 0) & st["detected"]]
        if len(found):
            top = found.groupby("token").size().sort_values(ascending=False).head(5)
            lines.append("sinks by token besides position 0 (heads): "
                         + ", ".join(f"{k} ({v})" for k, v in top.items()))
        else:
            lines.append("sinks by token besides position 0: none")
    return "\n".join(lines)


def format_skips(counts: dict) -> list[str]:
    out = []
    never = counts.get("never_valid_n") or []
    if never:
        out.append(f"skipped: N = {', '.join(map(str, never))} never fits a universe of "
                   f"these windows (largest {counts.get('largest_universe')} keys); reported "
                   "as NaN with n_queries = 0")
    if counts.get("nonfinite_rows"):
        out.append(f"skipped: {counts['nonfinite_rows']} query rows with non-finite "
                   "attention or values")
    return out


def format_nstar(res) -> str:
    """N*_tau by tau and renormalisation; "> N" where no N of the grid qualified."""
    ns = res["restrict_nstar"]
    largest = int(res["restrict"]["n"].max())
    ns = ns[ns["scope"] == "model"] if (ns["scope"] == "model").any() else ns
    cells = ns.assign(value=[f"> {largest}" if s == "above_grid" else f"{v:.0f}"
                             for v, s in zip(ns["n_star"], ns["n_star_status"], strict=True)])
    if "ranking" in cells.columns and cells["ranking"].nunique() > 1:
        table = cells.pivot_table(index="tau", columns=["ranking", "renormalize"],
                                  values="value", aggfunc="first")
        table.columns = [f"{r} {'renormalised' if c else 'deleted'}"
                         for r, c in table.columns]
    else:
        table = cells.pivot_table(index="tau", columns="renormalize", values="value",
                                  aggfunc="first")
        table.columns = ["renormalised" if c else "deleted" for c in table.columns]
    table.index.name = "tau"
    return "N*_tau (smallest N whose relative delta-NLL stays within tau)\n" + table.to_string()


def _join(*parts) -> str:
    return "\n".join(p for p in parts if p)


def analyze_summary(res) -> str:
    headline = res.headline()
    bootstrap = bool(res.manifest.get("config", {}).get("bootstrap", 1))
    return _join(*caveats(res),
                 format_headline(headline, bootstrap=bootstrap) if headline is not None
                 else "", format_sink_and_regimes(res),
                 *format_skips(res.manifest.get("counts", {})))


def prune_summary(res) -> str:
    return _join(*caveats(res), format_table(
        res["pruning"], ["ranker", "seed", "order", "keep_fraction", "heads_kept",
                         "perplexity", "delta_nll_rel"]))


def scan_summary(res) -> str:
    """The heads marked critical, largest effect first (only those)."""
    df = res["head_scan"].sort_values("delta_nll_rel", ascending=False)
    critical = df[df["critical"].astype(bool)]
    threshold = df["threshold"].iloc[0] if "threshold" in df.columns and len(df) else None
    at = f" (relative delta-NLL above {threshold:g})" if threshold is not None else ""
    if critical.empty:
        top = df.iloc[0]
        return _join(*caveats(res), f"no head of {len(df)} is critical{at}; the largest "
                     f"effect: layer {int(top['layer'])} head {int(top['head'])}, "
                     f"{top['delta_nll_rel']:.4f}")
    shown = critical.head(10)
    more = f" (the first {len(shown)} shown)" if len(critical) > len(shown) else ""
    return _join(*caveats(res), f"{len(critical)} of {len(df)} heads critical{at}{more}",
                 format_table(shown, ["layer", "head", "nll", "delta_nll_rel"]))


def restrict_summary(res) -> str:
    if "restrict_nstar" not in res.tables and "restrict_local" in res.tables:
        local = res["restrict_local"]  # --scope layer / head: the most sensitive first
        top = local[local["rank"] <= 3].sort_values(["scope", "ranking", "renormalize", "n",
                                                     "rank"], ascending=[False, True, True,
                                                                         True, True])
        return _join(*caveats(res), "Localised restriction (mean of per-window relative "
                     "NLL increases), three largest per scope\n" + top[
                         ["scope", "layer", "head", "ranking", "renormalize", "n",
                          "mean_doc_delta_rel"]].to_string(index=False))
    return _join(*caveats(res), format_nstar(res), format_oracle_ratio(res))


def format_oracle_ratio(res) -> str:
    """Each ranking's N* over the attention oracle's, with the ratio's interval, and the
    heads restricted alone at the oracle's N* (mean and largest increase per ranking)."""
    from attngeom.report.policies import beside_oracle

    parts = []
    rows = beside_oracle(res.tables.get("restrict_nstar"))
    if rows is not None:
        cells = rows.assign(value=[f"{r:.3g} [{lo:.3g}, {hi:.3g}]" for r, lo, hi in zip(
            rows["ratio"], rows["ratio_low"], rows["ratio_high"], strict=True)])
        table = cells.pivot_table(index="tau", columns=["ranking", "treatment"],
                                  values="value", aggfunc="first")
        table.columns = [f"{r} {t}" for r, t in table.columns]
        parts.append("N*_tau over the attention oracle's (ratio [95% interval])\n"
                     + table.to_string())
    alone = res.tables.get("restrict_alone")
    if alone is not None and len(alone):
        summary = alone.groupby(["ranking", "renormalize", "n"]).agg(
            heads=("delta_nll_rel", "count"), mean=("delta_nll_rel", "mean"),
            largest=("delta_nll_rel", "max"))
        parts.append("each head alone at the attention oracle's N*_tau: relative delta-NLL "
                     "over heads (none: the ranking is not defined at that N)\n"
                     + summary.to_string())
    return _join(*parts)


def atlas_summary(res) -> str:
    """Heads of each type, then the regime x head type counts (issue 32)."""
    from attngeom.report.findings import mark_unmeasured, unmeasured_scores

    scores = res["head_scores"]
    n_heads = scores[["layer", "head"]].drop_duplicates().shape[0]
    missing = unmeasured_scores(scores)  # no finite score: not measured, never 0 heads
    typed = (scores[scores["is_type"].astype(bool)].groupby("score").size()
             .reindex(scores["score"].unique(), fill_value=0))
    lines = [f"head types of {n_heads} heads (threshold as published unless given): "
             + ", ".join(f"{name} {int(k)}" for name, k in typed.items()
                         if name not in missing)]
    lines += [f"{name}: {why}" for name, why in missing.items()]
    if "atlas_contingency" in res.tables:
        c = res["atlas_contingency"]
        table = mark_unmeasured(c.pivot(index="regime", columns="head_type",
                                        values="count"), missing)
        lines.append("heads by regime (rows) and head type (columns; a head may have "
                     "several types)\n" + table.to_string())
    return _join(*caveats(res), *lines)


def competition_summary(res) -> str:
    """qa: accuracy, loss and the screen per background, then N*; context: N* per L and
    the log-log slope (issue 31)."""
    parts = []
    if "qa_answers" in res.tables:
        parts.append("qa answers per background (screen: accuracy >= 1/6 + 0.05 and loss "
                     "<= log 6 - 0.05 at no background)\n" + format_table(
                         res["qa_answers"], ["background", "prompt_format", "n_examples",
                                             "accuracy", "loss", "screen"]))
    if "qa_nstar" in res.tables:
        parts.append("qa N* (smallest N whose mean answer-loss increase stays within tau "
                     "nats)\n" + format_table(res["qa_nstar"], ["background", "ranking",
                                                                 "mode", "tau", "nstar"]))
    if "qa_support_summary" in res.tables:
        s = res["qa_support_summary"]
        s = s[(s["split"] == "all")] if "split" in s.columns else s
        if len(s):
            table = s.pivot_table(index="background", columns=["score", "statistic"],
                                  values="mean", aggfunc="first")
            table.columns = [f"{a} {b}" for a, b in table.columns]
            parts.append("support at the answer query (mean over heads and examples)\n"
                         + table.to_string(float_format=lambda x: f"{x:.4f}"))
    if "context_nstar" in res.tables:
        ns = res["context_nstar"]
        table = ns.pivot_table(index="length", columns=["scoring", "ranking", "mode", "tau"],
                               values="nstar", aggfunc="first")
        table.columns = [" ".join(str(x) for x in c) for c in table.columns]
        parts.append("context N* by length L (scoring ranking mode tau)\n"
                     + table.to_string(float_format=lambda x: f"{x:.0f}"))
    if "context_slope" in res.tables:
        parts.append("log-log slope of N* on L\n" + format_table(
            res["context_slope"], ["scoring", "ranking", "mode", "tau", "slope", "slope_low",
                                   "slope_high"], digits=2))
    return _join(*parts) or tables_summary(res)


def tables_summary(res) -> str:
    """The default summary of a command that declares none: its tables and their rows."""
    return _join(*caveats(res), *(f"{name}: {len(df)} rows" for name, df in
                                  res.tables.items()))


def format_protocol(record: dict) -> list[str]:
    """``analyze: T = 64, stride:8 queries, 4 windows, 20 bootstrap replicates, ...``."""
    lines = []
    for cmd, p in record.items():
        parts = [f"T = {p['window_length']}"] if "window_length" in p else []
        if "query_mode" in p:
            parts.append(f"{p['query_mode']} queries")
        for key, what in (("n_windows", "windows"), ("n_rank_windows", "ranking windows"),
                          ("n_eval_windows", "evaluation windows"),
                          ("bootstrap", "bootstrap replicates"),
                          ("effective_repeats", "random-control repeats")):
            if key in p:
                value = "all" if p[key] is None else p[key]
                parts.append(f"{value} {what[:-1] if value == 1 else what}")
        lines.append(f"{cmd}: {', '.join(parts)}")
    return lines
