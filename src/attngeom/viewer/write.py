"""``write_viewer``: the views of chosen heads and queries captured, drawn into one page.

It prepares a prompt or a run's window (``viewer.view.prepare``), computes every view
(``viewer.view.collect``) and writes the page (``viewer.page``), which holds no code
that computes: the page module draws what it is given, the view module computes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, MODEL_RULES
from attngeom.viewer.page import page_html, view_payload
from attngeom.viewer.view import DEFAULT_GRID, TOP_KEYS, collect, prepare


def write_viewer(out_html, model=None, prompt=None, *, run=None, window: int | None = None,
                 heads: Sequence[tuple[int, int]], queries: Sequence[int | None] = (-1,),
                 n_grid: Sequence[int] = DEFAULT_GRID, n_max: int | None = None,
                 seed: int | None = None, tokenizer=None, top_keys: int = TOP_KEYS,
                 title: str | None = None) -> Path:
    """Write the geometry viewer for every (layer, head) of ``heads`` at every query.

    ``model`` and ``prompt`` as ``inspect``'s model and text_or_ids; or ``run=`` (and
    ``window``) to view a run's window captured again (``model`` may then be left out).
    ``queries``: positions (negatives from the end; with a run ``-1`` / ``None`` is its
    final query). Every N up to ``n_max`` (default ``max(n_grid)``; 0: only the grid's
    N, a page about five times smaller) is precomputed for the slider, under both
    rankings and both distances, with the random control's set of the same size as a
    ghost. Long contexts draw the ``top_keys`` keys of largest
    contribution (plus the selected, the sink, the current token and the winner) one
    by one and the rest as a density. Returns the path written.
    """
    pairs = []
    for item in heads:
        try:
            layer, head = (int(x) for x in item)
        except (TypeError, ValueError):
            raise ConfigError(f"heads: expected (layer, head) pairs, got {item!r}") from None
        for query in queries:
            pairs.append((layer, head, query))
    if not pairs:
        raise ConfigError("heads: expected at least one (layer, head) pair and one query")
    prep = prepare(model, prompt, run=run, window=window, tokenizer=tokenizer)
    if prep.run is not None:
        pairs = [(a, b, None if q in (None, -1) else q) for a, b, q in pairs]
    else:
        pairs = [(a, b, -1 if q is None else q) for a, b, q in pairs]
    views = collect(prep, pairs, n_grid=n_grid, n_max=n_max, rules=MODEL_RULES,
                    distances=DISTANCES, seed=prep.seed if seed is None else int(seed),
                    top_keys=top_keys)
    seq = "w" if prep.window is None else f"w{prep.window}"
    payload = {
        "title": title or f"attngeom geometry viewer: {prep.label}",
        "model": prep.label,
        "source": (f"run {prep.run.name}, window {prep.window}" if prep.run is not None
                   else "prompt"),
        "sequences": {seq: views[0].tokens},
        "pairs": [view_payload(v, seq) for v in views],
    }
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page_html(payload, payload["title"]), encoding="utf-8")
    return out
