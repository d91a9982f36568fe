"""``attngeom``: a thin command line over :mod:`attngeom.api`.

It parses arguments, calls one API function, and prints where the results went.
Errors of the package become one line on stderr and exit status 2; nothing heavy
is imported before a command runs, so ``attngeom --help`` is quick.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4,8, got {text!r}") from None


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,0.5, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [x for x in text.replace(",", " ").split() if x]


def _heads(text: str) -> list[tuple[int, int]]:
    out = []
    for item in _names(text):
        try:
            layer, head = item.split(":")
            out.append((int(layer), int(head)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected heads as LAYER:HEAD,LAYER:HEAD, got {item!r}"
            ) from None
    return out


def _common_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="hub id or local path (default: the shared stories260K)")
    p.add_argument("--corpus", help="file (.txt/.jsonl/.parquet) or dataset name "
                   "(wikitext-103, openwebtext); default: the shared TinyStories sample")
    p.add_argument("--out", help="results directory")
    p.add_argument("--overwrite", action="store_true", help="replace a different run in --out")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float16", "bfloat16", "float64"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attngeom",
        description="Geometry of token selection in multi-head attention.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    a = sub.add_parser("analyze", help="top-N geometry, sink, taxonomy, bounds of a model")
    _common_model(a)
    a.add_argument("--window-length", type=int, default=256)
    a.add_argument("--n-windows", type=int, default=32, help="0 = every window of the corpus")
    a.add_argument("--start-window", type=int, default=0)
    a.add_argument("--n-grid", type=_ints, default=[1, 2, 4, 8, 16, 32])
    a.add_argument("--query-mode", default="final", help="final | all | stride:k")
    a.add_argument("--rules", type=_names, default=["attention", "contribution", "random"])
    a.add_argument("--distances", type=_names, default=["euclidean"])
    a.add_argument("--variants", type=_names, default=["full", "no_sink"])
    a.add_argument("--analyses", type=_names,
                   default=["metrics", "sink", "taxonomy", "bounds", "assumptions"])
    a.add_argument("--repeats", type=int, default=None,
                   help="random-control repeats (default 16 for final, 2 otherwise)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--batch-size", type=int, default=4)
    a.add_argument("--chunk-size", type=int, default=None, help="query rows per chunk")
    a.add_argument("--bootstrap", type=int, default=1000)
    a.add_argument("--text-column", default="text")
    a.add_argument("--separator", default=None, help="document separator line in .txt files")
    a.add_argument("--doc-boundary", default="auto", help="auto | bos | eos | sep | none")
    a.add_argument("--boundary-token", default=None, help="token placed between documents")
    a.add_argument("--regime-rule", default="single", help="single | lumped")
    a.add_argument("--report", action="store_true", help="also build the HTML report")
    a.add_argument("--quiet", action="store_true", help="no progress bar")

    r = sub.add_parser("report", help="build RUN_DIR/report/index.html")
    r.add_argument("run_dir")

    c = sub.add_parser("compare", help="regime stability between two runs")
    c.add_argument("run_a")
    c.add_argument("run_b")

    p = sub.add_parser("prune", help="keep-fraction pruning sweep per head ranker")
    _common_model(p)
    p.add_argument("--rankers", type=_names,
                   default=["taxonomy", "magnitude", "entropy", "random", "gradient",
                            "sensitivity"])
    p.add_argument("--keep-fractions", type=_floats, default=[1.0, 0.9, 0.75, 0.5, 0.25])
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2])
    p.add_argument("--all-orders", action="store_true",
                   help="try all six regime orders for the taxonomy ranker")
    p.add_argument("--window-length", type=int, default=128)
    p.add_argument("--n-rank-windows", type=int, default=8)
    p.add_argument("--n-eval-windows", type=int, default=8)

    s = sub.add_parser("scan-heads", help="remove each head alone; find critical heads")
    _common_model(s)
    s.add_argument("--threshold", type=float, default=0.05)
    s.add_argument("--window-length", type=int, default=128)
    s.add_argument("--n-eval-windows", type=int, default=8)

    t = sub.add_parser("restrict", help="keep only the top-N attention entries per query")
    _common_model(t)
    t.add_argument("--n-grid", type=_ints, default=[1, 2, 4, 8, 16, 32, 64])
    t.add_argument("--scopes", type=_names, default=["model"], help="model,layer,head")
    t.add_argument("--layers", type=_ints, default=None)
    t.add_argument("--heads", type=_heads, default=None, help="LAYER:HEAD,...")
    renorm = t.add_mutually_exclusive_group()
    renorm.add_argument("--no-renormalize", action="store_true",
                        help="only the unrenormalised variant")
    renorm.add_argument("--renormalize-only", action="store_true",
                        help="only the renormalised variant")
    t.add_argument("--taus", type=_floats, default=[0.01, 0.05, 0.10])
    t.add_argument("--window-length", type=int, default=128)
    t.add_argument("--n-eval-windows", type=int, default=8)

    k = sub.add_parser("check", help="run the load-time self-checks on a model")
    k.add_argument("--model")
    k.add_argument("--device", default="cpu")
    k.add_argument("--dtype", default="float32")

    d = sub.add_parser("demo", help="the default study on the shared model and corpora")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--quick", action="store_true", help="fewer windows (a smoke test)")
    d.add_argument("--quiet", action="store_true")
    return parser


def _run(args: argparse.Namespace) -> int:
    from attngeom import api

    if args.command == "analyze":
        res = api.analyze(
            args.model, args.corpus, args.out, overwrite=args.overwrite,
            progress=not args.quiet, window_length=args.window_length,
            n_windows=args.n_windows or None, start_window=args.start_window,
            n_grid=tuple(args.n_grid), query_mode=args.query_mode, rules=tuple(args.rules),
            distances=tuple(args.distances), variants=tuple(args.variants),
            analyses=tuple(args.analyses), repeats=args.repeats, seed=args.seed,
            device=args.device, dtype=args.dtype, batch_size=args.batch_size,
            chunk_size=args.chunk_size, bootstrap=args.bootstrap,
            text_column=args.text_column, separator=args.separator,
            doc_boundary=args.doc_boundary, boundary_token=args.boundary_token,
            regime_rule=args.regime_rule,
        )
        _print_headline(res)
        summary = format_sink_and_regimes(res)
        if summary:
            print(summary)
        _print_skips(res.manifest.get("counts", {}))
        if res.out_dir is not None:
            print(f"results: {res.out_dir}")
            if args.report:
                print(f"report: {api.report(res.out_dir)}")
        return 0
    if args.command == "report":
        print(f"report: {api.report(args.run_dir)}")
        return 0
    if args.command == "compare":
        print(api.compare(args.run_a, args.run_b))
        return 0
    if args.command == "prune":
        res = api.prune(
            args.model, args.corpus, args.out, rankers=tuple(args.rankers),
            keep_fractions=tuple(args.keep_fractions), seeds=tuple(args.seeds),
            orders="all" if args.all_orders else None, window_length=args.window_length,
            n_rank_windows=args.n_rank_windows, n_eval_windows=args.n_eval_windows,
            device=args.device, dtype=args.dtype, overwrite=args.overwrite,
        )
        _print_table(res["pruning"], ["ranker", "seed", "order", "keep_fraction",
                                      "heads_kept", "perplexity", "delta_nll_rel"])
        _print_out(res)
        return 0
    if args.command == "scan-heads":
        res = api.scan_heads(
            args.model, args.corpus, args.out, threshold=args.threshold,
            window_length=args.window_length, n_eval_windows=args.n_eval_windows,
            device=args.device, dtype=args.dtype, overwrite=args.overwrite,
        )
        df = res["head_scan"].sort_values("delta_nll_rel", ascending=False)
        _print_table(df.head(10), ["layer", "head", "nll", "delta_nll_rel", "critical"])
        _print_out(res)
        return 0
    if args.command == "restrict":
        renorm = (True, False)
        if args.no_renormalize:
            renorm = (False,)
        elif args.renormalize_only:
            renorm = (True,)
        res = api.restrict(
            args.model, args.corpus, args.out, n_grid=tuple(args.n_grid),
            scopes=tuple(args.scopes), layers=args.layers, heads=args.heads,
            renormalize=renorm, taus=tuple(args.taus), window_length=args.window_length,
            n_eval_windows=args.n_eval_windows, device=args.device, dtype=args.dtype,
            overwrite=args.overwrite,
        )
        print(format_nstar(res))
        _print_out(res)
        return 0
    if args.command == "check":
        out = api.check(args.model, device=args.device, dtype=args.dtype)
        print(f"self-checks passed: {out['model']}")
        return 0
    if args.command == "demo":
        out = api.demo(args.out, quick=args.quick, progress=not args.quiet)
        _print_demo(out)
        return 0
    raise AssertionError(args.command)


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


def _print_out(res) -> None:
    if res.out_dir is not None:
        print(f"results: {res.out_dir}")


def _print_headline(res) -> None:
    from attngeom.pipeline.tables import headline

    if "summary" not in res.tables:
        return
    print(format_headline(headline(res["summary"])))


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
        counts = counts[[r for r in ("Retriever", "Mixer", "Reset", "none")
                         if r in counts.columns]]
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


def _print_demo(out: dict) -> None:
    for name, table in out["headline"].items():
        print(f"\n== {name} ==")
        print(format_headline(table))
        print(format_sink_and_regimes(out["results"][name]))
    print("\n== regimes, tinystories vs wikitext ==")
    print(out["comparison"])
    scan = out["head_scan"]["head_scan"].sort_values("delta_nll_rel", ascending=False)
    print("\n== most critical heads (remove one head alone) ==")
    _print_table(scan.head(5), ["layer", "head", "delta_nll_rel", "critical"])
    print("\n== pruning (perplexity by keep fraction, mean over seeds) ==")
    pr = out["pruning"]["pruning"]
    print(pr.pivot_table(index="keep_fraction", columns="ranker", values="perplexity")
          .to_string(float_format=lambda x: f"{x:.3f}"))
    print("\n== top-N restriction: effective set size N*_tau (whole model) ==")
    print(format_nstar(out["restrict"]))
    print()
    for name, path in out["runs"].items():
        print(f"results ({name}): {path}")
    print(f"results (head scan): {out['head_scan'].out_dir}")
    print(f"results (pruning): {out['pruning'].out_dir}")
    print(f"results (restriction): {out['restrict'].out_dir}")
    for name, path in out["reports"].items():
        print(f"report ({name}): {path}")


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
