"""One head and one query as the viewer shows it: ``HeadView`` and ``inspect``.

``inspect`` captures the query row (from a prompt, or from a run's window captured
again), computes every key's geometry (``viewer.geometry``) and returns a
``HeadView``: the numbers, the per-key arrays and a matplotlib figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, MODEL_RULES, SINK
from attngeom.viewer.geometry import (
    SelectionGeometry,
    check_ns,
    principal_angles,
    selection_geometry,
    vector_distance,
)
from attngeom.viewer.source import (
    LayerRows,
    capture_layers,
    check_head,
    check_length,
    has_taxonomy,
    prompt_ids,
    read_run,
    resolve_query,
    run_regime,
    run_window,
)

DEFAULT_GRID = (1, 2, 4, 8, 16, 32)
START_N = 4  # the N a view opens at
TOP_KEYS = 256  # long contexts: the keys drawn one by one (the rest as a density)


@dataclass
class HeadView:
    """Everything the viewer shows of one (layer, head, query).

    Per key of the universe (``keys`` (U,), ascending positions): ``alpha``,
    ``value_norm`` ||v||, ``contribution`` alpha ||v||, ``angle`` (the PCA angle of
    y = alpha v). ``views[(rule, distance)]`` holds a ``SelectionGeometry`` (D of every
    key, the radii, the intruders and stragglers, the metrics) for every N of ``ns``;
    ``ghosts[distance]`` the random control's set (repeat 0, seeded as the run's) with
    its own metrics. ``output_distance[(rule, distance)]`` (K,) is D(z, s_N) for the
    head output z, ``ghost_distance`` D(s_random, s_N); ``output_angle`` and
    ``ghost_angles`` their PCA angles. ``shown`` indexes the keys drawn one by one (all
    of them, or on long contexts the top keys by contribution plus every selected
    key, the sink, the current token and the winner); the others are drawn as a
    density. ``regime`` is the head's label with where it came from (``source``).
    """

    model: str
    layer: int
    head: int
    query: int
    window: int | None
    token_ids: np.ndarray
    tokens: list[str]
    keys: np.ndarray
    alpha: np.ndarray
    value_norm: np.ndarray
    contribution: np.ndarray
    angle: np.ndarray
    winner: int
    regime: dict
    ns: np.ndarray
    n_grid: tuple[int, ...]
    views: dict[tuple[str, str], SelectionGeometry]
    ghosts: dict[str, SelectionGeometry]
    output_distance: dict[tuple[str, str], np.ndarray]
    output_angle: float
    ghost_distance: dict[tuple[str, str], np.ndarray]
    ghost_angles: dict[str, np.ndarray]
    shown: np.ndarray
    ranking: str = "attention"
    distance: str = "euclidean"
    seed: int = 0
    figure: Any = field(default=None, repr=False)
    row: Any = field(default=None, repr=False)  # the captured row (``_Row``), for more views

    @property
    def geometry(self) -> SelectionGeometry:
        """The geometry of the chosen ranking and distance."""
        return self.views[(self.ranking, self.distance)]

    @property
    def ghost(self) -> SelectionGeometry:
        """The random set of the same size under the chosen distance."""
        return self.ghosts[self.distance]

    @property
    def default_n(self) -> int:
        """The N first shown: 4 where it is valid (a small set, where the picture still
        separates keys; the largest N is a smear of the whole row), else the smallest."""
        valid = self.ns.tolist()
        return START_N if START_N in valid else int(min(valid))

    def metrics(self, n: int | None = None, *, ranking: str | None = None,
                distance: str | None = None) -> dict[str, float]:
        """P, R, F, margin, inversions, rho_max, rho_min at N (default ``default_n``)."""
        view = self.views[(ranking or self.ranking, distance or self.distance)]
        return view.metrics(self.default_n if n is None else n)

    def plot(self, n: int | None = None, *, ranking: str | None = None,
             distance: str | None = None, axes=None):
        """Draw the geometry at N (matplotlib; ``figures.viewer.fig_head_view``)."""
        from attngeom.figures.viewer import fig_head_view

        return fig_head_view(self, n=self.default_n if n is None else n,
                             ranking=ranking or self.ranking,
                             distance=distance or self.distance, axes=axes)

    def token(self, position: int) -> str:
        return self.tokens[int(position)]

    def describe(self, n: int | None = None) -> str:
        """A few lines: the head, its regime and winner, the metrics at N."""
        n = self.default_n if n is None else n
        m = self.metrics(n)
        r = self.regime
        where = "" if self.window is None else f" of window {self.window}"
        return "\n".join([
            f"{self.model} layer {self.layer} head {self.head}, query t = {self.query} "
            f"({self.token(self.query)}){where}",
            f"regime {r.get('regime')} ({r.get('source')}); winner t = {self.winner} "
            f"({self.token(self.winner)}), alpha ||v|| = "
            f"{self.contribution[np.searchsorted(self.keys, self.winner)]:.4g}",
            f"{self.ranking} top-{n}, {self.distance}: P = {m['precision']:.3f}, "
            f"R = {m['recall']:.3f}, F = {m['f_score']:.3f}, margin = {m['margin']:.4g}, "
            f"inversions = {int(m['inversions'])}",
        ])

    def complete(self) -> HeadView:
        """Add the views of both rankings and both distances (the page shows all four)."""
        add_views(self, MODEL_RULES, DISTANCES)
        return self

    def to_html(self, path=None) -> str:
        """The viewer page of this one head and query (every ranking and distance, the N
        slider); written to ``path`` when given. Returns the HTML."""
        from attngeom.viewer.page import page_html, view_payload

        self.complete()
        title = f"attngeom geometry viewer: {self.model} L{self.layer} H{self.head}"
        html = page_html({"title": title, "model": self.model,
                          "source": "prompt" if self.window is None else
                          f"window {self.window}", "sequences": {"w": self.tokens},
                          "pairs": [view_payload(self, "w")]}, title)
        if path is not None:
            Path(path).write_text(html, encoding="utf-8")
        return html

    def _repr_html_(self) -> str:
        """In a notebook: the page itself (the N slider, both rankings and distances), in an
        iframe so that its script and style stay its own."""
        import html

        return (f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" '
                'style="width:100%;height:1250px;border:0"></iframe>')

    def _repr_png_(self):  # a notebook shows the figure
        import io

        if self.figure is None:
            return None
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png")
        return buf.getvalue()


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token as the tokenizer writes it alone (a lone byte piece by its name)."""
    if tokenizer is None:
        return [f"#{int(i)}" for i in ids]
    cache: dict[int, str] = {}
    out = []
    for i in ids:
        i = int(i)
        if i not in cache:
            text = tokenizer.decode([i])
            if "\ufffd" in text or text == "":
                text = str(tokenizer.convert_ids_to_tokens(i))
            cache[i] = text
        out.append(cache[i])
    return out


def build_view(rows: LayerRows, *, model: str, head: int, query: int, token_ids,
               tokens: list[str], n_grid: Sequence[int], n_max: int | None,
               rules: Sequence[str], distances: Sequence[str], seed: int, window: int | None,
               regime: dict, top_keys: int = TOP_KEYS, ranking: str | None = None,
               distance: str | None = None) -> HeadView:
    """The ``HeadView`` of one captured row (``rows`` holds the query's layer)."""
    alpha, values, universe = rows.row(head, query)
    keys = torch.nonzero(universe).flatten()
    size = keys.numel()
    if n_max is not None and (isinstance(n_max, bool) or not isinstance(n_max, int)
                              or n_max < 0):
        raise ConfigError(f"n_max: expected None or an integer >= 0, got {n_max!r}")
    cap = max(n_grid) if n_max is None else n_max  # 0: the grid's N only
    ns = check_ns(sorted(set(n_grid) | set(range(1, cap + 1))), size)
    a = alpha.to(torch.float64)[keys].numpy()
    v = values.to(torch.float64)[keys].numpy()
    norm = np.sqrt((v * v).sum(-1))
    contrib = a * norm
    y = a[:, None] * v
    z = y.sum(0)
    angles, axes, (z_angle,) = principal_angles(y, z)
    # the winner of method §7: argmax alpha ||v||, ties to the smaller position (the
    # norms as the core computes them)
    from attngeom.core.batch import ValueStats
    from attngeom.core.taxonomy import source_winners

    core_norms = ValueStats(values[None].float()).norms
    winner = int(source_winners(alpha[None, None], core_norms, universe[None, None])[0, 0])
    view = HeadView(
        model=model, layer=rows.layer, head=head, query=query, window=window,
        token_ids=np.asarray(token_ids, dtype=np.int64), tokens=list(tokens),
        keys=keys.numpy(), alpha=a, value_norm=norm, contribution=contrib, angle=angles,
        winner=winner, regime=regime, ns=ns, n_grid=tuple(int(n) for n in n_grid), views={},
        ghosts={}, output_distance={}, output_angle=z_angle, ghost_distance={},
        ghost_angles={}, shown=np.zeros(0, dtype=np.int64), ranking=ranking or rules[0],
        distance=distance or distances[0], seed=seed,
        row=_Row(alpha, values, universe, axes, z, top_keys))
    add_views(view, rules, distances)
    return view


@dataclass
class _Row:
    """What a ``HeadView`` keeps of its captured row to add rankings or distances later."""

    alpha: torch.Tensor
    values: torch.Tensor
    universe: torch.Tensor
    axes: np.ndarray
    z: np.ndarray
    top_keys: int


def add_views(view: HeadView, rules: Sequence[str], distances: Sequence[str]) -> None:
    """Compute the views (and ghosts) of ``rules`` x ``distances`` the view lacks."""
    row = view.row
    kwargs = dict(query=view.query, seed=view.seed,
                  window=0 if view.window is None else view.window, layer=view.layer,
                  head=view.head)
    for d in distances:
        if d not in view.ghosts:
            g = selection_geometry(row.alpha, row.values, row.universe, view.ns,
                                   rule="random", distance=d, **kwargs)
            view.ghosts[d] = g
            view.ghost_angles[d] = np.array([float(np.arctan2(*(s @ row.axes.T)[::-1]))
                                             for s in g.aggregates])
        for r in rules:
            if (r, d) in view.views:
                continue
            geo = selection_geometry(row.alpha, row.values, row.universe, view.ns, rule=r,
                                     distance=d, **kwargs)
            view.views[(r, d)] = geo
            view.output_distance[(r, d)] = np.array([vector_distance(row.z, s, d)
                                                     for s in geo.aggregates])
            view.ghost_distance[(r, d)] = np.array([
                vector_distance(gs, s, d)
                for gs, s in zip(view.ghosts[d].aggregates, geo.aggregates, strict=True)])
    view.shown = _shown_keys(view.keys, view.contribution, view.views, view.ghosts,
                             view.query, view.winner, row.top_keys)


def _shown_keys(keys: np.ndarray, contrib: np.ndarray, views: dict, ghosts: dict, query: int,
                winner: int, top_keys: int) -> np.ndarray:
    """Indices (into ``keys``) of the keys drawn one by one, ascending."""
    if keys.size <= top_keys:
        return np.arange(keys.size)
    order = np.lexsort((keys, -contrib))  # contribution descending, ties to smaller position
    pick = set(order[:top_keys].tolist())
    where = {int(k): i for i, k in enumerate(keys.tolist())}
    for g in (*views.values(), *ghosts.values()):
        pick.update(where[int(k)] for k in g.order.tolist() if int(k) in where)
    for k in (SINK, query, winner):
        if k in where:
            pick.add(where[k])
    return np.array(sorted(pick), dtype=np.int64)


def prompt_regime(rows: LayerRows, head: int, num_tokens: int, cache: dict | None = None
                  ) -> dict:
    """The head's regime computed on this sequence alone (all its queries t >= T/2, the
    counted queries of ``all`` mode, method §7), labelled as such."""
    from attngeom.core.batch import AttentionBatch, ValueStats
    from attngeom.core.taxonomy import TaxonomyAccumulator

    cache = {} if cache is None else cache
    if rows.layer not in cache:  # one table per layer serves all its heads
        acc = TaxonomyAccumulator(counted="half", n_boot=0)
        acc.update(AttentionBatch(window=0, layer=rows.layer, alpha=rows.alpha,
                                  visible=rows.visible, query_positions=rows.rows,
                                  stats=ValueStats(rows.values, queries=rows.rows.numel())))
        cache[rows.layer] = acc.compute()["taxonomy"]
    table = cache[rows.layer]
    i = int(np.flatnonzero(table["head"] == head)[0])
    keep = ("regime", "n_queries", "f_self", "f_sink", "f_other", "winning_share",
            "runner_up_share", "top_source_kind", "top_source", "top_source_share")
    out = {k: (table[k][i].item() if hasattr(table[k][i], "item") else table[k][i])
           for k in keep}
    out["regime_rule"] = "single"
    out["source"] = (f"computed on this prompt only: {out['n_queries']} queries t >= "
                     f"{(num_tokens + 1) // 2}, not a run's label")
    return out


def regime_rows(num_tokens: int, causal: bool) -> list[int]:
    """The query rows a regime on the prompt counts (t >= T/2, t >= 1 when causal)."""
    start = max((num_tokens + 1) // 2, 1 if causal else 0)
    return list(range(start, num_tokens))


@dataclass
class Prepared:
    """A model, its tokenizer and layout, and the sequence to look at."""

    model: Any
    tokenizer: Any
    layout: Any
    label: str
    input_ids: torch.Tensor
    window: int | None
    run: Path | None
    special: torch.Tensor | None
    seed: int = 0


def prepare(model, text_or_ids, *, run, window, tokenizer, dtype: str = "float32"
            ) -> Prepared:
    """Load what is needed and check the sequence's length (one line on bad input)."""
    from attngeom.capture import load_model, load_tokenizer, model_layout

    if (text_or_ids is None) == (run is None):
        raise ConfigError("expected exactly one of a prompt (text or token ids) and run=")
    manifest = None
    if run is not None:
        run, manifest = read_run(run)
        if model is None:
            model = manifest["config"]["model"]
            dtype = manifest["config"].get("dtype", dtype)
    if model is None:
        raise ConfigError("expected a model: a loaded transformers model or a path")
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    label = Path(str(name)).name or type(model).__name__
    if isinstance(model, str | Path):
        label = Path(str(model)).name or str(model)
        if tokenizer is None:
            tokenizer = load_tokenizer(str(model))
        model, tokenizer = load_model(str(model), dtype=dtype, tokenizer=tokenizer)
    layout = model_layout(model)
    special = None
    if run is not None:
        if tokenizer is None:
            tokenizer = load_tokenizer(manifest["config"]["model"])
        info = manifest.get("model") or {}
        for key, have in (("num_layers", layout.num_layers), ("num_heads", layout.num_heads)):
            if key in info and int(info[key]) != have:
                raise ConfigError(f"the model has {have} {key[4:]} but run {run} was made with "
                                  f"{info[key]}: pass the run's model ({info.get('name')})")
        cut = run_window(run, manifest, tokenizer, window)
        ids, window, special = cut.input_ids, cut.index, cut.special
        label = manifest["config"].get("model_label") or Path(
            str(manifest["config"]["model"])).name
    else:
        ids = prompt_ids(text_or_ids, tokenizer)
        window = None
    check_length(int(ids.numel()), layout)
    seed = int(manifest["config"].get("seed", 0)) if manifest is not None else 0
    return Prepared(model=model, tokenizer=tokenizer, layout=layout, label=label,
                    input_ids=ids, window=window, run=run, special=special, seed=seed)


def final_query(prep: Prepared) -> int:
    """The run's ``final`` query of the window (its last content position), or T - 1."""
    from attngeom.core.queries import query_positions

    t = int(prep.input_ids.numel())
    if prep.special is None:
        return t - 1
    rows = query_positions("final", t, causal=prep.layout.is_causal, special=prep.special)
    return int(rows[0]) if rows.numel() else t - 1


def collect(prep: Prepared, pairs: Sequence[tuple[int, int, int]], *, n_grid, n_max, rules,
            distances, seed, top_keys: int = TOP_KEYS, ranking=None, distance=None
            ) -> list[HeadView]:
    """The views of (layer, head, query) triples of one sequence, from one forward."""
    t = int(prep.input_ids.numel())
    causal = prep.layout.is_causal
    resolved = []
    for layer, head, query in pairs:
        check_head(prep.layout, layer, head)
        q = final_query(prep) if query is None else resolve_query(query, t, causal=causal)
        resolved.append((layer, head, q))
    rows = {q for _, _, q in resolved}
    from_run = prep.run is not None and has_taxonomy(prep.run)
    if not from_run:  # the head's regime from the captured rows themselves
        rows |= set(regime_rows(t, causal))
    layers = sorted({layer for layer, _, _ in resolved})
    captured = capture_layers(prep.model, prep.input_ids, layers, sorted(rows))
    tokens = token_texts(prep.tokenizer, prep.input_ids.tolist())
    views, tables = [], {}
    for layer, head, q in resolved:
        if from_run:
            regime = run_regime(prep.run, layer, head)
        else:
            regime = prompt_regime(captured[layer], head, t, tables)
        views.append(build_view(
            captured[layer], model=prep.label, head=head, query=q,
            token_ids=prep.input_ids.tolist(), tokens=tokens, n_grid=n_grid, n_max=n_max,
            rules=rules, distances=distances, seed=seed, window=prep.window, regime=regime,
            top_keys=top_keys, ranking=ranking, distance=distance))
    return views


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")


def inspect(model=None, text_or_ids=None, *, run=None, window: int | None = None, layer: int,
            head: int, query: int | None = -1, n_grid: Sequence[int] = DEFAULT_GRID,
            n_max: int | None = None, distance: str = "euclidean",
            ranking: str = "attention", seed: int | None = None, tokenizer=None,
            figure: bool = True) -> HeadView:
    """The geometry of one head's selection at one query, as numbers and a figure.

    ``model``: a loaded transformers model (then pass ``tokenizer`` for a text prompt)
    or a path / hub id; with ``run=`` it may be left out (the run's model is loaded).
    ``text_or_ids``: a prompt (text, tokenised with the model's special tokens, or
    token ids); or ``run=``: a run directory, whose window ``window`` (default: its
    first) is cut again from its corpus and captured again. ``query``: a position
    (negatives count from the end; with a run, ``-1`` or ``None`` is the run's
    ``final`` query, its last content token). ``n_grid`` the N marked, ``n_max``
    (default ``max(n_grid)``) the largest N computed (every N up to it, the slider's;
    0: the grid's N only).
    ``distance``: euclidean or cosine;
    ``ranking``: attention or contribution (the random control's set of the same size
    rides along as a ghost, seeded by ``seed`` as the run's control is: by default the
    run's seed, else 0).

    Returns a ``HeadView`` whose ``metrics(n)`` equal ``attngeom.geometry.topn_metrics``
    for this row, with ``figure`` a matplotlib figure at the largest valid N of the
    grid (``view.plot(n)`` draws another N). Bad input (a layer, head or query out of
    range, a prompt longer than the model's positions, a run without what the viewer
    needs) is one ``ConfigError`` / ``RunDirError`` line naming the valid range.

    >>> view = inspect(model, "Once upon a time there was a cat named Tom.", layer=1, head=3,
    ...                tokenizer=tokenizer, figure=False)
    >>> view.metrics(1)["precision"], view.regime["regime"] in ("Retriever", "Mixer", "Reset")
    (1.0, True)
    """
    _check_choice("distance", distance, DISTANCES)
    _check_choice("ranking", ranking, MODEL_RULES)
    prep = prepare(model, text_or_ids, run=run, window=window, tokenizer=tokenizer)
    if query is None and prep.run is None:
        query = -1
    if query is None or (prep.run is not None and query == -1):
        query = None  # the run's final (content) query
    (view,) = collect(prep, [(layer, head, query)], n_grid=n_grid, n_max=n_max,
                      rules=(ranking,), distances=(distance,),
                      seed=prep.seed if seed is None else int(seed))
    if figure:
        view.figure = view.plot().figure
    return view
