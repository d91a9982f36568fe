"""Fixtures for the report tests: synthetic runs and one full report per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The synthetic-run writer lives beside the figure tests; share it rather than copy it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "figures"))

import attngeom_synth  # noqa: E402


@pytest.fixture(scope="session")
def full_run(tmp_path_factory):
    """A synthetic run holding every table, with its report built (PNG figures only)."""
    from attngeom.report.build import build_report

    run = attngeom_synth.write_run(tmp_path_factory.mktemp("full") / "run")
    index = build_report(run, formats=("png",))
    return run, index


@pytest.fixture
def write_run():
    return attngeom_synth.write_run


@pytest.fixture(scope="session")
def tables():
    return attngeom_synth.make_tables()
