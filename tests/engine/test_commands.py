"""The other commands through the CLI and the API: compare, prune, scan-heads, restrict."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from attngeom import api
from attngeom.cli import main
from attngeom.config import AnalysisConfig
from attngeom.core.accumulators import TopNAccumulator, TopNConfig
from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.geometry import causal_visibility
from attngeom.engine.analyze import run_analysis
from attngeom.errors import ConfigError, RunDirError
from attngeom.results.io import read_table, write_manifest
from tests.architectures import STORIES_PATH, WIKITEXT_PATH, minilm_path

WIKI = str(WIKITEXT_PATH)
TINY = dict(window_length=32, n_eval_windows=2)


@pytest.fixture(scope="module")
def stories():
    from attngeom.capture import load_model

    return load_model(str(STORIES_PATH))


@pytest.fixture(scope="module")
def two_runs(stories, tmp_path_factory):
    base = tmp_path_factory.mktemp("cmp")
    cfg = AnalysisConfig(model=str(STORIES_PATH), window_length=48, n_windows=2,
                         query_mode="all", bootstrap=0, analyses=("taxonomy",))
    a = run_analysis(cfg, base / "a", progress=False, model_and_tokenizer=stories)
    b = run_analysis(cfg.with_(corpus=WIKI), base / "b", progress=False,
                     model_and_tokenizer=stories)
    return a, b


def test_compare_agreement_and_confusion(two_runs, capsys) -> None:
    a, b = two_runs
    cmp = api.compare(a.out_dir, b.out_dir)
    ta, tb = a["taxonomy"], b["taxonomy"]
    same = (ta["regime"].to_numpy() == tb["regime"].to_numpy()).mean()
    assert cmp.agreement == pytest.approx(same)
    assert cmp.n_heads == 40 and int(cmp.confusion.to_numpy().sum()) == 40
    assert main(["compare", str(a.out_dir), str(b.out_dir)]) == 0
    out = capsys.readouterr().out
    assert "Cohen's kappa" in out
    assert out.startswith("caveat: a run of only 2 windows")  # two windows a run


def test_compare_refuses_runs_without_taxonomy_or_of_other_models(two_runs, tmp_path) -> None:
    a, _ = two_runs
    other = tmp_path / "other"
    res = api.analyze(minilm_path(), WIKI, other, window_length=16, n_windows=1,
                      query_mode="final", bootstrap=0, analyses=("taxonomy",), progress=False)
    with pytest.raises(RunDirError, match="different models"):
        api.compare(a.out_dir, res.out_dir)
    bare = tmp_path / "bare"
    bare.mkdir()
    write_manifest(bare, {"command": "analyze", "tables": {}})
    with pytest.raises(RunDirError, match="no taxonomy table"):
        api.compare(a.out_dir, bare)
    with pytest.raises(RunDirError, match="not an attngeom run"):
        api.compare(a.out_dir, tmp_path / "nothing")


def test_scan_heads_cli_equals_api(tmp_path) -> None:
    assert main(["scan-heads", "--out", str(tmp_path / "cli"), "--window-length", "32",
                 "--n-eval-windows", "2"]) == 0
    res = api.scan_heads(out=tmp_path / "api", **TINY)
    cli = read_table(tmp_path / "cli", "head_scan")
    pd.testing.assert_frame_equal(cli, read_table(tmp_path / "api", "head_scan"))
    assert len(cli) == 40 and set(cli.columns) >= {"layer", "head", "delta_nll_rel", "critical"}
    assert (res["head_scan"]["critical"] == (res["head_scan"]["delta_nll_rel"] > 0.05)).all()


def test_prune_and_restrict_write_their_tables(tmp_path) -> None:
    res = api.prune(out=tmp_path / "p", rankers=("magnitude", "random"), seeds=(0, 1),
                    keep_fractions=(1.0, 0.5), n_rank_windows=1, **TINY)
    p = read_table(tmp_path / "p", "pruning")
    assert set(p["ranker"]) == {"magnitude", "random"}
    assert len(p) == 2 + 2 * 2  # magnitude x 2 fractions + random x 2 seeds x 2 fractions
    full = p[p["keep_fraction"] == 1.0]
    assert full["delta_nll_rel"].abs().max() < 1e-9
    assert res.manifest["corpus"]["rank_windows"] == [0]
    assert res.manifest["corpus"]["eval_windows"] == [1, 2]
    r = api.restrict(out=tmp_path / "r", n_grid=(1, 32), renormalize=(True,), **TINY)
    t = r["restrict"].set_index("n")
    assert abs(t.loc[32, "delta_nll_rel"]) < 1e-6  # N >= window is the identity
    assert t.loc[1, "delta_nll_rel"] > 0
    assert set(r["restrict_nstar"]["tau"]) == {0.01, 0.05, 0.10}


@pytest.mark.parametrize(
    "argv, match",
    [
        (["prune", "--rankers", "taxonomy,oracle"], "rankers"),
        (["prune", "--keep-fractions", "1.0,1.5"], "keep_fractions"),
        (["prune", "--keep-fractions", "0"], "keep_fractions"),
        (["restrict", "--n-grid", "0,2"], "n_grid"),
        (["scan-heads", "--threshold", "-1"], "threshold"),
        (["restrict", "--layers", "9", "--scopes", "layer", "--window-length", "16",
          "--n-eval-windows", "1"], "layer"),
    ],
)
def test_bad_intervention_arguments(argv, match, capsys, tmp_path) -> None:
    code = main([*argv, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and match in err and "\n" not in err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_nonfinite_rows_are_counted_not_averaged() -> None:
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(1, 6, 2, generator=gen)
    rows = torch.arange(1, 6)
    alpha = torch.softmax(torch.randn(2, 5, 6, generator=gen), -1)
    alpha = alpha.masked_fill(~causal_visibility(rows, 6), 0.0)
    alpha[1, 2, 0] = float("nan")
    acc = TopNAccumulator(TopNConfig(n_grid=(2,), rules=("attention",), bounds=False,
                                     variants=("full",)))
    acc.update(AttentionBatch(0, 0, alpha, causal_visibility(rows, 6), rows,
                              ValueStats(values)))
    assert acc.nonfinite_rows == 1
    m = acc.compute()["metrics"]
    # N = 2 needs a universe of 3 keys, so t = 1 is skipped for both heads, and head 1
    # also loses its non-finite row
    assert list(m["n_queries"]) == [4, 3]
    assert list(m["n_skipped"]) == [1, 2]


def test_analyze_rejects_bad_config_before_loading() -> None:
    with pytest.raises(ConfigError, match="window_length"):
        AnalysisConfig(window_length=1)
    with pytest.raises(ConfigError, match="bounds"):
        AnalysisConfig(analyses=("bounds",))


def test_failed_overwrite_keeps_the_previous_results(tmp_path) -> None:
    """--overwrite clears the old run only when the new one is ready to be written."""
    out = tmp_path / "scan"
    api.scan_heads(out=out, **TINY)
    before = sorted(p.name for p in out.iterdir())
    code = main(["analyze", "--model", "/nonexistent/x", "--out", str(out), "--overwrite",
                 "--quiet"])
    assert code == 2
    assert sorted(p.name for p in out.iterdir()) == before
    assert read_table(out, "head_scan").shape[0] == 40


def test_check_command_runs_the_self_checks(capsys) -> None:
    """Every check is printed with the largest deviation it measured and its bound."""
    assert main(["check", "--model", str(STORIES_PATH)]) == 0
    out = capsys.readouterr().out
    assert "self-checks passed" in out
    result = api.check(str(STORIES_PATH))
    lines = {line.name: line for line in result.lines}
    assert lines["output under capture vs own forward (max |diff|)"].measured == 0.0
    assert 0 <= lines["visible probabilities sum to 1 (max |sum - 1|)"].measured < 1e-5
    assert lines["head gates of one (max |diff|)"].measured == 0.0
    removed = [x for name, x in lines.items() if name.startswith("removing head")]
    assert len(removed) == 2 and all(x.measured > 0 for x in removed)
    for line in result.lines:
        assert line.name in out
    code = main(["check", "--model", "/nonexistent/model"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("attngeom check: error:") and "\n" not in err


def test_every_command_reports_progress(stories) -> None:
    """The same progress line for every command: a total and updates that reach it
    (windows for analyze, forward passes for the perplexity commands)."""
    bars = []

    class Bar:
        def __init__(self, total, desc, unit):
            self.total, self.desc, self.unit, self.done = total, desc, unit, 0
            bars.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            pass

    common = dict(window_length=32, progress=Bar, model_and_tokenizer=stories)
    api.analyze(n_windows=3, analyses=("taxonomy",), bootstrap=0, **common)
    api.scan_heads(n_eval_windows=2, **common)
    api.restrict(n_eval_windows=2, n_grid=(1, 2), search="grid", **common)
    api.prune(n_rank_windows=2, n_eval_windows=2, rankers=("taxonomy", "entropy"),
              keep_fractions=(1.0, 0.5), **common)
    assert [b.unit for b in bars] == ["window", "pass", "pass", "window", "pass", "pass"]
    assert all(b.total > 0 and b.done == b.total for b in bars)
    assert "restrict" in bars[2].desc and "settings" in bars[2].desc
