"""attngeom.interventions: head gates, top-N restriction, rankers and perplexity (method §9).

The names below load lazily from their modules (``gates``, ``restriction``,
``perplexity``, ``rankers``, ``sweeps``, ``nstar``), so importing the package is cheap.
"""

from __future__ import annotations

_EXPORTS = {
    "head_gates": "gates",
    "remove_heads": "gates",
    "check_gates": "gates",
    "restrict_topn": "restriction",
    "evaluate_nll": "perplexity",
    "rank_heads": "rankers",
    "prune_sweep": "sweeps",
    "scan_heads": "sweeps",
    "restrict_sweep": "sweeps",
    "restrict_local": "sweeps",
    "search_nstar": "nstar",
    "bootstrap_nstar": "nstar",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"attngeom.interventions.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'attngeom.interventions' has no attribute {name!r}")
