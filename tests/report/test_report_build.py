"""build_report: one self-contained page naming every figure and table of the run."""

from __future__ import annotations

import base64
import re

import pytest

from attngeom.errors import RunDirError
from attngeom.report import build_report
from attngeom.report.html import fmt
from tests.figures.attngeom_synth import ALL_TABLES

ALL_FIGURES = ("topn_model", "topn_by_layer", "topn_depth", "sink_geometry", "sink_effect",
               "regimes", "source_fractions", "bounds", "pruning", "head_scan", "restrict")


def _figures(html: str) -> list[str]:
    return re.findall(r'data-figure="([^"]+)"', html)


def _sections(html: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', html)


def test_full_report_names_every_figure_and_table(full_run):
    run, index = full_run
    assert index == run / "report" / "index.html"
    html = index.read_text(encoding="utf-8")
    assert _figures(html) == list(ALL_FIGURES)
    for name in ALL_TABLES:
        assert f"<th>{name}</th>" in html and f"{name}.parquet" in html
    assert _sections(html) == ["run", "findings", "separability", "sink", "taxonomy",
                               "bounds", "interventions", "tables"]
    assert "tiny-llama (LlamaForCausalLM)" in html and "attngeom analyze tiny-llama" in html


def test_page_is_self_contained(full_run):
    _, index = full_run
    html = index.read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "@import" not in html and "url(" not in html
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) == len(ALL_FIGURES)
    for src in sources:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix):])[:8] == b"\x89PNG\r\n\x1a\n"


def test_findings_are_the_tables_numbers(full_run, write_run):
    run, index = full_run
    html = index.read_text(encoding="utf-8")
    import pandas as pd

    s = pd.read_parquet(run / "summary.parquet")
    row = s[(s.scope == "model") & (s.rule == "attention") & (s.variant == "full")
            & (s.metric == "f_score") & (s.n == 2)].iloc[0]
    assert (f"F-score at N = 2 (Euclidean, whole model): attention-selected sets "
            f"{fmt(row['mean'])} (95% CI {fmt(row.ci_low)} to {fmt(row.ci_high)})") in html
    assert "Of 16 heads: 4 Retrievers (25%), 8 Mixers (50%), 4 Resets (25%)." in html
    assert "1 of 16 heads are critical (threshold 0.1): layer 0 head 2 (2.5)." in html
    assert "at tau = 0.1 (attention ranking, renormalised, whole model): 8." in html


def test_partial_run_reports_what_it_has(tmp_path, write_run):
    run = write_run(tmp_path / "run", tables=("taxonomy", "head_scan"))
    html = build_report(run, formats=("png",)).read_text(encoding="utf-8")
    assert _figures(html) == ["regimes", "source_fractions", "head_scan"]
    assert _sections(html) == ["run", "findings", "taxonomy", "interventions", "tables"]
    assert "Top-N separability" not in html and "pruning.parquet" not in html


def test_metrics_without_summary_draws_means_and_says_so(tmp_path, write_run, tables):
    m = tables["metrics"]
    small = m[(m.layer == 0) & (m.rule == "attention") & (m.variant == "full")]
    run = write_run(tmp_path / "run", tables=("metrics",), frames={"metrics": small})
    html = build_report(run, formats=("png",)).read_text(encoding="utf-8")
    assert "topn_model" in _figures(html)
    assert "without bootstrap intervals" in html


def test_manifest_only_run_still_builds(tmp_path, write_run):
    run = write_run(tmp_path / "run", tables=())
    html = build_report(run).read_text(encoding="utf-8")
    assert _figures(html) == [] and _sections(html) == ["run", "tables"]
    assert "lists no tables" in html


def test_default_formats_write_pdf_beside_png(tmp_path, write_run):
    run = write_run(tmp_path / "run", tables=("restrict",))
    html = build_report(run).read_text(encoding="utf-8")
    assert (run / "report" / "figures" / "restrict.pdf").read_bytes()[:5] == b"%PDF-"
    assert '<a href="figures/restrict.pdf">PDF</a>' in html


def test_not_a_run(tmp_path):
    with pytest.raises(RunDirError, match=r"not an attngeom run: .* has no manifest.json"):
        build_report(tmp_path)
    with pytest.raises(RunDirError, match="does not exist"):
        build_report(tmp_path / "missing")


def test_corrupt_table_names_the_file(tmp_path, write_run):
    run = write_run(tmp_path / "run", tables=("taxonomy", "sink"))
    (run / "sink.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RunDirError, match=re.escape(str(run / "sink.parquet"))):
        build_report(run)


def test_listed_but_missing_table_names_the_file(tmp_path, write_run):
    run = write_run(tmp_path / "run", tables=("taxonomy", "pruning"))
    (run / "pruning.parquet").unlink()
    with pytest.raises(RunDirError, match=r"lists table pruning but .*pruning.parquet"):
        build_report(run)


def test_table_missing_a_column_names_the_file_and_column(tmp_path, write_run):
    run = write_run(tmp_path / "run", tables=("taxonomy",))
    import pandas as pd

    df = pd.read_parquet(run / "taxonomy.parquet").drop(columns=["regime"])
    df.to_parquet(run / "taxonomy.parquet")
    with pytest.raises(RunDirError, match=r"taxonomy.parquet.*regime"):
        build_report(run)


def test_unknown_table_in_manifest_is_noted(tmp_path, write_run):
    import json

    run = write_run(tmp_path / "run", tables=("head_scan",))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["tables"]["future_table"] = "future_table.parquet"
    (run / "manifest.json").write_text(json.dumps(manifest))
    html = build_report(run, formats=("png",)).read_text(encoding="utf-8")
    assert "future_table" in html and _figures(html) == ["head_scan"]


def test_html_escapes_manifest_text(tmp_path, write_run):
    import json

    run = write_run(tmp_path / "run", tables=())
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["command"] = "attngeom analyze <img src=x onerror=alert(1)>"
    (run / "manifest.json").write_text(json.dumps(manifest))
    html = build_report(run).read_text(encoding="utf-8")
    assert "<img src=x" not in html and "&lt;img src=x" in html


def test_label_stability_without_replicates_says_not_measured():
    """bootstrap 0 leaves every stability NaN: the finding says why, never '0 of 0'."""
    import pandas as pd

    from attngeom.report.findings import taxonomy_findings

    tax = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "regime": ["Mixer", "Reset"],
                        "regime_rule": ["single", "single"], "stability": [float("nan")] * 2,
                        "f_self": [0.1, 0.2], "f_sink": [0.5, 0.6], "f_other": [0.4, 0.2]})
    found = taxonomy_findings(tax)
    assert any("Label stability" in f and "not measured" in f for f in found)
    assert not any("0 of 0" in f for f in found)
    tax["stability"] = [0.9, 0.5]
    assert any("1 of 2 labels are unstable" in f for f in taxonomy_findings(tax))
