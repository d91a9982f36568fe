"""The geometry viewer as one self-contained HTML page: the views as inline JSON.

Everything the page draws is precomputed here, for every N up to the cap, both
rankings and both distances, and written into the page as inline JSON; the page's
own small script draws it on a canvas (no external request, works from ``file://``).

Size: per (head, query) pair and view, the radii of the keys drawn one by one are
stored as 16-bit integers (``q = round(D / scale * 65535)``, one scale per view)
in base64, with the exact float64 radii and metrics beside them as numbers. Rounding
is monotone, so a key with D <= rho_max keeps q(D) <= q(rho_max): the circles stay
exact in the drawing. Which keys are intruders or stragglers is stored as bits,
computed from the exact scores, not re-derived from the rounded radii. The keys not
drawn one by one (long contexts) are a histogram of their radii per N: 40 bins across
the *band* around the circles (rho_max, rho_min and, Euclidean, ||s_N||, padded by
three quarters of their spread or 1% of the picture), and a count below and above it.
The page's "zoom" maps the band onto most of the picture, piecewise linearly (so
still monotone: the circles keep every key on its side); real heads put almost every
key within a hair of ||s_N||, which the linear picture cannot separate.
"""

from __future__ import annotations

import base64
import html
import json

import numpy as np

from attngeom.viewer.page_assets import SCRIPT, STYLE

LEVELS = 65535
REST_BINS = 40


def _b64(array: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def _bits(mask: np.ndarray) -> str:
    return base64.b64encode(np.packbits(mask.astype(bool), axis=-1,
                                        bitorder="little").tobytes()).decode("ascii")


def _num(x: float) -> float | None:
    x = float(x)
    return None if not np.isfinite(x) else float(f"{x:.10g}")


def _nums(xs) -> list:
    return [_num(x) for x in np.asarray(xs, dtype=np.float64).tolist()]


def _band_histogram(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Counts below ``lo``, in ``REST_BINS`` equal bins of [lo, hi], and above ``hi``."""
    inside = (values >= lo) & (values <= hi)
    counts = np.histogram(values[inside], bins=REST_BINS, range=(lo, max(hi, lo + 1)))[0]
    return np.concatenate([[int((values < lo).sum())], counts, [int((values > hi).sum())]])


def view_payload(view, seq: str) -> dict:
    """What the page needs of one ``HeadView`` (every ranking and distance it holds)."""
    shown = view.shown
    rest = np.setdiff1d(np.arange(view.keys.size), shown)
    views = {}
    for (rule, dist), geo in view.views.items():
        out_d = view.output_distance[(rule, dist)]
        ghost_d = view.ghost_distance[(rule, dist)]
        marks = [geo.distances.max(), geo.rho_max.max(), geo.rho_min.max(), out_d.max(),
                 ghost_d.max()]
        if dist == "euclidean":
            marks.append(geo.aggregate_norm.max())
        scale = max(float(np.nanmax(marks)), 1e-300)

        def q(x, scale=scale):
            return np.clip(np.round(np.asarray(x, np.float64) / scale * LEVELS), 0, LEVELS)

        radius_q = q(geo.distances[:, shown])
        rest_q = q(geo.distances[:, rest]) if rest.size else np.zeros((geo.ns.size, 0))
        circles = [q(geo.rho_max), q(geo.rho_min)]
        if dist == "euclidean":
            circles.append(q(geo.aggregate_norm))
        ext = np.max(np.stack([radius_q.max(1), *circles, q(out_d), q(ghost_d),
                               rest_q.max(1) if rest.size else circles[0]]), 0)
        lo, hi = np.min(np.stack(circles), 0), np.max(np.stack(circles), 0)
        pad = np.maximum((hi - lo) * 0.75, ext * 0.01)
        band_lo = np.floor(np.maximum(lo - pad, 0))
        band_hi = np.ceil(np.minimum(hi + pad, ext))
        hist = np.stack([_band_histogram(rest_q[i], band_lo[i], band_hi[i])
                         for i in range(geo.ns.size)])
        offenders = (geo.intruders | geo.stragglers)[:, shown]
        views[f"{rule}|{dist}"] = {
            "order": geo.order.tolist(),
            "scale": _num(scale),
            "radius": _b64(radius_q, "<u2"),
            "ext_q": ext.astype(int).tolist(),
            "band_q": np.stack([band_lo, band_hi], 1).astype(int).tolist(),
            "offenders": _bits(offenders),
            "rho_max_q": q(geo.rho_max).astype(int).tolist(),
            "rho_min_q": q(geo.rho_min).astype(int).tolist(),
            "snorm_q": q(geo.aggregate_norm).astype(int).tolist() if dist == "euclidean"
            else None,
            "z_q": q(out_d).astype(int).tolist(),
            "ghost_q": q(ghost_d).astype(int).tolist(),
            "rho_max": _nums(geo.rho_max), "rho_min": _nums(geo.rho_min),
            "z": _nums(out_d), "ghost_agg": _nums(ghost_d),
            "P": _nums(geo.precision), "R": _nums(geo.recall), "F": _nums(geo.f_score),
            "margin": _nums(geo.margin), "inv": _nums(geo.inversions),
            "intruders": geo.intruders.sum(-1).tolist(),
            "stragglers": geo.stragglers.sum(-1).tolist(),
            "rest_hist": _b64(hist, "<u2") if rest.size else None,
            "rest_inside": geo.intruders[:, rest].sum(-1).tolist() if rest.size else None,
        }
    ghosts = {d: {"order": g.order.tolist(), "P": _nums(g.precision), "R": _nums(g.recall),
                  "F": _nums(g.f_score), "margin": _nums(g.margin),
                  "inv": _nums(g.inversions), "angle": _nums(view.ghost_angles[d])}
              for d, g in view.ghosts.items()}
    return {
        "id": f"L{view.layer}H{view.head}t{view.query}" + (
            "" if view.window is None else f"w{view.window}"),
        "model": view.model, "layer": view.layer, "head": view.head, "query": view.query,
        "window": view.window, "seq": seq, "winner": view.winner,
        "regime": {k: (_num(x) if isinstance(x, float) else x) for k, x in
                   view.regime.items()},
        "keys": view.keys.tolist() if view.keys.size != view.keys[-1] + 1 else None,
        "num_keys": int(view.keys.size),
        "shown": view.shown.tolist(),
        "angle": _b64(np.round((view.angle[shown] + np.pi) / (2 * np.pi) * LEVELS), "<u2"),
        "alpha": _b64(view.alpha, "<f4"), "contribution": _b64(view.contribution, "<f4"),
        "z_angle": _num(view.output_angle),
        "ns": view.ns.tolist(), "grid": [n for n in view.n_grid if n in set(view.ns.tolist())],
        "default_n": view.default_n, "seed": view.seed,
        "views": views, "ghosts": ghosts,
    }


def page_html(payload: dict, title: str) -> str:
    """The page: style, data and script inline."""
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    data = data.replace("</", "<\\/")  # never closes the script element
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html.escape(title)}</title><link rel=\"icon\" href=\"data:,\">"
        f"<style>{STYLE}</style></head><body>"
        f"<script id=\"attngeom-data\" type=\"application/json\">{data}</script>"
        f"<script>{SCRIPT}</script></body></html>\n")
