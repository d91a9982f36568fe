"""``attngeom``: a thin command line over :mod:`attngeom.api`.

Every option of a run command comes from its configuration's fields
(``attngeom.config``), with the field's help text and default, so an option is
declared once; values are passed to the configuration as given and validated there.
Errors of the package become one line on stderr and exit status 2; nothing heavy is
imported before a command runs, so ``attngeom --help`` is quick.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
import typing
from collections.abc import Sequence

from attngeom.names import NO_REGIME, REGIMES

COMMAND_HELP = {
    "analyze": "top-N geometry, sink, taxonomy, bounds and diagnostics of a model",
    "prune": "keep-fraction pruning sweep per head ranker",
    "scan-heads": "remove each head alone; find critical heads",
    "restrict": "keep only the top-N attention entries per query; N*_tau",
}


def _metavar(tp) -> str | None:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if len(args) == 1 and _is_union(tp) else tp
    if typing.get_origin(base) is tuple:
        inner = typing.get_args(base)[0]
        if typing.get_origin(inner) is tuple:
            return "L:H,..."
        return {int: "N,...", float: "X,...", bool: "BOOL,...", str: "NAME,..."}.get(inner)
    return {int: "N", float: "X", str: None}.get(base)


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _show(default) -> str:
    if default is None:
        return "none"
    if isinstance(default, tuple):
        return ",".join(str(x).lower() if isinstance(x, bool) else str(x) for x in default)
    return str(default)


def _add_config_options(p: argparse.ArgumentParser, cls) -> None:
    """One ``--flag`` per configuration field; unset flags keep the field's default."""
    from attngeom.config import option_fields

    for name, tp, default, meta in option_fields(cls):
        help_text = meta["help"]
        if "default" not in help_text:
            help_text += f" (default: {_show(default)})"
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=argparse.SUPPRESS,
                       metavar=meta.get("metavar") or _metavar(tp), help=help_text)


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="results directory (tables, manifest.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different run in --out (removes only attngeom's files)")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def build_parser() -> argparse.ArgumentParser:
    from attngeom.config import COMMANDS

    parser = argparse.ArgumentParser(
        prog="attngeom",
        description="Geometry of token selection in multi-head attention.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cls in COMMANDS.items():
        p = sub.add_parser(name, help=COMMAND_HELP[name],
                           description=(cls.__doc__ or "").replace("``", ""))
        _add_run_options(p)
        _add_config_options(p, cls)
        if name == "analyze":
            p.add_argument("--report", action="store_true", help="also build the HTML report")

    r = sub.add_parser("report", help="build RUN_DIR/report/index.html")
    r.add_argument("run_dir")

    c = sub.add_parser("compare", help="regime stability between two runs")
    c.add_argument("run_a")
    c.add_argument("run_b")

    k = sub.add_parser("check", help="run the load-time self-checks on a model")
    k.add_argument("--model", help="hub id, local model directory or .gguf file (default: the "
                   "shared stories260K)")
    k.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    k.add_argument("--dtype", default="float32", help="model dtype (default: float32)")

    s = sub.add_parser("reproduce", help="every run of a study file, then one study report",
                       description="Run every model x corpus cell of STUDY (a TOML file, or "
                       "demo, paper, followup) through the common runner, skipping finished "
                       "cells and resuming unfinished ones, then the cross-corpus and "
                       "cross-model steps, then DIR/report/index.html.")
    s.add_argument("study", metavar="STUDY")
    s.add_argument("--out", help="study directory (runs/, tables/, report/, study.json)")
    s.add_argument("--dry-run", action="store_true",
                   help="check the file and list the cells, their windows and memory; run "
                   "nothing")
    s.add_argument("--overwrite", action="store_true",
                   help="recompute finished cells and replace different runs in DIR")
    s.add_argument("--quiet", action="store_true", help="no progress lines")

    d = sub.add_parser("demo", help="the demo study (studies/demo.toml) on the shared models")
    d.add_argument("--out", default="runs/demo", help="results directory (default: runs/demo)")
    d.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def _options(args: argparse.Namespace) -> dict:
    skip = {"command", "version", "out", "overwrite", "quiet", "report"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def _run(args: argparse.Namespace) -> int:
    from attngeom import api

    if args.command in COMMAND_HELP:
        run = {"analyze": api.analyze, "prune": api.prune, "scan-heads": api.scan_heads,
               "restrict": api.restrict}[args.command]
        res = run(out=args.out, overwrite=args.overwrite, progress=not args.quiet,
                  **_options(args))
        if os.environ.get("RANK", "0") not in ("", "0"):
            return 0  # one process of a data-parallel run prints, the first
        PRINTERS[args.command](res)
        if res.out_dir is not None:
            print(f"results: {res.out_dir}")
            if getattr(args, "report", False):
                print(f"report: {api.report(res.out_dir)}")
        return 0
    if args.command == "report":
        print(f"report: {api.report(args.run_dir)}")
        return 0
    if args.command == "compare":
        print(api.compare(args.run_a, args.run_b))
        return 0
    if args.command == "check":
        print(api.check(args.model, device=args.device, dtype=args.dtype))
        return 0
    if args.command == "reproduce":
        res = api.reproduce(args.study, args.out, dry_run=args.dry_run,
                            overwrite=args.overwrite, progress=not args.quiet)
        _print_study(res)
        return 0
    if args.command == "demo":
        _print_study(api.demo(args.out, progress=not args.quiet))
        return 0
    raise AssertionError(args.command)


def _print_analyze(res) -> None:
    _print_headline(res)
    summary = format_sink_and_regimes(res)
    if summary:
        print(summary)
    _print_skips(res.manifest.get("counts", {}))


def _print_prune(res) -> None:
    _print_table(res["pruning"], ["ranker", "seed", "order", "keep_fraction", "heads_kept",
                                  "perplexity", "delta_nll_rel"])


def _print_scan(res) -> None:
    df = res["head_scan"].sort_values("delta_nll_rel", ascending=False)
    _print_table(df.head(10), ["layer", "head", "nll", "delta_nll_rel", "critical"])


def _print_restrict(res) -> None:
    print(format_nstar(res))


PRINTERS = {"analyze": _print_analyze, "prune": _print_prune, "scan-heads": _print_scan,
            "restrict": _print_restrict}


def _print_skips(counts: dict) -> None:
    never = counts.get("never_valid_n") or []
    if never:
        print(f"skipped: N = {', '.join(map(str, never))} never fits a universe of these "
              f"windows (largest {counts.get('largest_universe')} keys); reported as NaN "
              "with n_queries = 0")
    if counts.get("nonfinite_rows"):
        print(f"skipped: {counts['nonfinite_rows']} query rows with non-finite attention "
              "or values")


def _print_table(df, columns) -> None:
    if columns:
        df = df[[c for c in columns if c in df.columns]]
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))


def _print_headline(res) -> None:
    table = res.headline()
    if table is not None:
        print(format_headline(table))


def format_headline(df) -> str:
    """F_N by N (rows) and rule (columns) as 'mean [low, high]'."""
    lines = ["F_N over all heads (mean over windows, 95% window-bootstrap interval)"]
    rules = list(dict.fromkeys(df["rule"]))
    lines.append("   N  " + "".join(f"{r:>26}" for r in rules))
    for n, part in df.groupby("n"):
        cells = []
        for r in rules:
            row = part[part["rule"] == r]
            if row.empty or row["mean"].isna().all():
                cells.append(f"{'(skipped)':>26}")
                continue
            m, lo, hi = row.iloc[0][["mean", "ci_low", "ci_high"]]
            cells.append(f"{f'{m:.3f} [{lo:.3f}, {hi:.3f}]':>26}")
        flag = "  (trivial)" if bool(part["trivial"].iloc[0]) else ""
        lines.append(f"{n:>4}  " + "".join(cells) + flag)
    return "\n".join(lines)


def format_nstar(res) -> str:
    """N*_tau by tau and renormalisation; "> N" where no N of the grid qualified."""
    ns = res["restrict_nstar"]
    largest = int(res["restrict"]["n"].max())
    ns = ns[ns["scope"] == "model"] if (ns["scope"] == "model").any() else ns
    cells = ns.assign(value=[f"> {largest}" if s == "above_grid" else f"{v:.0f}"
                             for v, s in zip(ns["n_star"], ns["n_star_status"], strict=True)])
    table = cells.pivot_table(index="tau", columns="renormalize", values="value",
                              aggfunc="first")
    table.columns = [f"renormalize={c}" for c in table.columns]
    return table.to_string()


def format_sink_and_regimes(res) -> str:
    """Per layer: sink value-norm ratio, sink cosine, sink mass, regimes and stability."""
    import pandas as pd

    parts = []
    if "sink" in res.tables:
        sink = res["sink"]
        n = int(sink["n"].min())
        parts.append(sink[sink["n"] == n].groupby("layer")[
            ["norm_ratio", "sink_cos_mean", "sink_mass"]].median())
    if "taxonomy" in res.tables:
        tax = res["taxonomy"]
        counts = tax.groupby("layer")["regime"].value_counts().unstack(fill_value=0)
        counts = counts[[r for r in (*REGIMES, NO_REGIME) if r in counts.columns]]
        counts["stability"] = tax.groupby("layer")["stability"].median()
        parts.append(counts)
    if not parts:
        return ""
    table = pd.concat(parts, axis=1)
    lines = ["per layer: median sink geometry over heads, heads per regime and median "
             "label stability", table.to_string(float_format=lambda x: f"{x:.2f}")]
    if "sink_tokens" in res.tables:
        st = res["sink_tokens"]
        found = st[(st["position"] != 0) & st["detected"]]
        if len(found):
            top = found.groupby("token").size().sort_values(ascending=False).head(5)
            lines.append("sinks by token besides position 0 (heads): "
                         + ", ".join(f"{k} ({v})" for k, v in top.items()))
        else:
            lines.append("sinks by token besides position 0: none")
    return "\n".join(lines)


def _print_study(res) -> None:
    if res.out_dir is not None and os.environ.get("RANK", "0") not in ("", "0"):
        return  # one process of a data-parallel run prints, the first
    print(res.summary())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from attngeom import __version__

        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from attngeom.errors import AttngeomError

    try:
        return _run(args)
    except AttngeomError as exc:
        print(f"attngeom {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attngeom: interrupted; nothing partial was written as finished", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
