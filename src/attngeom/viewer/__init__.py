"""attngeom.viewer: one head's token selection, seen key by key (the geometry viewer).

``inspect`` returns a ``HeadView`` (the numbers and a matplotlib figure) for one
layer, head and query of a prompt or of a run's window; ``write_viewer`` writes a
self-contained HTML page (no external requests, works from ``file://``) with an N
slider, both distances and both rankings for chosen head-query pairs. See
``docs/viewer.md``.
"""

from attngeom.viewer.geometry import SelectionGeometry, selection_geometry
from attngeom.viewer.view import HeadView, inspect
from attngeom.viewer.write import write_viewer

__all__ = ["HeadView", "SelectionGeometry", "inspect", "selection_geometry", "write_viewer"]
