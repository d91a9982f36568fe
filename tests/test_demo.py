"""``attngeom demo`` (what ``make demo`` runs) end to end, in its quick form."""

from __future__ import annotations

import pytest

from attngeom.cli import main


@pytest.mark.slow
def test_demo_quick_writes_every_run_and_report(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--quick", "--quiet"]) == 0
    printed = capsys.readouterr().out
    for run in ("tinystories", "wikitext", "scan", "prune", "restrict"):
        assert (out / run / "manifest.json").is_file(), run
        assert (out / run / "report" / "index.html").is_file(), run
        assert f"report ({run}): " in printed
    assert "F_N over all heads" in printed and "Cohen's kappa" in printed
    assert "most critical heads" in printed and "N*_tau" in printed
