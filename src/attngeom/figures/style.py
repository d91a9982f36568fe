"""One look for every attngeom figure: sizes, fonts, colours, the returned artists.

Figures are sized for a two-column paper: ``COLUMN_WIDTH`` (3.4 in) for a single
panel, ``PAGE_WIDTH`` (7.0 in) for a row of panels, 8 pt text, so that a figure
included at its natural width reads like the surrounding text.

Nothing here touches pyplot or the global backend: figures are created with
``matplotlib.figure.Figure`` (which draws through Agg when saved) and the style
is applied with ``rc_context`` only while a figure function runs.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from attngeom.names import NO_REGIME, REGIMES

COLUMN_WIDTH = 3.4
"""Width in inches of one paper column."""
PAGE_WIDTH = 7.0
"""Width in inches of a full two-column page."""
PANEL_HEIGHT = 2.3
"""Height in inches of one panel."""
DPI = 200
"""Resolution of the saved PNG files."""

RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "lines.linewidth": 1.3,
    "lines.markersize": 3.5,
    "axes.grid": True,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.35,
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    # constrained layout already fits labels and legends; a "tight" bbox would only
    # cost a second draw per file
    "savefig.bbox": "standard",
    "pdf.fonttype": 42,
    "image.interpolation": "nearest",
}

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
             "#000000"]

RULE_COLORS = {"attention": "#0072B2", "contribution": "#009E73", "random": "#6E6E6E"}
RULE_LINESTYLES = {"attention": "-", "contribution": "-.", "random": "--"}
RULE_LABELS = {"attention": "attention top-N", "contribution": "contribution top-N",
               "random": "random N"}

# Retriever, Mixer, Reset, then the grey of heads with no regime
REGIME_COLORS = dict(zip((*REGIMES, NO_REGIME), ("#0072B2", "#E69F00", "#009E73", "#D9D9D9"),
                         strict=True))

SOURCE_COLORS = {"f_self": "#0072B2", "f_sink": "#E69F00", "f_other": "#009E73"}
SOURCE_LABELS = {"f_self": "self", "f_sink": "sink", "f_other": "other"}

METRIC_LABELS = {
    "precision": "precision $P_N$",
    "recall": "recall $R_N$",
    "f_score": "F-score $F_N$",
    "margin": r"margin $\gamma_N$",
    "inversions": r"inversions $\mathrm{GInv}_N$",
}
N_LABEL = "selected set size $N$ (tokens)"


def color_cycle(i: int) -> str:
    """The i-th colour of the shared qualitative palette."""
    return OKABE_ITO[i % len(OKABE_ITO)]


@dataclass
class Drawn:
    """What a figure function drew, so that callers and tests can inspect it.

    ``lines``, ``bands`` (filled intervals), ``bars`` and ``markers`` are keyed by
    the label the legend shows; ``images`` holds the heat maps; ``data`` holds the
    exact numbers that were plotted, one tidy frame per element.
    """

    ax: Any
    lines: dict[str, Any] = field(default_factory=dict)
    bands: dict[str, Any] = field(default_factory=dict)
    bars: dict[str, Any] = field(default_factory=dict)
    markers: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)
    colorbar: Any = None
    legend: Any = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def figure(self) -> Figure:
        return self.ax.figure


@contextlib.contextmanager
def context():
    """Apply the attngeom rc settings for the duration of the block."""
    with mpl.rc_context(RC):
        yield


def styled(func):
    """Run a figure function under the attngeom style."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with context():
            return func(*args, **kwargs)

    return wrapper


def new_figure(width: float = COLUMN_WIDTH, height: float = PANEL_HEIGHT, **subplots_kw):
    """A pyplot-free figure and its axes (``subplots_kw`` go to ``Figure.subplots``)."""
    with context():
        fig = Figure(figsize=(width, height), layout="constrained")
        axes = fig.subplots(**subplots_kw)
    return fig, axes


def axes_or_new(ax, width: float = COLUMN_WIDTH, height: float = PANEL_HEIGHT):
    """Return ``ax``, or the axes of a new single-panel figure when ``ax`` is None."""
    if ax is not None:
        return ax
    _, ax = new_figure(width, height)
    return ax


def set_n_axis(ax, ns) -> None:
    """Label the N axis; use a base-2 log scale when the grid spans 8x or more."""
    ns = np.asarray(sorted(set(int(n) for n in ns)))
    ax.set_xlabel(N_LABEL)
    if ns.size and ns.min() >= 1 and ns.max() / ns.min() >= 8:
        ax.set_xscale("log", base=2)
        # labels at powers of two only: the integer N a search adds between them would
        # print over each other (32, 36, 40, 45, 51)
        ticks = np.array([2 ** k for k in range(int(np.log2(ns.max())) + 1)
                          if ns.min() <= 2 ** k <= ns.max()])
        ticks = ticks if ticks.size >= 2 else ns
        ax.set_xticks(ticks if ticks.size <= 8 else ticks[:: int(np.ceil(ticks.size / 8))])
        ax.xaxis.set_major_formatter(mpl.ticker.ScalarFormatter())
        ax.xaxis.set_minor_locator(mpl.ticker.NullLocator())
    elif ns.size:
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))


def plain_log_ticks(axis) -> None:
    """Write log-axis ticks as plain numbers (20, 50) rather than 2 x 10^1."""
    axis.set_major_locator(mpl.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(mpl.ticker.NullFormatter())


def save(fig: Figure, out_dir: Path, name: str, formats=("png", "pdf")) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.<fmt>`` for each format; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with context():
        for fmt in formats:
            path = out_dir / f"{name}.{fmt}"
            fig.savefig(path, format=fmt, metadata=_metadata(fmt))
            paths.append(path)
    return paths


def _metadata(fmt: str) -> dict:
    # Fixed metadata keeps the files byte-stable between runs of the same tables.
    if fmt == "png":
        return {"Software": "attngeom"}
    if fmt == "pdf":
        return {"Creator": "attngeom", "Producer": "attngeom", "CreationDate": None}
    return {}
