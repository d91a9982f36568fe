"""Bad input, tried as a new user would: one line on stderr, exit status 2, no results.

Every case runs the real CLI. Those marked ``early`` must fail before any model is
loaded (``load_model`` is replaced by a function that fails the test), including an
output directory that cannot be created (``--out /proc/x``).
"""

from __future__ import annotations

import pytest

from attngeom.cli import main
from tests.architectures import WIKITEXT_PATH, minilm_path


def _cases(tmp):
    jsonl = tmp / "docs.jsonl"
    jsonl.write_text('{"body": "Once upon a time."}\n')
    afile = tmp / "a-file"
    afile.write_text("not a directory")
    wiki = str(WIKITEXT_PATH)
    return [
        # (argv, words in the message, fails before the model loads)
        (["analyze", "--model", "/nonexistent/model"], "no such local directory", True),
        (["analyze", "--corpus", str(tmp / "missing.txt")], "does not exist", True),
        (["analyze", "--n-grid", "0,2"], "n_grid", True),
        (["analyze", "--query-mode", "last"], "query_mode", True),
        (["analyze", "--rules", "attention,best"], "rules", True),
        (["analyze", "--window-length", "1"], "window_length", True),
        (["analyze", "--n-windows", "-3"], "n_windows", True),
        (["analyze", "--seed", "abc"], "seed", True),
        (["analyze", "--dtype", "float8"], "dtype", True),
        (["analyze", "--regime-rule", "plurality"], "regime_rule", True),
        (["analyze", "--analyses", "bounds"], "'bounds' needs 'metrics'", True),
        (["analyze", "--doc-boundary", "eos", "--boundary-token", "<|nope|>"],
         "is not a token", True),
        (["analyze", "--corpus", str(jsonl)], "no text column 'text'", True),
        (["analyze", "--corpus", "wikitext-103"], "wikitext-103", True),
        (["analyze", "--out", "/proc/x"], "cannot create results directory /proc/x", True),
        (["analyze", "--out", str(afile)], "a file", True),
        (["analyze", "--window-length", "600"], "512 positions", False),
        (["prune", "--rankers", "taxonomy,oracle"], "rankers", True),
        (["prune", "--keep-fractions", "1.5"], "keep_fractions", True),
        (["prune", "--orders", "Mixer>Mixer>Reset"], "orders", True),
        (["prune", "--out", "/proc/x"], "cannot create results directory", True),
        (["scan-heads", "--threshold", "-1"], "threshold", True),
        (["scan-heads", "--out", "/proc/x"], "cannot create results directory", True),
        (["restrict", "--scopes", "global"], "scopes", True),
        (["restrict", "--heads", "0:x"], "heads", True),
        (["restrict", "--taus", "-0.1"], "taus", True),
        (["restrict", "--out", "/proc/x"], "cannot create results directory", True),
        (["restrict", "--alone-tau", "0.2"], "alone_tau: expected one of the taus", True),
        (["restrict", "--rankings", "window", "--n-grid", "4,8", "--alone-tau", "0.05"],
         "add attention to the rankings", True),
        (["restrict-policies", "--n-grid", "8,16"], "quest ranking keeps 16 fixed keys", True),
        (["restrict-policies", "--rankings", "attention,windw"], "did you mean", True),
        (["restrict", "--model", minilm_path(), "--corpus", wiki], "not a causal LM", False),
        (["competition", "--rankings", "quest", "--budgets", "8,64"],
         "budgets: the quest ranking keeps 16 fixed keys", True),
        (["competition", "--budgets", "0"], "budgets: expected every N >= 1", True),
        (["competition", "--probe", "kept", "--rankings", "wndow"], "did you mean 'window'",
         True),
        (["competition", "--probe", "kept", "--lengths", "600"], "512 positions", False),
        (["compare", str(tmp / "no-run-a"), str(tmp / "no-run-b")], "not an attngeom run", True),
        (["report", str(tmp)], "not an attngeom run", True),
        (["check", "--model", "/nonexistent/model"], "no such local directory", False),
        (["check", "--quantization", "3bit"], "quantization", True),
        # asset: names work wherever a model or corpus does; an unknown one lists the known
        (["check", "--model", "asset:stories26"], "unknown asset 'stories26': expected one "
         "of stories260K, smollm2-135m", False),  # load_model's first line, before weights
        (["analyze", "--corpus", "asset:tiny"], "unknown asset 'tiny'", True),
        (["restrict", "--rankings", "attention,widow"], "unknown restriction ranking 'widow'; "
         "did you mean 'window'?", True),
        (["restrict", "--rankings", "window", "--n-grid", "1,2,8"], "window ranking keeps 4 "
         "fixed keys", True),
        (["restrict", "--rankings", "snapkv"], "snapkv compresses a prompt once", True),
        (["restrict-local", "--scan-top-layers", "99"], "scan_top_layers: expected at most "
         "the 5 layers", True),
        (["analyze", "--n-grid", "1,2,4096", "--window-length", "32"], "n_grid: expected "
         "every N at most the window length 32", True),
        (["competition", "--probe", "context", "--lengths", "64,32"], "lengths: expected "
         "increasing lengths, got 64,32", True),
        (["competition", "--probe", "context", "--lengths", "256,4096"], "lengths: expected "
         "lengths within", True),
        (["atlas", "--repeat-length", "400"], "repeat_length: expected a repeated prompt", True),
        (["atlas", "--thresholds", "retreival=0.2"], "did you mean 'retrieval'", True),
        (["analyze", "--device", "cuda"], "torch sees no CUDA GPU here", True),
        # load_model refuses before it reads a weight (no CUDA here)
        (["check", "--quantization", "8bit"], "need a CUDA GPU", False),
    ]


def test_every_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import attngeom.capture

    real_load = attngeom.capture.load_model
    state = {"early": False}

    def guarded(*args, **kwargs):
        if state["early"]:
            raise AssertionError("the model was loaded before the bad input was caught")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(attngeom.capture, "load_model", guarded)
    cases = _cases(tmp_path)
    assert len(cases) >= 18
    for argv, words, early in cases:
        state["early"] = early
        out = ["--out", str(tmp_path / "out")] if argv[0] not in (
            "compare", "report", "check") and "--out" not in argv else []
        code = main([*argv, *out, *(["--quiet"] if argv[0] in ("analyze", "prune",
                                                               "scan-heads", "restrict")
                                     else [])])
        err = capsys.readouterr().err.strip()
        assert code == 2, (argv, err)
        assert err.startswith(f"attngeom {argv[0]}: error:"), (argv, err)
        assert "\n" not in err, (argv, err)
        assert words in err, (argv, err)
        assert not (tmp_path / "out" / "manifest.json").exists(), argv


def test_argparse_errors_are_its_own_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["analyze", "--no-such-option"])
    assert info.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
