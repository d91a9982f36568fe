"""attngeom.report: a self-contained HTML report of a run directory.

``build_report(run_dir)`` writes ``run_dir/report/index.html``; pandas and
matplotlib are imported only when it is called.
"""

from __future__ import annotations

__all__ = ["build_report"]


def __getattr__(name):
    if name == "build_report":
        from attngeom.report.build import build_report

        return build_report
    raise AttributeError(f"module 'attngeom.report' has no attribute {name!r}")
