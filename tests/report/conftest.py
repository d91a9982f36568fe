"""Fixtures for the report tests: synthetic runs and one full report per session."""

from __future__ import annotations

import pytest

from tests.figures import attngeom_synth


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
