"""Fixtures for the figure tests: one set of small synthetic tables per session."""

from __future__ import annotations

import pytest

from tests.figures import attngeom_synth


@pytest.fixture(scope="session")
def tables():
    """Every table of a synthetic 4-layer, 4-head run (see attngeom_synth)."""
    return attngeom_synth.make_tables()
