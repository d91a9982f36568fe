"""Sparse-attention policies against the top-N oracle in the reports (issue 39).

The run report of ``restrict`` (or ``restrict-policies``) shows each ranking's N*_tau
beside the attention oracle's with their ratio and its paired document-bootstrap
interval (``restrict_nstar``'s ``oracle_n_star, ratio, ratio_low, ratio_high``), and
what restricting each head alone at the oracle's N* costs under every ranking
(``restrict_alone``). The study report adds the policy x head-type table and the heads
that break first with their atlas types (the ``policy_atlas`` step), and the qa probe's
accuracy against the budget (``qa_budget``). Every number is a cell of those tables or
a mean, count or maximum the caption names; nothing is refitted here.
"""

from __future__ import annotations

import math

import pandas as pd

from attngeom.figures.policies import ranking_order, type_order
from attngeom.names import ORACLE
from attngeom.report.html import fmt
from attngeom.report.tables import keyed

FIRST_SHOWN = 5  # heads alone: the heads of largest increase shown per ranking
STREAMING_POLICY = "window"  # the policy whose first heads are asked about (streaming?)


def _treatment(flag) -> str:
    return "renormalised" if bool(flag) else "deleted"


def beside_oracle(nstar) -> pd.DataFrame | None:
    """Whole-model rows of every ranking but the oracle, where the oracle was searched
    too (its N* and the ratio are in the row), with their treatment in words."""
    if nstar is None or "oracle_n_star" not in nstar.columns or "ranking" not in nstar:
        return None
    rows = nstar[(nstar["scope"] == "model") & (nstar["ranking"] != ORACLE)
                 & nstar["oracle_n_star"].notna()]
    if not len(rows):
        return None
    return rows.assign(treatment=rows["renormalize"].map(_treatment))


ORACLE_COLUMNS = ["n_star", "n_star_low", "n_star_high", "oracle_n_star", "ratio",
                  "ratio_low", "ratio_high"]


def _interval(low, high) -> str:
    return f"95% interval {fmt(low)} to {fmt(high)}"


def policy_findings(nstar, alone, label: str = "") -> list[str]:
    """One sentence per ranking, treatment and tau: its N* against the oracle's; one per
    ranking and treatment of the heads restricted alone: the most sensitive head."""
    out = []
    rows = beside_oracle(nstar)
    if rows is not None:
        for r in rows.sort_values(["ranking", "renormalize", "tau"]).itertuples():
            out.append(f"{label}Under {r.ranking} ({r.treatment}, whole model), N*_tau at tau "
                       f"= {fmt(r.tau)} is {fmt(r.n_star)} against the {ORACLE} oracle's "
                       f"{fmt(r.oracle_n_star)}: ratio {fmt(r.ratio)} "
                       f"({_interval(r.ratio_low, r.ratio_high)}).")
    if alone is not None and len(alone):
        for (ranking, flag), g in alone.groupby(["ranking", "renormalize"], sort=True):
            head = f"{label}Each head alone at the {ORACLE} oracle's N*_tau = " \
                   f"{fmt(g['n'].iloc[0])} (tau = {fmt(g['tau'].iloc[0])}, {_treatment(flag)})"
            done = g.dropna(subset=["delta_nll_rel"])
            if not len(done):
                out.append(f"{head}: {ranking} is not defined at that N (below its fixed "
                           "part).")
                continue
            top = done.sort_values(["delta_nll_rel", "layer", "head"],
                                   ascending=[False, True, True]).iloc[0]
            out.append(f"{head}: under {ranking} the largest increase is layer "
                       f"{int(top['layer'])} head {int(top['head'])} "
                       f"({fmt(top['delta_nll_rel'])}); mean over {len(done)} heads "
                       f"{fmt(done['delta_nll_rel'].mean())}.")
    return out


def first_alone(alone, first: int = FIRST_SHOWN) -> pd.DataFrame:
    """The ``first`` heads of largest pooled increase per ranking and treatment (ties to
    the smaller layer and head)."""
    done = alone.dropna(subset=["delta_nll_rel"])
    done = done.sort_values(["delta_nll_rel", "layer", "head"],
                            ascending=[False, True, True], kind="stable")
    keys = ["model", "corpus", "ranking", "renormalize"]
    return done[done.groupby(keys).cumcount() < first]


def policy_tables(nstar, alone) -> list[tuple[str, pd.DataFrame]]:
    out = []
    rows = beside_oracle(nstar)
    if rows is not None:
        index = ["model", "corpus", "ranking", "treatment", "tau"]
        out.append((f"N*_tau of each ranking beside the {ORACLE} oracle's (whole model; "
                    "ratio: its N* over the oracle's, with the paired document-bootstrap "
                    "interval of the ratio)",
                    rows.sort_values(index).set_index(index)[ORACLE_COLUMNS]))
    if alone is not None and len(alone):
        a = alone.assign(treatment=alone["renormalize"].map(_treatment))
        keys = ["model", "corpus", "ranking", "treatment", "tau", "n"]
        summary = a.groupby(keys).agg(heads=("delta_nll_rel", "count"),
                                      mean_delta_nll_rel=("delta_nll_rel", "mean"),
                                      max_delta_nll_rel=("delta_nll_rel", "max"))
        out.append((f"Each head restricted alone at the {ORACLE} oracle's N*_tau, per "
                    "ranking: heads with a value (none below a ranking's fixed part), mean "
                    "and largest relative delta-NLL over heads", summary))
        top = first_alone(a)
        if len(top):
            out.append((f"Each head alone: the {FIRST_SHOWN} heads of largest increase per "
                        "ranking", top.set_index([*keys, "layer", "head"])[
                            ["delta_nll_rel", "mean_doc_delta_rel", "nll"]]))
    return out


# --------------------------------------------------------------------------- the study


def _part_rows(tables: dict) -> pd.DataFrame | None:
    """``beside_oracle`` of the restriction part's and the policies part's N* tables."""
    parts = []
    for part, name in (("restriction", "restrict_nstar"), ("policies", "policy_nstar")):
        rows = beside_oracle(tables.get(name))
        if rows is not None:
            parts.append(rows.assign(part=part))
    return pd.concat(parts, ignore_index=True) if parts else None


def study_policy_tables(tables: dict) -> list[tuple[str, pd.DataFrame]]:
    """N* per ranking beside the oracle, the policy x head-type table, the heads that
    break first, and the qa accuracy against the budget."""
    out = []
    rows = _part_rows(tables)
    if rows is not None:
        index = ["model", "corpus", "part", "ranking", "treatment", "tau"]
        out.append((f"N*_tau of each ranking beside the {ORACLE} oracle's, by study part "
                    "(whole model; ratio and its paired document-bootstrap interval)",
                    rows.sort_values(index).set_index(index)[ORACLE_COLUMNS]))
    types = tables.get("policy_head_types")
    if types is not None and len(types):
        t = types.assign(treatment=types["renormalize"].map(_treatment))
        index = ["model", "corpus", "part", "treatment", "tau", "n", "head_type"]
        wide = keyed(t, index, "ranking", "mean_delta_nll_rel", "policy_head_types")
        wide.insert(0, "heads", t.groupby(index)["n_heads"].max())
        wide = wide.iloc[sorted(range(len(wide)), key=lambda i: (
            *wide.index[i][:-1], type_order(wide.index[i][-1])))]
        wide = wide[sorted(wide.columns, key=lambda c: (c != "heads", ranking_order(c)))]
        out.append(("Policy x head type: mean relative delta-NLL of restricting one head "
                    f"alone at the {ORACLE} oracle's N*_tau (n), per head type of the atlas "
                    "(heads: how many of that type; untyped: of no type; all: every head)",
                    wide))
    first = tables.get("policy_first_heads")
    if first is not None and len(first):
        f = first.assign(treatment=first["renormalize"].map(_treatment))
        index = ["model", "corpus", "part", "ranking", "treatment", "n", "rank"]
        out.append(("The heads that break first, with their atlas types (part local: the "
                    "localised scan; streaming 1 or 0, and the share of streaming heads "
                    "among the heads that part restricted)",
                    f.set_index(index)[["layer", "head", "mean_doc_delta_rel", "head_types",
                                        "streaming", "streaming_share", "n_heads"]]))
    budget = tables.get("qa_budget")
    if budget is not None and len(budget):
        b = budget[budget["budget"].astype(bool)] if "budget" in budget.columns else budget
        index = ["model", "corpus", "background", "ranking", "mode"]
        for value, words in (("accuracy", "accuracy"), ("delta_loss", "answer-loss increase "
                                                                      "(nats)")):
            wide = keyed(b, index, "n", value, "qa_budget")
            wide.columns = [f"N={c}" for c in wide.columns]
            out.append((f"qa {words} against the budget N, per ranking and background", wide))
    return out


def study_policy_findings(tables: dict) -> list[str]:
    """Per model, corpus, study part and treatment: how many of the heads that break
    first under ``window`` are streaming heads, against their share of the heads."""
    first = tables.get("policy_first_heads")
    if first is None or not len(first):
        return []
    out = []
    rows = first[first["ranking"] == STREAMING_POLICY]
    keys = ["model", "corpus", "part", "renormalize", "n"]
    for (model, corpus, part, flag, n), g in rows.groupby(keys, sort=True):
        source = "localised scan" if part == "local" else f"heads alone ({part} part)"
        share = g["streaming_share"].iloc[0]
        if math.isnan(share) or g["streaming"].isna().any():
            count, rate = "not measured (the atlas has no streaming score)", ""
        else:
            k = int(g["streaming"].sum())
            count = f"{k} {'is a streaming head' if k == 1 else 'are streaming heads'}"
            rate = (f" (streaming heads are {fmt(100 * share)}% of the "
                    f"{int(g['n_heads'].iloc[0])} heads restricted)")
        out.append(f"{model} on {corpus}, {source}: of the {len(g)} heads that break first "
                   f"under {STREAMING_POLICY} (N = {int(n)}, {_treatment(flag)}), "
                   f"{count}{rate}.")
    return out
