"""What the policy tables and findings of a report must say (issue 39), recomputed from
the run's tables as ``report_checks`` does for the rest: each ranking's N* beside the
attention oracle's, each head restricted alone, and in a study the policy x head-type
table, the heads that break first and the qa accuracy against the budget."""

from __future__ import annotations

import re

from tests.report.consistency import (
    Cells,
    Sentence,
    check_cells,
    expect,
    one,
    select,
    text,
    treatment,
)

_MC = {"model": ("model", None), "corpus": ("corpus", None)}
_NUM = r"-?[\d.e+-]+|n/a"
ORACLE = "attention"


def _as_itself(header: str):
    return {}, one(header)


def _beside_oracle(df, m=None):
    return df[(df["scope"] == "model") & (df["ranking"] != ORACLE)
              & df["oracle_n_star"].notna()]


def _over_heads(how: str):
    """A reduction over the heads a row names, NaN (no value) left out."""
    def value(rows):
        x = rows["delta_nll_rel"].dropna()
        return text({"count": lambda: len(x), "mean": x.mean, "max": x.max}[how]()) \
            if len(rows) else None
    return value


def _first_alone(df, m=None, first: int = 5):
    """The five heads of largest pooled increase per ranking and treatment, written from
    the caption: ties to the smaller layer, then head."""
    out = []
    for _, g in df.dropna(subset=["delta_nll_rel"]).groupby(
            ["model", "corpus", "ranking", "renormalize"]):
        out.append(g.sort_values(["delta_nll_rel", "layer", "head"],
                                 ascending=[False, True, True]).head(first))
    return out[0].iloc[0:0] if not out else __import__("pandas").concat(out)


RUN_POLICY_TABLES = [
    Cells(r"^N\*_tau of each ranking beside the attention oracle's \(whole model;",
          "restrict_nstar", {**_MC, "ranking": ("ranking", None),
                             "treatment": ("renormalize", treatment), "tau": ("tau", None)},
          _as_itself, where=_beside_oracle, every_key=("ranking", "renormalize", "tau")),
    Cells(r"^Each head restricted alone at the attention oracle's N\*_tau, per ranking",
          "restrict_alone", {**_MC, "ranking": ("ranking", None),
                             "treatment": ("renormalize", treatment), "tau": ("tau", None),
                             "n": ("n", None)},
          lambda h: {"heads": ({}, _over_heads("count")),
                     "mean_delta_nll_rel": ({}, _over_heads("mean")),
                     "max_delta_nll_rel": ({}, _over_heads("max"))}.get(h),
          every_key=("ranking", "renormalize")),
    Cells(r"^Each head alone: the 5 heads of largest increase per ranking$", "restrict_alone",
          {**_MC, "ranking": ("ranking", None), "treatment": ("renormalize", treatment),
           "tau": ("tau", None), "n": ("n", None), "layer": ("layer", None),
           "head": ("head", None)}, _as_itself, where=_first_alone,
          every_key=("ranking", "renormalize", "layer", "head")),
]


def _ratio(m, tables):
    rows = select(tables["restrict_nstar"], {"scope": "model", "ranking": m["ranking"],
                                             "tau": float(m["tau"])})
    rows = rows[rows["renormalize"].map(treatment) == m["treat"]]
    if len(rows) != 1:
        return [f"names {len(rows)} N* rows"]
    r = rows.iloc[0]
    return (expect("N*", m["n"], r["n_star"]) + expect("oracle", m["o"], r["oracle_n_star"])
            + expect("ratio", m["ratio"], r["ratio"]) + expect("low", m["lo"], r["ratio_low"])
            + expect("high", m["hi"], r["ratio_high"]))


def _alone_rows(m, tables):
    a = tables["restrict_alone"]
    return a[(a["ranking"] == m["ranking"]) & (a["renormalize"].map(treatment) == m["treat"])]


def _alone(m, tables):
    rows = _alone_rows(m, tables)
    done = rows.dropna(subset=["delta_nll_rel"])
    if not len(done):
        return ["names a ranking with no value"]
    top = done.sort_values(["delta_nll_rel", "layer", "head"],
                           ascending=[False, True, True]).iloc[0]
    out = expect("N", m["n"], rows["n"].iloc[0]) + expect("tau", m["tau"], rows["tau"].iloc[0])
    if (int(m["l"]), int(m["h"])) != (int(top["layer"]), int(top["head"])):
        out.append(f"names layer {m['l']} head {m['h']}, the source {top['layer']}/"
                   f"{top['head']}")
    return (out + expect("increase", m["d"], top["delta_nll_rel"])
            + expect("heads", m["k"], len(done))
            + expect("mean", m["m"], done["delta_nll_rel"].mean()))


def _undefined(m, tables):
    rows = _alone_rows(m, tables)
    return [] if len(rows) and rows["delta_nll_rel"].isna().all() else [
        "the ranking has values at that N"]


def _alone_cover(defined: bool):
    def cover(tables):
        a = tables.get("restrict_alone")
        if a is None:
            return set()
        return {(r, treatment(f)) for (r, f), g in a.groupby(["ranking", "renormalize"])
                if g["delta_nll_rel"].notna().any() == defined}
    return cover


_ALONE_HEAD = (rf"Each head alone at the attention oracle's N\*_tau = (?P<n>\d+) \(tau = "
               rf"(?P<tau>{_NUM}), (?P<treat>deleted|renormalised)\)")
RUN_POLICY_SENTENCES = [
    Sentence(rf"Under (?P<ranking>\w+) \((?P<treat>deleted|renormalised), whole model\), "
             rf"N\*_tau at tau = (?P<tau>{_NUM}) is (?P<n>{_NUM}) against the attention "
             rf"oracle's (?P<o>{_NUM}): ratio (?P<ratio>{_NUM}) \(95% interval (?P<lo>{_NUM}) "
             rf"to (?P<hi>{_NUM})\)\.", _ratio,
             cover=lambda t: {(r.ranking, treatment(r.renormalize), text(r.tau))
                              for r in _beside_oracle(t["restrict_nstar"]).itertuples()}
             if "restrict_nstar" in t and "oracle_n_star" in t["restrict_nstar"] else set(),
             key=lambda m: (m["ranking"], m["treat"], m["tau"])),
    Sentence(rf"{_ALONE_HEAD}: under (?P<ranking>\w+) the largest increase is layer "
             rf"(?P<l>\d+) head (?P<h>\d+) \((?P<d>{_NUM})\); mean over (?P<k>\d+) heads "
             rf"(?P<m>{_NUM})\.", _alone, cover=_alone_cover(True),
             key=lambda m: (m["ranking"], m["treat"])),
    Sentence(rf"{_ALONE_HEAD}: (?P<ranking>\w+) is not defined at that N \(below its fixed "
             r"part\)\.", _undefined, cover=_alone_cover(False),
             key=lambda m: (m["ranking"], m["treat"])),
]


# --------------------------------------------------------------------------- the study


def _parts(tables):
    import pandas as pd

    frames = [_beside_oracle(tables[name]).assign(part=part)
              for part, name in (("restriction", "restrict_nstar"), ("policies", "policy_nstar"))
              if name in tables and "oracle_n_star" in tables[name]]
    return pd.concat(frames, ignore_index=True) if frames else None


class _BesideOracle:
    """The study's N* beside the oracle: the restriction part's and the policies part's
    N* tables, each row named by its part."""

    caption = r"^N\*_tau of each ranking beside the attention oracle's, by study part"

    def check(self, shown, tables, out) -> None:
        spec = Cells(self.caption, "beside_oracle",
                     {**_MC, "part": ("part", None), "ranking": ("ranking", None),
                      "treatment": ("renormalize", treatment), "tau": ("tau", None)},
                     _as_itself,
                     every_key=("model", "corpus", "part", "ranking", "renormalize", "tau"))
        check_cells(spec, shown, None, {"beside_oracle": _parts(tables)}, out)


def study_policy_checks(tables) -> list:
    checks = [_BesideOracle()]
    checks += [
        Cells(r"^Policy x head type: mean relative delta-NLL", "policy_head_types",
              {**_MC, "part": ("part", None), "treatment": ("renormalize", treatment),
               "tau": ("tau", None), "n": ("n", None), "head_type": ("head_type", None)},
              lambda h: ({}, _max_heads) if h == "heads" else ({"ranking": h},
                                                               one("mean_delta_nll_rel")),
              complete=lambda df: {"heads", *df["ranking"]},
              every_key=("model", "corpus", "part", "renormalize", "head_type")),
        Cells(r"^The heads that break first, with their atlas types", "policy_first_heads",
              {**_MC, "part": ("part", None), "ranking": ("ranking", None),
               "treatment": ("renormalize", treatment), "n": ("n", None),
               "rank": ("rank", None)}, _as_itself,
              every_key=("model", "corpus", "part", "ranking", "renormalize", "n", "rank")),
        *(Cells(rf"^qa {re.escape(words)} against the budget N", "qa_budget",
                {**_MC, "background": ("background", None), "ranking": ("ranking", None),
                 "mode": ("mode", None)}, _n_cell(column), where=_budgets,
                complete=lambda df: {f"N={n}" for n in df["n"]},
                every_key=("model", "corpus", "background", "ranking", "mode"))
          for column, words in (("accuracy", "accuracy"),
                                ("delta_loss", "answer-loss increase (nats)"))),
    ]
    return checks


def _max_heads(rows):
    return text(rows["n_heads"].max()) if len(rows) else None


def _n_cell(column: str):
    def read(header: str):
        m = re.fullmatch(r"N=(\d+)", header)
        return None if m is None else ({"n": int(m.group(1))}, one(column))
    return read


def _budgets(df, m=None):
    """The rows at the probe's budgets, where the table says which."""
    return df[df["budget"].astype(bool)] if "budget" in df.columns else df


def _first_streaming(m, tables):
    f = tables["policy_first_heads"]
    g = f[(f["model"] == m["model"]) & (f["corpus"] == m["corpus"]) & (f["part"] == m["part"])
          & (f["ranking"] == "window") & (f["n"] == int(m["n"]))
          & (f["renormalize"].map(treatment) == m["treat"])]
    if not len(g):
        return ["names no rows"]
    out = expect("heads", m["k"], len(g))
    if m["count"] is None:
        return out + ([] if g["streaming"].isna().any() else ["streaming is measured"])
    return (out + expect("streaming", m["count"], g["streaming"].sum())
            + expect("share", m["share"], 100 * g["streaming_share"].iloc[0])
            + expect("restricted", m["of"], g["n_heads"].iloc[0]))


STUDY_POLICY_SENTENCES = [
    Sentence(rf"(?P<model>\S+) on (?P<corpus>\S+), (?:localised scan|heads alone "
             rf"\((?P<part>\w+) part\)): of the (?P<k>\d+) heads that break first under window "
             rf"\(N = (?P<n>\d+), (?P<treat>deleted|renormalised)\), (?:(?P<count>\d+) "
             rf"(?:is a streaming head|are streaming heads) \(streaming heads are "
             rf"(?P<share>{_NUM})% of the (?P<of>\d+) heads restricted\)|not measured \(the "
             rf"atlas has no streaming score\))\.",
             lambda m, t: _first_streaming(_with_part(m), t)),
]


def _with_part(m):
    d = m.groupdict()
    d["part"] = d["part"] or "local"
    return d
