"""``attngeom``: a thin command line over :mod:`attngeom.api`.

The run commands are those declared in ``config.COMMANDS`` (``@command``): each gets
a subcommand, its help, and one option per field of its configuration, with the
field's help text and default, so a command and an option are each declared once;
values are passed to the configuration as given and validated there. What a run
prints is ``api.summary`` (``report/text.py``); the CLI formats nothing itself. The
other commands are the ``TOOLS`` entries.
Errors of the package become one line on stderr and exit status 2; nothing heavy is
imported before a command runs, so ``attngeom --help`` is quick.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass


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


def _add_config_options(p: argparse.ArgumentParser, cls, only=None) -> None:
    """One ``--flag`` per configuration field (those named in ``only`` where given);
    unset flags keep the field's default."""
    from attngeom.config import option_fields

    for name, tp, default, meta in option_fields(cls):
        if only is not None and name not in only:
            continue
        help_text = meta["help"]
        if "default" not in help_text:
            help_text += f" (default: {_show(default)})"
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=argparse.SUPPRESS,
                       metavar=meta.get("metavar") or _metavar(tp), help=help_text)


def _add_out(p: argparse.ArgumentParser, what: str, default: str | None = None) -> None:
    """``--out``: the one declaration every command's output folder shares."""
    shown = f" (default: {default})" if default else ""
    p.add_argument("--out", default=default, metavar="DIR", help=f"{what}{shown}")


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress or status lines")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    _add_out(p, "results directory (tables, manifest.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different attngeom run in --out (only attngeom's own files "
                   "are removed; a folder holding other files is refused and left as it is)")
    _add_quiet(p)


@dataclass(frozen=True)
class Tool:
    """A command that is not a run of ``config.COMMANDS`` (report, compare, check,
    reproduce, demo): its help, the arguments it adds, and what it does with them.
    Adding one is one entry of ``TOOLS`` (plus its function in ``api``)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    description: str | None = None


def _report_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's results directory")
    _add_out(p, "write the report here instead of RUN_DIR/report (a run one cannot write "
             "to)")


def _report(args) -> None:
    from attngeom import api

    print(f"report: {api.report(args.run_dir, args.out)}")


def _compare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", metavar="RUN_A", help="a finished analyze run with a taxonomy")
    p.add_argument("run_b", metavar="RUN_B", help="another run of the same model")


def _compare(args) -> None:
    from attngeom import api

    print(api.compare(args.run_a, args.run_b))


def _check_parser(p: argparse.ArgumentParser) -> None:
    from attngeom.config import RunConfig

    _add_config_options(p, RunConfig, only=("model", "device", "dtype", "quantization"))


def _check(args) -> None:
    from attngeom import api

    print(api.check(**_options(args)))


def _reproduce_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", metavar="STUDY",
                   help="a study TOML file, or demo, paper, followup (the shipped studies)")
    _add_out(p, "study directory (runs/, tables/, report/, study.json)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the file and list the cells, their windows and memory; run "
                   "nothing")
    p.add_argument("--overwrite", action="store_true",
                   help="recompute finished cells and replace different runs in --out")
    p.add_argument("--shard", metavar="K/N", default=None,
                   help="run share K of N of the cells (K from 1; default: a SLURM array's "
                   "or Kubernetes Indexed Job's index, else all); the process that finishes "
                   "the last cell writes the tables and report (docs/scale.md)")
    _add_quiet(p)


def _reproduce(args) -> None:
    from attngeom import api

    _print_study(api.reproduce(args.study, args.out, dry_run=args.dry_run,
                               overwrite=args.overwrite, progress=not args.quiet,
                               shard=args.shard))


def _demo_parser(p: argparse.ArgumentParser) -> None:
    _add_out(p, "results directory", default="runs/demo")
    _add_quiet(p)


def _demo(args) -> None:
    from attngeom import api

    _print_study(api.demo(args.out, progress=not args.quiet))


def _view_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?", default=None,
                   help="a finished run that read windows (analyze, atlas, prune, restrict, "
                   "...: its window is captured again); or give --prompt")
    p.add_argument("--prompt", metavar="TEXT", default=None,
                   help="view this text instead of a run's window")
    p.add_argument("--model", metavar="MODEL", default=None,
                   help="the model of --prompt: hub id, local directory, .gguf file or "
                   "asset:NAME (default: the bundled stories260K)")
    p.add_argument("--heads", metavar="L:H,...", default="0:0",
                   help="heads to view, as LAYER:HEAD,... (default: 0:0)")
    p.add_argument("--queries", metavar="N,...", default="-1",
                   help="query positions, negatives from the end (default: -1, the final "
                   "query)")
    p.add_argument("--window", metavar="W", type=int, default=None,
                   help="the run's window to view (default: its first)")
    p.add_argument("--n-max", metavar="N", type=int, default=None,
                   help="every N up to this on the slider (0: the grid's N only; default: "
                   "the largest N of the grid)")
    _add_out(p, "where the page goes: an .html file, or a folder for viewer.html in it "
             "(default: RUN_DIR/viewer.html, or viewer.html)")


def _view(args) -> None:
    from attngeom import api

    path = api.view(args.run_dir, prompt=args.prompt, model=args.model, heads=args.heads,
                    queries=args.queries, window=args.window, out=args.out, n_max=args.n_max)
    print(f"viewer: {path}")


TOOLS = {
    "report": Tool("build RUN_DIR/report/index.html", _report_parser, _report),
    "compare": Tool("regime stability between two runs", _compare_parser, _compare),
    "check": Tool("run the load-time self-checks on a model", _check_parser, _check),
    "reproduce": Tool(
        "every run of a study file, then one study report", _reproduce_parser, _reproduce,
        "Run every model x corpus cell of STUDY (a TOML file, or demo, paper, followup) "
        "through the common runner, skipping finished cells and resuming unfinished "
        "ones, then the cross-corpus and cross-model steps, then DIR/report/index.html."),
    "demo": Tool("the demo study (studies/demo.toml) on the shipped models", _demo_parser,
                 _demo),
    "view": Tool("the geometry viewer: one HTML page of chosen heads and queries",
                 _view_parser, _view,
                 "Write a self-contained HTML page (no external requests) showing, for each "
                 "chosen head and query of a run's window or of a prompt, every "
                 "key's contribution at its exact distance to the selected set's aggregate "
                 "(docs/viewer.md); prints its path."),
}


def build_parser() -> argparse.ArgumentParser:
    from attngeom.config import COMMANDS

    parser = argparse.ArgumentParser(
        prog="attngeom",
        description="Geometry of token selection in multi-head attention.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, spec in COMMANDS.items():
        p = sub.add_parser(name, help=spec.help,
                           description=(spec.config.__doc__ or "").replace("``", ""))
        _add_run_options(p)
        _add_config_options(p, spec.config)
        p.add_argument("--report", action="store_true", help="also build the HTML report")
    for name, tool in TOOLS.items():
        tool.add_arguments(sub.add_parser(name, help=tool.help,
                                          description=tool.description or tool.help))
    return parser


_NOT_OPTIONS = {"command", "version", "out", "overwrite", "quiet", "report"}


def _options(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if k not in _NOT_OPTIONS}


def _first_process() -> bool:
    """One process of a data-parallel run prints, the first."""
    return os.environ.get("RANK", "0") in ("", "0")


def _run(args: argparse.Namespace) -> int:
    from attngeom import api
    from attngeom.config import COMMANDS

    if args.command in COMMANDS:
        res = api.run(args.command, out=args.out, overwrite=args.overwrite,
                      progress=not args.quiet, **_options(args))
        if not _first_process():
            return 0
        print(api.summary(res))
        if res.out_dir is not None:
            print(f"results: {res.out_dir}")
            if args.report:
                print(f"report: {api.report(res.out_dir)}")
        return 0
    TOOLS[args.command].run(args)
    return 0


def _print_study(res) -> None:
    if res.out_dir is not None and not _first_process():
        return
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
        print("attngeom: interrupted; the finished windows are kept: rerun the same command "
              "to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
