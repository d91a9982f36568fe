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


def geometry_loss(summary: pd.DataFrame, restrict: pd.DataFrame, *, renormalize=(False,),
                  rule: str = "attention", variant: str = "full",
                  metric: str = "f_score") -> pd.DataFrame:
    """Spearman correlation over N of F_N (whole model, ``rule``, ``variant``) and the
    whole-model top-N restriction's relative delta-NLL, per model, corpus, distance and
    renormalisation (method: "Geometry against loss").

    Only the N both grids hold count; a correlation from fewer than three N is NaN.
    """
    columns = ["model", "corpus", "distance", "rule", "variant", "metric", "renormalize",
               "n_points", "ns", "spearman"]
    if summary is None or restrict is None or not len(summary) or not len(restrict):
        return pd.DataFrame(columns=columns)
    geo = summary[(summary["scope"] == "model") & (summary["rule"] == rule)
                  & (summary["variant"] == variant) & (summary["metric"] == metric)]
    loss = restrict[restrict["scope"] == "model"]
    rows = []
    for (model, corpus, distance), g in geo.groupby(["model", "corpus", "distance"],
                                                   sort=True):
        for renorm in renormalize:
            lo = loss[(loss["model"] == model) & (loss["corpus"] == corpus)
                      & (loss["renormalize"] == bool(renorm))]
            if not len(lo):
                continue
            merged = g[["n", "mean"]].merge(lo[["n", "delta_nll_rel"]], on="n").sort_values("n")
            rows.append({
                "model": model, "corpus": corpus, "distance": distance, "rule": rule,
                "variant": variant, "metric": metric, "renormalize": bool(renorm),
                "n_points": len(merged), "ns": ",".join(str(int(n)) for n in merged["n"]),
                "spearman": spearman(merged["mean"], merged["delta_nll_rel"]),
            })
    return pd.DataFrame(rows, columns=columns)


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


def _measured(ref, tables: dict, model: str, corpus: str) -> float:
    """The study's own number for a published reference value, NaN where the study did
    not measure it."""
    p = dict(ref.params)

    def only(name):
        df = tables.get(name)
        if df is None or not len(df):
            return None
        return df[(df["model"] == model) & (df["corpus"] == corpus)]

    q = ref.quantity
    if q in ("f_score", "precision", "recall"):
        s = only("summary")
        if s is None:
            return math.nan
        s = s[(s["scope"] == "model") & (s["metric"] == q)
              & (s["rule"] == p.get("rule", "attention"))
              & (s["variant"] == p.get("variant", "full"))
              & (s["distance"] == p.get("distance", "euclidean"))]
        if "n" in p:
            s = s[s["n"] == int(p["n"])]
        return float(s["mean"].iloc[0]) if len(s) == 1 else math.nan
    if q == "n_star":
        s = only("restrict_nstar")
        if s is None:
            return math.nan
        s = s[(s["scope"] == "model") & np.isclose(s["tau"], float(p.get("tau", -1)))
              & (s["renormalize"] == bool(p.get("renormalize", False)))]
        return float(s["n_star"].iloc[0]) if len(s) == 1 else math.nan
    if q == "spearman_f_dnll":
        s = only("geometry_loss")
        if s is None:
            return math.nan
        s = s[(s["distance"] == p.get("distance", "euclidean"))
              & (s["renormalize"] == bool(p.get("renormalize", False)))]
        return float(s["spearman"].iloc[0]) if len(s) == 1 else math.nan
    return math.nan


def reference_values(study, tables: dict, references) -> pd.DataFrame:
    """Published values whose model (by preset) and corpus (by name) the study ran,
    each beside the study's measurement of the same quantity (NaN: not measured)."""
    rows = []
    for m_label, m in study.models.items():
        preset = getattr(m.preset, "name", None)
        for c_label, c in study.corpora.items():
            names = {c_label.lower(), str(c.corpus).lower()}
            for ref in references:
                if ref.model not in (preset, m_label) or ref.corpus.lower() not in names:
                    continue
                rows.append({
                    "model": m_label, "corpus": c_label, "quantity": ref.quantity,
                    "params": json.dumps(dict(ref.params), sort_keys=True),
                    "published": float(ref.value),
                    "measured": _measured(ref, tables, m_label, c_label),
                    "source": ref.source, "location": ref.where, "quote": ref.quote,
                })
    return pd.DataFrame(rows, columns=["model", "corpus", "quantity", "params", "published",
                                       "measured", "source", "location", "quote"])
