"""Resume after a crash, and data-parallel runs: the tables equal an uninterrupted run's.

A run is killed with SIGKILL once some of its shards are on disk; the same command
then finishes it, computing only the missing units, and its table files are
byte-identical to those of a run that was never interrupted. A damaged shard is
detected and redone; a resume with other options is refused, naming the option.
Two processes started by torchrun (gloo) split the units and write the same tables as
one process; when one of them is killed, the group stops and its shards resume.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attngeom.cli import main
from attngeom.errors import RunDirError
from attngeom.results.io import read_manifest
from tests.architectures import STORIES_PATH

pytestmark = pytest.mark.slow

BASE = ["--model", str(STORIES_PATH), "--window-length", "96", "--quiet"]
ANALYSIS = [*BASE, "--query-mode", "all", "--bootstrap", "50"]
ANALYZE = ["analyze", *ANALYSIS, "--n-windows", "24", "--batch-size", "1",
           "--n-grid", "1,2,4,8"]


def _env() -> dict:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                         env.get("PYTHONPATH", "")])
    return env


def _tables(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.glob("*.parquet"))}


def _shards(run: Path) -> list[Path]:
    return sorted(run.glob(".attngeom/*/*/*.shard"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main([*ANALYZE, "--out", str(out)]) == 0
    assert not (out / ".attngeom").exists()  # the shards go once the tables are written
    return out


def _wait_for_shards(proc: subprocess.Popen, out: Path, at_least: int) -> None:
    """Return once ``at_least`` shards are on disk (or the run has ended)."""
    deadline = time.monotonic() + 300
    while len(_shards(out)) < at_least and proc.poll() is None:
        assert time.monotonic() < deadline, "the run wrote no shard in 300 s"
        time.sleep(0.05)


def _killed_run(out: Path, at_least: int = 4) -> None:
    """Start the analysis in a subprocess and SIGKILL it once ``at_least`` shards exist."""
    proc = subprocess.Popen([sys.executable, "-m", "attngeom", *ANALYZE, "--out",
                             str(out)], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _wait_for_shards(proc, out, at_least)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it was killed"


def test_killed_run_resumes_to_identical_tables(reference, tmp_path, capsys):
    out = tmp_path / "run"
    _killed_run(out)
    done = len(_shards(out))
    assert 0 < done < 24
    assert main([*ANALYZE, "--out", str(out)]) == 0
    assert _tables(out) == _tables(reference)
    counts = read_manifest(out)["counts"]
    assert done <= counts["resumed_windows"] < 24  # only the unfinished windows ran again
    assert not (out / ".attngeom").exists()


def test_torn_shard_is_redone_and_other_options_are_refused(reference, tmp_path, capsys):
    out = tmp_path / "run"
    _killed_run(out)
    first = _shards(out)[0]
    first.write_bytes(first.read_bytes()[: len(first.read_bytes()) // 2])  # a torn write
    # a resume with another option is refused, naming it, and leaves the shards alone
    before = len(_shards(out))
    for change, name in ((["--n-grid", "1,2,4"], "n_grid"), (["--batch-size", "2"],
                                                               "batch_size")):
        assert main([*ANALYZE, *change, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"option {name} (was" in err and "\n" not in err
    assert len(_shards(out)) == before
    with pytest.raises(RunDirError, match="option n_grid"):
        from attngeom import api

        api.analyze(str(STORIES_PATH), out=out, window_length=96, n_windows=24,
                    query_mode="all", bootstrap=50, n_grid=(1, 2), batch_size=1,
                    progress=False)
    assert main([*ANALYZE, "--out", str(out)]) == 0
    assert _tables(out) == _tables(reference)
    assert read_manifest(out)["counts"]["redone_shards"] == 1


def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", "-m", "attngeom", *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("command", [
    ["analyze", *ANALYSIS, "--n-windows", "6", "--batch-size", "1", "--n-grid", "1,2,4"],
    ["prune", *BASE, "--n-rank-windows", "3", "--n-eval-windows", "3", "--batch-size", "1",
     "--rankers", "taxonomy,entropy,random", "--seeds", "0", "--keep-fractions", "1,0.5"],
    ["scan-heads", *BASE, "--n-eval-windows", "3", "--batch-size", "1"],
    ["restrict", *BASE, "--n-eval-windows", "3", "--batch-size", "1", "--n-grid", "1,4"],
], ids=["analyze", "prune", "scan-heads", "restrict"])
def test_two_processes_write_the_tables_of_one(command, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*command, "--out", str(one)]) == 0
    done = _torchrun([*command, "--out", str(two)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert _tables(two) == _tables(one)
    assert not (two / ".attngeom").exists()
    assert done.stdout.count("results:") == 1  # one process prints


def test_the_first_process_counts_every_process_windows(tmp_path):
    """Under torchrun the one progress line (rank 0's) reaches the total: the other
    process's windows are counted by their shards, and the bar leaves a final line."""
    args = ["analyze", *[a for a in ANALYSIS if a != "--quiet"], "--n-windows", "4",
            "--batch-size", "1", "--n-grid", "1,2", "--analyses", "metrics",
            "--out", str(tmp_path / "run")]
    done = _torchrun(args)
    assert done.returncode == 0, done.stderr[-3000:]
    finals = [line for line in done.stderr.replace("\r", "\n").splitlines()
              if "windows in" in line]
    assert len(finals) == 1 and finals[0].strip().startswith("analyze (96 tok/window): 4 "
                                                             "windows in"), finals


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has exited meanwhile
        return b""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_failed_process_group_leaves_its_shards_for_a_resume(reference, tmp_path):
    """One rank of a two-process run is killed mid-run: the launcher stops the group,
    the shards already written stay valid, and one process resumes from them to the
    tables of an uninterrupted run."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", "-m", "attngeom", *ANALYZE, "--out", str(out)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_shards(proc, out, 4)
        workers = [k for k in _children(proc.pid) if b"attngeom" in _cmdline(k)]
        assert workers, "the launcher has no worker processes"
        os.kill(workers[-1], signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert not (out / "manifest.json").exists(), "the run finished before a rank was killed"
    done = len(_shards(out))
    assert 0 < done < 24
    assert main([*ANALYZE, "--out", str(out)]) == 0
    assert _tables(out) == _tables(reference)
    counts = read_manifest(out)["counts"]
    assert counts["redone_shards"] == 0  # every shard the group left was whole
    assert done <= counts["resumed_windows"] < 24


def test_resumed_shards_are_read_one_unit_at_a_time(tmp_path, monkeypatch):
    """A resumed run checks every shard up front but unpickles each as its unit comes,
    so it holds one unit's state at a time (not every finished unit's at once)."""
    import attngeom.results.state as state
    from attngeom.corpora.windows import Window
    from attngeom.engine.runner import RunContext, units_of
    from attngeom.results.state import ShardStore

    windows = [Window(i, None) for i in range(4)]
    units = units_of(windows, 1)
    store = ShardStore(tmp_path, "f" * 16, command="analyze", resume_key={})
    for u in units[:3]:
        store.save("analyze", u.index, u.window_ids, {"unit": u.index})
    store.path("analyze", 1).write_bytes(b"torn")  # damaged: redone, counted
    ctx = RunContext(config=None, tokenizer=None, windows=windows, corpus_info=None,
                     policy=None, progress=False, store=store)
    loads = []
    real = state.pickle.loads
    monkeypatch.setattr(state.pickle, "loads", lambda data: loads.append(1) or real(data))
    computed = []
    got = ctx.run_units("analyze", units, lambda u: computed.append(u.index) or {"unit": u.index},
                        desc="t")
    assert next(got) == {"unit": 0} and len(loads) == 1  # only unit 0 unpickled so far
    assert ctx.pending == 2  # units 1 (torn) and 3 (missing) to compute, a window each
    assert [p["unit"] for p in got] == [1, 2, 3]
    assert computed == [1, 3] and len(loads) == 2 and ctx.counts["redone_shards"] == 1
    assert ctx.counts["resumed_windows"] == 2


def test_a_shard_damaged_after_the_check_stops_the_run(tmp_path):
    from attngeom.corpora.windows import Window
    from attngeom.engine.runner import RunContext, units_of
    from attngeom.results.state import ShardStore

    windows = [Window(i, None) for i in range(2)]
    units = units_of(windows, 1)
    store = ShardStore(tmp_path, "f" * 16, command="analyze", resume_key={})
    for u in units:
        store.save("analyze", u.index, u.window_ids, {"unit": u.index})
    ctx = RunContext(config=None, tokenizer=None, windows=windows, corpus_info=None,
                     policy=None, progress=False, store=store)
    got = ctx.run_units("analyze", units, lambda u: {"unit": u.index}, desc="t")
    assert next(got) == {"unit": 0}
    store.path("analyze", 1).write_bytes(b"torn")
    with pytest.raises(RunDirError, match="unit 1 of stage analyze: its shard was sound"):
        next(got)
