"""What a new user meets in the first hour: every step says what it is doing, every
caveat is a printed line, every refusal is one line that says what to type."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from attngeom import api
from attngeom.cli import main
from attngeom.engine.progress import Progress, final_line
from attngeom.engine.runner import RunResult
from attngeom.errors import RunDirError
from attngeom.report.text import format_headline, scan_summary
from attngeom.results.state import LOCK_FILE, STATE_DIR
from tests.architectures import STORIES_PATH

MODEL = str(STORIES_PATH)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """A corpus of about five windows of 16 tokens."""
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("Once upon a time there was a little girl who liked to play in the "
                    "park with her red ball and her small dog every day.\n")
    return str(path)


def _analyze(out, corpus, *extra):
    return main(["analyze", "--model", MODEL, "--corpus", corpus, "--window-length", "16",
                 "--analyses", "metrics", "--n-grid", "1,2", "--out", str(out), *extra])


def test_fewer_windows_than_asked_and_no_bootstrap_are_said(small_corpus, tmp_path, capsys):
    assert _analyze(tmp_path / "a", small_corpus, "--n-windows", "50", "--bootstrap",
                    "0") == 0
    out, err = capsys.readouterr()
    assert "warning: the corpus gives" in err and "50 were asked for" in err
    assert "loading stories260K" in err  # the model load is announced
    assert "windows in" in err  # the progress bar leaves its final line
    assert "asked for" in out.splitlines()[0]
    assert "no bootstrap, no interval" in out and "95%" not in out and "nan" not in out


def test_few_windows_carry_a_caveat_on_the_intervals(small_corpus, tmp_path, capsys):
    assert _analyze(tmp_path / "a", small_corpus, "--n-windows", "2", "--bootstrap", "20",
                    "--quiet") == 0
    out, err = capsys.readouterr()
    assert "caveat: only 2 windows" in out and err == ""


def test_headline_without_intervals_prints_means_only():
    df = pd.DataFrame({"n": [1, 1], "rule": ["attention", "random"], "mean": [0.5, 0.25],
                       "ci_low": [float("nan")] * 2, "ci_high": [float("nan")] * 2,
                       "trivial": [False, False]})
    text = format_headline(df)
    assert "no bootstrap" in text and "[" not in text and "0.500" in text


def test_scan_summary_lists_only_critical_heads():
    table = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "nll": [2.0, 2.1, 2.2],
                          "delta_nll_rel": [0.01, 0.2, 0.03], "critical": [False, True, False],
                          "threshold": [0.05] * 3})
    text = scan_summary(RunResult(tables={"head_scan": table}, manifest={}))
    assert text.splitlines()[0].startswith("1 of 3 heads critical")
    assert len(text.splitlines()) == 3  # the header line, the column names, one head
    none = scan_summary(RunResult(tables={"head_scan": table.assign(critical=False)},
                                  manifest={}))
    assert none.startswith("no head of 3 is critical")


def test_progress_leaves_a_final_line(capsys):
    with Progress(4, desc="analyze", unit="window", initial=1, redone=1) as bar:
        bar.advance(3)
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1].startswith("analyze: 4 windows in ")
    assert err.rstrip().endswith("(1 resumed, 1 redone)")
    assert final_line("restrict", 1, "pass", 2.0) == "restrict: 1 pass in 2.0 s"


def test_a_second_run_into_a_busy_directory_is_refused(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    (out / STATE_DIR).mkdir(parents=True)
    lock = out / STATE_DIR / LOCK_FILE
    import json
    import socket

    lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    assert _analyze(out, small_corpus, "--n-windows", "2", "--quiet") == 2
    err = capsys.readouterr().err.strip()
    assert "is in use by another attngeom run" in err and "\n" not in err
    # a killed run's lock (its process is gone) is taken over, and given back at the end
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    assert _analyze(out, small_corpus, "--n-windows", "2", "--quiet") == 0
    assert not lock.exists()


def test_a_finished_run_of_other_options_names_the_option(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert _analyze(out, small_corpus, "--n-windows", "2", "--quiet") == 0
    assert _analyze(out, small_corpus, "--n-windows", "3", "--quiet") == 2
    err = capsys.readouterr().err.strip()
    assert "option n_windows (was 2, now 3)" in err and "pass --overwrite" in err
    assert "overwrite=True" not in err.replace("(overwrite=True in Python)", "")


def test_interrupt_says_how_to_resume(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "run", interrupted)
    assert main(["analyze", "--quiet"]) == 130
    assert "rerun the same command to resume" in capsys.readouterr().err


def test_report_elsewhere_and_without_machine_paths(small_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert _analyze(run, small_corpus, "--n-windows", "2", "--quiet") == 0
    (run / "report").write_text("not a folder")  # a report folder that cannot be made
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot write the report" in err and "--out" in err and "\n" not in err
    assert main(["report", str(run), "--out", str(tmp_path / "elsewhere")]) == 0
    html = (tmp_path / "elsewhere" / "index.html").read_text()
    assert "<title>attngeom report: stories260K" in html
    for path in (MODEL, str(tmp_path), small_corpus):
        assert path not in html
    with pytest.raises(RunDirError, match="pass --out"):
        api.report(run)
