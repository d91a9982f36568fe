"""``attngeom reproduce`` end to end on the tiny study (tests/studies/conftest.py)."""

from __future__ import annotations

import json
import math
import re
import shutil

import pandas as pd
import pytest

from attngeom.cli import main
from attngeom.errors import RunDirError
from attngeom.results.io import read_table
from attngeom.studies.combine import geometry_loss, spearman
from attngeom.studies.reproduce import reproduce

pytestmark = pytest.mark.slow


def test_every_cell_ran_and_tables_are_side_by_side(tiny_study):
    _, out, res = tiny_study
    record = json.loads((out / "study.json").read_text())
    cells = {(c["model"], c["corpus"], c["command"]): c for c in record["cells"]}
    assert set(cells) == {
        ("stories", "tiny", "analyze"), ("stories", "tiny", "prune"),
        ("stories", "tiny", "scan-heads"), ("stories", "tiny", "restrict"),
        ("stories", "wiki", "analyze"), ("stories", "wiki", "restrict"),
        ("minilm", "tiny", "analyze"), ("minilm", "wiki", "analyze"),
    }
    assert {c["status"] for c in record["cells"]} == {"run"}
    # the protocol, per command: what a reader needs to weigh the numbers
    assert {"window_length": 64, "query_mode": "stride:8", "n_windows": 4,
            "bootstrap": 20}.items() <= record["protocol"]["analyze"].items()
    assert record["protocol"]["restrict"]["window_length"] == 64
    for c in record["cells"]:
        assert (out / c["directory"] / "manifest.json").is_file()
        assert (out / c["directory"] / "report" / "index.html").is_file()
    # one table per analysis, with model and corpus columns, holding every run
    tax = read_table(out / "tables", "taxonomy")
    assert set(zip(tax["model"], tax["corpus"], strict=True)) == {
        ("stories", "tiny"), ("stories", "wiki"), ("minilm", "tiny"), ("minilm", "wiki")}
    per_run = read_table(out / "runs" / "minilm" / "wiki" / "analyze", "taxonomy")
    assert len(tax[(tax["model"] == "minilm") & (tax["corpus"] == "wiki")]) == len(per_run)
    summary = read_table(out / "tables", "summary")
    assert set(summary["model"]) == {"stories", "minilm"}
    restrict = read_table(out / "tables", "restrict")
    assert set(restrict["model"]) == {"stories"}  # the encoder has no next-token loss
    # the wiki cells drew 12 documents with the study's seed
    manifest = json.loads((out / "runs/stories/wiki/analyze/manifest.json").read_text())
    assert manifest["corpus"]["sample"] == 12 and manifest["corpus"]["seed"] == 1


def test_regime_stability_between_corpora_matches_compare(tiny_study):
    from attngeom.engine.compare import compare_runs

    _, out, _ = tiny_study
    st = read_table(out / "tables", "regime_stability")
    assert sorted(st["model"]) == ["minilm", "stories"]
    row = st[st["model"] == "stories"].iloc[0]
    direct = compare_runs(out / "runs/stories/tiny/analyze", out / "runs/stories/wiki/analyze")
    assert (row["corpus"], row["other_corpus"]) == ("tiny", "wiki")
    assert row["n_heads"] == direct.n_heads and row["agreement"] == direct.agreement


def test_geometry_loss_is_spearman_over_the_shared_n(tiny_study):
    _, out, _ = tiny_study
    gl = read_table(out / "tables", "geometry_loss")
    # each corpus alone over every N (the corpora-averaged rows: tests/studies/test_combine)
    assert set(gl[gl["averaged"]]["corpus"]) == {"tiny+wiki"}
    gl = gl[~gl["averaged"] & (gl["n_min"] == 1) & (gl["rule"] == "attention")]
    assert set(zip(gl["model"], gl["corpus"], strict=True)) == {("stories", "tiny"),
                                                                 ("stories", "wiki")}
    assert set(gl["ns"]) == {"1,2,4,8"} and not gl["renormalize"].any()
    s = read_table(out / "tables", "summary")
    r = read_table(out / "tables", "restrict")
    g = s[(s["model"] == "stories") & (s["corpus"] == "tiny") & (s["scope"] == "model")
          & (s["rule"] == "attention") & (s["variant"] == "full") & (s["metric"] == "f_score")
          & (s["distance"] == "euclidean")].sort_values("n")
    lo = r[(r["model"] == "stories") & (r["corpus"] == "tiny") & (r["scope"] == "model")
           & (~r["renormalize"]) & r["n"].isin(g["n"])].sort_values("n")
    expected = pd.Series(g["mean"].to_numpy()).corr(pd.Series(lo["delta_nll_rel"].to_numpy()),
                                                   method="spearman")
    got = gl[gl["corpus"] == "tiny"]["spearman"].iloc[0]
    assert got == pytest.approx(expected, abs=1e-12) or (math.isnan(got)
                                                         and math.isnan(expected))


def test_spearman_against_pandas_and_its_edges():
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 4, 7).astype(float)  # ties
        y = rng.normal(size=7)
        want = pd.Series(x).corr(pd.Series(y), method="spearman")
        got = spearman(x, y)
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want)
    assert math.isnan(spearman([1, 2], [2, 1]))  # two points say nothing
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))  # constant
    assert spearman([1, 2, 3, 4], [10, 9, 8, 1]) == pytest.approx(-1.0)
    assert len(geometry_loss(None, None)) == 0


def test_second_run_skips_finished_cells_and_redoes_a_missing_one(tiny_study, tmp_path,
                                                                    monkeypatch):
    path, out, _ = tiny_study
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "runs" / "stories" / "wiki" / "restrict")
    loads = []
    import attngeom.capture as capture

    real = capture.load_model
    monkeypatch.setattr(capture, "load_model", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    res = reproduce(path, copy, progress=False)
    status = {(c["model"], c["corpus"], c["command"]): c["status"] for c in res.cells}
    assert status.pop(("stories", "wiki", "restrict")) == "run"
    assert set(status.values()) == {"skipped"}
    assert len(loads) == 1  # only the model of the missing cell loaded, once
    for name in ("restrict", "taxonomy", "geometry_loss"):
        a, b = read_table(out / "tables", name), read_table(copy / "tables", name)
        pd.testing.assert_frame_equal(a, b)


def test_other_study_or_foreign_files_are_refused(tiny_study, tmp_path):
    path, out, _ = tiny_study
    other = tmp_path / "other.toml"
    other.write_text(path.read_text().replace('name = "tiny"', 'name = "tiny2"'))
    with pytest.raises(RunDirError, match="holds study 'tiny', not 'tiny2'"):
        reproduce(other, out, progress=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(RunDirError, match="notes.txt"):
        reproduce(path, mine, progress=False)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_study_report_shows_models_side_by_side(tiny_study):
    _, out, res = tiny_study
    html = res.report.read_text(encoding="utf-8")
    assert res.report == out / "report" / "index.html"
    for fig in ("study-topn", "study-sink", "study-regimes", "study-pruning", "study-restrict"):
        assert f'data-figure="{fig}"' in html, fig
        assert (out / "report" / "figures" / f"{fig}.pdf").is_file()
    assert "Regime agreement between corpora" in html and "N*_tau" in html
    assert "Spearman" in html and "Published values" in html
    assert "protocol of analyze" in html and "stride:8 queries" in html
    assert str(out.parent) not in html  # no absolute path of the machine
    links = re.findall(r'href="\.\./(runs/[^"]+/report/index\.html)"', html)
    assert len(links) == 8 and all((out / link).is_file() for link in links)


def test_cli_prints_findings_and_where(tiny_study, capsys):
    path, out, _ = tiny_study
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "8 runs" in printed and "(8 finished before)" in printed
    assert "protocol: analyze: T = 64, stride:8 queries, 4 windows" in printed
    assert f"report: {out / 'report' / 'index.html'}" in printed
    assert "Cohen's kappa" in printed and "Spearman" in printed
