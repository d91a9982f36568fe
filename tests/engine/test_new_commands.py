"""End to end: atlas, competition (qa and context), restrict-local and view, through the
API and the CLI on stories260K, their reports, and a tiny study with the new parts."""

from __future__ import annotations

import re
import textwrap

import pandas as pd
import pytest

from attngeom import api
from attngeom.cli import main
from attngeom.results.io import read_table
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH

ATLAS = dict(n_windows=2, window_length=128, needle_contexts=(96, 64), n_needles=1,
             n_repeats=1, repeat_length=8, bootstrap=0, n_grid=(1, 2), query_mode="final")
ATLAS_ARGV = ["--n-windows", "2", "--window-length", "128", "--needle-contexts", "96,64",
              "--n-needles", "1", "--n-repeats", "1", "--repeat-length", "8",
              "--bootstrap", "0", "--n-grid", "1,2", "--query-mode", "final"]
QA = dict(probe="qa", backgrounds=(0,), n_episodes=2, nstar=False, bootstrap=20)
QA_ARGV = ["--probe", "qa", "--backgrounds", "0", "--n-episodes", "2", "--nstar", "false",
           "--bootstrap", "20"]


@pytest.fixture(scope="module")
def stories():
    from attngeom.capture import load_model

    return load_model(str(STORIES_PATH))


def _same_tables(a, b) -> None:
    names = sorted(p.stem for p in a.glob("*.parquet"))
    assert names == sorted(p.stem for p in b.glob("*.parquet"))
    for name in names:
        pd.testing.assert_frame_equal(read_table(a, name), read_table(b, name))


@pytest.fixture(scope="module")
def atlas_run(tmp_path_factory, stories):
    out = tmp_path_factory.mktemp("atlas") / "api"
    res = api.atlas(str(STORIES_PATH), str(TINYSTORIES_PATH), out, progress=False,
                    model_and_tokenizer=stories, **ATLAS)
    return res


def test_atlas_writes_scores_and_the_side_by_side(atlas_run) -> None:
    res = atlas_run
    for name in ("head_scores", "atlas_contingency", "atlas_kappa", "atlas_depth",
                 "atlas_fn", "taxonomy", "summary"):
        assert (res.out_dir / f"{name}.parquet").is_file(), name
    scores = res["head_scores"]
    n_heads = 5 * 8  # stories260K: 5 layers x 8 heads
    assert scores[["layer", "head"]].drop_duplicates().shape[0] == n_heads
    # the contingency counts every head of the taxonomy once per regime
    c = res["atlas_contingency"]
    per_regime = c.drop_duplicates("regime").set_index("regime")["n_regime"]
    assert per_regime.sum() == len(res["taxonomy"]) == n_heads
    assert "head types of 40 heads" in api.summary(res)


def test_atlas_cli_equals_api_and_thresholds_change_labels(atlas_run, tmp_path) -> None:
    cli = tmp_path / "cli"
    assert main(["atlas", "--model", str(STORIES_PATH), "--corpus", str(TINYSTORIES_PATH),
                 *ATLAS_ARGV, "--out", str(cli), "--quiet"]) == 0
    _same_tables(atlas_run.out_dir, cli)
    from attngeom.probes.atlas_command import with_thresholds

    scores = atlas_run["head_scores"]
    loose = with_thresholds(scores, ("previous_token=0",))
    assert loose.loc[loose["score"] == "previous_token", "is_type"].all()
    assert (loose.loc[loose["score"] != "previous_token", "is_type"].tolist()
            == scores.loc[scores["score"] != "previous_token", "is_type"].tolist())


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory, stories):
    out = tmp_path_factory.mktemp("qa") / "api"
    return api.competition(str(STORIES_PATH), None, out, progress=False,
                           model_and_tokenizer=stories,
                           **{k: v for k, v in QA.items() if k != "probe"})


def test_competition_qa_cli_equals_api(qa_run, tmp_path) -> None:
    res = qa_run
    assert set(res.tables) == {"qa_answers", "qa_examples", "qa_support",
                               "qa_support_summary", "qa_budget", "competition_settings"}
    answers = res["qa_answers"]
    assert answers["n_examples"].tolist() == [2] and answers["model"].tolist() == [
        "stories260K-hf"] and answers["corpus"].nunique() == 1
    settings = dict(zip(res["competition_settings"]["setting"],
                        res["competition_settings"]["value"], strict=True))
    assert settings["probe"] == "qa" and settings["prompt_format"] == "plain"
    assert "qa answers per background" in api.summary(res)
    cli = tmp_path / "cli"
    assert main(["competition", "--model", str(STORIES_PATH), *QA_ARGV, "--out", str(cli),
                 "--quiet"]) == 0
    _same_tables(res.out_dir, cli)


def test_competition_context_and_restrict_local(tmp_path, stories) -> None:
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(" ".join(f"Doc {k} says the cat sat {i} times."
                                           for i in range(12)) for k in range(3)))
    res = api.competition(str(STORIES_PATH), str(corpus), tmp_path / "ctx", probe="context",
                          progress=False, model_and_tokenizer=stories, window_length=16,
                          lengths=(16, 32), n_documents=2, tail=8, taus=(0.1,),
                          bootstrap=20)
    assert sorted(res["context_nstar"]["length"].unique()) == [16, 32]
    assert set(res["context_slope"]["scoring"]) == {"tail", "all"}
    assert "log-log slope" in api.summary(res)
    local = api.run("restrict-local", str(STORIES_PATH), str(TINYSTORIES_PATH),
                    tmp_path / "local", progress=False, model_and_tokenizer=stories,
                    window_length=32, n_eval_windows=2, scan_n=(4,), scan_top_layers=1,
                    renormalize=(False,), bootstrap=0)
    table = local["restrict_local"]
    assert set(table["scope"]) == {"layer", "head"}
    assert table.loc[table["scope"] == "head", "layer"].nunique() == 1


@pytest.mark.parametrize("argv, message", [
    (["competition", "--probe", "maze"], "probe: unknown probe 'maze' (known: qa, context, kept)"),
    (["competition", "--facts", "5,2"], "facts: expected MIN,MAX"),
    (["competition", "--probe", "context", "--taus", "5"], "taus: expected relative"),
    (["competition-qa", "--probe", "context"], "is the 'qa' probe"),
    (["atlas", "--thresholds", "sink"], "thresholds: expected NAME=VALUE"),
    (["atlas", "--needle-contexts", "999"], "needle_contexts: expected lengths up to"),
    (["restrict-local", "--scope", "model"], "restrict-local scans layers or heads"),
    (["view"], "expected a run directory or --prompt"),
    (["view", "--prompt", "Once upon a time", "--heads", "9:0"], "layer: expected"),
    (["view", "--prompt", "Once upon a time", "--heads", "x"], "heads: expected"),
])
def test_bad_input_one_line(argv, message, capsys, tmp_path) -> None:
    if argv[0] != "view":
        argv = [*argv, "--out", str(tmp_path / "o"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_view_writes_one_page_per_prompt(tmp_path, capsys) -> None:
    out = tmp_path / "v.html"
    assert main(["view", "--prompt", "Once upon a time there was a cat. The cat",
                 "--heads", "1:0,2:3", "--queries=-1,5", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"viewer: {out}"
    html = out.read_text(encoding="utf-8")
    assert "L1H0" in html and "L2H3" in html and "http://" not in html.split("<body")[0]
    assert api.view(prompt="Hello there", heads="0:1", out=tmp_path / "a.html",
                    n_max=0).is_file()


def test_reports_name_the_new_sections_and_figures(atlas_run, qa_run) -> None:
    from attngeom.report.build import build_report

    def parts(run):
        html = build_report(run.out_dir, formats=("png",)).read_text(encoding="utf-8")
        return (re.findall(r'<section id="([a-z_]+)"', html), html)

    sections, html = parts(atlas_run)
    assert "atlas" in sections
    for name in ("atlas_contingency", "atlas_depth"):
        assert f'data-figure="{name}"' in html, name
    assert "Heads by regime and head type (counts)" in html
    sections, html = parts(qa_run)
    assert "competition" in sections
    for name in ("competition_support", "competition_recall_map"):
        assert f'data-figure="{name}"' in html, name
    assert "Competence screen" in html


def test_report_links_heads_to_the_viewer(tmp_path, stories) -> None:
    from attngeom.report.build import build_report

    res = api.analyze(str(STORIES_PATH), str(TINYSTORIES_PATH), tmp_path / "an",
                      progress=False, model_and_tokenizer=stories, n_windows=2,
                      window_length=32, analyses=("taxonomy",), bootstrap=0)
    html = build_report(res.out_dir, formats=("png",), viewer=api.report_viewer
                        ).read_text(encoding="utf-8")
    links = re.findall(r'href="viewer.html#(L\d+H\d+)"', html)
    assert links and (res.out_dir / "report" / "viewer.html").is_file()
    page = (res.out_dir / "report" / "viewer.html").read_text(encoding="utf-8")
    for tag in links:
        layer, head = map(int, re.findall(r"\d+", tag))
        assert f'"layer": {layer}' in page or f'"layer":{layer}' in page


def test_tiny_study_runs_the_new_parts(tmp_path) -> None:
    study = tmp_path / "new.toml"
    study.write_text(textwrap.dedent(f"""
    [study]
    name = "new-parts"
    analyses = ["geometry", "taxonomy", "atlas", "qa", "local_restriction"]

    [models.stories]
    model = "{STORIES_PATH}"

    [corpora.tiny]
    corpus = "{TINYSTORIES_PATH}"

    [analyze]
    n_windows = 2
    window_length = 64
    bootstrap = 0

    [atlas]
    n_windows = 2
    window_length = 128
    needle_contexts = [96, 64]
    n_needles = 1
    n_repeats = 1
    repeat_length = 8
    bootstrap = 0
    n_grid = [1, 2]

    [qa]
    backgrounds = [0]
    n_episodes = 2
    nstar = false
    bootstrap = 20

    [local_restriction]
    window_length = 32
    n_eval_windows = 2
    scan_n = [4]
    scan_top_layers = 1
    renormalize = [false]
    """))
    out = tmp_path / "study"
    assert main(["reproduce", str(study), "--out", str(out), "--quiet"]) == 0
    for folder in ("analyze", "atlas", "qa", "restrict-local"):
        assert (out / "runs" / "stories" / "tiny" / folder / "manifest.json").is_file()
    # analyze and the atlas both write a taxonomy on the same model and corpus: the study
    # keeps them apart instead of refusing the doubled rows
    from attngeom.results.io import read_table
    for name in ("summary", "atlas_summary", "taxonomy", "atlas_taxonomy"):
        assert len(read_table(out / "tables", name))
    html = (out / "report" / "index.html").read_text(encoding="utf-8")
    assert "Head atlas: heads by regime and head type, across models" in html
    assert "qa: answers and the competence screen" in html
    assert "Localised restriction: the most sensitive layer and head" in html
