"""Every command resumes: the probes and the atlas killed mid-run finish to the same bytes.

``competition --probe qa``, ``--probe context``, ``--probe kept`` and ``atlas`` run their
work as units on the engine (issue 37): each is started in a subprocess, SIGKILLed once a
unit of a later stage is on disk (an N* search round for the probes, the kept sets'
stage, the needles for the atlas), and the same command then finishes it. Its table
files must be byte-identical to an uninterrupted run's, and only the missing units run
again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from attngeom.cli import main
from attngeom.results.io import read_manifest
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH
from tests.engine.test_resume import _env, _tables, _torchrun

pytestmark = pytest.mark.slow

BASE = ["--model", str(STORIES_PATH), "--quiet", "--batch-size", "1", "--bootstrap", "20"]
COMMANDS = {
    "qa": (["competition", *BASE, "--backgrounds", "0", "--n-episodes", "3",
            "--grid-max", "4", "--positional", "false"], "qa-search-1"),
    "context": (["competition", *BASE, "--probe", "context", "--lengths", "32,64",
                 "--tail", "16", "--n-documents", "3", "--taus", "0.1"], "context-search-2"),
    "kept": (["competition", *BASE, "--probe", "kept", "--lengths", "96", "--n-documents",
              "8", "--rankings", "window,h2o,tova", "--budgets", "16,32"], "kept"),
    "atlas": (["atlas", *BASE, "--corpus", str(TINYSTORIES_PATH), "--n-windows", "3",
               "--window-length", "96", "--query-stride", "4", "--n-repeats", "2",
               "--repeat-length", "16", "--n-needles", "3", "--needle-length", "3",
               "--needle-contexts", "96,48"], "atlas-needles"),
}


def _stage_shards(out: Path, stage: str) -> list[Path]:
    return sorted(out.glob(f".attngeom/*/{stage}/*.shard"))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each command's uninterrupted run, computed once for the tests that compare to it."""
    out = {}
    for name, (args, _) in COMMANDS.items():
        out[name] = tmp_path_factory.mktemp(name) / "reference"
        assert main([*args, "--out", str(out[name])]) == 0
    return out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_killed_probe_resumes_to_identical_tables(name, references, tmp_path):
    args, stage = COMMANDS[name]
    reference = references[name]
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "attngeom", *args, "--out", str(out)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not _stage_shards(out, stage) and proc.poll() is None:
        assert time.monotonic() < deadline, f"no shard of {stage} in 600 s"
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert not (out / "manifest.json").exists(), "the run finished before it was killed"
    done = len(list(out.glob(".attngeom/*/*/*.shard")))
    assert main([*args, "--out", str(out)]) == 0
    assert _tables(out) == _tables(reference)
    counts = read_manifest(out)["counts"]
    resumed = sum(v for k, v in counts.items() if k.startswith("resumed_"))
    assert resumed >= done > 0  # the finished units were read back, not run again
    assert not (out / ".attngeom").exists()


def test_two_processes_split_the_qa_probe_units(references, tmp_path):
    """Under torchrun the probe's units (blocks of examples, search rounds) are shared
    between the processes, and the tables are those of one process."""
    args, _ = COMMANDS["qa"]
    out = tmp_path / "two"
    done = _torchrun([*args, "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert _tables(out) == _tables(references["qa"])
    assert done.stdout.count("results:") == 1


def test_a_configuration_error_leaves_no_folder_that_refuses_the_correction(tmp_path, capsys):
    """A background the model cannot hold is found while the prompts are built, before
    the model loads and before any unit: the corrected command then runs in the same
    folder (no shard of the failed run refuses it as another run's)."""
    out = tmp_path / "run"
    bad = ["competition", "--model", str(STORIES_PATH), "--quiet", "--backgrounds", "0,600",
           "--n-episodes", "2", "--nstar", "false", "--bootstrap", "0"]
    assert main([*bad, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "backgrounds" in err and "512 positions" in err and "\n" not in err
    assert not list(out.glob(".attngeom/*/*/*.shard"))
    good = [a if a != "0,600" else "0,64" for a in bad]
    assert main([*good, "--out", str(out)]) == 0
    assert (out / "qa_answers.parquet").is_file()
