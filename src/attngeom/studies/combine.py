"""The study's steps across runs: tables side by side, regime stability between corpora,
geometry against loss, and published values beside the measured ones.

Everything here reads the runs' tidy tables (which carry ``model`` and ``corpus``
columns) and returns tidy tables; nothing loads a model.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd


def combine(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One table from the same table of several runs (their model and corpus columns
    keep them apart)."""
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def spearman(x, y) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN with fewer than three
    pairs or when either side is constant, where it says nothing."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 3:
        return math.nan
    # Pearson on average ranks (pandas' own spearman needs scipy); NaN when constant
    return float(pd.Series(x).rank().corr(pd.Series(y).rank()))


TABLE1_N_MINS = (1, 2, 8)  # the paper's Table 1 columns: N >= 1, N >= 2, N >= 8
TABLE1_RANKINGS = ("attention", "contribution")
GEOMETRY_LOSS_COLUMNS = ["model", "corpus", "distance", "rule", "variant", "metric",
                         "renormalize", "n_points", "ns", "spearman", "n_min", "averaged",
                         "n_corpora"]


def _ranking_of(restrict: pd.DataFrame) -> pd.Series:
    """The restriction ranking of each row (a table from before rankings: attention)."""
    if "ranking" in restrict.columns:
        return restrict["ranking"].astype(str)
    return pd.Series("attention", index=restrict.index)


def _curves(summary, restrict, model, distance, ranking, renorm, variant, metric):
    """Per corpus, F_N (``mean``) and the relative delta-NLL of the same N, by N."""
    geo = summary[(summary["model"] == model) & (summary["distance"] == distance)
                  & (summary["rule"] == ranking) & (summary["variant"] == variant)
                  & (summary["metric"] == metric) & (summary["scope"] == "model")]
    loss = restrict[(restrict["model"] == model) & (restrict["scope"] == "model")
                    & (_ranking_of(restrict) == ranking)
                    & (restrict["renormalize"].astype(bool) == bool(renorm))]
    out = {}
    for corpus, g in geo.groupby("corpus", sort=True):
        lo = loss[loss["corpus"] == corpus]
        if not len(lo):
            continue
        merged = (g[["n", "mean"]].merge(lo[["n", "delta_nll_rel"]], on="n")
                  .drop_duplicates("n").set_index("n").sort_index())
        if len(merged):
            out[str(corpus)] = merged
    return out


def _rows_for(curve: pd.DataFrame, n_mins) -> list[dict]:
    rows = []
    for n_min in n_mins:
        part = curve[curve.index >= n_min]
        rows.append({"n_min": int(n_min), "n_points": len(part),
                     "ns": ",".join(str(int(n)) for n in part.index),
                     "spearman": spearman(part["mean"], part["delta_nll_rel"])})
    return rows


def geometry_loss(summary: pd.DataFrame, restrict: pd.DataFrame, *, renormalize=(False,),
                  rankings=TABLE1_RANKINGS, n_mins=TABLE1_N_MINS, variant: str = "full",
                  metric: str = "f_score") -> pd.DataFrame:
    """The follow-up's Table 1: Spearman over N of F_N against the whole-model top-N
    restriction's relative delta-NLL (method: "Geometry against loss").

    For each model, distance, ranking (the same one selects the geometry's set and the
    restriction's kept keys: ``rule``) and renormalisation: F_N and delta-NLL are first
    averaged over the corpora (only the N every corpus holds), then ranked over N, for
    N >= 1, N >= 2 and N >= 8 (``n_min``); these rows have ``averaged`` True and the
    corpora joined by ``+`` as their corpus. The same correlation of each corpus alone
    follows (``averaged`` False). Ties take average ranks; a correlation of fewer than
    three N, or of a constant side, is NaN. A restriction table without a ``ranking``
    column is attention-ranked.
    """
    if summary is None or restrict is None or not len(summary) or not len(restrict):
        return pd.DataFrame(columns=GEOMETRY_LOSS_COLUMNS)
    rows = []
    present = set(_ranking_of(restrict)) & set(summary["rule"])
    for model in sorted(summary["model"].unique()):
        for distance in sorted(summary[summary["model"] == model]["distance"].unique()):
            for ranking in [r for r in rankings if r in present]:
                for renorm in renormalize:
                    curves = _curves(summary, restrict, model, distance, ranking, renorm,
                                     variant, metric)
                    base = {"model": model, "distance": distance, "rule": ranking,
                            "variant": variant, "metric": metric,
                            "renormalize": bool(renorm)}
                    if len(curves) >= 2:
                        common = sorted(set.intersection(*(set(c.index)
                                                           for c in curves.values())))
                        mean = sum(c.loc[common] for c in curves.values()) / len(curves)
                        for r in _rows_for(mean, n_mins):
                            rows.append({**base, "corpus": "+".join(curves), **r,
                                         "averaged": True, "n_corpora": len(curves)})
                    for corpus, curve in curves.items():
                        for r in _rows_for(curve, n_mins):
                            rows.append({**base, "corpus": corpus, **r, "averaged": False,
                                         "n_corpora": 1})
    return pd.DataFrame(rows, columns=GEOMETRY_LOSS_COLUMNS)


def regime_stability(comparisons: list[tuple[str, str, str, object]]) -> pd.DataFrame:
    """One row per (model, corpus, other corpus) from ``compare.Comparison`` objects."""
    rows = [{
        "model": model, "corpus": a, "other_corpus": b, "n_heads": c.n_heads,
        "excluded": c.excluded, "agreement": c.agreement, "kappa": c.kappa,
        "n_stable": c.n_stable, "stable_agreement": c.stable_agreement,
    } for model, a, b, c in comparisons]
    return pd.DataFrame(rows, columns=["model", "corpus", "other_corpus", "n_heads", "excluded",
                                       "agreement", "kappa", "n_stable", "stable_agreement"])


# --------------------------------------------------------------------------- references

REFERENCE_COLUMNS = ["model", "corpus", "quantity", "params", "published", "measured",
                     "source", "location", "quote", "kind", "relation", "published_low",
                     "published_high", "published_text", "difference", "paper_models",
                     "our_setting", "paper_corpus"]
_CONTEXT_PROTOCOLS = ("fixed", "geometry")  # the settings a small model is shown against


def _nan(x) -> float:
    return math.nan if x is None else float(x)


def _one(df) -> float:
    return float(df.iloc[0]) if len(df) == 1 else math.nan


def _restrict_rows(df: pd.DataFrame, p: dict) -> pd.DataFrame:
    """Rows of a restrict or restrict_nstar table in the reference's setting."""
    df = df[df["scope"] == p.get("scope", "model")]
    df = df[_ranking_of(df) == p.get("ranking", "attention")]
    df = df[df["renormalize"].astype(bool) == bool(p.get("renormalize", False))]
    for key in ("layer", "head"):
        if key in p and key in df.columns:
            df = df[df[key] == int(p[key])]
    return df


def _measured_one(quantity: str, p: dict, tables: dict, model: str, corpus: str) -> float:
    """Our number for ``quantity`` in setting ``p`` on one model and corpus (NaN: the
    study did not measure it in that setting)."""

    def rows(name):
        df = tables.get(name)
        if df is None or not len(df):
            return None
        return df[(df["model"] == model) & (df["corpus"] == corpus)]

    if quantity in ("f_score", "precision", "recall", "best_n"):
        s = rows("summary")
        if s is None:
            return math.nan
        s = s[(s["scope"] == "model") & (s["rule"] == p.get("rule", "attention"))
              & (s["variant"] == p.get("variant", "full"))
              & (s["distance"] == p.get("distance", "euclidean"))]
        if quantity == "best_n":
            s = s[s["metric"] == "f_score"].sort_values("n")
            return float(s.loc[s["mean"].idxmax(), "n"]) if len(s) else math.nan
        s = s[s["metric"] == quantity]
        if "n" in p:
            s = s[s["n"] == int(p["n"])]
        return _one(s["mean"])
    if quantity == "n_star":
        if p.get("scoring", "all") != "all" or p.get("protocol", "fixed") != "fixed" \
                or "tau" not in p:
            return math.nan  # tail128 scoring, context sweeps, absolute tolerances
        s = rows("restrict_nstar")
        if s is None:
            return math.nan
        s = _restrict_rows(s, p)
        return _one(s[np.isclose(s["tau"].astype(float), float(p["tau"]))]["n_star"])
    if quantity == "delta_nll_rel":
        if p.get("protocol", "fixed") != "fixed" or p.get("scoring", "all") != "all":
            return math.nan
        local = p.get("scope", "model") != "model"
        # the localised scan (restrict_local) is scored as the paper's: the mean of the
        # per-document relative increases; whole-model rows as the ratio of means
        s = rows("restrict_local" if local else "restrict")
        column = "mean_doc_delta_rel" if local else "delta_nll_rel"
        if s is None or column not in s.columns:
            return math.nan
        s = _restrict_rows(s, p)
        if "n" in p:
            s = s[s["n"] == int(p["n"])]
        if local and "layer" not in p:  # the largest single-layer effect
            return float(s[column].max()) if len(s) else math.nan
        return _one(s[column])
    if quantity == "sink_norm_ratio":
        s = rows("sink")
        if s is None:
            return math.nan
        return float(s[s["n"] == s["n"].min()]["norm_ratio"].median())
    if quantity == "regime_share":
        s = rows("taxonomy")
        if s is None or "regime" not in p:
            return math.nan
        return float((s["regime"] == p["regime"]).mean())
    return math.nan


def _measured(ref, tables: dict, model: str, corpora: list[str]) -> float:
    """Our number for ``ref`` on ``model``. A two-corpus reference reads the averaged
    geometry-loss row (Table 1), the maximum of the two corpora's N*_tau (the paper's
    cross-corpus summary), or the mean of the corpora's values of any other quantity."""
    p = ref.setting
    if ref.quantity == "spearman_f_dnll":
        g = tables.get("geometry_loss")
        if g is None or not len(g):
            return math.nan
        g = g[(g["model"] == model) & (g["corpus"] == "+".join(corpora))
              & (g["distance"] == p.get("distance", "euclidean"))
              & (g["rule"] == p.get("ranking", "attention"))
              & (g["renormalize"].astype(bool) == bool(p.get("renormalize", False)))]
        if "n_min" in g.columns:
            g = g[g["n_min"] == int(p.get("n_min", 1))]
        return _one(g["spearman"])
    values = [_measured_one(ref.quantity, p, tables, model, c) for c in corpora]
    if len(values) == 1:
        return values[0]
    if not all(math.isfinite(v) for v in values):
        return math.nan
    # N*: the paper's cross-corpus summary is the larger; other quantities: the mean
    return max(values) if ref.quantity == "n_star" else float(np.mean(values))


def _corpus_labels(study, ref_corpus: str) -> list[str] | None:
    """The study's corpus labels a reference's corpus names (``a+b``: both), or None."""
    found = []
    for part in ref_corpus.lower().split("+"):
        hit = [label for label, c in study.corpora.items()
               if part in (label.lower(), str(c.corpus).lower().partition(":")[0])]
        if not hit:
            return None
        found.append(hit[0])
    return sorted(found)


def _our_setting(study, model: str, corpora: list[str]) -> str:
    """Window length, protocol and documents of the study's restrict (else analyze) runs."""
    for command in ("restrict", "analyze"):
        for cell in study.cells_of(command):
            if cell.model == model and cell.corpus in corpora:
                cfg = cell.config
                protocol = getattr(cfg, "document_protocol", "stream")
                docs = f", {cfg.n_documents} documents" if protocol == "fixed" else ""
                return f"{command}: L = {cfg.window_length}, {protocol} windows{docs}"
    return ""


def _row(ref, model, corpora, measured, kind, study, low=None, high=None, models=""):
    published = _nan(ref.value) if kind == "match" and not ref.is_range else math.nan
    exact = kind == "match" and ref.relation == "=" and ref.value is not None
    diff = measured - float(ref.value) if exact and math.isfinite(measured) else math.nan
    return {
        "model": model, "corpus": "+".join(corpora), "quantity": ref.quantity,
        "params": json.dumps(ref.setting, sort_keys=True), "published": published,
        "measured": measured, "source": ref.source, "location": ref.where,
        "quote": ref.note, "kind": kind, "relation": ref.relation,
        "published_low": _nan(low if low is not None else ref.low),
        "published_high": _nan(high if high is not None else ref.high),
        "published_text": (f"{low:g}-{high:g}" if low is not None and low != high
                           else f"{low:g}" if low is not None else ref.shown()),
        "difference": diff, "paper_models": models,
        "our_setting": _our_setting(study, model, corpora), "paper_corpus": ref.corpus,
    }


def reference_values(study, tables: dict, references) -> pd.DataFrame:
    """Published values beside ours.

    ``kind = "match"``: the reference's model is the preset of a study model and its
    corpus one the study ran (both corpora for a two-corpus value); ``measured`` is our
    number in the same setting (ranking, renormalisation, tau, N, distance; NaN where we
    did not measure that setting) and ``difference`` = measured - published for a
    point value. ``kind = "context"``: a study model the paper did not run, beside the
    paper's range over its models (``published_low`` .. ``published_high``, the models
    in ``paper_models``) for the same setting, shown only where we measured it; never a
    match, so ``published`` and ``difference`` stay NaN.
    """
    from attngeom.studies.references import ANY_MODEL

    refs = list(references)
    run_by = {r.model for r in refs if r.model != ANY_MODEL}
    rows = []
    for m_label, m in study.models.items():
        preset = getattr(m.preset, "name", None)
        if preset in run_by:
            for ref in refs:
                if ref.model != preset:
                    continue
                corpora = _corpus_labels(study, ref.corpus)
                if corpora is None:
                    continue
                rows.append(_row(ref, m_label, corpora,
                                 _measured(ref, tables, m_label, corpora), "match", study))
        groups: dict = {}
        for ref in refs:
            if ref.setting.get("protocol") not in _CONTEXT_PROTOCOLS:
                continue
            if preset in run_by and ref.model != ANY_MODEL:
                continue  # a model the paper ran: its own values above, ranges as context
            key = (ref.source, ref.where, ref.quantity, ref.corpus,
                   json.dumps(ref.setting, sort_keys=True, default=str))
            groups.setdefault(key, []).append(ref)
        for group in groups.values():
            ref = group[0]
            points = [r.value for r in group if r.value is not None and not r.is_range]
            ends = [x for r in group if r.is_range for x in (r.low, r.high)]
            both = points + ends
            if not both:
                continue
            models = ",".join(sorted({r.model for r in group}))
            for corpora in _context_corpora(study, ref.corpus):
                measured = _measured(ref, tables, m_label, corpora)
                if math.isfinite(measured):
                    rows.append(_row(ref, m_label, corpora, measured, "context", study,
                                     low=min(both), high=max(both), models=models))
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def _context_corpora(study, ref_corpus: str) -> list[list[str]]:
    """The study corpora a context range is shown beside: the same corpus where the study
    ran it, else each of the study's corpora (a two-corpus value: all of them averaged),
    the paper's corpus named in the row (``paper_corpus``): scale, not a match."""
    same = _corpus_labels(study, ref_corpus)
    if same is not None:
        return [same]
    labels = sorted(study.corpora)
    if "+" in ref_corpus:
        return [labels] if len(labels) >= 2 else []
    return [[label] for label in labels]
