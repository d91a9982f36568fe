"""Compiled and plain kernels, a failing compiler, and the memory budget: same tables.

The compiled kernels (``core/kernels.py``) do exact work (comparisons, counts,
integer hashing) or, on CPU, float arithmetic that rounds as the plain operations do,
so a run with ``compile="on"`` must write the tables of a run with ``compile="off"``
byte for byte; so must a run whose compiler fails (it warns once and
falls back). A run whose memory budget cuts the queries into chunks of three rows
computes q.k in smaller matrix products (BLAS may round those differently in float32)
and adds its per-row sums in another order: its tables agree to that rounding, and a
resume keeps the chunk (it is part of the resume key), so a run's own shards always
agree byte for byte.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from attngeom.config import AnalysisConfig
from attngeom.core import kernels
from attngeom.engine.analyze import run_analysis
from attngeom.engine.stream import chunk_rows, half_budget
from tests.architectures import STORIES_PATH

# all queries, both universes, the random control (hashing) and every analysis
RUN = dict(model=str(STORIES_PATH), window_length=40, n_windows=2, query_mode="all",
           bootstrap=20, n_grid=(1, 2, 4, 8), repeats=2)


@pytest.fixture(scope="module")
def stories():
    from attngeom.capture import load_model

    return load_model(str(STORIES_PATH))


@pytest.fixture(scope="module")
def plain_run(stories, tmp_path_factory):
    cfg = AnalysisConfig(**RUN, compile="off")
    return run_analysis(cfg, tmp_path_factory.mktemp("plain") / "r", progress=False,
                        model_and_tokenizer=stories)


@pytest.fixture()
def fresh_kernels(monkeypatch):
    """Forget compiled wrappers and a past failure, and restore both afterwards."""
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setitem(kernels._STATE, "broken", False)
    yield


def _digests(run) -> dict[str, str]:
    return {name: hashlib.sha256((run.out_dir / f"{name}.parquet").read_bytes()).hexdigest()
            for name in run.manifest["tables"]}


def test_compiled_kernels_write_identical_tables(stories, plain_run, tmp_path,
                                                 fresh_kernels) -> None:
    before = kernels.compile_seconds()
    cfg = AnalysisConfig(**RUN, compile="on")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback would hide the check
        run = run_analysis(cfg, tmp_path / "compiled", progress=False,
                           model_and_tokenizer=stories)
    assert not kernels._STATE["broken"]
    assert kernels.compile_seconds() > before  # something was compiled
    assert _digests(run) == _digests(plain_run)
    assert not kernels.compile_enabled()  # the run's setting does not leak


def test_compiled_final_queries_write_identical_tables(stories, tmp_path,
                                                       fresh_kernels) -> None:
    """``--compile auto`` compiles ``final`` queries in long runs: same tables."""
    final = dict(RUN, query_mode="final", n_windows=3, repeats=3)
    runs = {}
    for choice in ("off", "on"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            runs[choice] = run_analysis(AnalysisConfig(**final, compile=choice),
                                        tmp_path / choice, progress=False,
                                        model_and_tokenizer=stories)
    assert not kernels._STATE["broken"]
    assert _digests(runs["on"]) == _digests(runs["off"])


def test_failing_compiler_warns_once_and_falls_back(stories, plain_run, tmp_path,
                                                    monkeypatch, fresh_kernels) -> None:
    def broken(fn, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("no C compiler found\nsecond line")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    cfg = AnalysisConfig(**RUN, compile="on")
    with pytest.warns(RuntimeWarning, match="torch.compile unavailable .*no C compiler") as rec:
        run = run_analysis(cfg, tmp_path / "fallback", progress=False,
                           model_and_tokenizer=stories)
    assert len([w for w in rec if "torch.compile" in str(w.message)]) == 1
    assert _digests(run) == _digests(plain_run)


def test_memory_budget_sets_the_chunk_and_never_the_tables(stories, plain_run,
                                                           tmp_path) -> None:
    # 8 heads x 40 tokens x 48 bytes a row; half of a 92 kB budget allows three rows per
    # chunk, the other half goes to the kernels' temporaries (which then chunk too)
    tiny = AnalysisConfig(**RUN, compile="off", memory_budget=92160 / 2**30)
    assert chunk_rows(tiny, num_heads=8, num_tokens=40) == 3
    assert half_budget(tiny) == 46080
    assert chunk_rows(tiny.with_(chunk_size=7), num_heads=8, num_tokens=40) == 7
    assert chunk_rows(AnalysisConfig(**RUN, memory_budget=1.0), 32, 4096) == 85
    run = run_analysis(tiny, tmp_path / "tiny", progress=False, model_and_tokenizer=stories)
    for name in plain_run.manifest["tables"]:
        a = pd.read_parquet(plain_run.out_dir / f"{name}.parquet")
        b = pd.read_parquet(run.out_dir / f"{name}.parquet")
        assert list(a.columns) == list(b.columns) and len(a) == len(b), name
        for col in a.columns:
            if a[col].dtype.kind == "f":
                near = np.isclose(b[col], a[col], rtol=1e-5, atol=1e-7, equal_nan=True)
                # the probabilities themselves differ in float32's last bits (q.k in
                # products of three rows), so a comparison at a near-tie may go the
                # other way: a count moves by one in an isolated row, never more
                assert (~near).sum() <= max(1, len(a) // 500), (name, col, (~near).sum())
            else:
                assert a[col].equals(b[col]), f"{name}.{col}"


def test_compile_choice_is_validated_and_auto_follows_the_rows(monkeypatch) -> None:
    from attngeom.errors import ConfigError

    with pytest.raises(ConfigError, match="compile"):
        AnalysisConfig(model="m", corpus="c", compile="yes")
    with pytest.raises(ConfigError, match="memory_budget"):
        AnalysisConfig(model="m", corpus="c", memory_budget=0)
    monkeypatch.delenv("ATTNGEOM_COMPILE", raising=False)  # the tests set it off
    assert kernels.resolve_compile("auto", device="cpu", query_mode="all")
    assert kernels.resolve_compile("auto", device="cpu", query_mode="stride:4")
    assert not kernels.resolve_compile("auto", device="cpu", query_mode="stride:16")
    assert not kernels.resolve_compile("auto", device="cpu", query_mode="final")
    # final queries: on CPU over a long run only (compiling saves about a tenth)
    many = kernels.FINAL_COMPILE_WINDOWS
    assert kernels.resolve_compile("auto", device="cpu", query_mode="final", run_windows=many)
    assert not kernels.resolve_compile("auto", device="cpu", query_mode="final",
                                       run_windows=many - 1)
    assert not kernels.resolve_compile("auto", device="cuda", query_mode="final",
                                       run_windows=many)
    assert kernels.resolve_compile("auto", device="cuda:0", query_mode="stride:4")
    assert not kernels.resolve_compile("auto", device="cuda", query_mode="final")
    assert kernels.resolve_compile("on", device="cpu", query_mode="final")
    monkeypatch.setenv("ATTNGEOM_COMPILE", "0")
    assert not kernels.resolve_compile("auto", device="cpu", query_mode="all")


def test_auto_compile_weighs_the_runs_windows_not_a_batchs(stories, monkeypatch, tmp_path):
    """``final`` queries under ``--compile auto``: the stream is told the whole run's
    window count (here 3, in batches of one), which decides whether to compile."""
    import attngeom.engine.stream as stream

    seen = []
    real = stream.resolve_compile

    def spy(choice, **kw):
        seen.append(kw["run_windows"])
        return real(choice, **kw)

    monkeypatch.setattr(stream, "resolve_compile", spy)
    cfg = AnalysisConfig(model=str(STORIES_PATH), window_length=40, n_windows=3,
                         batch_size=1, bootstrap=0, n_grid=(1, 2), compile="auto")
    run_analysis(cfg, tmp_path / "r", progress=False, model_and_tokenizer=stories)
    assert seen == [3, 3, 3]
