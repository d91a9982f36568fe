"""What every key table and finding of a report must say, from the definitions.

``RUN_TABLES`` / ``RUN_SENTENCES`` cover the run reports (analyze, restrict,
restrict-local, atlas, competition qa and context), ``study_checks(...)`` the study
report. Each table check names the source table and how a cell is read from it (one
row, or the reduction the caption states); each sentence check parses the setting the
sentence names and recomputes its numbers in that setting (see ``consistency``).
A new column of a table (e.g. the search rule of N*) is read as itself by the checks
that list columns generically (``_as_itself``), so they extend without change.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from attngeom.report.html import fmt
from tests.report.consistency import (
    Cells,
    Sentence,
    ci_text,
    close,
    expect,
    one,
    reduced,
    same,
    select,
    text,
    treatment,
)
from tests.report.policy_checks import (
    RUN_POLICY_SENTENCES,
    RUN_POLICY_TABLES,
    STUDY_POLICY_SENTENCES,
    study_policy_checks,
)

_MC = {"model": ("model", None), "corpus": ("corpus", None)}


def _as_itself(header: str):
    """A column shown under its own source name, one row per cell."""
    return {}, one(header)


def _n_header(prefix: str, column: str, value):
    def read(header: str):
        m = re.fullmatch(rf"{re.escape(prefix)}(\S+)", header)
        return ({column: float(m.group(1))}, value) if m else None
    return read


def _unmeasured_scores(df):
    """Head types (score names) no head has a value for."""
    if "score" in df.columns:
        finite = df.groupby("score")["value"].apply(lambda v: v.notna().any())
    else:
        return []
    return [str(k) for k, ok in finite.items() if not ok]


# --------------------------------------------------------------------------- run tables


def _summary_where(df, m):
    return df[(df["scope"] == "model") & (df["variant"] == "full")
              & (df["distance"] == m.group(1).lower())]


RUN_TABLES = [
    Cells(r"^Model-wide P, R and F by rule and N \((\w+), whole model; mean \[95% CI\]\)$",
          "summary", {**_MC, "metric": ("metric", None), "rule": ("rule", None)},
          _n_header("N=", "n", ci_text), where=_summary_where),
    Cells(r"^Sink geometry by layer \(median value-norm ratio, mean cosine and mass over "
          r"heads\)$", "sink", {**_MC, "layer": ("layer", None)},
          lambda h: {"heads": ({}, reduced("head", "nunique")),
                     "norm_ratio_median": ({}, reduced("norm_ratio", "median")),
                     "sink_cos_mean": ({}, reduced("sink_cos_mean", "mean")),
                     "sink_mass_mean": ({}, reduced("sink_mass", "mean"))}.get(h),
          where=lambda df, m: df[df["n"] == df["n"].min()]),
    Cells(r"^Position 0 by layer", "sink_tokens", {**_MC, "layer": ("layer", None)},
          lambda h: {"token": ({}, reduced("token", "first")),
                     "mean_share": ({}, reduced("mean_share", "mean")),
                     "lift": ({}, reduced("lift", "mean")),
                     "heads_detected": ({}, reduced("detected", "sum"))}.get(h),
          where=lambda df, m: df[df["position"] == 0]),
    Cells(r"^Sinks by token identity other than position 0", "sink_tokens",
          {**_MC, "layer": ("layer", None), "head": ("head", None)}, _as_itself,
          where=lambda df, m: df[(df["position"] != 0) & df["detected"].astype(bool)]),
    Cells(r"^Heads per regime by layer$", "taxonomy", {**_MC, "layer": ("layer", None)},
          lambda h: ({"regime": h}, reduced("layer", "count"))),
    Cells(r"^Regime signatures \(mean over heads\)$", "taxonomy",
          {**_MC, "regime": ("regime", None)},
          lambda h: ({}, reduced("layer", "count")) if h == "heads"
          else ({}, reduced(h, "mean"))),
    Cells(r"^Most frequent single other source", "taxonomy",
          {**_MC, "top_source_kind": ("top_source_kind", None),
           "top_source": ("top_source", None)},
          lambda h: ({}, reduced("layer", "count")) if h == "heads" else None),
    Cells(r"^Measured F against the envelope by N \(mean over heads\)$", "bounds",
          {**_MC, "n": ("n", None)},
          lambda h: {"f_measured": ({}, reduced("f_measured", "mean")),
                     "f_envelope": ({}, reduced("f_envelope", "mean")),
                     "certified_share": ({}, reduced("certified", "mean"))}.get(h)),
    Cells(r"^Assumption diagnostics \(median over heads\)$", "assumptions", dict(_MC),
          lambda h: ({}, reduced(h, "median"))),
    Cells(r"^Perplexity by ranker and keep fraction \(mean over seeds\)$", "pruning",
          {**_MC, "ranker": ("ranker", None), "order": ("order", lambda v: "" if v != v
                                                        else str(v))},
          _n_header("keep ", "keep_fraction", reduced("perplexity", "mean"))),
    Cells(r"^Ten heads whose removal costs most$", "head_scan",
          {**_MC, "layer": ("layer", None), "head": ("head", None)}, _as_itself),
    Cells(r"^Relative delta-NLL under whole-model top-N restriction, by ranking and "
          r"treatment \(deleted or renormalised\), at the N of the grid$", "restrict",
          {**_MC, "ranking": ("ranking", None), "treatment": ("renormalize", treatment)},
          _n_header("N=", "n", one("delta_nll_rel")),
          where=lambda df, m: df[(df["scope"] == "model") & df["on_grid"].astype(bool)],
          complete=lambda df: {f"N={n}" for n in df["n"]},
          every_key=("ranking", "renormalize")),
    Cells(r"^Effective set sizes N\*_tau", "restrict_nstar",
          {**_MC, "scope": ("scope", None), "layer": ("layer", None),
           "head": ("head", None), "ranking": ("ranking", None),
           "treatment": ("renormalize", treatment), "tau": ("tau", None)}, _as_itself,
          every_key=("scope", "layer", "head", "ranking", "renormalize", "tau")),
    Cells(r"^Localised restriction: the five most sensitive per scope$", "restrict_local",
          {**_MC, "scope": ("scope", None), "ranking": ("ranking", None),
           "renormalize": ("renormalize", None), "n": ("n", None), "rank": ("rank", None),
           "layer": ("layer", None), "head": ("head", None)}, _as_itself),
    Cells(r"^Head scores \(one row per head\)", "head_scores",
          {**_MC, "layer": ("layer", None), "head": ("head", None)},
          lambda h: ({"score": h}, one("value")),
          complete=lambda df: set(df["score"]), unmeasured=_unmeasured_scores),
]


def _types_unmeasured(tables):
    return lambda df: _unmeasured_scores(tables["head_scores"])


def atlas_checks(tables) -> list[Cells]:
    """The contingency and kappa tables read the head scores to know what was measured."""
    gone = _types_unmeasured(tables)
    return [
        Cells(r"^Heads by regime and head type \(counts\)", "atlas_contingency",
              {**_MC, "regime": ("regime", None)},
              lambda h: ({"head_type": h}, one("count")),
              complete=lambda df: set(df["head_type"]), unmeasured=gone),
        Cells(r"^Cohen's kappa of each regime against each head type", "atlas_kappa",
              {**_MC, "regime": ("regime", None)},
              lambda h: ({"head_type": h}, one("kappa")),
              complete=lambda df: set(df["head_type"]), unmeasured=gone),
        Cells(r"^F_N of each head type's heads against their random control", "atlas_fn",
              {**_MC, "head_type": ("head_type", None), "n": ("n", None)}, _as_itself,
              where=lambda df, m: df[~df["head_type"].isin(gone(None))]),
    ]


COMPETITION_TABLES = [
    Cells(r"^Competence screen: answers per background", "qa_answers",
          {**_MC, "background": ("background", None)}, _as_itself),
    Cells(r"^qa N\* \(answer-loss increase within tau nats\)$", "qa_nstar",
          {**_MC, "background": ("background", None), "ranking": ("ranking", None),
           "mode": ("mode", None), "tau": ("tau", None)}, _as_itself,
          every_key=("background", "ranking", "mode", "tau")),
    Cells(r"^Support statistics at the answer query \(mean over heads, all episodes\)$",
          "qa_support_summary", {**_MC, "background": ("background", None)},
          lambda h: ({"score": h.split(" ")[0], "statistic": h.split(" ")[1]},
                     one("mean")),
          where=lambda df, m: df[df["split"] == "all"],
          complete=lambda df: {f"{a} {b}" for a, b in zip(df["score"], df["statistic"],
                                                          strict=True)}),
    Cells(r"^Context sweep: N\* per length$", "context_nstar",
          {**_MC, "scoring": ("scoring", None), "ranking": ("ranking", None),
           "mode": ("mode", None), "tau": ("tau", None), "length": ("length", None)},
          _as_itself, every_key=("scoring", "ranking", "mode", "tau", "length")),
    Cells(r"^Log-log slope of N\* on L$", "context_slope",
          {**_MC, "scoring": ("scoring", None), "ranking": ("ranking", None),
           "mode": ("mode", None), "tau": ("tau", None)}, _as_itself),
]


# --------------------------------------------------------------------------- run sentences


def _rows(tables, name, **eq):
    df = tables.get(name)
    return None if df is None else select(df, eq)


def _ci_words(rows) -> str | None:
    if len(rows) != 1:
        return None
    r = rows.iloc[0]
    if np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"]):
        return f"{fmt(r['mean'])} (95% CI {fmt(r['ci_low'])} to {fmt(r['ci_high'])})"
    return fmt(r["mean"])


def _f_score(m, tables):
    s = tables["summary"]
    s = s[(s["scope"] == "model") & (s["variant"] == "full") & (s["metric"] == "f_score")
          & (s["distance"] == m["distance"].lower()) & (s["n"] == int(m["n"]))]
    out = []
    for rule in ("attention", "random", "contribution"):
        shown = m[rule]
        rows = s[s["rule"] == rule]
        if shown is None:
            if len(rows):
                out.append(f"the {rule} rule is in the table but not in the sentence")
            continue
        want = _ci_words(rows)
        if want != shown:
            out.append(f"{rule}: shows {shown!r}, the source gives {want!r}")
    return out


def _sink_variant(m, tables):
    s = tables["summary"]
    s = s[(s["scope"] == "model") & (s["rule"] == "attention") & (s["metric"] == "f_score")
          & (s["n"] == int(m["n"])) & (s["distance"] == m["distance"].lower())]
    full, no_sink = (s[s["variant"] == v]["mean"] for v in ("full", "no_sink"))
    if len(full) != 1 or len(no_sink) != 1:
        return ["the sentence names several rows (distances averaged?)"]
    return (expect("full", m["full"], full.iloc[0])
            + expect("no sink", m["no_sink"], no_sink.iloc[0]))


def _nstar(m, tables):
    rows = _rows(tables, "restrict_nstar", scope="model", ranking=m["ranking"],
                 renormalize=m["treat"] == "renormalised", tau=float(m["tau"]))
    if rows is None or len(rows) != 1:
        return [f"names {0 if rows is None else len(rows)} N* rows"]
    r = rows.iloc[0]
    if r["n_star_status"] == "above_grid":
        largest = int(tables["restrict"]["n"].max())
        want = f"above the largest N tried ({largest})"
        return [] if m["value"] == want else [f"shows {m['value']!r}, expected {want!r}"]
    return expect("N*", m["value"], r["n_star"])


def _nstar_cover(tables):
    ns = tables.get("restrict_nstar")
    if ns is None:
        return set()
    ns = ns[ns["scope"] == "model"]
    return {(str(r.ranking), treatment(r.renormalize), fmt(r.tau)) for r in ns.itertuples()}


def _local(m, tables):
    scope = m["scope"]
    rows = _rows(tables, "restrict_local", scope=scope, ranking=m["ranking"],
                 renormalize=m["treat"] == "renormalised", n=int(m["n"]), rank=1)
    if rows is None or len(rows) != 1:
        return ["names no single most sensitive row"]
    r = rows.iloc[0]
    where = (f"layer {int(r['layer'])}" if scope == "layer"
             else f"layer {int(r['layer'])} head {int(r['head'])}")
    out = [] if m["where"] == where else [f"names {m['where']!r}, the source {where!r}"]
    return out + expect("increase", m["value"], r["mean_doc_delta_rel"])


def _pruning(m, tables):
    p = tables["pruning"].copy()
    p["order"] = p["order"].fillna("").astype(str)
    several = p.groupby("ranker")["order"].transform("nunique") > 1
    p["name"] = np.where(several & (p["order"] != ""), p["ranker"] + " [" + p["order"] + "]",
                         p["ranker"])
    keep = float(m["keep"]) / 100
    at = p[np.isclose(p["keep_fraction"], keep)].groupby("name")["perplexity"].mean()
    best = at.sort_values().index[0]
    out = [] if m["best"] == best else [f"best ranker {m['best']!r}, the source {best!r}"]
    out += expect("perplexity", m["ppl"], at[best])
    full = p[np.isclose(p["keep_fraction"], 1.0)]["perplexity"].mean()
    out += expect("every head", m["full"], full)
    if m["random"] is not None:
        out += expect("random", m["random"], at["random"])
    return out


def _atlas_types(m, tables):
    hs = tables["head_scores"]
    gone = set(_unmeasured_scores(hs))
    out = expect("heads", m["heads"], hs[["layer", "head"]].drop_duplicates().shape[0])
    shown = dict(re.findall(r"([\w-]+) (\d+)", m["types"]))
    for score in hs["score"].unique():
        name = score.replace("_", "-")
        if score in gone:
            if name in shown:
                out.append(f"{name} is counted ({shown[name]}) though no head has a value")
            continue
        want = int(hs[(hs["score"] == score) & hs["is_type"].astype(bool)].shape[0])
        if shown.get(name) != str(want):
            out.append(f"{name}: shows {shown.get(name)!r}, the source gives {want}")
    return out


def _atlas_unmeasured(m, tables):
    hs = tables["head_scores"]
    score = m["name"].replace("-", "_")
    if score not in _unmeasured_scores(hs):
        return [f"{score} has values: it is measured"]
    samples = int(hs[hs["score"] == score]["n_samples"].max())
    return [] if int(m["samples"]) == samples else [f"{m['samples']} samples, the source "
                                                      f"{samples}"]


def _kappa(m, tables):
    k = tables["atlas_kappa"]
    k = k[~k["head_type"].isin(_unmeasured_scores(tables["head_scores"]))]
    best = k.dropna(subset=["kappa"]).sort_values("kappa", ascending=False).iloc[0]
    out = [] if (m["regime"], m["type"]) == (best["regime"],
                                             best["head_type"].replace("_", "-")) else [
        f"names {m['regime']} / {m['type']}, the source {best['regime']} / "
        f"{best['head_type']}"]
    return out + expect("kappa", m["kappa"], best["kappa"]) + expect("both", m["both"],
                                                                      best["both"])


def _qa_answers(m, tables):
    rows = _rows(tables, "qa_answers", background=int(m["bg"]))
    if rows is None or len(rows) != 1:
        return ["names no single background"]
    r = rows.iloc[0]
    screen = "passed" if r["screen"] else "not passed"
    return (expect("accuracy", m["acc"], r["accuracy"]) + expect("loss", m["loss"], r["loss"])
            + ([] if m["screen"] == screen else ["screen"]))


def _qa_nstar(m, tables):
    rows = _rows(tables, "qa_nstar", ranking=m["ranking"], mode=m["mode"],
                 tau=float(m["tau"]), background=int(m["bg"]))
    if rows is None or len(rows) != 1:
        return [f"names {0 if rows is None else len(rows)} qa N* rows"]
    return expect("N*", m["value"], rows.iloc[0]["nstar"])


def _slope(m, tables):
    rows = _rows(tables, "context_slope", scoring=m["scoring"], ranking=m["ranking"],
                 mode=m["mode"], tau=float(m["tau"]))
    if rows is None or len(rows) != 1:
        return ["names no single slope"]
    r = rows.iloc[0]
    return (expect("slope", m["slope"], r["slope"]) + expect("low", m["low"], r["slope_low"])
            + expect("high", m["high"], r["slope_high"]))


_NUM = r"-?[\d.e+-]+|n/a"
RUN_SENTENCES = [
    Sentence(r"F-score at N = (?P<n>\d+) \((?P<distance>\w+), whole model\): "
             r"attention-selected sets (?P<attention>.+?)(?:, random sets (?P<random>.+?))?"
             r"(?:, contribution-ranked (?P<contribution>.+?))?\.", _f_score),
    Sentence(rf"Excluding the sink from the universe moves attention F at N = (?P<n>\d+) "
             rf"\((?P<distance>\w+), whole model\) from (?P<full>{_NUM}) to "
             rf"(?P<no_sink>{_NUM})\.", _sink_variant),
    Sentence(rf"Effective set size N\*_tau at tau = (?P<tau>{_NUM}) \((?P<ranking>\w+) "
             rf"ranking, (?P<treat>deleted|renormalised), whole model\): (?P<value>.+)\.",
             _nstar, cover=_nstar_cover,
             key=lambda m: (m["ranking"], m["treat"], m["tau"])),
    Sentence(rf"Most sensitive (?P<scope>layer|head) to keeping N = (?P<n>\d+) keys "
             rf"\((?P<ranking>\w+), (?P<treat>deleted|renormalised)\): (?P<where>layer \d+"
             rf"(?: head \d+)?), mean relative NLL increase (?P<value>{_NUM})\.", _local),
    Sentence(rf"Keeping (?P<keep>{_NUM})% of heads, the best ranker is (?P<best>.+?) "
             rf"\(perplexity (?P<ppl>{_NUM}), mean over seeds; (?P<full>{_NUM}) with every "
             rf"head\)(?:; random removal gives (?P<random>{_NUM}))?\.", _pruning),
    Sentence(r"Head types among (?P<heads>\d+) heads \(published thresholds\): "
             r"(?P<types>.+)\.", _atlas_types),
    Sentence(r"(?P<name>[\w-]+) heads: not measured: (?P<samples>\d+) [\w -]+ counted"
             r"(?: \(.*\))?\.", _atlas_unmeasured),
    Sentence(rf"Closest regime and head type: (?P<regime>\w+) and (?P<type>[\w-]+) heads "
             rf"\(Cohen's kappa (?P<kappa>{_NUM}), (?P<both>\d+) heads both\)\.", _kappa),
    Sentence(rf"qa with (?P<bg>\d+) tokens of background \(\w+ prompt\): accuracy "
             rf"(?P<acc>{_NUM}), answer loss (?P<loss>{_NUM}) nats, competence screen "
             rf"(?P<screen>passed|not passed)\.", _qa_answers),
    Sentence(rf"qa N\* at tau = (?P<tau>{_NUM}) nats \((?P<ranking>\w+), (?P<mode>\w+)\), "
             rf"(?P<bg>\d+) tokens of background: (?P<value>{_NUM})\.", _qa_nstar,
             cover=lambda t: {(r.ranking, r.mode, fmt(r.tau), str(int(r.background)))
                              for r in t["qa_nstar"].itertuples()} if "qa_nstar" in t
             else set(),
             key=lambda m: (m["ranking"], m["mode"], m["tau"], m["bg"])),
    Sentence(rf"Context sweep: N\* grows with L as L\^(?P<slope>{_NUM}) \(95% interval "
             rf"(?P<low>{_NUM}) to (?P<high>{_NUM}); (?P<scoring>\w+) scoring, "
             rf"(?P<ranking>\w+) (?P<mode>\w+), tau = (?P<tau>{_NUM})\)\.", _slope),
]

# sentences of the analyze report checked only for their form here: the sink, taxonomy,
# bounds and head-scan sentences name no setting a run holds several of
RUN_SENTENCES += [Sentence(p, lambda m, t: []) for p in (
    r"Sink value norm: .+", r"The sink's value points against .+",
    r"F at N = \d+ when the sink is selected: .+", r"Sinks by token other than .+",
    r"No token other than position 0 .+", r"Of \d+ heads: .+", r"Label stability .+",
    r"In Mixer heads the sink wins .+", r"The constant-norm envelope certifies .+",
    r"The coherence mu is .+", r"\d+ of \d+ heads are critical .+",
    r"No head is critical.+")]


# --------------------------------------------------------------------------- the study


def _ns_words(ns: str) -> str:
    values = [x for x in str(ns).split(",") if x]
    return f"{values[0]}..{values[-1]} ({len(values)} sizes)"


def _published(refs, preset, paper_corpus, quantity, **setting):
    """The published value of ``preset`` on ``paper_corpus`` in ``setting`` (exactly
    these keys, no others but the ones every such value carries), or None."""
    found = [r for r in refs if r.model == preset and r.corpus == paper_corpus
             and r.quantity == quantity and "n_star_rule" not in r.setting
             and all(k in r.setting and close(r.setting[k], v) for k, v in setting.items())]
    return found[0].value if len(found) == 1 else None


def study_checks(tables, presets: dict, corpora: dict) -> list:
    """The study report's tables. ``presets``: study model -> the paper's preset;
    ``corpora``: study corpus -> the paper's corpus name (the stub the study ran)."""
    from attngeom.studies import references as R

    refs = R.REFERENCES

    def verdict(rows):
        """The verdicts of the published values beside these rows (every L)."""
        rv = tables["reference_values"]
        kinds = set()
        for r in rows.itertuples():
            for v in rv[(rv["model"] == r.model) & (rv["corpus"] == r.corpus)
                        & (rv["quantity"] == "n_star") & rv["published"].notna()].itertuples():
                p = json.loads(v.params)
                if p.get("protocol") == "context" and "n_star_rule" not in p \
                        and "tau" in p and close(p["tau"], r.tau) \
                        and p.get("window_length") == r.length \
                        and p["ranking"] == r.ranking \
                        and p["scoring"] == ("tail128" if r.scoring == "tail" else "all") \
                        and p["renormalize"] == (r.mode == "renormalisation"):
                    kinds.add(v.kind)
        return ", ".join(sorted(kinds))

    def context_value(header):
        if header == "verdict":
            return {}, verdict
        m = re.fullmatch(r"(ours|paper) L=(\d+)", header)
        if m is None:
            return None
        L = int(m.group(2))
        if m.group(1) == "ours":
            return {"length": L}, one("nstar")

        def paper(rows):
            if len(rows) != 1:
                return None
            r = rows.iloc[0]
            v = _published(refs, presets.get(r["model"]), corpora.get(r["corpus"]), "n_star",
                           protocol="context", window_length=L, tau=float(r["tau"]),
                           ranking=r["ranking"], renormalize=r["mode"] == "renormalisation",
                           scoring="tail128" if r["scoring"] == "tail" else "all")
            return text(v if v is not None else math.nan)
        paper.single = True
        return {"length": L}, paper

    def spearman(header):
        m = re.fullmatch(r"N >= (\d+)(: N over)?", header)
        if m is None:
            return None
        if m.group(2):
            def over(rows):
                return _ns_words(rows.iloc[0]["ns"]) if len(rows) == 1 else None
            over.single = True
            return {"n_min": int(m.group(1))}, over
        return {"n_min": int(m.group(1))}, one("spearman")

    def nstar(header):
        m = re.fullmatch(r"(n_star|grid_n_star) tau=(\S+)", header)
        return ({"tau": float(m.group(2))}, one(m.group(1))) if m else None

    return [
        Cells(r"^F_N \(whole model\) by N$", "summary",
              {**_MC, "distance": ("distance", None), "rule": ("rule", None)},
              lambda h: ({"n": int(h)}, one("mean")),
              where=lambda df, m: df[(df["scope"] == "model") & (df["metric"] == "f_score")
                                     & (df["variant"] == "full")]),
        Cells(r"^Effective set size N\*_tau \(whole model", "restrict_nstar",
              {**_MC, "ranking": ("ranking", None), "treatment": ("renormalize", treatment)},
              nstar, where=lambda df, m: df[df["scope"] == "model"],
              every_key=("model", "corpus", "ranking", "renormalize")),
        Cells(r"^Geometry against loss \(the follow-up's Table 1", "geometry_loss",
              {**_MC, "distance": ("distance", None), "rule": ("rule", None),
               "renormalize": ("renormalize", None)}, spearman),
        Cells(r"^Pruning: perplexity by ranker", "pruning",
              {**_MC, "ranker": ("ranker", None),
               "order": ("order", lambda v: "" if v != v else str(v))},
              _n_header("keep ", "keep_fraction", reduced("perplexity", "mean"))),
        Cells(r"^Context sweep: N\* by model, corpus and length L", "context_nstar",
              {**_MC, "scoring": ("scoring", None), "ranking": ("ranking", None),
               "mode": ("mode", None), "tau": ("tau", None)}, context_value,
              every_key=("model", "corpus", "scoring", "ranking", "mode", "tau")),
        _ReferenceTable(presets, corpora),
        _Unmeasured(presets, corpora),
        Cells(r"^Localised restriction: the most sensitive layer and head per model "
              r"\(head -1: the layer scope, every head of the layer restricted\)$",
              "restrict_local", {**_MC, "scope": ("scope", None), "ranking": ("ranking", None),
                                 "renormalize": ("renormalize", None), "n": ("n", None)},
              _as_itself, where=lambda df, m: df[df["rank"] == 1],
              every_key=("model", "corpus", "scope", "ranking", "renormalize", "n")),
        *study_policy_checks(tables),
    ]


class _Unmeasured:
    """The paper's values for our models in settings we did not run: each is the paper's
    value for that model's preset, on the paper corpus our corpus is, in that setting."""

    caption = r"^#reference-unmeasured$"

    def __init__(self, presets, corpora):
        self.presets, self.corpora = presets, corpora

    def check(self, shown, tables, out) -> None:
        from attngeom.report.study import setting_text  # names the row, no number
        from attngeom.studies import references as R

        for _labels, cells in shown.rows:
            row = dict(zip(shown.columns, cells, strict=True))
            preset = self.presets.get(row["model"])
            corpora = {self.corpora.get(c) for c in row["corpus"].split("+")}
            found = [r for r in R.REFERENCES
                     if r.model == preset and r.where == row["location"]
                     and r.quantity == row["quantity"] and r.shown() == row["published"]
                     and setting_text(json.dumps(r.setting)) == row["setting"]
                     and (r.setting.get("protocol") == "qa"
                          or set(r.corpus.split("+")) == corpora)]
            if not found:
                out.add(f"unmeasured row {row['model']}/{row['location']}/{row['quantity']} "
                        f"on {row['corpus']}: the paper gives no {row['published']!r} for "
                        f"{preset} on that corpus in that setting")


class _ReferenceTable:
    """The published values beside ours: each row's published value from the paper's
    list, ours from our tables, and the verdict "match" only where nothing differs."""

    caption = r"^#reference-values$"

    def __init__(self, presets, corpora):
        self.presets, self.corpora = presets, corpora

    def check(self, shown, tables, out) -> None:
        from attngeom.studies import references as R

        cols = shown.columns
        rv = tables["reference_values"]
        for _labels, cells in shown.rows:
            row = dict(zip(cols, cells, strict=True))
            model = row["ours: model (size), corpus"].split(" (")[0]
            ours_corpus = row["ours: model (size), corpus"].rsplit(", ", 1)[1]
            paper_corpus = row["paper's: model (size), corpus"].rsplit(", ", 1)[1]
            quantity = row["quantity and setting"].split(":")[0]
            where = row["where"]
            verdict, differs = row["verdict"], row["what differs"]
            if verdict not in ("match", "context"):
                out.add(f"reference row {model}/{where}: verdict {verdict!r}")
            if (verdict == "match") != (differs == "-"):
                out.add(f"reference row {model}/{where}: verdict {verdict} with "
                        f"differences {differs!r}")
            candidates = rv[(rv["model"] == model) & (rv["corpus"] == ours_corpus)
                            & (rv["location"] == where) & (rv["quantity"] == quantity)
                            & (rv["paper_corpus"] == paper_corpus)]
            from attngeom.report.study import setting_text  # names the row, no number

            candidates = candidates[[
                row["quantity and setting"] == f"{quantity}: {setting_text(params)}"
                and same(row["ours"], v)
                for params, v in zip(candidates["params"], candidates["measured"],
                                     strict=True)]]
            if not len(candidates):
                out.add(f"reference row {model}/{where}/{quantity}: no measurement of ours "
                        f"on {ours_corpus} is {row['ours']!r}")
                continue
            p = json.loads(candidates.iloc[0]["params"])
            mine = self._ours(tables, model, ours_corpus, quantity, p)
            if mine is not None and text(mine) != row["ours"]:
                out.add(f"reference row {model}/{where}/{quantity}: ours {row['ours']!r}, "
                        f"our tables give {text(mine)!r}")
            preset = self.presets.get(model)
            if row["paper's: model (size), corpus"].startswith(f"{preset} ("):  # its own
                want = _published(R.REFERENCES, preset, paper_corpus, quantity, **p)
                if want is not None and row["published"] != f"{want:g}":
                    out.add(f"reference row {model}/{where}/{quantity} on {paper_corpus}: "
                            f"published {row['published']!r}, the paper's {want:g}")
            wanted = {self.corpora.get(c) for c in ours_corpus.split("+")}
            if set(paper_corpus.split("+")) != wanted and "corpus" not in differs:
                out.add(f"reference row {model}/{where}: our corpus {ours_corpus} is not the "
                        f"paper's {paper_corpus}, and the row does not say so")

    @staticmethod
    def _ours(tables, model, corpus, quantity, p):
        if quantity == "n_star" and p.get("protocol") == "fixed":
            rows = _rows(tables, "restrict_nstar", model=model, corpus=corpus, scope="model",
                         ranking=p["ranking"], renormalize=p["renormalize"], tau=p["tau"])
            return rows.iloc[0]["n_star"] if rows is not None and len(rows) == 1 else None
        if quantity == "n_star" and p.get("protocol") == "context" and "window_length" in p:
            rows = _rows(tables, "context_nstar", model=model, corpus=corpus,
                         ranking=p["ranking"], length=p["window_length"], tau=p["tau"],
                         scoring="tail" if p["scoring"] == "tail128" else "all",
                         mode="renormalisation" if p["renormalize"] else "deletion")
            return rows.iloc[0]["nstar"] if rows is not None and len(rows) == 1 else None
        return None


def _study_nstar(m, tables):
    out = []
    for part in m["parts"].split(", "):
        tau, value = re.fullmatch(r"N\*_(\S+)% = (\S+)", part).groups()
        rows = _rows(tables, "restrict_nstar", model=m["model"], corpus=m["corpus"],
                     scope="model", ranking=m["ranking"], renormalize=False,
                     tau=float(tau) / 100)
        if rows is None or len(rows) != 1:
            out.append(f"N*_{tau}% names {0 if rows is None else len(rows)} rows")
            continue
        out += expect(f"N*_{tau}%", value, rows.iloc[0]["n_star"])
    return out


def _study_spearman(m, tables):
    g = tables["geometry_loss"]
    g = g[(g["model"] == m["model"]) & (g["corpus"] == m["corpus"]) & (g["rule"] == m["rule"])
          & (g["distance"] == m["distance"]) & (g["n_min"] == 1)]
    if len(g) != 1:
        return [f"names {len(g)} correlations"]
    out = [] if m["ns"] == g.iloc[0]["ns"] else [f"over {m['ns']}, the source "
                                                  f"{g.iloc[0]['ns']}"]
    return out + expect("rho", m["rho"], g.iloc[0]["spearman"])


def _study_f(m, tables):
    s = tables["summary"]
    s = s[(s["model"] == m["model"]) & (s["corpus"] == m["corpus"]) & (s["scope"] == "model")
          & (s["variant"] == "full") & (s["metric"] == "f_score")
          & (s["distance"] == m["distance"].lower()) & (s["n"] == int(m["n"]))]
    a, r = s[s["rule"] == "attention"], s[s["rule"] == "random"]
    if len(a) != 1 or len(r) != 1:
        return ["names several rows"]
    a = a.iloc[0]
    return (expect("F", m["f"], a["mean"]) + expect("low", m["lo"], a["ci_low"])
            + expect("high", m["hi"], a["ci_high"]) + expect("random", m["rnd"],
                                                            r.iloc[0]["mean"]))


STUDY_SENTENCES = [
    Sentence(rf"(?P<model>\S+) on (?P<corpus>\S+) \((?P<distance>\w+), whole model\): "
             rf"F_(?P<n>\d+) = (?P<f>{_NUM}) \[(?P<lo>{_NUM}), (?P<hi>{_NUM})\] for the "
             rf"attention-selected set against (?P<rnd>{_NUM}) for random sets of the same "
             rf"size\.", _study_f),
    Sentence(r"(?P<model>\S+) on (?P<corpus>\S+), top-N restriction by (?P<ranking>\w+) "
             r"without renormalisation: (?P<parts>.+)\.", _study_nstar),
    Sentence(rf"(?P<model>\S+) on (?P<corpus>\S+) \((?P<rule>\w+) ranking, "
             rf"(?P<distance>\w+)\): Spearman correlation of F_N with the restriction's "
             rf"relative delta-NLL over N = (?P<ns>[\d,]+) \(the follow-up's Table 1: the "
             rf"nine N = 1\.\.256\): (?P<rho>{_NUM})\.", _study_spearman),
]


# the sparse-attention policies against the oracle (issue 39): tests/report/policy_checks.py
RUN_TABLES += RUN_POLICY_TABLES
RUN_SENTENCES += RUN_POLICY_SENTENCES
STUDY_SENTENCES += STUDY_POLICY_SENTENCES
