"""Public path of the geometry core: ``attngeom.geometry.topn_metrics`` (method §4),
and the metric registry (``register_metric``; docs/extending.md)."""

from attngeom.core.geometry import (
    DISTANCES,
    METRICS,
    RULES,
    TopNMetrics,
    causal_visibility,
    select_order,
    topn_metrics,
)
from attngeom.core.metrics import KeyScores, Metric, RowCounts, register_metric, unregister_metric

__all__ = [
    "DISTANCES", "METRICS", "RULES", "KeyScores", "Metric", "RowCounts", "TopNMetrics",
    "causal_visibility", "register_metric", "select_order", "topn_metrics",
    "unregister_metric",
]
