"""Like with like: where a published value's setting and our measurement's differ.

A published number is a *match* for ours only when both were measured the same way:
the same model and corpus (``combine.reference_values`` checks those), the same tau,
ranking, renormalisation and scope (our number is read in that setting or not at all),
and the same protocol aspects this module compares:

- ``L``: the window length (App. B.2: 1024 positions, the initial token included; the
  context sweep's L of the row; the geometry's final query of 1024-token windows);
- ``windows``: one window per document (App. B.2, B.3) or documents joined into one
  stream and cut (attngeom's ``stream``);
- ``N* search``: how N*_tau was found. The paper's fixed-length N* is an integer from
  bisection with r = 3 refinement (r = 2 for Gemma-2-9B; App. B.2), its context-length
  N* an integer from bisection and a +-3 neighbourhood (App. B.3; compared as "integer
  by bisection", the neighbourhood aside), its qa N* the
  smallest passing power of two up to 256 (App. B.4). Ours is the smallest N of the grid
  (``search = "grid"``) or an integer by interpolation (``interventions.nstar``; by
  bisection where a run records ``step = "bisect"``); on a non-monotone curve these
  can differ, so they are compared;
- ``N range``: the N a Spearman correlation ran over (App. C.2: the nine powers of two
  1..256 from N_min);
- ``questions``: the qa probe's episodes, BABILong qa1 (the paper) or attngeom's
  generated qa1 with a corpus as background.

Each side is a dict aspect -> text; an aspect on one side only is not compared.
``differences(ours, paper)`` lists ``"L: 64 vs 1024"``-style items, empty for a match.
The number of documents is shown with our setting but does not break a match (it sets
the interval's width, not what is estimated).
"""

from __future__ import annotations

import math

ASPECTS = ("L", "windows", "N* search", "N range", "questions")
PAPER_L = 1024  # App. B.1-B.2: fixed-length and geometry windows
PAPER_ONE_PER_DOC = "one per document"
SPEARMAN_NS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # App. C.2's nine sizes
_NSTAR = ("n_star", "n_star_ci_low", "n_star_ci_high", "n_star_ratio", "n_star_loglog_slope")


def size_text(params_b: float) -> str:
    """A parameter count in billions as ``260K``, ``135M``, ``7.24B`` ("?" unknown)."""
    if params_b is None or not math.isfinite(params_b) or params_b <= 0:
        return "?"
    n = params_b * 1e9
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def sizes_text(values) -> str:
    """``7.24B`` for one size, ``1.54B-24B`` for a spread."""
    known = sorted(v for v in values if v is not None and math.isfinite(v))
    if not known:
        return "?"
    lo, hi = size_text(known[0]), size_text(known[-1])
    return lo if lo == hi else f"{lo}-{hi}"


def _ns_text(ns) -> str:
    ns = [int(n) for n in ns]
    return f"{ns[0]}..{ns[-1]} ({len(ns)} sizes)" if ns else "none"


def paper_side(ref) -> dict[str, str]:
    """The protocol aspects of a published value (module docstring)."""
    p, q = ref.setting, ref.quantity
    protocol = p.get("protocol")
    out: dict[str, str] = {}
    if protocol in ("fixed", "geometry", "context"):
        out["L"] = str(p.get("window_length", PAPER_L)) if protocol != "context" \
            else str(p["window_length"]) if "window_length" in p else "256,512,1024,2048"
    if protocol in ("fixed", "context"):
        out["windows"] = PAPER_ONE_PER_DOC
    if protocol == "qa":
        out["questions"] = "BABILong qa1"
    if q in ("n_star_qa", "n_star_qa_ratio"):
        out["N* search"] = "powers of two"
    elif q in _NSTAR and protocol == "context":
        out["N* search"] = "integer by bisection"  # then a +-3 neighbourhood
    elif q in _NSTAR and protocol == "fixed":
        out["N* search"] = (f"integer by bisection, refine "
                            f"{2 if ref.model == 'gemma-2-9b' else 3}")
    if q == "spearman_f_dnll":
        out["N range"] = _ns_text([n for n in SPEARMAN_NS if n >= int(p.get("n_min", 1))])
    return out


_PROBE_COMMANDS = ("competition-{}", "competition")  # a study part, or the plain command


def probe_configs(study, protocol: str, model: str, corpora) -> list:
    """The configurations of the study's ``protocol`` probe runs on ``model`` and
    ``corpora`` (a plain ``competition`` run counts when its probe is that one)."""
    out = []
    for command in _PROBE_COMMANDS:
        for cell in study.cells_of(command.format(protocol)):
            if cell.model == model and cell.corpus in corpora \
                    and getattr(cell.config, "probe", protocol) == protocol:
                out.append(cell.config)
    return out


def _config(study, command: str, model: str, corpora):
    for cell in study.cells_of(command):
        if cell.model == model and cell.corpus in corpora:
            return cell.config
    return None


def _windows(config) -> str:
    """How a run cut its windows, in the words ``paper_side`` uses."""
    if getattr(config, "document_protocol", "stream") == "fixed":
        return PAPER_ONE_PER_DOC
    k = getattr(config, "windows_per_document", None)
    return f"first {k} per document" if k else "documents joined"


def _step(config, rows) -> str:
    """How our adaptive search narrows a bracket: a table's or run's ``step`` where one
    records it, else interpolation (``interventions.nstar.search_rounds``' default)."""
    for source in (rows, config):
        if source is None:
            continue
        if hasattr(source, "columns"):
            if "step" in source.columns and len(source):
                return "bisection" if str(source["step"].iloc[0]) == "bisect" \
                    else "interpolation"
        elif getattr(source, "step", None):
            return "bisection" if source.step == "bisect" else "interpolation"
    return "interpolation"


def _restrict_search(config, rows) -> str:
    search = None
    if rows is not None and "search" in rows.columns and len(rows):
        search = str(rows["search"].iloc[0])
    search = search or getattr(config, "search", "adaptive")
    if search == "grid":
        grid = getattr(config, "n_grid", None)
        return "smallest grid N" + (f" ({_ns_text(sorted(grid))})" if grid else "")
    refine = getattr(config, "refine", 3)
    return f"integer by {_step(config, rows)}, refine {refine}"


def our_side(study, tables: dict, ref, model: str, corpora) -> dict[str, str]:
    """What our runs did in this reference's setting, by the aspects of ``paper_side``
    (only the aspects a run of that kind has)."""
    p, q = ref.setting, ref.quantity
    protocol = p.get("protocol")
    out: dict[str, str] = {}

    def rows(name):
        df = tables.get(name)
        if df is None or not len(df):
            return None
        sel = df[(df["model"] == model) & df["corpus"].isin(list(corpora))]
        return sel if len(sel) else None

    if protocol == "qa":
        cfg = next(iter(probe_configs(study, "qa", model, corpora)), None)
        if cfg is not None:
            out["questions"] = ("BABILong qa1" if getattr(cfg, "babilong", None)
                                else "generated qa1")
        if q in ("n_star_qa", "n_star_qa_ratio"):
            out["N* search"] = "powers of two"  # the grid estimate is what we read
        return out
    if protocol == "context":
        cfg = next(iter(probe_configs(study, "context", model, corpora)), None)
        if "window_length" in p:
            out["L"] = str(p["window_length"])  # only that L is read
        elif cfg is not None:
            out["L"] = ",".join(str(x) for x in cfg.lengths or cfg.DEFAULT_LENGTHS)
        out["windows"] = PAPER_ONE_PER_DOC  # the sweep's nested suffixes of one window
        if q in _NSTAR:
            out["N* search"] = f"integer by {_step(cfg, rows('context_nstar'))}"
        return out
    if protocol not in ("fixed", "geometry"):
        return out
    local = p.get("scope", "model") != "model" and q == "delta_nll_rel"
    command = ("restrict-local" if local else "analyze" if protocol == "geometry"
               else "restrict")
    cfg = _config(study, command, model, corpora)
    if q == "spearman_f_dnll":
        geo = _config(study, "analyze", model, corpora)
        lengths = sorted({c.window_length for c in (cfg, geo) if c is not None})
        if lengths:
            out["L"] = ",".join(map(str, lengths))
        kinds = sorted({_windows(c) for c in (cfg, geo) if c is not None})
        if kinds:
            out["windows"] = ",".join(kinds)
        g = tables.get("geometry_loss")
        if g is not None and len(g) and "n_min" in g.columns:
            g = g[(g["model"] == model) & (g["corpus"] == "+".join(corpora))
                  & (g["n_min"] == int(p.get("n_min", 1)))]
            if len(g):
                out["N range"] = _ns_text(str(g["ns"].iloc[0]).split(","))
        return out
    if cfg is None:
        return out
    out["L"] = str(cfg.window_length)
    if protocol == "fixed":
        out["windows"] = _windows(cfg)
    if q in _NSTAR:
        out["N* search"] = _restrict_search(cfg, rows("restrict_nstar"))
    return out


def differences(ours: dict[str, str], paper: dict[str, str]) -> list[str]:
    """``"L: 64 vs 1024"`` for every aspect both sides have and do not share."""
    return [f"{aspect}: {ours[aspect]} vs {paper[aspect]}" for aspect in ASPECTS
            if aspect in ours and aspect in paper and ours[aspect] != paper[aspect]]
