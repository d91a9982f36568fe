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

from attngeom.names import HEAD_TYPES, PROBES
from attngeom.studies.comparable import (
    differences,
    our_side,
    paper_side,
    probe_configs,
    size_text,
    sizes_text,
)


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


# --------------------------------------------------------------------------- policy atlas

ALL_HEADS, UNTYPED = "all", "untyped"  # policy_head_types rows beside the head types
STREAMING = "streaming"  # the atlas' head type the window policy is asked about
FIRST_HEADS = 5  # the heads that break first: this many per ranking
HEAD_TYPES_COLUMNS = ["model", "corpus", "part", "ranking", "renormalize", "tau", "n",
                      "head_type", "n_heads", "mean_delta_nll_rel", "max_delta_nll_rel"]
FIRST_HEADS_COLUMNS = ["model", "corpus", "part", "ranking", "renormalize", "n", "rank",
                       "layer", "head", "mean_doc_delta_rel", "head_types", "streaming",
                       "streaming_share", "n_heads"]
_CELL = ["model", "corpus", "layer", "head"]


def atlas_types(head_scores: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Per head of the atlas (``head_scores``): the types it is of, comma-joined in the
    registry's order (``types``), and 1.0 / 0.0 for a streaming head or not (NaN where
    its streaming score is NaN); with, per (model, corpus), the types the atlas measured
    (some head has a finite score: an unmeasured type is never "no head of it")."""
    order = {t: i for i, t in enumerate(HEAD_TYPES.names())}
    hs = head_scores.drop_duplicates([*_CELL, "score"])  # analyze and atlas may both score
    hs = hs.assign(order=hs["score"].map(order).fillna(len(order))).sort_values(
        [*_CELL, "order", "score"], kind="stable")
    measured = {key: [t for t in dict.fromkeys(g["score"].astype(str))
                      if g.loc[g["score"] == t, "value"].notna().any()]
                for key, g in hs.groupby(["model", "corpus"], sort=False)}
    rows = []
    for (model, corpus, layer, head), g in hs.groupby(_CELL, sort=False):
        kinds = [str(t) for t, is_type, value in zip(g["score"], g["is_type"], g["value"],
                                                     strict=True)
                 if bool(is_type) and np.isfinite(value)]
        stream = g.loc[g["score"] == STREAMING, ["is_type", "value"]]
        flag = (float(bool(stream["is_type"].iloc[0]))
                if len(stream) and np.isfinite(stream["value"].iloc[0]) else math.nan)
        rows.append((model, corpus, int(layer), int(head), ",".join(kinds), flag))
    return pd.DataFrame(rows, columns=[*_CELL, "types", STREAMING]), measured


def _joined(alone: pd.DataFrame, types: pd.DataFrame) -> pd.DataFrame:
    """``alone`` rows of the models and corpora the atlas scored, with each head's types."""
    return alone.merge(types, on=_CELL, how="inner")


def policy_head_types(alone: dict, head_scores: pd.DataFrame) -> pd.DataFrame:
    """Per head type of the atlas and ranking: how much restricting one head alone at
    the oracle's N*_tau raises the loss (issue 39, the atlas joined).

    ``alone``: study part -> its heads-alone table (``restrict_alone`` columns: the
    ``policies`` part's ``policy_alone``, the ``restriction`` part's ``restrict_alone``).
    For each model and corpus the atlas scored, part, ranking and treatment: per head
    type the atlas measured, the number of its heads with a delta (``n_heads``: a head
    at an N below the ranking's fixed part has none) and their mean and largest relative
    delta-NLL; then ``untyped`` (heads of no measured type) and ``all``. A head of
    several types counts in each.
    """
    if head_scores is None or not len(head_scores):
        return pd.DataFrame(columns=HEAD_TYPES_COLUMNS)
    types, measured = atlas_types(head_scores)
    rows = []
    for part, table in alone.items():
        if table is None or not len(table):
            continue
        joined = _joined(table, types)
        keys = ["model", "corpus", "ranking", "renormalize"]
        for (model, corpus, ranking, renorm), g in joined.groupby(keys, sort=True):
            of = [set(filter(None, t.split(","))) for t in g["types"]]
            groups = [(t, [t in o for o in of]) for t in measured.get((model, corpus), [])]
            groups += [(UNTYPED, [not o for o in of]), (ALL_HEADS, [True] * len(of))]
            for name, chosen in groups:
                delta = g.loc[np.asarray(chosen, dtype=bool), "delta_nll_rel"].dropna()
                rows.append({"model": model, "corpus": corpus, "part": part,
                             "ranking": ranking, "renormalize": bool(renorm),
                             "tau": float(g["tau"].iloc[0]), "n": int(g["n"].iloc[0]),
                             "head_type": name, "n_heads": len(delta),
                             "mean_delta_nll_rel": float(delta.mean()) if len(delta)
                             else math.nan,
                             "max_delta_nll_rel": float(delta.max()) if len(delta)
                             else math.nan})
    return pd.DataFrame(rows, columns=HEAD_TYPES_COLUMNS)


def policy_first_heads(alone: dict, local: pd.DataFrame | None, head_scores: pd.DataFrame,
                       first: int = FIRST_HEADS) -> pd.DataFrame:
    """The heads that break first under each ranking, with their atlas types: are the
    heads a window breaks the streaming heads?

    Per model and corpus the atlas scored, for each heads-alone table of ``alone`` (study
    part -> table; ranked by the mean of each window's relative increase, ties to the
    smaller layer and head) and for the localised scan's head rows (``restrict_local``,
    part ``local``, its own rank), per ranking, treatment and N: the ``first`` heads of
    largest increase with their types, ``streaming`` (1 / 0; NaN where the atlas has no
    streaming score) and ``streaming_share``, the share of streaming heads among the
    ``n_heads`` heads that part restricted (the base rate the first heads compare with).
    """
    if head_scores is None or not len(head_scores):
        return pd.DataFrame(columns=FIRST_HEADS_COLUMNS)
    types, _ = atlas_types(head_scores)
    scored = []
    for part, table in alone.items():
        if table is not None and len(table):
            t = table.dropna(subset=["mean_doc_delta_rel"])
            t = t.sort_values(["mean_doc_delta_rel", "layer", "head"],
                              ascending=[False, True, True], kind="stable")
            t = t.assign(rank=t.groupby(["model", "corpus", "ranking", "renormalize"])
                         .cumcount() + 1)
            scored.append((part, t))
    if local is not None and len(local):
        scored.append(("local", local[local["scope"] == "head"]))
    rows = []
    for part, table in scored:
        joined = _joined(table, types)
        keys = ["model", "corpus", "ranking", "renormalize", "n"]
        for (model, corpus, ranking, renorm, n), g in joined.groupby(keys, sort=True):
            share = float(g[STREAMING].mean()) if g[STREAMING].notna().all() else math.nan
            for r in g.sort_values("rank").head(first).itertuples(index=False):
                rows.append({"model": model, "corpus": corpus, "part": part,
                             "ranking": ranking, "renormalize": bool(renorm), "n": int(n),
                             "rank": int(r.rank), "layer": int(r.layer), "head": int(r.head),
                             "mean_doc_delta_rel": float(r.mean_doc_delta_rel),
                             "head_types": r.types, STREAMING: float(getattr(r, STREAMING)),
                             "streaming_share": share, "n_heads": len(g)})
    return pd.DataFrame(rows, columns=FIRST_HEADS_COLUMNS)


# --------------------------------------------------------------------------- references

REFERENCE_COLUMNS = ["model", "corpus", "quantity", "params", "published", "measured",
                     "source", "location", "quote", "kind", "relation", "published_low",
                     "published_high", "published_text", "difference", "paper_models",
                     "our_setting", "paper_corpus", "differs", "our_size", "paper_size",
                     "our_length", "paper_length", "paper_order"]
# the settings a small model is shown against (qa and context: the competition probes)
_CONTEXT_PROTOCOLS = ("fixed", "geometry", "context", "qa")
_PROBE_PROTOCOLS = PROBES.names()  # read from the competition probes' tables
_PAPER_TAIL = 128  # App. B.3's tail128: the final 128 targets at every L
_PAPER_LENGTHS = (256, 512, 1024, 2048)  # App. C.4's four window lengths
_RATIO_LENGTHS = (256, 2048)  # C.4's "8x longer L": N*_5% at 2048 over 256
_QA_TASK = "babilong-qa1"  # the probe generates (or reads) qa1 only
# BABILong's background names as token counts (the probe's ``background`` column; a
# BABILong split "1k" is read as 1024 tokens too): only an equal count is the same setting
_BACKGROUND_TOKENS = {"0K": 0, "1K": 1024, "2K": 2048, "4K": 4096}
_PAPER_QA_GRID = 256  # BABILong N*: powers of two 1..256 (App. B.4)


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


def _mode(p: dict) -> str:
    """The probes' ``mode`` column for a reference's ``renormalize``."""
    return "renormalisation" if p.get("renormalize", False) else "deletion"


def _selected(df: pd.DataFrame, p: dict) -> pd.DataFrame:
    return df[(df["ranking"] == p.get("ranking", "attention")) & (df["mode"] == _mode(p))]


def _measured_context(quantity: str, p: dict, rows, tail: int | None) -> float:
    """Our number from the context sweep (``context_*``) in a C.4 setting: the same L,
    ranking, deletion or renormalisation, relative tau and scoring. Tail128 is our
    ``tail`` scoring only when the sweep scored the final 128 targets (a shorter tail is
    another setting: NaN); all-token scoring is the same whatever the tail."""
    scoring = p.get("scoring")
    if scoring == "tail128":
        if tail != _PAPER_TAIL:
            return math.nan
        ours = "tail"
    elif scoring == "all":
        ours = "all"
    else:
        return math.nan  # no scoring named (the NLL drop, parity): not read here
    if quantity in ("n_star", "n_star_ci_low", "n_star_ci_high", "n_star_ratio"):
        s = rows("context_nstar")
        if s is None or "tau" not in p:
            return math.nan  # no table, or C.4's absolute tolerance (not run here)
        s = _selected(s, p)
        s = s[(s["scoring"] == ours) & np.isclose(s["tau"].astype(float), float(p["tau"]))]
        if quantity == "n_star_ratio":
            a, b = (_one(s[s["length"] == L]["nstar"]) for L in _RATIO_LENGTHS)
            return b / a if a > 0 else math.nan
        if "window_length" not in p:
            return math.nan
        column = {"n_star_ci_low": "nstar_low", "n_star_ci_high": "nstar_high"}.get(
            quantity, "nstar_stable" if p.get("n_star_rule") == "stable" else "nstar")
        if column not in s.columns:
            return math.nan
        return _one(s[s["length"] == int(p["window_length"])][column])
    if quantity == "n_star_loglog_slope":
        s, ns = rows("context_slope"), rows("context_nstar")
        if s is None or ns is None or "tau" not in p:
            return math.nan
        ns = _selected(ns, p)
        ns = ns[(ns["scoring"] == ours) & np.isclose(ns["tau"].astype(float), float(p["tau"]))]
        if sorted(set(ns["length"].astype(int))) != list(_PAPER_LENGTHS):
            return math.nan  # a slope over other lengths is another setting
        s = _selected(s, p)
        return _one(s[(s["scoring"] == ours)
                      & np.isclose(s["tau"].astype(float), float(p["tau"]))]["slope"])
    if quantity == "delta_nll_rel":
        s = rows("context_curve")
        if s is None or "n" not in p or "window_length" not in p:
            return math.nan
        s = _selected(s, p)
        s = s[(s["scoring"] == ours) & (s["length"] == int(p["window_length"]))
              & (s["n"] == int(p["n"]))]
        return _one(s["delta_rel"].drop_duplicates())
    return math.nan


def _qa_nstar(rows, p: dict, background: int) -> float:
    """Our qa N* in the paper's reading: the power-of-two grid estimate (Tables 6 and 10
    report grid values up to 256), NaN where our grid found no pass (its value is then
    the prompt-length endpoint, which the paper's grid would not give)."""
    s = rows("qa_nstar")
    if s is None or "tau_nats" not in p:
        return math.nan
    s = _selected(s, p)
    s = s[(s["background"] == background)
          & np.isclose(s["tau"].astype(float), float(p["tau_nats"]))]
    n = _one(s["grid_nstar"])
    if not math.isfinite(n) or n > _PAPER_QA_GRID or int(n) & (int(n) - 1) \
            or ("prompt_tokens_max" in s.columns and n >= float(s["prompt_tokens_max"].iloc[0])):
        return math.nan
    return n


def _measured_qa(quantity: str, p: dict, rows) -> float:
    """Our number from the qa probe (``qa_*``) in a BABILong qa1 setting: the same
    background (token count), ranking, deletion or renormalisation and tau in nats; the
    4K/0K ratios and changes only where we ran both 0 and 4096 tokens of background."""
    bg = _BACKGROUND_TOKENS.get(p.get("background"))
    low, high = _BACKGROUND_TOKENS["0K"], _BACKGROUND_TOKENS["4K"]
    if quantity == "n_star_qa":
        return math.nan if bg is None else _qa_nstar(rows, p, bg)
    if quantity == "n_star_qa_ratio":
        return _qa_nstar(rows, p, high) / _qa_nstar(rows, p, low)
    if quantity in ("qa_loss", "qa_accuracy", "qa_accuracy_change_pp"):
        s = rows("qa_answers")
        if s is None:
            return math.nan
        column = "loss" if quantity == "qa_loss" else "accuracy"

        def at(b):
            return _one(s[s["background"] == b][column])

        if quantity == "qa_accuracy_change_pp":
            return 100.0 * (at(high) - at(low))
        return math.nan if bg is None else at(bg)
    statistic = {"support_displacement_ratio": "displacement", "support_mass_ratio": "mass",
                 "support_recall64_change_pp": "recall",  # the probe's recall is @64
                 "outranking_probability": "outranking"}.get(quantity)
    if statistic is None:
        return math.nan  # non-support counts and slopes: not in our tables
    s = rows("qa_support_summary")
    if s is None:
        return math.nan
    # mass is of the attention probabilities whatever the score; the others rank by it
    s = s[(s["score"] == p.get("ranking", "attention")) & (s["statistic"] == statistic)
          & (s["split"] == "all")]

    def mean(b):
        return _one(s[s["background"] == b]["mean"])

    if quantity == "outranking_probability":
        return math.nan if bg is None else mean(bg)
    if quantity == "support_recall64_change_pp":
        return 100.0 * (mean(high) - mean(low))
    return mean(high) / mean(low) if mean(low) > 0 else math.nan


def _measured_one(quantity: str, p: dict, tables: dict, model: str, corpus: str,
                  tail: int | None = None) -> float:
    """Our number for ``quantity`` in setting ``p`` on one model and corpus (NaN: the
    study did not measure it in that setting). ``tail``: the targets our context sweep
    scored on this model and corpus (None: not known)."""

    def rows(name):
        df = tables.get(name)
        if df is None or not len(df):
            return None
        return df[(df["model"] == model) & (df["corpus"] == corpus)]

    if p.get("protocol") == "context":
        return _measured_context(quantity, p, rows, tail)
    if p.get("protocol") == "qa":
        return _measured_qa(quantity, p, rows)
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


def _measured(ref, tables: dict, model: str, corpora: list[str],
              tails: dict | None = None) -> float:
    """Our number for ``ref`` on ``model``. A two-corpus reference reads the averaged
    geometry-loss row (Table 1), the maximum of the two corpora's N*_tau (the paper's
    cross-corpus summary), or the mean of the corpora's values of any other quantity.
    ``tails``: (model, corpus) -> the targets our context sweep scored there."""
    p = ref.setting
    if p.get("protocol") == "qa" and ref.corpus.lower() != _QA_TASK:
        return math.nan  # qa2, qa3: the probe runs qa1 only
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
    values = [_measured_one(ref.quantity, p, tables, model, c,
                            tail=(tails or {}).get((model, c))) for c in corpora]
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


def _tails(study, tables: dict) -> dict:
    """(model, corpus) -> the final targets our context sweep scored there: the run's
    ``tail`` option, else a ``competition_settings`` row that names it."""
    out = {}
    settings = tables.get("competition_settings")
    if settings is not None and len(settings) and {"model", "corpus", "setting",
                                                   "value"} <= set(settings.columns):
        for r in settings[settings["setting"] == "tail"].itertuples(index=False):
            try:
                out[(r.model, r.corpus)] = int(r.value)
            except (TypeError, ValueError):
                continue
    for model in study.models:
        for corpus in study.corpora:
            for cfg in probe_configs(study, "context", model, [corpus]):
                if getattr(cfg, "tail", None) is not None:
                    out[(model, corpus)] = int(cfg.tail)
    return out


def _probe_setting(study, protocol: str, model: str, corpora: list[str]) -> str:
    """What our qa or context probe ran, in a few words (the row's ``our_setting``)."""
    for cfg in probe_configs(study, protocol, model, corpora):
        if protocol == "context":
            lengths = ",".join(str(x) for x in cfg.lengths or cfg.DEFAULT_LENGTHS)
            return (f"context: L = {lengths}, final {getattr(cfg, 'tail', '?')} targets "
                    f"and all targets, {getattr(cfg, 'n_documents', '?')} documents")
        babilong = getattr(cfg, "babilong", None)
        source = (f"BABILong {babilong}" if babilong else
                  f"generated qa1, {getattr(cfg, 'n_episodes', '?')} episodes")
        backgrounds = ",".join(str(x) for x in getattr(cfg, "backgrounds", ()))
        return (f"qa: {source}, background {backgrounds} tokens, "
                f"{getattr(cfg, 'prompt_format', '?')} prompts, N grid to "
                f"{getattr(cfg, 'grid_max', '?')}")
    return ""


def _our_setting(study, model: str, corpora: list[str], protocol: str | None = None) -> str:
    """Window length, protocol and documents of the study's restrict (else analyze) runs;
    for a qa or context reference, what the probe ran."""
    if protocol in _PROBE_PROTOCOLS:
        return _probe_setting(study, protocol, model, corpora)
    for command in ("restrict", "analyze"):
        for cell in study.cells_of(command):
            if cell.model == model and cell.corpus in corpora:
                cfg = cell.config
                protocol = getattr(cfg, "document_protocol", "stream")
                docs = f", {cfg.n_documents} documents" if protocol == "fixed" else ""
                return f"{command}: L = {cfg.window_length}, {protocol} windows{docs}"
    return ""


def _tail_note(ref, model: str, corpora: list[str], tails: dict) -> str:
    """Why a tail128 value has no number of ours beside it when our sweep scored another
    tail (empty otherwise)."""
    p = ref.setting
    if p.get("protocol") != "context" or p.get("scoring") != "tail128":
        return ""
    other = sorted({tails[(model, c)] for c in corpora
                    if tails.get((model, c)) not in (None, _PAPER_TAIL)})
    if not other:
        return ""
    return (f"our sweep scored the final {','.join(map(str, other))} targets, not "
            f"{_PAPER_TAIL}: another setting, not measured")


MATCH, CONTEXT, NOT_MEASURED = "match", "context", "not measured"


def _params_b(study, label: str) -> float:
    """Our model's parameter count (billions): its configuration's, else its preset's."""
    from attngeom.studies.presets import PRESETS

    m = study.models.get(label)
    shape = getattr(m, "shape", None) or {}
    if shape.get("params_b"):
        return float(shape["params_b"])
    preset = PRESETS.get(getattr(getattr(m, "preset", None), "name", None))
    return float(preset.params_b) if preset is not None else math.nan


def _paper_models(ref, models: list[str], refs) -> list[str]:
    """The paper's models behind a value: its own, or for a statement about every model
    the models the same place of the paper names (else all of the paper's)."""
    from attngeom.studies.references import ANY_MODEL

    if ANY_MODEL not in models:
        return models
    named = sorted({r.model for r in refs if r.where == ref.where and r.model != ANY_MODEL
                    and r.source == ref.source})
    return named or sorted({r.model for r in refs if r.source == ref.source
                            and r.model != ANY_MODEL})


def _row(ref, study, tables, model, corpora, measured, low=None, high=None, models=(),
         tails=None, refs=()):
    """One published value beside ours: the verdict (``kind``) and what differs."""
    from attngeom.studies.presets import PRESETS

    preset = getattr(getattr(study.models[model], "preset", None), "name", None)
    paper_models = _paper_models(ref, list(models) or [ref.model], refs)
    same_model = paper_models == [preset] and not ref.is_range and low is None
    ours, paper = our_side(study, tables, ref, model, corpora), paper_side(ref)
    our_size = size_text(_params_b(study, model))
    paper_size = sizes_text(PRESETS[m].params_b for m in paper_models if m in PRESETS)
    differs = []
    if not same_model:
        theirs = (f"{paper_models[0]}" if len(paper_models) == 1
                  else f"{len(paper_models)} models")
        differs.append(f"model: {model} ({our_size}) vs {theirs} ({paper_size})")
    if ref.setting.get("protocol") != "qa" and _corpus_labels(study, ref.corpus) != \
            sorted(corpora):
        differs.append(f"corpus: {'+'.join(corpora)} vs {ref.corpus}")
    differs += differences(ours, paper)
    kind = (NOT_MEASURED if not math.isfinite(measured)
            else MATCH if not differs else CONTEXT)
    published = _nan(ref.value) if same_model else math.nan
    exact = kind == MATCH and ref.relation == "=" and ref.value is not None
    diff = measured - float(ref.value) if exact else math.nan
    protocol = ref.setting.get("protocol")
    note = ref.note
    if protocol in _PROBE_PROTOCOLS:
        extra = _tail_note(ref, model, corpora, tails or {})
        note = "; ".join(x for x in (note, extra) if x)
    return {
        "model": model, "corpus": "+".join(corpora), "quantity": ref.quantity,
        "params": json.dumps(ref.setting, sort_keys=True), "published": published,
        "measured": measured, "source": ref.source, "location": ref.where,
        "quote": note, "kind": kind, "relation": ref.relation,
        "published_low": _nan(low if low is not None else ref.low),
        "published_high": _nan(high if high is not None else ref.high),
        "published_text": (f"{low:g}-{high:g}" if low is not None and low != high
                           else f"{low:g}" if low is not None else ref.shown()),
        "difference": diff, "paper_models": ",".join(paper_models),
        "our_setting": _our_setting(study, model, corpora, protocol),
        "paper_corpus": ref.corpus, "differs": "; ".join(differs),
        "our_size": our_size, "paper_size": paper_size,
        "our_length": ours.get("L", ""), "paper_length": paper.get("L", ""),
        "paper_order": next((i for i, r in enumerate(refs) if r is ref), -1),
    }


def reference_values(study, tables: dict, references) -> pd.DataFrame:
    """Published values beside ours, each with a verdict (``kind``).

    For a study model whose preset the paper ran, each of its published values on a
    corpus the study ran (both corpora for a two-corpus value) is a row; ``measured`` is
    our number in the same tau, ranking, renormalisation, scope, N and distance (NaN
    where we did not measure that setting: ``kind = "not measured"``). For every study
    model, the paper's range over its models in a setting we measured is a row too
    (``published_low`` .. ``published_high``, the models in ``paper_models``; on the
    same corpus where the study ran it, else on each of ours).

    ``kind = "match"`` only where the model, the corpus and every protocol aspect of
    ``studies.comparable`` (window length, windows, N* search, Spearman's N range, qa
    questions) agree; then ``difference`` = measured - published for a point value.
    Otherwise ``kind = "context"`` and ``differs`` lists what is not alike (``"L: 64 vs
    1024"``), beside ``our_size`` / ``paper_size`` (parameters) and ``our_length`` /
    ``paper_length``; ``published`` is the model's own value where the paper ran it
    (NaN for a range) and ``difference`` stays NaN. ``paper_order`` is the value's
    place in ``references`` (the paper's order, for the report).
    """
    from attngeom.studies.references import ANY_MODEL

    refs = list(references)
    run_by = {r.model for r in refs if r.model != ANY_MODEL}
    tails = _tails(study, tables)
    rows = []
    for m_label, m in study.models.items():
        preset = getattr(m.preset, "name", None)
        if preset in run_by:
            for ref in refs:
                if ref.model != preset:
                    continue
                for corpora in _match_corpora(study, tables, ref, m_label):
                    rows.append(_row(ref, study, tables, m_label, corpora,
                                     _measured(ref, tables, m_label, corpora, tails),
                                     tails=tails, refs=refs))
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
            models = sorted({r.model for r in group})
            for corpora in _context_corpora(study, ref.corpus):
                measured = _measured(ref, tables, m_label, corpora, tails)
                if math.isfinite(measured):
                    rows.append(_row(ref, study, tables, m_label, corpora, measured,
                                     low=min(both), high=max(both), models=models,
                                     tails=tails, refs=refs))
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


_QA_TABLES = ("qa_answers", "qa_nstar", "qa_support_summary", "qa_curve")


def _match_corpora(study, tables: dict, ref, model: str) -> list[list[str]]:
    """The study corpora a paper model's reference is matched on: the reference's own
    corpus (both, for a two-corpus value); for BABILong qa1, each corpus our qa probe
    took its background from on this model (its task is qa1 whatever the background)."""
    if ref.setting.get("protocol") != "qa":
        corpora = _corpus_labels(study, ref.corpus)
        return [] if corpora is None else [corpora]
    if ref.corpus.lower() != _QA_TASK:
        return []
    found = set()
    for name in _QA_TABLES:
        df = tables.get(name)
        if df is not None and len(df):
            found |= set(df.loc[df["model"] == model, "corpus"].astype(str))
    return [[c] for c in sorted(found)]


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
