"""Public path of the geometry core: ``attngeom.geometry.topn_metrics`` (method §4)."""

from attngeom.core.geometry import (
    DISTANCES,
    METRICS,
    RULES,
    TopNMetrics,
    causal_visibility,
    select_order,
    topn_metrics,
)

__all__ = [
    "DISTANCES", "METRICS", "RULES", "TopNMetrics", "causal_visibility", "select_order",
    "topn_metrics",
]
