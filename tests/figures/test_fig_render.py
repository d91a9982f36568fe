"""render_all: draws what a run holds, as PNG and PDF, in the shared style."""

from __future__ import annotations

import matplotlib.image as mpimg
import pytest

from attngeom.errors import RunDirError
from attngeom.figures import render_all
from attngeom.figures.render import render_figures
from attngeom.figures.runtables import load_run
from attngeom.figures.separability import fig_topn_curves
from attngeom.figures.style import RC
from tests.figures.attngeom_synth import write_run


def test_partial_run_writes_png_and_pdf(tmp_path):
    run = write_run(tmp_path / "run", tables=("pruning", "head_scan"))
    files = render_all(run, tmp_path / "figs")
    assert sorted(f.name for f in files) == [
        "head_scan.pdf", "head_scan.png", "pruning.pdf", "pruning.png"]
    for f in files:
        assert f.stat().st_size > 1000
        if f.suffix == ".pdf":
            assert f.read_bytes()[:5] == b"%PDF-"
        else:
            image = mpimg.imread(f)
            assert image.shape[0] > 100 and image.shape[1] > 100


def test_unusable_rows_skip_one_figure_with_a_note(tmp_path, tables):
    s = tables["summary"]
    layer_only = s[(s.scope == "layer") & (s.layer == 0)]  # no model-scope rows
    run = write_run(tmp_path / "run", tables=("summary",), frames={"summary": layer_only})
    result = render_figures(load_run(run), tmp_path / "figs", formats=("png",))
    names = [f.name for f in result.figures]
    assert "topn_model" not in names and "topn_by_layer" in names
    assert any("topn_model" in note and "summary" in note for note in result.notes)


def test_not_a_run(tmp_path):
    with pytest.raises(RunDirError, match="no manifest.json"):
        render_all(tmp_path, tmp_path / "figs")


def test_style_applies_to_drawn_text(tables):
    d = fig_topn_curves(tables["summary"])
    assert d.ax.xaxis.label.get_fontsize() == RC["axes.labelsize"]
    assert d.figure.get_figwidth() == pytest.approx(3.4)
