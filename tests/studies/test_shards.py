"""Shares of a study (``reproduce --shard K/N``): which cells a share runs, the variables
of SLURM arrays and Kubernetes Indexed Jobs, the leases that keep two processes off one
cell, and two shares started together writing the tables and report of one process.

The end-to-end tests run a four-cell study shaped like ``studies/followup-small.toml``
(stories260K on two corpora, analyze and restrict on each, cross_corpus and
geometry_vs_loss) but smaller: followup-small itself costs about 56 s of CPU for one
process and 85 s for two shares here, twice the minute a test may take.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from attngeom.cli import main
from attngeom.errors import ConfigError
from attngeom.results import state
from attngeom.results.state import Lease, RunLock
from attngeom.studies import claims
from attngeom.studies.shards import Shard, parse_shard, resolve_shard, shard_from_env

ROOT = Path(__file__).resolve().parents[2]

STUDY = textwrap.dedent("""
    [study]
    name = "shards"
    analyses = ["metrics", "taxonomy", "cross_corpus", "restriction", "geometry_vs_loss"]

    [defaults]
    seed = 3
    window_length = 32
    batch_size = 2
    device = "cpu"
    dtype = "float32"

    [models.stories]
    model = "asset:stories260K"

    [corpora.tiny]
    corpus = "asset:tinystories"
    [corpora.wiki]
    corpus = "asset:wikitext-2-test"
    separator = "wikitext-articles"

    [analyze]
    n_windows = 2
    query_mode = "stride:8"
    n_grid = [1, 2, 4, 8]
    bootstrap = 10

    [restriction]
    n_grid = [1, 2, 4, 8]
    n_eval_windows = 2
    bootstrap = 10
    """)
# the study's cells, in order: (tiny, analyze), (tiny, restrict), (wiki, analyze),
# (wiki, restrict); share 1/2 is the first two


# --------------------------------------------------------------------------- shares


def test_shares_are_contiguous_blocks_covering_every_cell_once():
    for n_cells in range(1, 10):
        cells = list(range(n_cells))
        for count in range(1, n_cells + 1):
            parts = [Shard(k, count).select(cells) for k in range(1, count + 1)]
            assert [c for p in parts for c in p] == cells  # in order, each once
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            assert all(p == list(range(p[0], p[-1] + 1)) for p in parts)  # blocks


@pytest.mark.parametrize(("text", "message"), [
    ("0/2", "share 0 of 2 is outside 1..2"),
    ("3/2", "share 3 of 2 is outside 1..2"),
    ("-1/2", "share -1 of 2 is outside 1..2"),
    ("1/0", "expected at least one share"),
    ("5/5", "5 shares for 4 cells; use at most 4"),
    ("2", "expected K/N"),
    ("a/b", "expected K/N"),
    ("1/2/3", "expected K/N"),
])
def test_a_bad_share_is_one_line(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        parse_shard(text, n_cells=4)
    assert "\n" not in str(err.value) and str(err.value).startswith("--shard: ")


def _slurm(task, lo, hi, count=None, step=None) -> dict:
    env = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": str(lo),
           "SLURM_ARRAY_TASK_MAX": str(hi)}
    if count is not None:
        env["SLURM_ARRAY_TASK_COUNT"] = str(count)
    if step is not None:
        env["SLURM_ARRAY_TASK_STEP"] = str(step)
    return env


def test_slurm_array_index_is_the_place_in_the_range_from_zero_or_one():
    assert shard_from_env(_slurm(0, 0, 3, 4)) == Shard(1, 4, "SLURM_ARRAY_TASK_ID")
    assert shard_from_env(_slurm(3, 0, 3, 4)).index == 4
    assert shard_from_env(_slurm(1, 1, 4, 4)) == Shard(1, 4, "SLURM_ARRAY_TASK_ID")
    assert shard_from_env(_slurm(4, 1, 4)) == Shard(4, 4, "SLURM_ARRAY_TASK_ID")  # no COUNT
    assert shard_from_env(_slurm(4, 0, 6, 4, step=2)) == Shard(3, 4, "SLURM_ARRAY_TASK_ID")
    assert shard_from_env({}) is None


@pytest.mark.parametrize(("env", "message"), [
    (_slurm(4, 1, 9, 3), "is not one range"),  # --array=1,4,9
    (_slurm(3, 0, 6, 4, step=2), "is not one range"),  # 3 is not on the step
    ({"SLURM_ARRAY_TASK_ID": "2"}, "without SLURM_ARRAY_TASK_MIN/MAX: pass --shard"),
    ({"SLURM_ARRAY_TASK_ID": "x"}, "SLURM_ARRAY_TASK_ID='x' is not an integer"),
    (_slurm(0, 0, 7, 8), "8 shares for 4 cells"),
])
def test_a_slurm_array_that_names_no_share_is_one_line(env, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        shard_from_env(env, n_cells=4)
    assert "\n" not in str(err.value)


def test_kubernetes_index_counts_from_zero_and_needs_the_completions():
    env = {"JOB_COMPLETION_INDEX": "0", "JOB_COMPLETIONS": "2"}
    assert shard_from_env(env) == Shard(1, 2, "JOB_COMPLETION_INDEX")
    assert shard_from_env({**env, "JOB_COMPLETION_INDEX": "1"}).index == 2
    # the index alone is a torchrun node rank in a multi-node Indexed Job, not a share
    assert shard_from_env({"JOB_COMPLETION_INDEX": "1"}) is None
    with pytest.raises(ConfigError, match=r"JOB_COMPLETION_INDEX: share 3 of 2"):
        shard_from_env({**env, "JOB_COMPLETION_INDEX": "2"})


def test_the_flag_wins_and_one_share_is_the_whole_study():
    env = _slurm(0, 0, 1, 2)
    assert resolve_shard("2/3", 5, env=env) == Shard(2, 3)
    assert resolve_shard(None, 5, env=env) == Shard(1, 2, "SLURM_ARRAY_TASK_ID")
    assert resolve_shard("1/1", 5, env=env) is None  # a plain run inside an array job
    assert resolve_shard(None, 5, env={}) is None


@pytest.fixture(scope="module")
def study_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shards") / "shards.toml"
    path.write_text(STUDY, encoding="utf-8")
    return path


def test_dry_run_lists_the_shares_cells(study_file, capsys):
    assert main(["reproduce", str(study_file), "--dry-run", "--shard", "2/2"]) == 0
    printed = capsys.readouterr().out
    assert "share 2/2 (from --shard): cells 3 to 4" in printed
    assert "wiki" in printed and " tiny " not in printed
    assert "by the process that finishes the last cell" in printed


def test_cli_refuses_a_bad_share_in_one_line(study_file, capsys, monkeypatch):
    assert main(["reproduce", str(study_file), "--dry-run", "--shard", "3/2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("attngeom reproduce: error: --shard: share 3 of 2 is outside 1..2 "
                   "(K counts from 1)")
    for key, value in _slurm(0, 0, 7, 8).items():
        monkeypatch.setenv(key, value)
    assert main(["reproduce", str(study_file), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().endswith("8 shares for 4 cells; use at most 4 "
                                                    "(a share without a cell would have "
                                                    "nothing to do)")


# --------------------------------------------------------------------------- leases


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _holder(path: Path, **fields) -> dict:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "token": "t" * 32,
              "note": "test", **fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(holder))
    return holder


def test_a_lease_has_one_holder_until_released(tmp_path):
    a, b = Lease(tmp_path / "x" / "c.lock", "a"), Lease(tmp_path / "x" / "c.lock", "b")
    assert a.take() and a.take()  # taking a held lease again is a no-op
    assert not b.take()  # this process is alive: busy, even for another Lease object
    assert a.holder()["note"] == "a" and b.replaced is None
    a.release()
    assert not (tmp_path / "x" / "c.lock").exists()
    assert b.take()
    b.release()


def test_a_dead_process_lease_is_taken_over(tmp_path):
    path = tmp_path / "c.lock"
    dead = _holder(path, pid=_dead_pid())
    lease = Lease(path, "me")
    assert lease.take()
    assert lease.replaced == dead and lease.holder()["pid"] == os.getpid()
    lease.release()


def test_another_machines_lease_is_stale_only_without_heartbeat(tmp_path):
    path = tmp_path / "c.lock"
    _holder(path, host="elsewhere.invalid", pid=1)
    assert not Lease(path).take()  # touched just now: its process may be alive
    old = time.time() - state.STALE_S - 60
    os.utime(path, (old, old))
    lease = Lease(path)
    assert lease.take() and lease.replaced["host"] == "elsewhere.invalid"
    lease.release()


def test_a_half_written_lease_is_busy_until_it_is_old(tmp_path):
    path = tmp_path / "c.lock"
    path.write_bytes(b"")  # created, not yet written
    assert not Lease(path).take()
    old = time.time() - state.HEARTBEAT_S - 5
    os.utime(path, (old, old))
    lease = Lease(path)
    assert lease.take()
    lease.release()


def test_the_heartbeat_touches_the_lease_while_held(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "HEARTBEAT_S", 0.02)
    path = tmp_path / "c.lock"
    lease = Lease(path)
    assert lease.take()
    old = time.time() - 1000
    os.utime(path, (old, old))
    deadline = time.monotonic() + 30
    while path.stat().st_mtime == old and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.stat().st_mtime > old
    lease.release()
    assert not path.exists()


def test_a_lease_taken_over_is_not_removed_by_its_old_holder(tmp_path):
    path = tmp_path / "c.lock"
    lease = Lease(path)
    assert lease.take()
    theirs = _holder(path, token="u" * 32)  # another process took it over
    lease.release()
    assert json.loads(path.read_text()) == theirs


def test_two_takeovers_of_one_stale_lease_make_one_holder(tmp_path):
    """Both judged the same stale file; the first replaced it; the second, moving the
    first one's lease aside, finds other bytes and puts them back."""
    path = tmp_path / "c.lock"
    _holder(path, pid=_dead_pid())
    seen = path.read_bytes()
    first = Lease(path)
    assert first.take()
    second = Lease(path)
    assert not second._move_aside(seen)
    assert first.holder()["token"] == first._token
    assert [p.name for p in tmp_path.iterdir()] == ["c.lock"]  # nothing left aside
    first.release()


def test_a_run_lock_goes_only_for_the_dead_lease_holder(tmp_path):
    lock = RunLock(tmp_path / "run")
    lock.path.parent.mkdir(parents=True)
    lock.path.write_text(json.dumps({"pid": 12, "host": "elsewhere.invalid"}))
    assert not lock.drop_if_held_by({"pid": 12, "host": "other.invalid"})
    assert not lock.drop_if_held_by({"pid": 13, "host": "elsewhere.invalid"})
    assert lock.path.exists()
    assert lock.drop_if_held_by({"pid": 12, "host": "elsewhere.invalid"})
    assert not lock.path.exists()


# --------------------------------------------------------------------------- studies


def _env() -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for key in [k for k in env if k.startswith(("SLURM_ARRAY_", "JOB_COMPLETION"))]:
        del env[key]
    return env


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attngeom", "reproduce", *args, "--quiet"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def one_process(study_file):
    """The study run by one process, the reference every sharing is compared with."""
    from attngeom.studies.reproduce import reproduce

    out = study_file.parent / "one"
    reproduce(study_file, out, progress=False)
    return out


def _tables(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((out / "tables").glob("*.parquet"))}


def _report(out: Path) -> str:
    """The study report less what differs between two runs of one process: when it was
    written and how long each part took."""
    html = (out / "report" / "index.html").read_text(encoding="utf-8")
    html = re.sub(r"created [0-9TZ:-]+", "created X", html)
    html = re.sub(r"&quot;created&quot;: &quot;[0-9TZ:-]+&quot;", "created X", html)
    html = re.sub(r"&quot;wall_s&quot;: [0-9.e-]+", "wall_s X", html)
    html = re.sub(r"<dd>[0-9.]+ s</dd>", "<dd>X s</dd>", html)
    return re.sub(r"(<td>(run|resumed|skipped)</td>)<td>[0-9.]+</td>", r"\1<td>X</td>", html)


def _copy(one: Path, tmp_path: Path, *drop: str) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(one, copy)
    for run in drop:
        shutil.rmtree(copy / "runs" / "stories" / run)
    return copy


@pytest.mark.slow
def test_two_shares_started_together_write_the_tables_and_report_of_one(study_file,
                                                                         one_process, tmp_path):
    out = tmp_path / "together"
    procs = [_cli(str(study_file), "--out", str(out), "--shard", f"{k}/2") for k in (1, 2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (_, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, stderr[-3000:]
    printed = [stdout for stdout, _ in outputs]
    # the share that finished last wrote the tables; the other said who would
    assert sum(line.startswith("report: ") for s in printed for line in s.splitlines()) == 1
    assert sum("cells are not finished" in s or "written by another process" in s
               for s in printed) == 1, printed
    assert _tables(out) == _tables(one_process)
    assert _report(out) == _report(one_process)
    record = json.loads((out / "study.json").read_text())
    assert [c["status"] for c in record["cells"]] == ["run"] * 4
    # no lease or cell record is left, only what the steps were written from
    assert sorted(p.name for p in (out / ".attngeom").iterdir()) == ["steps.json"]


@pytest.mark.slow
def test_a_cell_a_live_process_holds_is_left_to_it_then_taken_over(study_file, one_process,
                                                                    tmp_path):
    from attngeom.studies.reproduce import reproduce
    from attngeom.studies.study import load_study

    out = _copy(one_process, tmp_path, "tiny/analyze")
    cell = load_study(study_file).cells[0]
    lease = claims.cell_lease(out, cell).path
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _holder(lease, pid=holder.pid)
        res = reproduce(study_file, out, shard="1/2", progress=False, reports=False)
        assert [c["status"] for c in res.cells] == ["elsewhere", "skipped"]
        assert res.unfinished == 1 and "cells are not finished" in res.summary()
        assert not (out / cell.directory / "manifest.json").exists()  # not computed here
    finally:
        holder.kill()
        holder.wait()
    res = reproduce(study_file, out, shard="1/2", progress=False, reports=False)
    assert [c["status"] for c in res.cells] == ["run", "skipped", "skipped", "skipped"]
    assert res.unfinished == 0 and res.steps == "written"
    assert _tables(out) == _tables(one_process)


@pytest.mark.slow
def test_a_plain_run_waits_for_a_cell_another_process_computes(study_file, one_process,
                                                               tmp_path, monkeypatch):
    """The holder gives the cell back unfinished (it was killed): the plain run, which
    waited, computes it, and the study's tables are complete."""
    from attngeom.studies import reproduce as module
    from attngeom.studies.study import load_study

    monkeypatch.setattr(module, "POLL_S", 0.05)
    out = _copy(one_process, tmp_path, "wiki/analyze")
    other = claims.cell_lease(out, load_study(study_file).cells[2], "another process")
    assert other.take()
    threading.Timer(0.5, other.release).start()
    res = module.reproduce(study_file, out, progress=False, reports=False)
    assert [c["status"] for c in res.cells] == ["skipped", "skipped", "run", "skipped"]
    assert _tables(out) == _tables(one_process)


@pytest.mark.slow
def test_the_share_finishing_second_leaves_the_steps_written(study_file, one_process,
                                                             tmp_path, monkeypatch):
    from attngeom.studies import reproduce as module

    monkeypatch.setattr(module, "POLL_S", 0.05)
    out = _copy(one_process, tmp_path)
    before = (out / "study.json").read_bytes()
    writing = claims.steps_lease(out, "the share finishing first")
    assert writing.take()  # it is writing: the second share waits for it
    threading.Timer(0.3, writing.release).start()
    res = module.reproduce(study_file, out, shard="2/2", progress=False)
    assert res.steps == "elsewhere" and res.unfinished == 0
    assert "written by another process" in res.summary()
    assert (out / "study.json").read_bytes() == before
    assert not writing.path.exists()


@pytest.mark.slow
def test_torchrun_ranks_follow_the_first_ranks_claims(study_file, one_process, tmp_path):
    """Under torchrun every rank enters the cells rank 0 claims (three finished, one to
    compute, data-parallel), and only rank 0 writes the tables and prints."""
    out = _copy(one_process, tmp_path, "wiki/restrict")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "attngeom", "reproduce", str(study_file), "--out", str(out), "--quiet"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("report: ")] == [
        f"report: {out / 'report' / 'index.html'}"]
    assert _tables(out) == _tables(one_process)
    statuses = [c["status"] for c in json.loads((out / "study.json").read_text())["cells"]]
    assert statuses == ["skipped", "skipped", "skipped", "run"]
