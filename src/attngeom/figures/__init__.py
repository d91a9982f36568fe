"""attngeom.figures: one function per figure, tables (+ ax) in, artists out.

Every ``fig_*`` function takes the run's table(s) as pandas frames and an optional
matplotlib ``ax``, draws one panel and returns a ``Drawn`` holding the artists and
the numbers it plotted. ``render_all(run_dir, out_dir)`` draws whatever a run
holds as PNG and PDF. matplotlib is imported only when one of these is used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "fig_topn_curves": "separability",
    "fig_topn_by_layer": "separability",
    "fig_sink_variant": "separability",
    "fig_sink_norm_ratio": "sink",
    "fig_sink_cosine": "sink",
    "fig_sink_split": "sink",
    "fig_regime_map": "taxonomy",
    "fig_regime_shares": "taxonomy",
    "fig_source_fractions": "taxonomy",
    "fig_bounds": "bounds",
    "fig_pruning": "interventions",
    "fig_head_scan": "interventions",
    "fig_restrict": "interventions",
    "render_all": "render",
    "render_figures": "render",
    "load_run": "runtables",
    "Drawn": "style",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module = importlib.import_module(f"attngeom.figures.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'attngeom.figures' has no attribute {name!r}")
