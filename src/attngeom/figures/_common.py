"""Row selection and layer x head heat maps shared by the figure modules."""

from __future__ import annotations

import numpy as np

from attngeom.errors import ConfigError


def pick(df, table: str, *, model=None, corpus=None, **equal):
    """Rows of ``df`` for one model and corpus, and ``column == value`` for ``equal``.

    ``model`` / ``corpus`` may be left out when the table holds only one; otherwise
    the caller has to say which. An empty selection is a ``ConfigError`` that names
    the table and the filter, so that a figure is never silently blank.
    """
    for column, wanted in (("model", model), ("corpus", corpus)):
        if column not in df.columns:
            continue
        values = sorted(df[column].dropna().unique().tolist())
        if wanted is None:
            if len(values) > 1:
                raise ConfigError(
                    f"expected one {column} in the {table} table or {column}=..., got {values}"
                )
        else:
            df = df[df[column] == wanted]
    for column, wanted in equal.items():
        if wanted is None:
            continue
        if column not in df.columns:
            raise ConfigError(f"expected column {column!r} in the {table} table, it has none")
        df = df[df[column] == wanted]
    if len(df) == 0:
        filt = {k: v for k, v in {"model": model, "corpus": corpus, **equal}.items()
                if v is not None}
        raise ConfigError(f"expected rows in the {table} table for {filt}, got none")
    return df


def layer_head_grid(df, column: str):
    """A (layers, heads) array of ``column`` (mean over any other key), NaN where absent."""
    layers = np.arange(int(df["layer"].max()) + 1)
    heads = np.arange(int(df["head"].max()) + 1)
    means = df.groupby(["layer", "head"])[column].mean()
    grid = np.full((layers.size, heads.size), np.nan)
    for (layer, head), value in means.items():
        grid[int(layer), int(head)] = value
    return grid, layers, heads


def draw_layer_head_map(ax, grid, *, cmap, norm=None, colorbar_label=None, colorbar=True,
                        cbar_ticks=None):
    """Draw ``grid`` as a layer (rows, layer 0 on top) x head (columns) heat map."""
    import matplotlib as mpl

    cmap = mpl.colormaps[cmap] if isinstance(cmap, str) else cmap
    cmap = cmap.with_extremes(bad="#FFFFFF")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto",
                      origin="upper", interpolation="nearest")
    n_layers, n_heads = grid.shape
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(_ticks(n_heads))
    ax.set_yticks(_ticks(n_layers))
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    bar = None
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, shrink=0.9, pad=0.02, ticks=cbar_ticks)
        bar.outline.set_linewidth(0.4)
        if colorbar_label:
            bar.set_label(colorbar_label)
    return image, bar


def _ticks(n: int):
    step = max(1, int(np.ceil(n / 8)))
    return np.arange(0, n, step)
