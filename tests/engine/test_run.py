"""``analyze`` end to end on the shared real model: tables, determinism, CLI = API, bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attngeom import api
from attngeom.assets import asset
from attngeom.cli import main
from attngeom.config import AnalysisConfig
from attngeom.engine.analyze import run_analysis
from attngeom.errors import ConfigError, CorpusError, ModelError, RunDirError
from attngeom.results.io import read_manifest, read_table
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH, WIKITEXT_PATH, minilm_path

SMALL = dict(window_length=48, n_windows=3, query_mode="stride:8", bootstrap=50,
             n_grid=(1, 2, 4, 8, 48))
WIKI = str(WIKITEXT_PATH)


@pytest.fixture(scope="module")
def stories():
    from attngeom.capture import load_model

    return load_model(str(STORIES_PATH))


@pytest.fixture(scope="module")
def small_run(stories, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    cfg = AnalysisConfig(model=str(STORIES_PATH), **SMALL)
    return run_analysis(cfg, out, progress=False, model_and_tokenizer=stories)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tables_and_manifest(small_run) -> None:
    out = small_run.out_dir
    manifest = read_manifest(out)
    assert set(manifest["tables"]) == {
        "metrics", "summary", "sink", "sink_tokens", "taxonomy", "bounds", "assumptions",
    }
    for name in manifest["tables"]:
        df = read_table(out, name)
        pd.testing.assert_frame_equal(
            df.reset_index(drop=True),
            read_table(out, name).reset_index(drop=True),
        )
        assert len(df) == len(small_run[name]), name
    m = read_table(out, "metrics")
    # 3 windows x 5 layers x 8 heads x 3 rules x 2 variants x 1 distance x 5 N
    assert len(m) == 3 * 5 * 8 * 3 * 2 * 5
    assert manifest["model"]["num_kv_heads"] == 4 and manifest["model"]["sha256"]
    assert manifest["corpus"]["n_windows"] == 3 and manifest["corpus"]["sha256"]
    assert manifest["seed"] == 0 and manifest["config"]["effective_repeats"] == 2
    assert manifest["counts"]["never_valid_n"] == [48]  # the final query sees 48 keys
    # N = 48 is reported as skipped, never averaged as 0
    big = m[m["n"] == 48]
    assert big["f_score"].isna().all() and (big["n_queries"] == 0).all()
    assert (big["n_skipped"] > 0).all()
    triv = m[(m["n"] == 1)]
    assert triv["trivial"].all() and not m[m["n"] == 2]["trivial"].any()


def test_attention_beats_random_control(small_run) -> None:
    """The paper's headline on a real model: attention-selected sets separate far better."""
    s = small_run["summary"]
    sel = s[(s["scope"] == "model") & (s["metric"] == "f_score") & (s["variant"] == "full")]
    f = sel.set_index(["rule", "n"])["mean"]
    for n in (2, 4, 8):
        assert f["attention", n] > f["random", n] + 0.1
    # model-scope mean is the mean over windows of the mean over heads
    m = small_run["metrics"]
    part = m[(m["rule"] == "attention") & (m["variant"] == "full") & (m["n"] == 4)]
    expect = part.groupby("window")["f_score"].mean().mean()
    assert f["attention", 4] == pytest.approx(expect)
    row = sel[(sel["rule"] == "attention") & (sel["n"] == 4)].iloc[0]
    assert row["ci_low"] <= row["mean"] <= row["ci_high"]


def test_bounds_never_exceed_measured(small_run) -> None:
    m = small_run["metrics"]
    ok = m.dropna(subset=["precision_bound", "precision"])
    assert len(ok) > 0
    # per-query bounds hold row by row, so their window means do too
    assert (ok["precision_bound"] <= ok["precision"] + 1e-9).all()
    assert (ok["recall_bound"] <= ok["recall"] + 1e-9).all()
    assert (ok["precision_inv_bound"] <= ok["precision"] + 1e-9).all()
    assert (ok["recall_inv_bound"] <= ok["recall"] + 1e-9).all()


def test_same_seed_gives_identical_files(stories, tmp_path, small_run) -> None:
    cfg = AnalysisConfig(model=str(STORIES_PATH), **SMALL)
    again = run_analysis(cfg, tmp_path / "again", progress=False, model_and_tokenizer=stories)
    for name in small_run.manifest["tables"]:
        a = small_run.out_dir / f"{name}.parquet"
        b = again.out_dir / f"{name}.parquet"
        assert _digest(a) == _digest(b), name
    other = run_analysis(cfg.with_(seed=1, analyses=("metrics",)), tmp_path / "seed1",
                         progress=False, model_and_tokenizer=stories)
    mine = small_run["metrics"].query("rule == 'random'")["f_score"].to_numpy()
    theirs = other["metrics"].query("rule == 'random'")["f_score"].to_numpy()
    assert not np.allclose(mine, theirs, equal_nan=True)


def test_output_dir_of_another_run_is_refused_and_untouched(stories, small_run) -> None:
    out = small_run.out_dir
    before = {p.name: _digest(p) for p in out.iterdir() if p.is_file()}
    cfg = AnalysisConfig(model=str(STORIES_PATH), **{**SMALL, "n_windows": 2})
    with pytest.raises(RunDirError, match="different"):
        run_analysis(cfg, out, progress=False, model_and_tokenizer=stories)
    after = {p.name: _digest(p) for p in out.iterdir() if p.is_file()}
    assert before == after


def test_rerun_same_command_is_allowed_and_overwrite_replaces(stories, tmp_path) -> None:
    cfg = AnalysisConfig(model=str(STORIES_PATH), **{**SMALL, "analyses": ("metrics",)})
    run_analysis(cfg, tmp_path / "r", progress=False, model_and_tokenizer=stories)
    run_analysis(cfg, tmp_path / "r", progress=False, model_and_tokenizer=stories)
    cfg2 = cfg.with_(n_windows=1)
    res = run_analysis(cfg2, tmp_path / "r", overwrite=True, progress=False,
                       model_and_tokenizer=stories)
    assert read_manifest(tmp_path / "r")["corpus"]["n_windows"] == 1
    assert set(res["metrics"]["window"]) == {0}


def test_cli_tables_equal_api_tables(tmp_path, small_run) -> None:
    args = ["analyze", "--model", str(STORIES_PATH), "--out", str(tmp_path / "cli"),
            "--window-length", "48", "--n-windows", "3", "--query-mode", "stride:8",
            "--bootstrap", "50", "--n-grid", "1,2,4,8,48", "--quiet"]
    assert main(args) == 0
    for name in small_run.manifest["tables"]:
        cli = read_table(tmp_path / "cli", name)
        ref = read_table(small_run.out_dir, name)
        pd.testing.assert_frame_equal(cli, ref)


def test_encoder_minilm_runs_with_bidirectional_universe(tmp_path) -> None:
    res = api.analyze(minilm_path(), WIKI, tmp_path / "mini", window_length=32, n_windows=2,
                      query_mode="all", bootstrap=20, n_grid=(1, 2, 4, 31, 32),
                      progress=False, analyses=("metrics", "sink", "taxonomy", "bounds"))
    m = res["metrics"]
    assert m["layer"].nunique() == 6 and m["head"].nunique() == 12
    # every row of an encoder sees all 32 keys: N = 31 is valid, N = 32 never; the 30
    # content positions are the queries, [CLS] and [SEP] never (SPEC 2)
    full = m[(m["variant"] == "full") & (m["rule"] == "attention")]
    assert (full[full["n"] == 31]["n_queries"] == 30).all()
    assert (full[full["n"] == 32]["n_queries"] == 0).all()
    assert res.manifest["corpus"]["boundary_policy"]["kind"] == "sep"
    # sinks by token: [CLS] at position 0 is the sink of the middle layers; [SEP] is
    # reported for every head (it is a special token) with what it receives
    tokens = res["sink_tokens"]
    zero = tokens[tokens["position"] == 0]
    assert zero[zero["layer"].between(1, 4)]["detected"].mean() > 0.8
    sep = tokens[tokens["token"] == "[SEP]"]
    assert len(sep) == 6 * 12 and (sep["pairs"] > 0).all() and (sep["occurrences"] >= 2).all()
    assert res.manifest["model"]["is_causal"] is False
    # the paper's sink signature in the middle layers: a value several times shorter than
    # the rest, a large attention mass, and F_N lower when the sink is selected
    sink = res["sink"]
    middle = sink[(sink["n"] == 4) & sink["layer"].between(1, 4)].groupby("layer").median(
        numeric_only=True)
    assert (middle["norm_ratio"] > 5).all()
    assert (middle["sink_mass"] > 0.2).all()
    assert (middle["f_full_sink_selected"] < middle["f_full_sink_unselected"]).all()
    # the certified bounds hold on a real encoder with its strong first-token sink too
    ok = m.dropna(subset=["recall_bound", "recall"])
    assert len(ok) > 0
    assert (ok["recall_bound"] <= ok["recall"] + 1e-9).all()
    assert (ok["precision_bound"] <= ok["precision"] + 1e-9).all()
    assert (ok["f_bound"] <= ok["f_score"] + 1e-9).all()



def test_encoder_queries_are_content_positions(tmp_path) -> None:
    """SPEC 2: no analysed query of an encoder is [CLS] or [SEP], including the [SEP]s
    that join documents inside a window; final is the last content token."""
    from attngeom.capture import load_tokenizer
    from attngeom.corpora.documents import load_windows
    from attngeom.engine.stream import window_rows

    tok = load_tokenizer(minilm_path())
    for mode in ("final", "all", "stride:3"):
        cfg = AnalysisConfig(model=minilm_path(), corpus=str(TINYSTORIES_PATH), window_length=48,
                             n_windows=12, query_mode=mode)
        windows, _, policy = load_windows(cfg, tok)
        assert any((w.input_ids[1:-1] == tok.sep_token_id).any() for w in windows)
        for w, rows in zip(windows, window_rows(cfg, windows, causal=False), strict=True):
            ids = w.input_ids[rows]
            assert not ((ids == tok.cls_token_id) | (ids == tok.sep_token_id)).any()
            if mode == "final":
                content = torch.nonzero(~w.special).flatten()
                assert rows.tolist() == [int(content.max())]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(model="/nonexistent/model-dir"), ModelError, "nonexistent"),
        (dict(window_length=600), ConfigError, "512 positions"),
        (dict(n_grid=(0, 2)), ConfigError, "n_grid"),
        (dict(query_mode="last"), ConfigError, "query_mode"),
        (dict(rules=("attention", "best")), ConfigError, "rules"),
        (dict(regime_rule="plurality"), ConfigError, "regime_rule: expected one of"),
        (dict(doc_boundary="eos", boundary_token="<|sep|>"), ConfigError,
         "'<\\|sep\\|>' is not a token"),
        (dict(doc_boundary="newline"), ConfigError, "doc_boundary"),
    ],
)
def test_bad_input_one_line_errors(kwargs, error, match, tmp_path, monkeypatch) -> None:
    """Bad options fail in one line, and those the tokenizer can judge before the model
    loads (a boundary token it does not know)."""
    import attngeom.capture

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the error")

    if "window_length" not in kwargs:
        monkeypatch.setattr(attngeom.capture, "load_model", no_model)
    with pytest.raises(error, match=match) as info:
        api.analyze(out=tmp_path / "x", progress=False, **{**SMALL, **kwargs})
    assert "\n" not in str(info.value)
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_bad_corpora(tmp_path, stories) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time.")
    for path, match in ((empty, "empty"), (short, "tokens"),
                        (tmp_path / "missing.txt", "missing.txt")):
        cfg = AnalysisConfig(model=str(STORIES_PATH), corpus=str(path), **SMALL)
        with pytest.raises(CorpusError, match=match) as info:
            run_analysis(cfg, None, progress=False, model_and_tokenizer=stories)
        assert "\n" not in str(info.value)


def test_cli_reports_errors_in_one_line(capsys, tmp_path) -> None:
    code = main(["analyze", "--model", "/nonexistent/x", "--out", str(tmp_path / "o"),
                 "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("attngeom analyze: error:") and "\n" not in err


def test_default_paths_exist() -> None:
    assert Path(asset("tinystories")).is_file()
    assert Path(WIKI).is_file()
    assert json.loads((STORIES_PATH / "config.json").read_text())["num_key_value_heads"] == 4
