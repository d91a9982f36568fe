"""attngeom: the geometry of token selection in multi-head attention.

For every layer and head, the N most-attended tokens of a query are tested, in
value-state space, for being a compact, separable group (geometric Precision,
Recall and F_N) against a seeded random control; the attention sink, the
Retriever / Mixer / Reset taxonomy, certified bounds, head removal and top-N
restriction complete the protocol. Start with :func:`attngeom.analyze`.

The public functions load lazily, so ``import attngeom`` (and ``attngeom --help``)
does not import torch or transformers.
"""

from __future__ import annotations

__version__ = "0.1.0"

_API = (
    "AnalysisConfig", "AnalysisResult", "PruneConfig", "RestrictConfig", "RunResult",
    "ScanConfig", "analyze", "check", "compare", "demo", "prune", "report", "reproduce",
    "restrict",
    "scan_heads", "atlas", "competition", "inspect", "view",
)

_SUBMODULES = (
    "api", "assets", "capture", "cli", "config", "core", "errors", "figures", "geometry",
    "interventions", "names", "pipeline", "report", "results", "studies", "validate",
    "viewer",
)

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from attngeom import api

        return getattr(api, name)
    if name in _SUBMODULES:
        from importlib import import_module

        return import_module(f"attngeom.{name}")
    raise AttributeError(f"module 'attngeom' has no attribute {name!r}")
