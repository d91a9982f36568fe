"""How long a study's cells should take, from their configurations alone (the dry run).

A cell's work is counted in forward passes over tokens, from what its command does
(``analyze``: one forward per window; ``restrict``: the grid and about a dozen more N per
search, each a restricted forward of every evaluation window; ``competition --probe qa``:
every prompt under every N the searches ask; ...). A forward of T tokens through a model
of P parameters, L layers and width D costs about ``2 P T + 4 L D T^2`` floating-point
operations plus a fixed cost per layer call (kernel launches, Python), and the work
around it (capturing attention rows, the metrics, an eager attention) multiplies that by
a factor of the command. The two machine constants (``FLOPS``, ``LAYER_CALL_S``) were
fitted to the demo study on two CPU cores (``docs/studies.md``, "How long"); on another
machine the estimate scales with them, and it is an estimate: a rough guide to the order
of the wait, not a measurement.
"""

from __future__ import annotations

import math

# fitted on two CPU cores (torch 2.13, float32): sustained floating-point throughput of
# a small model's forward, and the fixed cost of one layer's call in one forward
FLOPS = 12e9
LAYER_CALL_S = 4e-3
# work beyond the plain forward, per command (capture and metrics, eager attention with
# the restriction, candidate scoring)
OVERHEAD = {"analyze": 2.5, "atlas": 2.5, "prune": 1.2, "scan-heads": 1.1, "restrict": 1.6,
            "restrict-local": 1.6, "restrict-policies": 1.6, "competition": 1.6,
            "competition-qa": 1.6, "competition-context": 1.6}
EXTRA_N = 10  # Ns the adaptive search asks beyond the grid, per search (measured: 9-12)
QA_PROMPT = 160  # tokens of a qa prompt without background (instruction, facts, question)


def forward_seconds(shape: dict, tokens: int) -> float:
    """One forward of ``tokens`` tokens through a model of ``shape`` (``inspect_model``)."""
    params = float(shape.get("params_b", 0.0)) * 1e9
    layers, width = int(shape.get("layers", 1)), int(shape.get("hidden", 1))
    flops = 2.0 * params * tokens + 4.0 * layers * width * tokens * tokens
    return flops / FLOPS + layers * LAYER_CALL_S


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
    if command in ("restrict", "restrict-local", "restrict-policies"):
        selections = len(cfg.rankings) * len(cfg.renormalize)
        if cfg.scope != "model":
            targets = layers + min(cfg.scan_top_layers, layers) * heads
            return [(t, float(cfg.n_eval_windows * (1 + selections * targets
                                                    * len(cfg.scan_n))))]
        scopes = sum({"model": 1, "layer": layers, "head": layers * heads}[s]
                     for s in cfg.scopes)
        per = _grid(cfg.n_grid, t) + (EXTRA_N if cfg.search == "adaptive" else 0)
        # each head alone at the oracle's N* (--alone-tau): one more pass with the base
        alone = 0 if cfg.alone_tau is None else 1 + selections * (
            len(cfg.heads) if cfg.heads is not None
            else heads * (layers if cfg.layers is None else len(cfg.layers)))
        return [(t, float(cfg.n_eval_windows * (1 + selections * scopes * per + alone)))]
    if command.startswith("competition"):
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
            per = _powers(cfg.grid_max, length) + EXTRA_N
            out.append((length, float(cfg.n_episodes * (1 + searches * selections * per))))
        return out
    lengths = cfg.context_lengths(limit)
    return [(length, float(cfg.n_documents * (1 + searches * selections
                                              * (_grid([2 ** k for k in range(20)], length)
                                                 + EXTRA_N))))
            for length in lengths]


def cell_seconds(command: str, cfg, shape: dict | None) -> float:
    """The cell's estimated seconds (NaN without the model's shape)."""
    if not shape:
        return math.nan
    work = sum(n * forward_seconds(shape, tokens)
               for tokens, n in cell_forwards(command, cfg, shape))
    return work * OVERHEAD.get(command, 1.5)
