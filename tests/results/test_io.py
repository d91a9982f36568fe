"""Results directory I/O: tables, manifest, run directories, hashes (docs/internals.md)."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attngeom.assets import asset
from attngeom.errors import ConfigError, RunDirError
from attngeom.names import METRICS
from attngeom.results import io as rio
from attngeom.results.io import (
    MANIFEST_NAME,
    available_tables,
    prepare_run_dir,
    read_manifest,
    read_table,
    write_manifest,
    write_table,
)
from attngeom.results.manifest import (
    build_manifest,
    config_fingerprint,
    directory_sha256,
    file_sha256,
)
from attngeom.results.schemas import ROW_KEYS, SCHEMAS, validate_table

SRC = Path(__file__).resolve().parents[2] / "src" / "attngeom" / "results"
STORIES_HF = Path(asset("stories260K"))

def _internals_tables() -> tuple[str, ...]:
    """The tables ``docs/internals.md`` lists (its table of tables), in its order."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "internals.md").read_text()
    section = text[text.index("| table | written by |"):]
    return tuple(re.findall(r"^\| `(\w+)` \|", section.split("\n\n")[0], flags=re.M))


INTERNALS_TABLES = _internals_tables()


def head_scan(rows=((0, 0), (0, 1), (1, 0), (1, 1))) -> pd.DataFrame:
    n = len(rows)
    return pd.DataFrame({
        "model": ["m"] * n,
        "corpus": ["c"] * n,
        "layer": [r[0] for r in rows],
        "head": [r[1] for r in rows],
        "nll": [1.5 + 0.25 * i for i in range(n)],
        "delta_nll_rel": [0.1 * i for i in range(n)],
        "critical": [i % 2 == 0 for i in range(n)],
        "threshold": [0.05] * n,
    })


def metrics_frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for window in range(3):
        for layer in range(2):
            for head in range(2):
                for rule in ("attention", "random"):
                    for n in (1, 2, 4):
                        rows.append(dict(window=window, layer=layer, head=head, rule=rule, n=n))
    df = pd.DataFrame(rows)
    k = len(df)
    df.insert(0, "corpus", "tiny")
    df.insert(0, "model", "stories260K")
    df["variant"], df["distance"] = "full", "euclidean"
    for col in METRICS:
        df[col] = rng.random(k)
    df.loc[3, "margin"] = np.nan
    df["n_queries"] = 1
    df["n_skipped"] = 0
    df["trivial"] = df["n"] == 1
    for col in ("precision_bound", "recall_bound", "f_bound", "precision_inv_bound",
                "recall_inv_bound"):
        df[col] = np.nan
    return df


# --------------------------------------------------------------------------- schemas


def test_schemas_cover_internals_tables():
    assert SCHEMAS.names() == INTERNALS_TABLES
    for name, cols in SCHEMAS.items():
        assert list(cols)[:2] == ["model", "corpus"], name
        assert set(cols.values()) <= {"string", "int64", "float64", "bool"}
        assert set(ROW_KEYS[name]) <= set(cols), name
    assert list(SCHEMAS["summary"]) == [
        "model", "corpus", "scope", "layer", "head", "rule", "variant", "distance", "n",
        "metric", "mean", "ci_low", "ci_high", "n_windows", "trivial",
    ]
    assert SCHEMAS["metrics"]["trivial"] == "bool" and SCHEMAS["metrics"]["window"] == "int64"
    assert SCHEMAS["restrict_nstar"]["n_star"] == "float64"  # NaN when never reached


def test_validate_table():
    validate_table("head_scan", head_scan())
    with pytest.raises(ConfigError, match="table head_scan: missing columns nll, critical"):
        validate_table("head_scan", head_scan().drop(columns=["nll", "critical"]))
    with pytest.raises(RunDirError, match=r"x\.parquet \(table head_scan\): missing columns nll"):
        validate_table("head_scan", head_scan().drop(columns=["nll"]), source="x.parquet")
    with pytest.raises(ConfigError, match="column layer: expected int64, got"):
        validate_table("head_scan", head_scan().assign(layer="zero"))
    with pytest.raises(ConfigError, match="table: unknown table .metric.; did you mean .metrics."):
        validate_table("metric", head_scan())


def test_results_imports_no_torch():
    allowed = {"pandas", "pyarrow", "numpy", "attngeom"}
    for path in SRC.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "attngeom":
                    assert name.startswith(("attngeom.errors", "attngeom.names",
                                            "attngeom.registry", "attngeom.results")), (path, name)
                else:
                    import sys

                    assert top in allowed or top in sys.stdlib_module_names, (path, name)


# --------------------------------------------------------------------------- tables


def test_round_trip(tmp_path):
    df = metrics_frame()
    path = write_table(tmp_path, "metrics", df)
    assert path == tmp_path / "metrics.parquet"
    back = read_table(tmp_path, "metrics")
    assert list(back.columns) == list(SCHEMAS["metrics"])
    assert str(back["window"].dtype) == "int64" and str(back["trivial"].dtype) == "bool"
    assert back["precision"].dtype == np.float64
    assert math.isnan(back.loc[3, "margin"]) and back["precision_bound"].isna().all()
    pd.testing.assert_frame_equal(back, df[list(SCHEMAS["metrics"])], check_dtype=False)
    assert back["model"].tolist() == df["model"].tolist()
    assert available_tables(tmp_path) == ["metrics"]


def test_rows_sorted_and_bytes_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    df = metrics_frame()
    shuffled = df.sample(frac=1.0, random_state=3)[list(reversed(df.columns))]
    write_table(a, "metrics", df)
    write_table(b, "metrics", shuffled)
    assert (a / "metrics.parquet").read_bytes() == (b / "metrics.parquet").read_bytes()
    write_table(b, "metrics", df)  # rewriting the same data: same bytes again
    assert file_sha256(a / "metrics.parquet") == file_sha256(b / "metrics.parquet")
    back = read_table(a, "metrics")
    keys = list(ROW_KEYS["metrics"])
    assert back[keys].equals(back[keys].sort_values(keys).reset_index(drop=True))
    write_table(b, "metrics", metrics_frame(seed=1))  # different data: different bytes
    assert (a / "metrics.parquet").read_bytes() != (b / "metrics.parquet").read_bytes()
    meta = __import__("pyarrow.parquet", fromlist=["x"]).read_metadata(a / "metrics.parquet")
    assert b"pandas" not in (meta.metadata or {})


def test_dtype_coercion_and_extra_columns(tmp_path):
    df = head_scan()
    df["layer"] = df["layer"].astype(float)  # integral floats are fine for an int column
    df["note"] = ["x", "y", "z", "w"]
    write_table(tmp_path, "head_scan", df)
    back = read_table(tmp_path, "head_scan")
    assert str(back["layer"].dtype) == "int64"
    assert list(back.columns) == [*SCHEMAS["head_scan"], "note"]
    with pytest.raises(ConfigError, match="column layer: expected integers"):
        write_table(tmp_path, "head_scan", head_scan().assign(layer=[0.5, 0, 1, 1]))
    with pytest.raises(ConfigError, match="column layer: expected integers"):
        write_table(tmp_path, "head_scan", head_scan().assign(layer=[np.nan, 0, 1, 1]))
    with pytest.raises(ConfigError, match="column model: expected string, got int64"):
        write_table(tmp_path, "head_scan", head_scan().assign(model=[1, 2, 3, 4]))
    with pytest.raises(ConfigError, match="column model: expected strings, got int 2"):
        write_table(tmp_path, "head_scan", head_scan().assign(model=["a", 2, "b", "c"]))
    with pytest.raises(ConfigError, match="missing columns threshold"):
        write_table(tmp_path, "head_scan", head_scan().drop(columns="threshold"))
    empty = pd.DataFrame(columns=list(SCHEMAS["head_scan"]))
    write_table(tmp_path, "head_scan", empty)
    assert len(read_table(tmp_path, "head_scan")) == 0


def test_atomic_write_leaves_no_temp_file(tmp_path, monkeypatch):
    write_table(tmp_path, "head_scan", head_scan())
    write_manifest(tmp_path, {"command": "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head_scan.parquet", MANIFEST_NAME]
    before = (tmp_path / "head_scan.parquet").read_bytes()

    import pyarrow.parquet as pq

    def broken(table, where, **kw):
        where.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_table(tmp_path, "head_scan", head_scan(rows=((5, 5),)))
    # The old file is intact and the temporary file is gone.
    assert (tmp_path / "head_scan.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head_scan.parquet", MANIFEST_NAME]


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(RunDirError, match=r"table sink not found: .*sink\.parquet does not exist"):
        read_table(tmp_path, "sink")
    (tmp_path / "sink.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(RunDirError, match=r"cannot read .*sink\.parquet: not a valid Parquet") as e:
        read_table(tmp_path, "sink")
    assert "\n" not in str(e.value)
    write_table(tmp_path, "head_scan", head_scan())
    # A valid Parquet file short of a column: named as well.
    head_scan().drop(columns="nll").to_parquet(tmp_path / "head_scan.parquet")
    with pytest.raises(RunDirError,
                       match=r"head_scan\.parquet \(table head_scan\): missing columns nll"):
        read_table(tmp_path, "head_scan")
    with pytest.raises(RunDirError, match="does not exist"):
        write_table(tmp_path / "nowhere", "head_scan", head_scan())
    with pytest.raises(RunDirError, match="does not exist"):
        available_tables(tmp_path / "nowhere")


# --------------------------------------------------------------------------- manifest


def test_manifest_round_trip_and_errors(tmp_path):
    with pytest.raises(RunDirError,
                       match=rf"not an attngeom run: {tmp_path} has no manifest\.json"):
        read_manifest(tmp_path)
    m = {"b": 1, "a": {"z": [1, 2], "y": Path("p")}, "seed": np.int64(3)}
    write_manifest(tmp_path, m)
    text = (tmp_path / MANIFEST_NAME).read_text()
    assert text.index('"a"') < text.index('"b"') and text.endswith("\n")
    assert read_manifest(tmp_path) == {"a": {"y": "p", "z": [1, 2]}, "b": 1, "seed": 3}
    (tmp_path / MANIFEST_NAME).write_text('{"command": "analyze", ')
    with pytest.raises(RunDirError, match=r"corrupt manifest .*manifest\.json"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("[1, 2]")
    with pytest.raises(RunDirError, match="expected a JSON object, got list"):
        read_manifest(tmp_path)
    with pytest.raises(ConfigError, match="JSON-serialisable"):
        write_manifest(tmp_path, {"x": float("nan")})
    with pytest.raises(ConfigError, match="JSON-serialisable"):
        write_manifest(tmp_path, {"x": object()})


def test_build_manifest():
    config = {"window_length": 256, "n_grid": (1, 2)}
    m = build_manifest(
        "analyze", config, {"name": "stories260K", "sha256": "ab"}, {"name": "tiny"},
        seed=0, timings={"total_s": 1.5}, tables={"metrics": "metrics.parquet"},
        counts={"windows": 4},
    )
    assert set(m) >= {"attngeom_version", "command", "config", "model", "corpus", "versions",
                      "seed", "timings", "tables", "counts", "created", "fingerprint"}
    assert set(m["versions"]) == {"torch", "transformers", "numpy", "pandas", "pyarrow",
                                  "python"}
    assert m["versions"]["pandas"] == pd.__version__
    assert m["fingerprint"] == config_fingerprint(config)
    m2 = build_manifest("analyze", config, {"name": "stories260K", "sha256": "ab"},
                        {"name": "tiny"}, 0, {"total_s": 1.5}, ["metrics"], {"windows": 4})
    assert build_manifest("analyze", config, {}, {}, 0, {}, [], {},
                          fingerprint="given")["fingerprint"] == "given"
    drop = lambda d: {k: v for k, v in d.items() if k != "created"}  # noqa: E731
    assert drop(m) == drop(m2)  # only "created" may differ
    from dataclasses import dataclass

    @dataclass
    class Info:
        name: str
        sha256: str

    assert build_manifest("x", {}, {}, Info("c", "00"), 0, {}, [], {})["corpus"] == {
        "name": "c", "sha256": "00"}


def test_config_fingerprint():
    a = config_fingerprint({"a": 1, "b": [1, 2], "c": {"x": None}})
    assert a == config_fingerprint({"c": {"x": None}, "b": (1, 2), "a": 1})
    assert a != config_fingerprint({"a": 2, "b": [1, 2], "c": {"x": None}})
    canonical = '{"a":1,"b":[1,2],"c":{"x":null}}'
    assert a == hashlib.sha256(canonical.encode()).hexdigest()
    with pytest.raises(ConfigError):
        config_fingerprint(["not", "a", "mapping"])


# --------------------------------------------------------------------------- run dirs


def _finished_run(run_dir: Path, *, command="analyze", config=None):
    config = config or {"window_length": 256}
    fp = config_fingerprint(config)
    prepare_run_dir(run_dir, command=command, fingerprint=fp)
    write_table(run_dir, "head_scan", head_scan())
    write_manifest(run_dir, build_manifest(command, config, {}, {}, 0, {}, ["head_scan"], {}))
    return fp


def test_prepare_run_dir_new_and_same_run(tmp_path):
    d = tmp_path / "a" / "b"
    assert prepare_run_dir(d, command="analyze", fingerprint="f") == d and d.is_dir()
    assert prepare_run_dir(d, command="analyze", fingerprint="f") == d  # empty: fine
    fp = _finished_run(tmp_path / "run")
    # The same run (same command and fingerprint) is allowed and left untouched (resume).
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    prepare_run_dir(tmp_path / "run", command="analyze", fingerprint=fp)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(RunDirError, match="a file"):
        prepare_run_dir(f, command="analyze", fingerprint="f")


def test_prepare_run_dir_refuses_different_run_then_overwrites(tmp_path):
    run = tmp_path / "run"
    fp = _finished_run(run)
    with pytest.raises(RunDirError, match=r"holds a different attngeom run \(fingerprint "
                       rf"{fp[:12]}; this run: other\); pass --overwrite"):
        prepare_run_dir(run, command="analyze", fingerprint="other")
    with pytest.raises(RunDirError, match="different attngeom run .command 'analyze'; this "
                       "run: 'prune'"):
        prepare_run_dir(run, command="prune", fingerprint=fp)
    assert (run / MANIFEST_NAME).exists()  # refused: nothing removed
    (run / ".head_scan.parquet.0123456789abcdef0123456789abcdef.tmp").write_bytes(b"left over")
    prepare_run_dir(run, command="prune", fingerprint="other", overwrite=True)
    assert list(run.iterdir()) == []


def test_a_finished_run_of_other_options_is_refused_naming_the_option(tmp_path):
    run = tmp_path / "run"
    _finished_run(run, config={"window_length": 256, "seed": 0})
    new = {"window_length": 128, "seed": 0}
    with pytest.raises(RunDirError, match=r"different attngeom run \(option window_length "
                       r"\(was 256, now 128\)\); pass --overwrite"):
        prepare_run_dir(run, command="analyze", fingerprint=config_fingerprint(new),
                        config=new)


def test_prepare_run_dir_never_deletes_user_files(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    (user / "data").mkdir()
    for overwrite in (False, True):
        with pytest.raises(RunDirError,
                           match=r"files attngeom did not write \(data, thesis\.tex\)"):
            prepare_run_dir(user, command="analyze", fingerprint="f", overwrite=overwrite)
    assert (user / "thesis.tex").read_text() == "precious" and (user / "data").is_dir()

    run = tmp_path / "run"
    fp = _finished_run(run)
    (run / "notes.txt").write_text("mine")
    # A different run mixed with user files: refused even with overwrite, nothing deleted.
    with pytest.raises(RunDirError, match=r"another run and files attngeom did not write \(notes"):
        prepare_run_dir(run, command="analyze", fingerprint="other", overwrite=True)
    assert (run / "notes.txt").exists() and (run / "head_scan.parquet").exists()
    # The same run with a user file beside it can still resume.
    assert prepare_run_dir(run, command="analyze", fingerprint=fp) == run


def test_prepare_run_dir_manifestless_and_corrupt(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_table(run, "head_scan", head_scan())
    with pytest.raises(RunDirError,
                       match="attngeom files but no manifest.json; pass --overwrite"):
        prepare_run_dir(run, command="analyze", fingerprint="f")
    (run / MANIFEST_NAME).write_text("{oops")
    with pytest.raises(RunDirError, match="corrupt manifest"):
        prepare_run_dir(run, command="analyze", fingerprint="f")
    prepare_run_dir(run, command="analyze", fingerprint="f", overwrite=True)
    assert list(run.iterdir()) == []


def test_prepare_run_dir_removes_files_the_manifest_lists(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.html").write_text("<html>")
    (run / "figures").mkdir()
    (run / "figures" / "f1.png").write_bytes(b"png")
    manifest = {"attngeom_version": "0.1.0", "command": "report", "fingerprint": "r",
                "files": ["report.html", "figures"], "tables": {}}
    write_manifest(run, manifest)
    # a listed folder is not removed wholesale (it could hold anything): refused
    with pytest.raises(RunDirError, match="figures"):
        prepare_run_dir(run, command="analyze", fingerprint="a", overwrite=True)
    (run / "figures" / "f1.png").unlink()
    (run / "figures").rmdir()
    prepare_run_dir(run, command="analyze", fingerprint="a", overwrite=True)
    assert list(run.iterdir()) == []


# --------------------------------------------------------------------------- hashes


def test_file_and_directory_sha256(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights" * 1000)
    assert file_sha256(f) == hashlib.sha256(b"weights" * 1000).hexdigest()
    with pytest.raises(ConfigError, match="no such file"):
        file_sha256(tmp_path / "missing.bin")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w")
    h = directory_sha256(model)
    (model / "README.md").write_text("docs do not count")
    (model / ".cache").mkdir()
    (model / ".cache" / "x.json").write_text("{}")
    assert directory_sha256(model) == h
    (model / "tokenizer.json").write_text("{}")
    assert directory_sha256(model) != h
    os.remove(model / "tokenizer.json")
    (model / "config.json").write_text('{"a": 1}')
    assert directory_sha256(model) != h
    with pytest.raises(ConfigError, match="found none"):
        directory_sha256(model / ".cache", patterns=["*.bin"])


def test_directory_sha256_real_model():
    h = directory_sha256(STORIES_HF)
    assert h == directory_sha256(str(STORIES_HF)) and len(h) == 64
    assert file_sha256(STORIES_HF / "model.safetensors") == (
        "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd")


def test_lazy_package_exports():
    import attngeom.results as r

    assert r.write_table is rio.write_table and "read_manifest" in dir(r)
    with pytest.raises(AttributeError):
        r.nope  # noqa: B018
    assert json.loads(json.dumps(sorted(r.__all__)))  # names only


def test_overwrite_never_removes_what_attngeom_did_not_write(tmp_path) -> None:
    """A report folder holding a user's file, or another tool's manifest.json, is refused."""
    run = tmp_path / "run"
    run.mkdir()
    write_manifest(run, build_manifest("analyze", {"a": 1}, {}, {}, 0, {}, [], {}))
    (run / "report" / "figures").mkdir(parents=True)
    (run / "report" / "index.html").write_text("<html></html>")
    (run / "report" / "figures" / "f.png").write_bytes(b"png")
    (run / "report" / "my_thesis.tex").write_text("mine")
    with pytest.raises(RunDirError, match="report"):
        prepare_run_dir(run, command="analyze", fingerprint="other", overwrite=True)
    assert (run / "report" / "my_thesis.tex").read_text() == "mine"
    (run / "report" / "my_thesis.tex").unlink()
    prepare_run_dir(run, command="analyze", fingerprint="other", overwrite=True)
    assert list(run.iterdir()) == []

    other = tmp_path / "webapp"
    other.mkdir()
    (other / "manifest.json").write_text('{"name": "my webapp", "version": 3}')
    with pytest.raises(RunDirError, match="manifest.json"):
        prepare_run_dir(other, command="analyze", fingerprint="x", overwrite=True)
    assert (other / "manifest.json").is_file()


def test_another_process_write_probe_is_looked_past(tmp_path):
    """Each process of a data-parallel run proves the directory writable with a probe
    file it removes at once; a process checking the directory meanwhile must neither
    refuse the run because of it nor delete it (it raced before: "files attngeom did
    not write (.attngeom-write-test.<hex>)")."""
    from attngeom.engine.runner import check_writable

    probe = f"{rio.WRITE_PROBE_PREFIX}{'ab' * 16}"
    new = tmp_path / "new"
    new.mkdir()
    (new / probe).write_bytes(b"")
    assert prepare_run_dir(new, command="analyze", fingerprint="f", check_only=True) == new
    run = tmp_path / "run"
    fp = _finished_run(run)
    (run / probe).write_bytes(b"")
    assert prepare_run_dir(run, command="analyze", fingerprint=fp) == run
    prepare_run_dir(run, command="prune", fingerprint="other", overwrite=True)
    assert [p.name for p in run.iterdir()] == [probe]  # the other process removes its own
    (run / "notes.txt").write_text("mine")  # a look-alike with another name is foreign
    (run / ".attngeom-write-test.notes").write_text("mine")
    with pytest.raises(RunDirError, match=r"did not write \(\.attngeom-write-test\.notes, "
                                          r"notes\.txt\)"):
        prepare_run_dir(run, command="analyze", fingerprint="f", check_only=True)
    assert check_writable(new) == new and [p.name for p in new.iterdir()] == [probe]
