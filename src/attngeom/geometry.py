"""Public path of the geometry core: ``attngeom.geometry.topn_metrics`` (SPEC 2)."""

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
