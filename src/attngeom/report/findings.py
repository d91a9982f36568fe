"""Plain-number findings and key tables, one function per kind of table.

Each ``*_findings`` returns sentences (empty when the table is absent); each
``*_tables`` returns ``(caption, DataFrame)`` pairs. Numbers come straight from
the run's tables; nothing here refits or resamples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attngeom.names import MIXER, NO_REGIME, REGIMES, SEPARABILITY, STABLE, VARIANTS
from attngeom.report.html import fmt
from attngeom.report.policies import policy_findings, policy_tables
from attngeom.report.tables import keyed

LABELS = (*REGIMES, NO_REGIME)


def main_rows(summary):
    """Model-scope, full-universe rows, Euclidean when the run has it."""
    rows = summary[(summary["scope"] == "model") & (summary["variant"] == "full")]
    if "euclidean" in set(rows["distance"]):
        rows = rows[rows["distance"] == "euclidean"]
    else:
        rows = rows[rows["distance"] == rows["distance"].iloc[0]] if len(rows) else rows
    return rows


def main_setting(rows) -> str:
    """The setting of ``main_rows`` in words: ``Euclidean, whole model``."""
    distance = str(rows["distance"].iloc[0]) if len(rows) else "euclidean"
    return f"{distance.capitalize()}, whole model"


def _pick_n(rows):
    nontrivial = rows[~rows["trivial"].astype(bool)]
    return int(nontrivial["n"].min()) if len(nontrivial) else None


def _ci(row) -> str:
    if np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"]):
        return f"{fmt(row['mean'])} (95% CI {fmt(row['ci_low'])} to {fmt(row['ci_high'])})"
    return fmt(row["mean"])


def separability_findings(summary, model_label: str = "") -> list[str]:
    if summary is None:
        return []
    rows = main_rows(summary)
    out = []
    n = _pick_n(rows)
    if n is None:
        return out
    setting = main_setting(rows)
    for pick_n in sorted({n, int(rows["n"].max())}):
        at = rows[(rows["n"] == pick_n) & (rows["metric"] == "f_score")].set_index("rule")
        if "attention" not in at.index:
            continue
        text = (f"{model_label}F-score at N = {pick_n} ({setting}): attention-selected sets "
                f"{_ci(at.loc['attention'])}")
        if "random" in at.index:
            text += f", random sets {_ci(at.loc['random'])}"
        if "contribution" in at.index:
            text += f", contribution-ranked {_ci(at.loc['contribution'])}"
        out.append(text + ".")
    distance = rows["distance"].iloc[0]
    full = summary[(summary["scope"] == "model") & (summary["rule"] == "attention")
                   & (summary["metric"] == "f_score") & (summary["n"] == n)
                   & (summary["distance"] == distance)].set_index("variant")["mean"]
    if set(VARIANTS) <= set(full.index):
        out.append(f"{model_label}Excluding the sink from the universe moves attention F at "
                   f"N = {n} ({setting}) from {fmt(full['full'])} to {fmt(full['no_sink'])}.")
    return out


def separability_tables(summary) -> list[tuple[str, pd.DataFrame]]:
    if summary is None:
        return []
    rows = main_rows(summary)
    rows = rows[rows["metric"].isin(SEPARABILITY)]
    if rows.empty:
        return []
    cell = rows.assign(value=[
        fmt(m) if not (np.isfinite(lo) and np.isfinite(hi))
        else f"{fmt(m)} [{fmt(lo)}, {fmt(hi)}]"
        for m, lo, hi in rows[["mean", "ci_low", "ci_high"]].itertuples(index=False)])
    table = keyed(cell, ["model", "corpus", "metric", "rule"], "n", "value", "summary")
    table.columns = [f"N={c}" for c in table.columns]
    return [(f"Model-wide P, R and F by rule and N ({main_setting(rows)}; mean [95% CI])",
             table)]


def sink_findings(sink, model_label: str = "") -> list[str]:
    if sink is None:
        return []
    per_head = sink.groupby(["layer", "head"]).agg(
        norm_ratio=("norm_ratio", "mean"), cos=("sink_cos_mean", "mean"),
        mass=("sink_mass", "mean"))
    h = len(per_head)
    out = [f"{model_label}Sink value norm: the mean non-sink value norm is "
           f"{fmt(per_head['norm_ratio'].median())} times the sink's (median over {h} heads; "
           f"range {fmt(per_head['norm_ratio'].min())} to {fmt(per_head['norm_ratio'].max())})."]
    negative = int((per_head["cos"] < 0).sum())
    out.append(f"{model_label}The sink's value points against the mean non-sink value "
               f"(negative cosine) in {negative} of {h} heads; median cosine "
               f"{fmt(per_head['cos'].median())}. Mean attention mass on the sink: "
               f"{fmt(per_head['mass'].mean())}.")
    n0 = int(sink["n"].min())
    nontrivial = sink[sink["n"] > 1]
    if len(nontrivial):
        n0 = int(nontrivial["n"].min())
    at = sink[sink["n"] == n0]
    sel, unsel = at["f_full_sink_selected"].mean(), at["f_full_sink_unselected"].mean()
    if np.isfinite(sel) and np.isfinite(unsel):
        out.append(f"{model_label}F at N = {n0} when the sink is selected: {fmt(sel)}; "
                   f"when it is not: {fmt(unsel)} (mean over heads).")
    return out


def sink_token_findings(sink_tokens, model_label: str = "") -> list[str]:
    if sink_tokens is None:
        return []
    found = sink_tokens[(sink_tokens["position"] != 0) & sink_tokens["detected"].astype(bool)]
    heads = sink_tokens[["layer", "head"]].drop_duplicates().shape[0]
    if found.empty:
        return [f"{model_label}No token other than position 0 is a sink in any of {heads} "
                "heads (mean share >= 0.1 and >= 5x uniform, queries >= 16 positions away)."]
    by_token = found.groupby("token").agg(heads=("head", "size"),
                                          share=("mean_share", "median"))
    by_token = by_token.sort_values("heads", ascending=False)
    names = ", ".join(f"{tok} in {int(r.heads)} heads (median share {fmt(r.share)})"
                      for tok, r in by_token.head(4).iterrows())
    return [f"{model_label}Sinks by token other than position 0: {names}"
            f"{' ...' if len(by_token) > 4 else ''}."]


def sink_tables(sink, sink_tokens) -> list[tuple[str, pd.DataFrame]]:
    out = []
    if sink is not None:
        sink = sink[sink["n"] == sink["n"].min()]  # one row per head (the same at every N)
        per_layer = sink.groupby(["model", "corpus", "layer"]).agg(
            heads=("head", "nunique"), norm_ratio_median=("norm_ratio", "median"),
            sink_cos_mean=("sink_cos_mean", "mean"), sink_mass_mean=("sink_mass", "mean"))
        out.append(("Sink geometry by layer (median value-norm ratio, mean cosine and mass "
                    "over heads)", per_layer))
    if sink_tokens is not None:
        zero = sink_tokens[sink_tokens["position"] == 0]
        per_layer = zero.groupby(["model", "corpus", "layer"]).agg(
            token=("token", "first"), mean_share=("mean_share", "mean"),
            lift=("lift", "mean"), heads_detected=("detected", "sum"))
        out.append(("Position 0 by layer (queries >= 16 positions later; mean over heads)",
                    per_layer))
        found = sink_tokens[(sink_tokens["position"] != 0)
                            & sink_tokens["detected"].astype(bool)]
        if len(found):
            top = found.sort_values("mean_share", ascending=False).head(20)
            cols = ["token", "token_id", "mean_share", "lift", "occurrences", "pairs"]
            out.append(("Sinks by token identity other than position 0 (largest 20 by mean "
                        "share)", top.set_index(["model", "corpus", "layer", "head"])[cols]))
    return out


def taxonomy_findings(taxonomy, model_label: str = "") -> list[str]:
    if taxonomy is None:
        return []
    counts = taxonomy["regime"].astype(str).value_counts()
    total = int(counts.sum())
    parts = [f"{int(counts.get(r, 0))} {r}s ({fmt(100 * counts.get(r, 0) / total, 2)}%)"
             for r in REGIMES]
    text = f"{model_label}Of {total} heads: " + ", ".join(parts)
    if counts.get(NO_REGIME, 0):
        text += f", and {int(counts[NO_REGIME])} with no valid query"
    out = [text + "."]
    if "stability" in taxonomy.columns:
        stab = taxonomy["stability"].astype(float)
        rule = taxonomy["regime_rule"].iloc[0] if "regime_rule" in taxonomy else "single"
        head = f"{model_label}Label stability (window bootstrap, {rule}-source rule): "
        if stab.notna().any():
            out.append(f"{head}median {fmt(stab.median())}; {int((stab < STABLE).sum())} of "
                       f"{int(stab.notna().sum())} labels are unstable (< {fmt(STABLE)}).")
        else:  # --bootstrap 0, or one window: no replicate to relabel
            out.append(f"{head}not measured (no window-bootstrap replicates: bootstrap 0 "
                       "or a single window).")
    means = taxonomy.groupby(taxonomy["regime"].astype(str))[["f_self", "f_sink", "f_other"]]
    means = means.mean()
    if MIXER in means.index:
        out.append(f"{model_label}In {MIXER} heads the sink wins "
                   f"{fmt(means.loc[MIXER, 'f_sink'])} of queries on average.")
    return out


def taxonomy_tables(taxonomy) -> list[tuple[str, pd.DataFrame]]:
    if taxonomy is None:
        return []
    counts = (taxonomy.assign(regime=taxonomy["regime"].astype(str))
              .groupby(["model", "corpus", "layer", "regime"]).size().unstack(fill_value=0))
    counts = counts[[r for r in LABELS if r in counts.columns]]
    cols = [c for c in ("winning_share", "runner_up_share", "stability", "f_self", "f_sink",
                        "f_other", "top_source_share", "sink_alignment", "self_alignment",
                        "mean_output_norm") if c in taxonomy.columns]
    keys = ["model", "corpus", taxonomy["regime"].astype(str)]
    signature = taxonomy.groupby(keys)[cols].mean()
    signature.insert(0, "heads", taxonomy.groupby(keys).size())
    out = [("Heads per regime by layer", counts),
           ("Regime signatures (mean over heads)", signature)]
    if "top_source_kind" in taxonomy.columns:
        src = taxonomy[taxonomy["top_source_kind"] != "none"]
        common = (src.groupby(["model", "corpus", "top_source_kind", "top_source"]).size()
                  .rename("heads").sort_values(ascending=False).head(10).to_frame())
        out.append(("Most frequent single other source (heads whose top other source it is)",
                    common))
    return out


def bounds_findings(bounds, model_label: str = "") -> list[str]:
    if bounds is None:
        return []
    certified = bounds["certified"].astype(float).mean()
    largest = bounds.groupby(["layer", "head"])["largest_certified_n"].first()
    out = [f"{model_label}The constant-norm envelope certifies separability for "
           f"{fmt(100 * certified, 3)}% of (head, N) pairs; median largest certified N over "
           f"heads: {fmt(largest.median())}."]
    if "pair_violation_rate" in bounds.columns:
        q = bounds["mu_quantile"].iloc[0]
        out.append(f"{model_label}The coherence mu is the fitted {fmt(q)} quantile of |cos| over "
                   f"non-sink pairs, so {fmt(bounds['pair_violation_rate'].mean())} of pairs "
                   f"exceed it by construction (largest excess "
                   f"{fmt(bounds['pair_violation_max'].max())}); the sink cosine has the "
                   f"opposite sign to its fitted mean in "
                   f"{fmt(bounds['sink_cos_violation_rate'].mean())} of sink pairs.")
    return out


def bounds_tables(bounds, assumptions) -> list[tuple[str, pd.DataFrame]]:
    out = []
    if bounds is not None:
        per_n = bounds.groupby(["model", "corpus", "n"]).agg(
            f_measured=("f_measured", "mean"), f_envelope=("f_envelope", "mean"),
            certified_share=("certified", "mean"))
        out.append(("Measured F against the envelope by N (mean over heads)", per_n))
    if assumptions is not None:
        cols = [c for c in assumptions.columns
                if c not in ("model", "corpus", "layer", "head")
                and assumptions[c].dtype.kind in "fi"]
        med = assumptions.groupby(["model", "corpus"])[cols].median()
        out.append(("Assumption diagnostics (median over heads)", med))
    return out


def _ranker_names(pruning):
    """Each row's ranker, with its order where one ranker ran several (taxonomy orders
    are different rankings of the heads: never averaged together)."""
    order = pruning["order"].fillna("").astype(str)
    several = pruning.assign(order=order).groupby("ranker")["order"].transform("nunique") > 1
    return pruning["ranker"].astype(str).where(~several | (order == ""),
                                                pruning["ranker"] + " [" + order + "]")


def pruning_findings(pruning, model_label: str = "") -> list[str]:
    if pruning is None:
        return []
    named = pruning.assign(ranker=_ranker_names(pruning))
    table = named.groupby(["ranker", "keep_fraction"])["perplexity"].mean().unstack()
    full = pruning.loc[np.isclose(pruning["keep_fraction"], 1.0), "perplexity"].mean()
    keeps = [k for k in table.columns if not np.isclose(k, 1.0)]
    if not keeps:
        return []
    keep = min(keeps, key=lambda k: abs(k - 0.5))
    col = table[keep].dropna().sort_values()
    text = (f"{model_label}Keeping {fmt(100 * keep, 3)}% of heads, the best ranker is "
            f"{col.index[0]} (perplexity {fmt(col.iloc[0])}, mean over seeds")
    if np.isfinite(full):
        text += f"; {fmt(full)} with every head"
    text += ")"
    if "random" in col.index and col.index[0] != "random":
        text += f"; random removal gives {fmt(col['random'])}"
    return [text + "."]


def pruning_tables(pruning) -> list[tuple[str, pd.DataFrame]]:
    if pruning is None:
        return []
    p = pruning.assign(order=pruning["order"].fillna("").astype(str))
    table = p.groupby(["model", "corpus", "ranker", "order", "keep_fraction"])["perplexity"].mean()
    table = table.unstack("keep_fraction")
    table = table[sorted(table.columns, reverse=True)]
    table.columns = [f"keep {fmt(c)}" for c in table.columns]
    return [("Perplexity by ranker and keep fraction (mean over seeds)", table)]


def head_scan_findings(head_scan, model_label: str = "") -> list[str]:
    if head_scan is None:
        return []
    critical = head_scan[head_scan["critical"].astype(bool)].sort_values(
        "delta_nll_rel", ascending=False)
    threshold = (f" (threshold {fmt(head_scan['threshold'].iloc[0])})"
                 if "threshold" in head_scan.columns else "")
    if critical.empty:
        top = head_scan.sort_values("delta_nll_rel", ascending=False).iloc[0]
        return [f"{model_label}No head is critical{threshold}; the largest single-head effect "
                f"is layer {int(top['layer'])} head {int(top['head'])} "
                f"(relative delta-NLL {fmt(top['delta_nll_rel'])})."]
    names = ", ".join(f"layer {int(r.layer)} head {int(r.head)} ({fmt(r.delta_nll_rel)})"
                      for r in critical.head(5).itertuples())
    return [f"{model_label}{len(critical)} of {len(head_scan)} heads are critical{threshold}: "
            f"{names}{' ...' if len(critical) > 5 else ''}."]


def head_scan_tables(head_scan) -> list[tuple[str, pd.DataFrame]]:
    if head_scan is None:
        return []
    cols = [c for c in ("model", "corpus", "layer", "head", "delta_nll_rel", "nll", "critical")
            if c in head_scan.columns]
    top = head_scan.sort_values("delta_nll_rel", ascending=False).head(10)[cols]
    top = top.set_index(["model", "corpus", "layer", "head"])
    return [("Ten heads whose removal costs most", top)]


def _treatment(renormalize) -> str:
    return "renormalised" if bool(renormalize) else "deleted"


def _rankings(df):
    """Each row's restriction ranking (a table from before rankings: attention)."""
    return df["ranking"] if "ranking" in df.columns else pd.Series("attention", index=df.index)


def restrict_findings(restrict, nstar, model_label: str = "") -> list[str]:
    """N*_tau of each whole-model setting, named by ranking and renormalisation."""
    out = []
    if nstar is not None:
        model_rows = nstar[nstar["scope"] == "model"].assign(ranking=_rankings(nstar))
        largest = int(restrict["n"].max()) if restrict is not None else None
        for r in model_rows.sort_values(["ranking", "renormalize", "tau"]).itertuples():
            above = getattr(r, "n_star_status", "") == "above_grid"
            value = (f"above the largest N tried ({largest})" if above and largest
                     else "above the largest N tried" if above else fmt(r.n_star))
            out.append(f"{model_label}Effective set size N*_tau at tau = {fmt(r.tau)} "
                       f"({r.ranking} ranking, {_treatment(r.renormalize)}, whole model): "
                       f"{value}.")
    elif restrict is not None:
        rows = restrict[restrict["scope"] == "model"].assign(ranking=_rankings(restrict))
        for (ranking, renorm), g in rows.groupby(["ranking", "renormalize"], sort=True):
            best = g.sort_values("n").iloc[0]
            out.append(f"{model_label}Keeping only the top {int(best['n'])} entries per query "
                       f"({ranking} ranking, {_treatment(renorm)}, whole model) changes NLL "
                       f"by {fmt(best['delta_nll_rel'])} (relative).")
    return out


def restrict_tables(restrict, nstar) -> list[tuple[str, pd.DataFrame]]:
    """The whole-model delta-NLL by ranking and renormalisation at each N of the grid
    (the N the integer search added are drawn in the figure), and every N*_tau."""
    out = []
    if restrict is not None:
        rows = restrict[restrict["scope"] == "model"].assign(ranking=_rankings(restrict))
        grid = rows[rows["on_grid"].astype(bool)] if "on_grid" in rows.columns else rows
        if len(grid):
            rows = grid
        if len(rows):
            t = keyed(rows.assign(renormalize=rows["renormalize"].map(_treatment)),
                      ["model", "corpus", "ranking", "renormalize"], "n", "delta_nll_rel",
                      "restrict")
            t.columns = [f"N={c}" for c in t.columns]
            t.index = t.index.set_names("treatment", level="renormalize")
            out.append(("Relative delta-NLL under whole-model top-N restriction, by ranking "
                        "and treatment (deleted or renormalised), at the N of the grid", t))
    if nstar is not None:
        ns = nstar.assign(ranking=_rankings(nstar))
        ns = ns.assign(renormalize=ns["renormalize"].map(_treatment)).rename(
            columns={"renormalize": "treatment"})
        index = ["model", "corpus", "scope", "layer", "head", "ranking", "treatment", "tau"]
        if (ns["layer"] < 0).all() and (ns["head"] < 0).all():  # whole model only
            ns, index = ns.drop(columns=["layer", "head"]), [
                k for k in index if k not in ("layer", "head")]
        ns = ns.sort_values(index)
        out.append(("Effective set sizes N*_tau (smallest N whose relative delta-NLL stays "
                    "within tau; n_star_low to n_star_high: its document-bootstrap "
                    "interval)", ns.set_index(index)[[c for c in ns.columns
                                                       if c not in index]]))
    return out


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Section:
    """One report section: the tables it reads, its sentences and its key tables.

    ``sentences(*frames, label)`` and ``tables(*frames)`` receive the frames named in
    ``reads`` (``None`` where the run lacks one), in that order.
    """

    name: str
    heading: str
    reads: tuple[str, ...]
    sentences: tuple[Callable, ...]
    tables: Callable


SECTIONS = (
    Section("separability", "Top-N separability", ("summary",), (separability_findings,),
            separability_tables),
    Section("sink", "Attention sink", ("sink", "sink_tokens"),
            (lambda s, t, label: sink_findings(s, label),
             lambda s, t, label: sink_token_findings(t, label)), sink_tables),
    Section("taxonomy", "Head taxonomy", ("taxonomy",), (taxonomy_findings,), taxonomy_tables),
    Section("bounds", "Certified bounds and assumptions", ("bounds", "assumptions"),
            (lambda b, a, label: bounds_findings(b, label),), bounds_tables),
    Section("interventions", "Interventions",
            ("pruning", "head_scan", "restrict", "restrict_nstar"),
            (lambda p, h, r, n, label: pruning_findings(p, label),
             lambda p, h, r, n, label: head_scan_findings(h, label),
             lambda p, h, r, n, label: restrict_findings(r, n, label)),
            lambda p, h, r, n: pruning_tables(p) + head_scan_tables(h) + restrict_tables(r, n)),
)


# --------------------------------------------------------------------------- issue 31-32


# what a head score averages over, for "not measured: 0 needle trials counted"
_SAMPLE_UNITS = {"retrieval": "needle trials", "induction": "repeated-token rows",
                 "echo": "repeated-token rows"}
NOT_MEASURED = "not measured"


def unmeasured_scores(head_scores) -> dict[str, str]:
    """Score -> why it has no value (no head has a finite one), e.g. ``retrieval`` ->
    ``not measured: 0 needle trials counted (8 needles of 6 tokens, ..., 0 recovered)``:
    an undetermined head type is never counted as zero heads."""
    from attngeom.figures.atlas import unmeasured_types

    out = {}
    for score in unmeasured_types(head_scores):
        g = head_scores[head_scores["score"] == score]
        samples = int(g["n_samples"].max()) if "n_samples" in g.columns else 0
        unit = _SAMPLE_UNITS.get(str(score), "query rows")
        inputs = str(g["inputs"].iloc[0]) if "inputs" in g.columns else ""
        out[str(score)] = (f"{NOT_MEASURED}: {samples} {unit} counted"
                           + (f" ({inputs})" if inputs else ""))
    return out


def atlas_findings(head_scores, contingency, kappa, label: str = "") -> list[str]:
    if head_scores is None:
        return []
    n_heads = head_scores[["layer", "head"]].drop_duplicates().shape[0]
    missing = unmeasured_scores(head_scores)
    typed = head_scores[head_scores["is_type"].astype(bool)].groupby("score").size()
    parts = [f"{name.replace('_', '-')} {int(typed.get(name, 0))}"
             for name in head_scores["score"].drop_duplicates() if name not in missing]
    out = [f"{label}Head types among {n_heads} heads (published thresholds): "
           + (", ".join(parts) if parts else "none") + "."]
    out += [f"{label}{name.replace('_', '-')} heads: {why}." for name, why in missing.items()]
    if kappa is not None and len(kappa):
        best = kappa[~kappa["head_type"].isin(list(missing))].dropna(subset=["kappa"])
        best = best.sort_values("kappa", ascending=False)
        if len(best):
            r = best.iloc[0]
            out.append(f"{label}Closest regime and head type: {r['regime']} and "
                       f"{str(r['head_type']).replace('_', '-')} heads (Cohen's kappa "
                       f"{fmt(r['kappa'])}, {int(r['both'])} heads both).")
    return out


def mark_unmeasured(table, missing: dict[str, str]):
    """Every column of an unmeasured head type reads "not measured", never 0 or n/a."""
    table = table.copy()
    for name in missing:
        if name in table.columns:
            table[name] = NOT_MEASURED
    return table


def atlas_tables(head_scores, contingency, kappa, fn) -> list[tuple[str, pd.DataFrame]]:
    out = []
    missing = unmeasured_scores(head_scores) if head_scores is not None else {}
    why = "".join(f"; {name}: {text}" for name, text in missing.items())
    if head_scores is not None:
        wide = keyed(head_scores, ["model", "corpus", "layer", "head"], "score", "value",
                     "head_scores")
        out.append((f"Head scores (one row per head){why}", mark_unmeasured(wide, missing)))
    if contingency is not None and len(contingency):
        t = keyed(contingency, ["model", "corpus", "regime"], "head_type", "count",
                  "atlas_contingency")
        out.append((f"Heads by regime and head type (counts){why}",
                    mark_unmeasured(t, missing)))
    if kappa is not None and len(kappa):
        t = keyed(kappa, ["model", "corpus", "regime"], "head_type", "kappa", "atlas_kappa")
        out.append((f"Cohen's kappa of each regime against each head type{why}",
                    mark_unmeasured(t, missing)))
    if fn is not None and len(fn):
        shown = fn[~fn["head_type"].isin(list(missing))]
        out.append(("F_N of each head type's heads against their random control "
                    "(head-level, Euclidean, full universe)",
                    shown.set_index(["model", "corpus", "head_type", "n"])))
    return out


def competition_findings(answers, qa_nstar, support, context_nstar, slope,
                         label: str = "") -> list[str]:
    out = []
    if answers is not None:
        for r in answers.sort_values("background").itertuples():
            out.append(f"{label}qa with {int(r.background)} tokens of background "
                       f"({r.prompt_format} prompt): accuracy {fmt(r.accuracy)}, answer loss "
                       f"{fmt(r.loss)} nats, competence screen "
                       f"{'passed' if r.screen else 'not passed'}.")
    if qa_nstar is not None:
        for r in qa_nstar.sort_values(["tau", "background"]).itertuples():
            out.append(f"{label}qa N* at tau = {fmt(r.tau)} nats ({r.ranking}, {r.mode}), "
                       f"{int(r.background)} tokens of background: {fmt(r.nstar)}.")
    if slope is not None:
        for r in slope.itertuples():
            out.append(f"{label}Context sweep: N* grows with L as L^{fmt(r.slope)} (95% "
                       f"interval {fmt(r.slope_low)} to {fmt(r.slope_high)}; {r.scoring} "
                       f"scoring, {r.ranking} {r.mode}, tau = {fmt(r.tau)}).")
    return out


def competition_tables(answers, qa_nstar, support, context_nstar, slope
                       ) -> list[tuple[str, pd.DataFrame]]:
    out = []
    if answers is not None:
        cols = [c for c in ("prompt_format", "n_examples", "accuracy", "accuracy_low",
                            "accuracy_high", "loss", "loss_low", "loss_high", "screen",
                            "scoring") if c in answers.columns]
        out.append(("Competence screen: answers per background (accuracy >= 1/6 + 0.05 and "
                    "loss <= log 6 - 0.05; reported, never used to hide a result)",
                    answers.set_index(["model", "corpus", "background"])[cols]))
    if qa_nstar is not None:
        out.append(("qa N* (answer-loss increase within tau nats)",
                    qa_nstar.set_index(["model", "corpus", "background", "ranking", "mode",
                                        "tau"])))
    if support is not None:
        s = support[support["split"] == "all"] if "split" in support.columns else support
        t = keyed(s, ["model", "corpus", "background"], ["score", "statistic"], "mean",
                  "qa_support_summary")
        t.columns = [f"{a} {b}" for a, b in t.columns]
        out.append(("Support statistics at the answer query (mean over heads, all episodes)",
                    t))
    if context_nstar is not None:
        cols = [c for c in ("nstar", "nstar_low", "nstar_high", "grid_nstar")
                if c in context_nstar.columns]
        out.append(("Context sweep: N* per length",
                    context_nstar.set_index(["model", "corpus", "scoring", "ranking", "mode",
                                             "tau", "length"])[cols]))
    if slope is not None:
        out.append(("Log-log slope of N* on L",
                    slope.set_index(["model", "corpus", "scoring", "ranking", "mode", "tau"])))
    return out


def local_findings(local, label: str = "") -> list[str]:
    if local is None or not len(local):
        return []
    out = []
    for scope in ("layer", "head"):
        rows = local[(local["scope"] == scope) & (local["rank"] == 1)]
        for r in rows.itertuples():
            where = (f"layer {int(r.layer)}" if scope == "layer"
                     else f"layer {int(r.layer)} head {int(r.head)}")
            out.append(f"{label}Most sensitive {scope} to keeping N = {int(r.n)} keys "
                       f"({r.ranking}, {'renormalised' if r.renormalize else 'deleted'}): "
                       f"{where}, mean relative NLL increase {fmt(r.mean_doc_delta_rel)}.")
    return out


def local_tables(local) -> list[tuple[str, pd.DataFrame]]:
    if local is None or not len(local):
        return []
    top = local[local["rank"] <= 5].sort_values(["scope", "ranking", "renormalize", "n",
                                                 "rank"])
    cols = [c for c in ("mean_doc_delta_rel", "delta_nll_rel", "nll", "n_windows")
            if c in top.columns]
    return [("Localised restriction: the five most sensitive per scope",
             top.set_index(["model", "corpus", "scope", "ranking", "renormalize", "n", "rank",
                            "layer", "head"])[cols])]


SECTIONS = SECTIONS + (
    Section("policies", "Sparse-attention policies against the oracle",
            ("restrict_nstar", "restrict_alone"), (policy_findings,), policy_tables),
    Section("local_restriction", "Localised restriction", ("restrict_local",),
            (local_findings,), local_tables),
    Section("atlas", "Head atlas", ("head_scores", "atlas_contingency", "atlas_kappa",
                                    "atlas_fn"),
            (lambda h, c, k, f, label: atlas_findings(h, c, k, label),), atlas_tables),
    Section("competition", "Retrieval under competition",
            ("qa_answers", "qa_nstar", "qa_support_summary", "context_nstar",
             "context_slope"), (competition_findings,), competition_tables),
)
