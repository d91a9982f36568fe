"""The public names are pinned: renaming one is a visible, deliberate change."""

from __future__ import annotations

import inspect

import attngeom
import attngeom.geometry
import attngeom.interventions

PUBLIC = {
    "AnalysisConfig", "AnalysisResult", "PruneConfig", "RestrictConfig", "RunResult",
    "ScanConfig", "analyze", "check", "compare", "demo", "prune", "report", "reproduce",
    "restrict",
    "scan_heads", "atlas", "competition", "inspect", "view",
}


def test_top_level_names() -> None:
    assert set(attngeom.__all__) == PUBLIC | {"__version__"}
    for name in PUBLIC:
        assert getattr(attngeom, name) is not None


def test_api_signatures_take_model_corpus_out_first() -> None:
    for name in ("analyze", "prune", "scan_heads", "restrict"):
        params = list(inspect.signature(getattr(attngeom, name)).parameters)
        assert params[:3] == ["model", "corpus", "out"], name


def test_geometry_and_interventions_exports() -> None:
    assert callable(attngeom.geometry.topn_metrics)
    for name in attngeom.interventions.__all__:
        assert callable(getattr(attngeom.interventions, name)), name
