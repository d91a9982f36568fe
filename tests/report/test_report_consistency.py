"""Every number a report shows is the one its run's tables give, in the setting it names.

Each report (analyze, restrict, restrict-local, atlas, competition qa and context, a
study) is built from synthetic Parquet tables (``report_synth``) and read back as a
reader sees it; ``report_checks`` recomputes each key table's cells and each finding
from the tables alone (``consistency`` says how). The mutations below are the faults
the issue-38 audit found, put back one at a time: each must be caught.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from attngeom.report import findings as F
from attngeom.report.build import render_html
from attngeom.report.study import build_study_report
from tests.figures import attngeom_synth
from tests.report import report_synth as rs
from tests.report.consistency import SKIPPED, check_report, read_report
from tests.report.report_checks import (
    COMPETITION_TABLES,
    RUN_SENTENCES,
    RUN_TABLES,
    STUDY_SENTENCES,
    atlas_checks,
    study_checks,
)

REAL_RESTRICT_TABLES, REAL_RESTRICT_FINDINGS = F.restrict_tables, F.restrict_findings
REAL_ATLAS_TABLES = F.atlas_tables

RUNS = {
    "analyze": (lambda: attngeom_synth.make_tables(), "analyze"),
    "restrict": (rs.restrict_tables, "restrict"),
    "restrict-local": (rs.local_tables, "restrict-local"),
    "atlas": (rs.atlas_tables, "atlas"),
    "competition-qa": (rs.qa_tables, "competition"),
    "competition-context": (rs.context_tables, "competition"),
}


def _checks(tables):
    return RUN_TABLES + COMPETITION_TABLES + (atlas_checks(tables) if "head_scores" in tables
                                              else [])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (run directory, its tables as written)."""
    from attngeom.figures.runtables import load_run

    root = tmp_path_factory.mktemp("consistency")
    out = {}
    for name, (make, command) in RUNS.items():
        frames = make()
        run = rs.write_run(root / name, frames, command)
        out[name] = (run, load_run(run).tables)
    return out


def _report(run_dir):
    """The run's report page as ``build_report`` writes it, less the figures (which
    carry no number of a table): what a reader reads."""
    from attngeom.figures.runtables import load_run

    run = load_run(run_dir)
    return read_report(render_html(run, [], [], base=run_dir))


@pytest.mark.parametrize("name", list(RUNS))
def test_every_number_of_a_run_report_is_its_tables(runs, name):
    run, tables = runs[name]
    report = _report(run)
    counts = {}
    assert check_report(report, tables, _checks(tables), RUN_SENTENCES, counts) == []
    # every table and finding was recomputed, every column read
    assert counts["tables"] == len([t for t in report.tables if t.caption not in SKIPPED]) >= 1
    assert counts["findings"] == len(report.findings) >= 3
    assert counts["cells"] >= 70 and counts["unread"] == []


def test_the_built_report_with_its_figures_reads_the_same(runs, tmp_path):
    from attngeom.report import build_report

    run, tables = runs["restrict"]
    html = build_report(run, out=tmp_path / "report", formats=("png",)).read_text("utf-8")
    report = read_report(html)
    assert check_report(report, tables, _checks(tables), RUN_SENTENCES) == []
    # N*: 3 rankings x 2 treatments x 2 tau; against the oracle: 2 rankings x 2 x 2;
    # each head alone: 4 rankings x 2 treatments
    assert len(report.findings) == 12 + 8 + 8


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tables = rs.study_tables()
    root = rs.write_study(tmp_path_factory.mktemp("study") / "s", tables)
    from attngeom.report.study import _load

    _, written = _load(root)
    return root, written


def _study_problems(study_dir, tables, counts=None):
    html = (study_dir / "report" / "index.html").read_text("utf-8")
    checks = study_checks(tables, {rs.STUDY_MODEL: rs.STUDY_PRESET}, rs.STUDY_CORPORA)
    return check_report(read_report(html), tables, checks, STUDY_SENTENCES, counts)


def test_every_number_of_the_study_report_is_its_tables(study):
    root, tables = study
    build_study_report(root, formats=("png",))
    counts = {}
    assert _study_problems(root, tables, counts) == []
    # 7, the localised scan's most sensitive, and the policies: N* beside the oracle,
    # policy x head type, the heads that break first, qa accuracy and answer loss
    assert counts["tables"] == 13 and counts["findings"] >= 10
    assert counts["cells"] >= 500 and counts["unread"] == []
    html = (root / "report" / "index.html").read_text("utf-8")
    # the context sweep shows each corpus's own published values (Table 3's Qwen rows)
    assert "Context sweep: N* by model, corpus and length L" in html


# --------------------------------------------------------------------------- mutations


def _averaging_restrict_tables(restrict, nstar):
    """The restrict table as the audit found it: rankings averaged into one row."""
    out = REAL_RESTRICT_TABLES(restrict, nstar)
    rows = restrict[restrict["scope"] == "model"]
    t = rows.pivot_table(index=["model", "corpus", "renormalize"], columns="n",
                         values="delta_nll_rel", aggfunc="mean")
    t.columns = [f"N={c}" for c in t.columns]
    return [(out[0][0], t), *out[1:]]


def _with_tables(monkeypatch, section: str, tables):
    monkeypatch.setattr(F, "SECTIONS", tuple(
        dataclasses.replace(s, tables=tables) if s.name == section else s
        for s in F.SECTIONS))


def test_a_table_that_averages_rankings_fails(runs, monkeypatch):
    run, tables = runs["restrict"]
    monkeypatch.setattr(F, "restrict_tables", _averaging_restrict_tables)
    problems = check_report(_report(run), tables, _checks(tables), RUN_SENTENCES)
    assert any("row label 'renormalize'" in p or "names 3 rows" in p for p in problems), \
        problems


def test_a_table_that_averages_under_the_right_labels_fails(runs, monkeypatch):
    run, tables = runs["restrict"]

    def averaged(restrict, nstar):
        out = REAL_RESTRICT_TABLES(restrict, nstar)
        caption, t = out[0]
        mean = t.groupby(level="treatment").transform("mean")  # every ranking the same
        return [(caption, mean), *out[1:]]

    monkeypatch.setattr(F, "restrict_tables", averaged)
    problems = check_report(_report(run), tables, _checks(tables), RUN_SENTENCES)
    assert any("the source gives" in p and "N=1" in p for p in problems), problems


def test_a_finding_that_does_not_name_its_ranking_fails(runs, monkeypatch):
    run, tables = runs["restrict"]

    def unnamed(restrict, nstar, label=""):
        return [s.replace(" ranking, ", " ").replace("(attention ", "(").replace(
            "(contribution ", "(").replace("(random ", "(")
            for s in REAL_RESTRICT_FINDINGS(restrict, nstar, label)]

    monkeypatch.setattr(F, "restrict_findings", unnamed)
    problems = check_report(_report(run), tables, _checks(tables), RUN_SENTENCES)
    assert any("no check knows this sentence" in p for p in problems), problems
    assert any("no sentence for" in p for p in problems), problems


def test_a_dropped_column_and_a_zero_for_not_measured_fail(runs, monkeypatch):
    run, tables = runs["atlas"]

    def dropping(head_scores, contingency, kappa, fn):
        out = REAL_ATLAS_TABLES(head_scores, contingency, kappa, fn)
        wide = head_scores.pivot_table(index=["model", "corpus", "layer", "head"],
                                       columns="score", values="value", aggfunc="first")
        return [("Head scores (one row per head)", wide), *out[1:]]

    _with_tables(monkeypatch, "atlas", dropping)
    problems = check_report(_report(run), tables, _checks(tables), RUN_SENTENCES)
    assert any("columns ['retrieval'] of head_scores are not shown" in p for p in problems)
    assert any("does not say why retrieval is not measured" in p for p in problems)

    def counting_zero(head_scores, contingency, kappa, label=""):
        n = head_scores[["layer", "head"]].drop_duplicates().shape[0]
        typed = head_scores[head_scores["is_type"]].groupby("score").size()
        parts = [f"{s.replace('_', '-')} {int(typed.get(s, 0))}"
                 for s in head_scores["score"].unique()]
        return [f"{label}Head types among {n} heads (published thresholds): "
                + ", ".join(parts) + "."]

    monkeypatch.setattr(F, "SECTIONS", tuple(
        dataclasses.replace(s, sentences=(lambda h, c, k, f, label: counting_zero(
            h, c, k, label),)) if s.name == "atlas" else s for s in F.SECTIONS))
    problems = check_report(_report(run), tables, _checks(tables), RUN_SENTENCES)
    assert any("retrieval is counted (0) though no head has a value" in p
               for p in problems), problems


def test_a_mislabelled_corpus_fails(study, monkeypatch):
    """The audit's context sweep: a WikiText row showing OpenWebText's published values."""
    import attngeom.report.study as S

    root, tables = study
    real = S._published

    def first_corpus(tables_, model, corpus, quantity, **setting):
        return real(tables_, model, "owt", quantity, **setting)  # the corpus ignored

    monkeypatch.setattr(S, "_published", first_corpus)
    build_study_report(root, formats=("png",))
    problems = _study_problems(root, tables)
    assert any("Context sweep" in p and "'wt'" in p and "paper L=" in p for p in problems), \
        problems


def test_a_match_that_differs_fails(study, monkeypatch):
    import attngeom.report.study as S

    root, tables = study
    real = S.reference_table

    def all_match(ref):
        t = real(ref)
        return t.assign(verdict="match")

    monkeypatch.setattr(S, "reference_table", all_match)
    build_study_report(root, formats=("png",))
    problems = _study_problems(root, tables)
    assert any("verdict match with differences" in p for p in problems), problems


def test_the_reader_reads_rowspans_and_captions():
    from attngeom.report.html import table_html

    df = pd.DataFrame({"a": ["x", "x", "y"], "b": [1, 2, 1], "v": [0.5, 0.25, 1.0]})
    shown = read_report(table_html(df.set_index(["a", "b"]), caption="cap")).tables[0]
    assert (shown.caption, shown.index, shown.columns) == ("cap", ["a", "b"], ["v"])
    assert shown.rows == [(["x", "1"], ["0.5"]), (["x", "2"], ["0.25"]), (["y", "1"], ["1"])]
