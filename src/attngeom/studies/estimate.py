"""How long a study's cells should take, from their configurations alone (the dry run).

A cell's work is counted in forward passes over tokens, from what its command does
(``analyze``: one forward per window; ``restrict``: the grid and about a dozen more N per
search, each a restricted forward of every evaluation window; ``competition --probe qa``:
every prompt under every N the searches ask; ...). A forward of T tokens through a model
of P parameters, L layers and width D costs about ``2 P T + 4 L D T^2`` floating-point
operations plus a fixed cost per layer call (kernel launches, Python); the work around
it is counted apart: the analyses' work per analysed (head, query row, key), and a
restricted forward's eager probabilities and selection per layer. The machine constants
below were fitted to the demo study on two CPU cores; on another machine the estimate
scales with them, and it is an estimate: a rough guide to the order of the wait, not a
measurement.
"""

from __future__ import annotations

import math

# fitted to the demo's 16 cells on two CPU cores (torch 2.13, float32; 451 s measured
# against 480 s estimated): sustained floating-point throughput of a forward, the fixed
# cost of one layer's call in a plain forward and in a restricted one (the eager
# probabilities and the selection), the analyses' cost per analysed (head, query row,
# key) of every layer (three rules, both universes, the bounds), and a cell's own
# overhead (its run report's figures, the tables written)
FLOPS = 150e9
LAYER_CALL_S = 1e-3
RESTRICTED_LAYER_S = 3e-3
ROW_KEY_S = 3e-6
CELL_S = 6.0
EXTRA_PER_TAU = 4  # Ns the adaptive search asks beyond the grid per tau (N* - 3 .. N*)
QA_PROMPT = 160  # tokens of a qa prompt without background (instruction, facts, question)


def forward_seconds(shape: dict, tokens: int, *, restricted: bool = False) -> float:
    """One forward of ``tokens`` tokens through a model of ``shape`` (``inspect_model``)."""
    params = float(shape.get("params_b", 0.0)) * 1e9
    layers, width = int(shape.get("layers", 1)), int(shape.get("hidden", 1))
    flops = 2.0 * params * tokens + 4.0 * layers * width * tokens * tokens
    per_layer = RESTRICTED_LAYER_S if restricted else LAYER_CALL_S
    return flops / FLOPS * (1.3 if restricted else 1.0) + layers * per_layer


def _rows(query_mode: str, tokens: int) -> int:
    """Analysed query rows of a window under ``query_mode``."""
    if query_mode == "final":
        return 1
    if query_mode.startswith("stride:"):
        return max(1, tokens // int(query_mode.split(":", 1)[1]))
    return tokens


def _grid(n_grid, length: int) -> int:
    return sum(1 for n in n_grid if n < length)


def _powers(top: int, below: int) -> int:
    return sum(1 for k in range(20) if 2 ** k <= top and 2 ** k < below)


def cell_forwards(command: str, cfg, shape: dict) -> list[tuple[int, float]]:
    """(tokens per forward, number of forwards) of a cell's work."""
    t = int(cfg.window_length)
    layers, heads = int(shape.get("layers", 1)), int(shape.get("heads", 1))
    if command == "analyze":
        return [(t, float(cfg.n_windows or 32))]
    if command == "atlas":
        contexts = cfg.effective_needle_contexts
        return [(t, float(cfg.n_windows)), (1 + 2 * cfg.repeat_length, float(cfg.n_repeats)),
                (max(contexts) + cfg.needle_length, float(cfg.n_needles))]
    if command == "scan-heads":
        return [(t, float(cfg.n_eval_windows * (layers * heads + 1)))]
    if command == "prune":
        settings = sum(len(cfg.seeds) if r == "random" else 1 for r in cfg.rankers)
        ranking = layers * heads + 1 if "sensitivity" in cfg.rankers else 1
        return [(t, float(cfg.n_eval_windows * (1 + settings * len(cfg.keep_fractions))
                          + cfg.n_rank_windows * ranking))]
    if hasattr(cfg, "scan_n"):  # restrict, restrict-local, restrict-policies
        selections = len(cfg.rankings) * len(cfg.renormalize)
        if cfg.scope != "model":
            targets = layers + min(cfg.scan_top_layers, layers) * heads
            return [(t, float(cfg.n_eval_windows * (1 + selections * targets
                                                    * len(cfg.scan_n))))]
        scopes = sum({"model": 1, "layer": layers, "head": layers * heads}[s]
                     for s in cfg.scopes)
        per = _grid(cfg.n_grid, t) + (EXTRA_PER_TAU * len(cfg.taus)
                                      if cfg.search == "adaptive" else 0)
        # each head alone at the oracle's N* (--alone-tau): one more pass with the base
        alone = 0 if cfg.alone_tau is None else 1 + selections * (
            len(cfg.heads) if cfg.heads is not None
            else heads * (layers if cfg.layers is None else len(cfg.layers)))
        return [(t, float(cfg.n_eval_windows * (1 + selections * scopes * per + alone)))]
    if hasattr(cfg, "probe"):  # competition and its study parts
        return _competition_forwards(cfg, shape)
    return [(t, 1.0)]


def _competition_forwards(cfg, shape: dict) -> list[tuple[int, float]]:
    selections = len(cfg.rankings) * len(cfg.renormalize)
    limit = shape.get("max_positions")
    searches = 1 if cfg.nstar else 0
    if cfg.probe == "qa":
        selections += 1 if cfg.positional else 0
        backgrounds = cfg.backgrounds or tuple(b for b in cfg.DEFAULT_BACKGROUNDS
                                               if limit is None or b + QA_PROMPT <= limit)
        out = []
        for b in backgrounds:
            length = b + QA_PROMPT
            per = _powers(cfg.grid_max, length) + EXTRA_PER_TAU * len(cfg.effective_taus)
            # the budgets sit on the search's powers of two (shared) unless it is off
            budgets = 0 if searches else len(cfg.budgets)
            out.append((length, float(cfg.n_episodes
                                      * (1 + selections * (searches * per + budgets)))))
        return out
    lengths = cfg.context_lengths(limit)
    if cfg.probe == "kept":  # one unrestricted forward per document and length
        return [(length, float(cfg.n_documents)) for length in lengths]
    searches *= 1.5  # the tail and all-token searches share most of their Ns
    return [(length, float(cfg.n_documents * (1 + searches * selections
                                              * (_grid([2 ** k for k in range(20)], length)
                                                 + EXTRA_PER_TAU * len(cfg.effective_taus)))))
            for length in lengths]


def cell_seconds(command: str, cfg, shape: dict | None) -> float:
    """The cell's estimated seconds (NaN without the model's shape)."""
    if not shape:
        return math.nan
    restricted = hasattr(cfg, "rankings")  # an eager, restricted forward
    work = sum(n * forward_seconds(shape, tokens, restricted=restricted)
               for tokens, n in cell_forwards(command, cfg, shape))
    if command in ("analyze", "atlas"):
        t = int(cfg.window_length)
        heads = int(shape.get("layers", 1)) * int(shape.get("heads", 1))
        windows = float(getattr(cfg, "n_windows", None) or 32)
        work += windows * heads * _rows(cfg.query_mode, t) * t * ROW_KEY_S
    return work + CELL_S
