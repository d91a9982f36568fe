"""Synthetic runs and a study for the report-consistency tests.

Every table carries the schema's columns (``results.schemas.validate_table`` is run on
it) and numbers chosen so that averaging the settings a report must keep apart gives a
different number than any one of them: the three restriction rankings differ by an
order of magnitude, the two corpora of the context sweep have different published
values, and the head atlas has a score (retrieval) no head could be measured on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from attngeom.results.io import write_manifest, write_table
from attngeom.results.schemas import validate_table
from tests.figures import attngeom_synth as base

MODEL, CORPUS = base.MODEL, base.CORPUS
MC = {"model": MODEL, "corpus": CORPUS}
LAYERS, HEADS = base.LAYERS, base.HEADS
LEVEL = {"attention": 0.9, "contribution": 0.6, "random": 9.0}  # delta-NLL at N = 1


def _checked(name: str, rows) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    validate_table(name, df)
    return df


def restrict_tables() -> dict[str, pd.DataFrame]:
    """Whole-model restriction by three rankings, deleted and renormalised: the grid N
    (1..16) and the integers an adaptive search added (off the grid), with N*_tau."""
    rows, nstar = [], []
    oracle = {}  # (renormalize, tau) -> the attention ranking's N*, for every ranking's ratio
    for ranking, level in LEVEL.items():
        for renorm in (False, True):
            scale = level * (0.6 if renorm else 1.0)
            ns = sorted({*base.N_GRID, 3, 5, 6, 7, 11, 13})
            curve = {n: scale / n ** 1.5 for n in ns}
            for n in ns:
                d = curve[n]
                rows.append({**MC, "scope": "model", "layer": -1, "head": -1, "n": n,
                             "renormalize": renorm, "nll": 2.0 * (1 + d),
                             "perplexity": float(np.exp(2.0 * (1 + d))), "delta_nll_rel": d,
                             "ranking": ranking, "on_grid": n in base.N_GRID,
                             "passes": ",".join(f"{t:g}" for t in (0.05, 0.1) if d <= t)})
            for tau in (0.05, 0.1):
                passing = [n for n in ns if curve[n] <= tau]
                found = float(min(passing)) if passing else float("nan")
                theirs = oracle.setdefault((renorm, tau), found)  # attention comes first
                grid = [n for n in base.N_GRID if curve[n] <= tau]
                nstar.append({**MC, "scope": "model", "layer": -1, "head": -1,
                              "renormalize": renorm, "tau": tau, "n_star": found,
                              "n_star_status": "search" if passing else "above_grid",
                              "ranking": ranking,
                              "grid_n_star": float(min(grid)) if grid else float("nan"),
                              "n_star_low": found - 1, "n_star_high": found + 2,
                              "n_evaluated": len(ns), "search": "interpolate",
                              "monotone": True, "note": "", "window_length": 64,
                              "n_star_bisect": found, "n_star_interpolate": found,
                              "oracle_n_star": theirs, "ratio": found / theirs,
                              "ratio_low": found / theirs - 0.25 * (ranking != "attention"),
                              "ratio_high": found / theirs + 0.5 * (ranking != "attention")})
    return {"restrict": _checked("restrict", rows),
            "restrict_nstar": _checked("restrict_nstar", nstar),
            "restrict_alone": alone_table(oracle)}


ALONE_TAU = 0.05


def alone_table(oracle: dict) -> pd.DataFrame:
    """Each head alone at the attention oracle's N*_5% of each treatment: the three
    rankings measured (every head a different increase, the rankings an order of
    magnitude apart) and quest, whose page of 16 is more than that N (NaN)."""
    rows = []
    for renorm in (False, True):
        n = int(oracle[(renorm, ALONE_TAU)])
        for ranking in (*LEVEL, "quest"):
            for layer in range(LAYERS):
                for head in range(HEADS):
                    d = (math.nan if ranking == "quest"
                         else LEVEL[ranking] * (1 + layer * HEADS + head) / 100)
                    rows.append({**MC, "layer": layer, "head": head, "ranking": ranking,
                                 "renormalize": renorm, "tau": ALONE_TAU, "n": n,
                                 "nll": 2.0 * (1 + d), "delta_nll_rel": d,
                                 "mean_doc_delta_rel": d * (1.1 if head % 2 else 0.9),
                                 "status": "below_fixed" if ranking == "quest" else "measured",
                                 "n_windows": 3})
    return _checked("restrict_alone", rows)


def local_tables() -> dict[str, pd.DataFrame]:
    """The localised scan: every layer, then each head of the two most sensitive layers,
    at N = 4 and 16, attention ranking, deleted."""
    rows = []
    for n in (4, 16):
        layer_effect = {layer: (0.3 if layer == 1 else 0.02 * (layer + 1)) * 4 / n
                        for layer in range(LAYERS)}
        for rank, layer in enumerate(sorted(layer_effect, key=lambda k: -layer_effect[k]), 1):
            e = layer_effect[layer]
            rows.append({**MC, "scope": "layer", "layer": layer, "head": -1,
                         "ranking": "attention", "renormalize": False, "n": n, "nll": 2 + e,
                         "delta_nll_rel": e * 0.9, "mean_doc_delta_rel": e, "rank": rank,
                         "n_windows": 3})
        heads = [(layer, h, layer_effect[layer] / (h + 1)) for layer in (1, 3)
                 for h in range(HEADS)]
        for rank, (layer, h, e) in enumerate(sorted(heads, key=lambda x: -x[2]), 1):
            rows.append({**MC, "scope": "head", "layer": layer, "head": h,
                         "ranking": "attention", "renormalize": False, "n": n, "nll": 2 + e,
                         "delta_nll_rel": e * 0.9, "mean_doc_delta_rel": e, "rank": rank,
                         "n_windows": 3})
    return {"restrict_local": _checked("restrict_local", rows)}


SCORES = ("previous_token", "induction", "sink", "retrieval")
THRESHOLDS = {"previous_token": 0.4, "induction": 0.4, "sink": 0.5, "retrieval": 0.1}


def atlas_tables() -> dict[str, pd.DataFrame]:
    """Head scores of four types; retrieval has no value anywhere (0 of 8 needle trials
    recovered), so it must read as not measured, never as 0 heads."""
    rows = []
    for layer in range(LAYERS):
        for head in range(HEADS):
            for score in SCORES:
                if score == "retrieval":
                    value, samples = float("nan"), 0
                    inputs = "8 needles of 6 tokens, contexts 32/16, seed 0, 0 recovered"
                else:
                    value = ((layer * HEADS + head) * (SCORES.index(score) + 3) % 10) / 10
                    samples, inputs = 40, "3 windows of 64 tokens"
                rows.append({**MC, "layer": layer, "head": head, "score": score,
                             "value": value, "threshold": THRESHOLDS[score],
                             "is_type": bool(value == value and value >= THRESHOLDS[score]),
                             "n_samples": samples, "inputs": inputs, "seed": 0})
    scores = _checked("head_scores", rows)
    from attngeom.probes.atlas import side_by_side

    taxonomy = base.make_tables()["taxonomy"]
    summary = base.make_tables()["summary"]
    out = {"head_scores": scores}
    for name, df in side_by_side(scores.drop(columns=["model", "corpus"]), taxonomy,
                                 summary).items():
        out[name] = _checked(name, df.assign(**MC)[["model", "corpus", *df.columns]])
    return out


BACKGROUNDS = (0, 1024, 4096)


def qa_tables() -> dict[str, pd.DataFrame]:
    answers, nstar, support = [], [], []
    for b in BACKGROUNDS:
        acc = 0.7 - b / 20000
        answers.append({**MC, "background": b, "prompt_format": "plain", "n_examples": 12,
                        "accuracy": acc, "accuracy_low": acc - 0.2, "accuracy_high": acc + 0.2,
                        "loss": 0.8 + b / 5000, "loss_low": 0.6, "loss_high": 1.9,
                        "screen": b == 0, "scoring": "first-token"})
        for ranking, mode, k in (("attention", "deletion", 1), ("contribution", "deletion", 2),
                                 ("attention", "renormalisation", 3)):
            for tau in (0.1, 0.2):
                v = float(2 ** (k + b // 1024) // (2 if tau == 0.2 else 1))
                nstar.append({**MC, "background": b, "ranking": ranking, "mode": mode,
                              "tau": tau, "nstar": v, "grid_nstar": v, "nstar_low": v / 2,
                              "nstar_high": v * 2})
        for score in ("attention", "contribution"):
            for stat, v in (("mass", 0.4 - b / 20000), ("displacement", 2 + b / 100),
                            ("recall", 0.9 - b / 10000), ("outranking", 0.45 - b / 20000)):
                for split, shift in (("all", 0.0), ("correct", 0.01)):
                    support.append({**MC, "background": b, "score": score,
                                    "statistic": stat, "split": split,
                                    "mean": v + shift + (0.001 if score == "contribution"
                                                         else 0.0),
                                    "ci_low": v - 0.01, "ci_high": v + 0.02,
                                    "n_examples": 12})
    return {"qa_answers": _checked("qa_answers", answers),
            "qa_nstar": _checked("qa_nstar", nstar),
            "qa_support_summary": _checked("qa_support_summary", support)}


LENGTHS = (256, 512, 1024, 2048)


def context_rows(model: str, corpus: str, scale: float) -> list[dict]:
    rows = []
    for length in LENGTHS:
        for scoring, f in (("tail", 1.0), ("all", 0.6)):
            for ranking in ("attention", "contribution"):
                for tau in (0.05, 0.1):
                    v = float(round(scale * f * (2 + length / 32) / (tau * 20)))
                    rows.append({"model": model, "corpus": corpus, "length": length,
                                 "ranking": ranking, "mode": "deletion", "scoring": scoring,
                                 "tau": tau, "nstar": v, "grid_nstar": v,
                                 "nstar_low": v - 1, "nstar_high": v + 3})
    return rows


def context_tables() -> dict[str, pd.DataFrame]:
    rows = context_rows(MODEL, CORPUS, 1.0)
    slope = [{**MC, "ranking": "attention", "mode": "deletion", "scoring": s, "tau": tau,
              "slope": 0.8 if s == "tail" else 0.7, "slope_low": 0.6, "slope_high": 1.0,
              "n_lengths": 4} for s in ("tail", "all") for tau in (0.05, 0.1)]
    return {"context_nstar": _checked("context_nstar", rows),
            "context_slope": _checked("context_slope", slope)}


def write_run(run_dir: Path, frames: dict[str, pd.DataFrame], command: str) -> Path:
    """A run directory holding ``frames`` with the synthetic manifest of ``command``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, df in frames.items():
        write_table(run_dir, name, df)
    manifest = base.manifest_for(frames)
    manifest["command"] = command
    write_manifest(run_dir, manifest)
    return run_dir


# --------------------------------------------------------------------------- a study

STUDY_MODEL = "qwen"  # the preset the paper ran, so its published values sit beside ours
STUDY_PRESET = "qwen-2.5-7b"
STUDY_CORPORA = {"owt": "openwebtext", "wt": "wikitext-103"}


def study_stub(step=None):
    """A stand-in for ``studies.study.Study``: one paper model on both paper corpora,
    restrict at L = 64 on stream windows and a context sweep at the paper's lengths."""
    restrict = SimpleNamespace(window_length=64, document_protocol="stream",
                               n_documents=50, search="adaptive", refine=3, step=step)
    context = SimpleNamespace(probe="context", lengths=LENGTHS, tail=128, n_documents=6,
                              step=step)
    cells = [SimpleNamespace(model=STUDY_MODEL, corpus=c, command=cmd, config=cfg)
             for c in STUDY_CORPORA for cmd, cfg in (("restrict", restrict),
                                                     ("competition-context", context))]
    return SimpleNamespace(
        models={STUDY_MODEL: SimpleNamespace(preset=SimpleNamespace(name=STUDY_PRESET),
                                             shape={"params_b": 7.6})},
        corpora={k: SimpleNamespace(corpus=v) for k, v in STUDY_CORPORA.items()},
        cells_of=lambda cmd: [x for x in cells if x.command == cmd])


def study_tables() -> dict[str, pd.DataFrame]:
    """The combined tables of ``study_stub``: geometry, N*, Table 1, the context sweep on
    both corpora (different published values on each) and the reference values."""
    from attngeom.studies import combine, references

    t = base.make_tables()
    summaries, restricts, nstars, contexts = [], [], [], []
    for i, corpus in enumerate(STUDY_CORPORA):
        s = t["summary"].assign(model=STUDY_MODEL, corpus=corpus)
        s["mean"] = s["mean"] + 0.01 * i
        summaries.append(s)
        r = restrict_tables()
        restricts.append(r["restrict"].assign(model=STUDY_MODEL, corpus=corpus))
        nstars.append(r["restrict_nstar"].assign(model=STUDY_MODEL, corpus=corpus))
        contexts += context_rows(STUDY_MODEL, corpus, 1.0 + 0.5 * i)
    tables = {"summary": pd.concat(summaries, ignore_index=True),
              "restrict": pd.concat(restricts, ignore_index=True),
              "restrict_nstar": pd.concat(nstars, ignore_index=True),
              "context_nstar": _checked("context_nstar", contexts),
              "pruning": t["pruning"].assign(model=STUDY_MODEL, corpus="owt")}
    tables.update(policy_study_tables())
    tables["geometry_loss"] = combine.geometry_loss(tables["summary"], tables["restrict"])
    tables["reference_values"] = combine.reference_values(study_stub(), tables,
                                                          references.REFERENCES)
    return tables


POLICIES = {"contribution": "window", "random": "h2o"}  # the policies part's rankings


def policy_study_tables() -> dict[str, pd.DataFrame]:
    """The policies part on wt (its N* beside the oracle, each head alone), the atlas'
    head scores with a streaming score (two streaming heads), the policy_atlas step's
    tables from them, and qa accuracy at three budgets under two rankings."""
    from attngeom.studies import combine

    where = {"model": STUDY_MODEL, "corpus": "wt"}
    r = restrict_tables()
    nstar = r["restrict_nstar"].assign(**where).replace({"ranking": POLICIES})
    alone = r["restrict_alone"].assign(**where).replace({"ranking": POLICIES})
    scores = atlas_tables()["head_scores"]
    streaming = scores[scores["score"] == "sink"].assign(
        score="streaming", threshold=0.1, is_type=False, value=0.5)
    streaming.loc[streaming["head"] == 0, ["value", "is_type"]] = [0.05, True]
    scores = pd.concat([scores, streaming], ignore_index=True).assign(**where)
    local = local_tables()["restrict_local"].assign(ranking="window", **where)
    parts = {"policies": alone}
    def budget_row(b, ranking, n):
        acc = (0.9 if ranking == "attention" else 0.3 + n / 512) - b / 5000
        loss = (0.05 if ranking == "attention" else 1.2 - n / 256) + b / 8000
        return {**where, "background": b, "ranking": ranking, "mode": "deletion", "n": n,
                "budget": n in (16, 64, 256), "nstar_taus": "" if n != 40 else "0.1",
                "n_examples": 20, "accuracy": acc, "accuracy_low": acc - 0.1,
                "accuracy_high": acc + 0.1, "delta_loss": loss, "delta_low": loss - 0.05,
                "delta_high": loss + 0.05, "support_recall": min(1.0, n / 300),
                "recall_low": 0.0, "recall_high": 1.0}

    # the probe's budgets, and an N* row (budget false) the report leaves out
    budget = [budget_row(b, ranking, n) for b in (0, 1024) for ranking in ("attention", "window")
              for n in (16, 40, 64, 256)]
    return {"policy_nstar": _checked("policy_nstar", nstar),
            "policy_alone": _checked("policy_alone", alone),
            "head_scores": _checked("head_scores", scores),
            "restrict_local": local,
            "policy_head_types": _checked("policy_head_types",
                                          combine.policy_head_types(parts, scores)),
            "policy_first_heads": _checked("policy_first_heads", combine.policy_first_heads(
                parts, local, scores)),
            "qa_budget": _checked("qa_budget", budget)}


def write_study(study_dir: Path, tables: dict[str, pd.DataFrame]) -> Path:
    """``study.json`` and ``tables/`` as ``attngeom reproduce`` writes them."""
    study_dir = Path(study_dir)
    (study_dir / "tables").mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        write_table(study_dir / "tables", name, df)
    record = {"study": "synthetic", "title": "synthetic study", "cells": [],
              "models": {STUDY_MODEL: {"model": STUDY_PRESET, "is_causal": True,
                                       "shape": {"layers": 28, "heads": 28, "kv_heads": 4}}},
              "corpora": {k: {"corpus": v} for k, v in STUDY_CORPORA.items()},
              "tables": {name: f"tables/{name}.parquet" for name in tables},
              "created": "2026-01-01T00:00:00Z", "attngeom_version": "0.1.0"}
    (study_dir / "study.json").write_text(json.dumps(record), encoding="utf-8")
    return study_dir
