"""``build_report(run_dir)``: one self-contained HTML page describing a run.

The page holds the run's manifest, a summary of findings in plain numbers, every
figure ``attngeom.figures`` can draw from the run (embedded as base64 PNG), the
key tables and a list of every table the run holds. Sections appear only for
what the run holds; figures that could not be drawn are listed with the reason.
"""

from __future__ import annotations

from pathlib import Path

from attngeom.errors import RunDirError
from attngeom.figures.render import RenderedFigure, render_figures
from attngeom.figures.runtables import RunTables, load_run
from attngeom.figures.style import DPI
from attngeom.report import findings as F
from attngeom.report.html import (
    esc,
    facts_html,
    figure_html,
    fmt,
    json_details,
    page,
    plural,
    table_html,
)


def build_report(run_dir, *, out=None, formats=("png", "pdf"), viewer=None) -> Path:
    """Write ``run_dir/report/index.html`` (figures beside it in ``report/figures``), or
    ``out/index.html`` where ``out`` is given (a run one cannot write to).

    Raises ``attngeom.errors.RunDirError`` naming the file when ``run_dir`` is not a
    run or one of its listed tables is missing or unreadable, and with one line when
    the report's folder cannot be written.

    ``build_report("runs/demo/tinystories")`` writes and returns
    ``runs/demo/tinystories/report/index.html``.

    For an analyze run with a taxonomy, ``viewer`` (a function ``(out_html, run_dir,
    heads)`` writing the geometry viewer, ``attngeom.viewer.write_viewer`` through
    ``api.report``; the report layer does not import the viewer) writes ``viewer.html``
    beside the page (the geometry viewer of the two heads of each regime with the largest
    winning share, at the final query of the run's first window, the grid's N only) and
    links each of those heads' rows in the per-head taxonomy table to it
    (``viewer.html#L{layer}H{head}``); where the run's model or corpus cannot be
    loaded again the report says so in a note.
    """
    run = load_run(run_dir)
    out = Path(run_dir) / "report" if out is None else Path(out)
    fig_dir = out / "figures"
    try:
        fig_dir.mkdir(parents=True, exist_ok=True)
        probe = out / ".attngeom-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"cannot write the report to {out}: {e.strerror or type(e).__name__}"
                          "; pass --out DIR to write it elsewhere") from None
    rendered = render_figures(run, fig_dir, formats=formats)
    notes = list(rendered.notes)
    notes += [f"manifest.json lists table {name!r}, which this version of attngeom does not "
              "know; it is not shown" for name in run.unknown]
    viewed = _viewer_page(run, out, notes, viewer) if viewer is not None else set()
    html = render_html(run, rendered.figures, notes, base=out, viewed=viewed)
    index = out / "index.html"
    index.write_text(html, encoding="utf-8")
    return index


VIEWER_FILE = "viewer.html"
VIEWER_HEADS_PER_REGIME = 2


def viewer_heads(taxonomy, per_regime: int = VIEWER_HEADS_PER_REGIME) -> list[tuple[int, int]]:
    """The heads the report's viewer page shows: per regime, those with the largest
    winning share (ties by layer and head)."""
    tax = taxonomy.drop_duplicates(["layer", "head"]).copy()
    tax["regime"] = tax["regime"].astype(str)
    key = "winning_share" if "winning_share" in tax.columns else "layer"
    heads = []
    for _, grp in tax.sort_values([key, "layer", "head"], ascending=[False, True, True]
                                  ).groupby("regime", sort=True):
        heads += [(int(r.layer), int(r.head)) for r in grp.head(per_regime).itertuples()]
    return sorted(set(heads))


def _viewer_page(run: RunTables, out: Path, notes: list[str], write
                 ) -> set[tuple[int, int]]:
    """Write ``out/viewer.html`` for an analyze run's ``viewer_heads`` (empty set and a
    note where it cannot be written; nothing for other runs)."""
    taxonomy = run.get("taxonomy")
    if run.manifest.get("command") != "analyze" or taxonomy is None or not len(taxonomy):
        return set()
    from attngeom.errors import AttngeomError

    heads = viewer_heads(taxonomy)
    try:
        write(out / VIEWER_FILE, run.run_dir, heads)
    except (AttngeomError, OSError) as e:
        notes.append(f"the geometry viewer page was not written: {e}")
        return set()
    return set(heads)


def _taxonomy_heads_html(taxonomy, viewed: set[tuple[int, int]]) -> str:
    """The per-head taxonomy table, each viewed head's row linked to its viewer page."""
    cols = [c for c in ("regime", "winning_share", "stability", "f_self", "f_sink",
                        "f_other", "top_source_kind", "top_source") if c in taxonomy.columns]
    df = taxonomy.drop_duplicates(["layer", "head"]).sort_values(["layer", "head"])
    df = df.set_index(["layer", "head"])[cols].copy()
    df.insert(0, "viewer", [f"@@VIEW:L{la}H{h}@@" if (la, h) in viewed else ""
                            for la, h in df.index])
    html = table_html(df, caption="Heads (a link opens the head in the geometry viewer)")
    for la, h in viewed:
        tag = f"L{la}H{h}"
        html = html.replace(f"@@VIEW:{tag}@@",
                            f'<a href="{VIEWER_FILE}#{tag}">view {tag}</a>')
    return html


def render_html(run: RunTables, figures: list[RenderedFigure], notes: list[str],
                base: Path, viewed: set[tuple[int, int]] | None = None) -> str:
    manifest = run.manifest
    corpus = manifest.get("corpus") or {}
    title = f"attngeom report: {run_title(manifest, run.run_dir)}"
    subtitle = " | ".join(str(x) for x in (
        f"corpus {corpus['name']}" if corpus.get("name") else None,
        f"created {manifest['created']}" if manifest.get("created") else None,
        f"attngeom {manifest['attngeom_version']}" if manifest.get("attngeom_version")
        else None,
    ) if x)

    summary = run.get("summary")
    if summary is None and run.get("metrics") is not None:
        from attngeom.figures.separability import summary_from_metrics

        summary = summary_from_metrics(run.get("metrics"))

    blocks: list[tuple[str, str, str]] = [("run", "Run", _manifest_section(run))]
    sentences = _findings(run, summary)
    if sentences:
        items = "".join(f"<li>{esc(s)}</li>" for s in sentences)
        groups = run.groups()
        about = (f" ({groups[0][0]} on {groups[0][1]})" if len(groups) == 1 else "")
        blocks.append(("findings", f"Findings{about}", f'<ul class="findings">{items}</ul>'))

    def frame(name):
        return summary if name == "summary" else run.get(name)

    for section in F.SECTIONS:
        figs = [f for f in figures if f.section == section.name]
        tabs = section.tables(*(frame(n) for n in section.reads))
        if not figs and not tabs:
            continue
        parts = [figure_html(f.name, f.title, f.caption, f.png, _pdf(f), f.tables, DPI, base)
                 for f in figs]
        parts += [table_html(_drop_constant_keys(df), caption=cap) for cap, df in tabs]
        if section.name == "taxonomy" and viewed:
            parts.append(_taxonomy_heads_html(run.get("taxonomy"), viewed))
        blocks.append((section.name, section.heading, "".join(parts)))

    blocks.append(("tables", "Tables in this run", _tables_section(run)))
    if notes:
        blocks.append(("notes", "Notes",
                       "".join(f'<p class="note">{esc(n)}</p>' for n in notes)))

    body = "".join(f'<section id="{esc(anchor)}"><h2>{esc(heading)}</h2>{content}</section>'
                   for anchor, heading, content in blocks)
    toc = [(anchor, heading) for anchor, heading, _ in blocks]
    return page(title, subtitle, toc, body)


def _drop_constant_keys(df):
    """Drop ``model`` / ``corpus`` index levels that hold one value (the manifest says it)."""
    names = list(df.index.names)
    drop = [n for n in ("model", "corpus")
            if n in names and df.index.get_level_values(n).nunique() == 1]
    if drop and len(drop) < len(names):
        df = df.droplevel(drop)
    return df


def _pdf(figure: RenderedFigure):
    return next((p for p in figure.files if p.suffix == ".pdf"), None)


def _findings(run: RunTables, summary) -> list[str]:
    out: list[str] = []
    groups = run.groups()
    for model, corpus in groups:
        label = f"[{model}, {corpus}] " if len(groups) > 1 else ""

        def only(name, model=model, corpus=corpus):
            df = summary if name == "summary" else run.get(name)
            if df is None:
                return None
            sub = df[(df["model"].astype(str) == model) & (df["corpus"].astype(str) == corpus)]
            return sub if len(sub) else None

        for section in F.SECTIONS:
            frames = [only(n) for n in section.reads]
            for sentences in section.sentences:
                out += sentences(*frames, label)
    return out




def run_title(manifest: dict, run_dir: Path) -> str:
    """The model's name (its label, else the last part of its path or hub id), not the
    path it was loaded from."""
    label = (manifest.get("config") or {}).get("model_label")
    name = (manifest.get("model") or {}).get("name")
    if label:
        return str(label)
    if name:
        return Path(str(name)).name or str(name)
    return run_dir.name


def portable(value):
    """``value`` with every absolute path of this machine cut to its last part, so a
    report shows no home folder or mount point when it is shared."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(portable(v) for v in value)
    if isinstance(value, str) and len(value) > 1 and (value.startswith(("/", "~"))
                                                      or value[1:3] == ":\\"):
        return f".../{Path(value).name}"
    return value


def _manifest_section(run: RunTables) -> str:
    m = run.manifest
    model = m.get("model") or {}
    corpus = m.get("corpus") or {}
    m = portable(m)
    model = m.get("model") or {}
    corpus = m.get("corpus") or {}
    facts = [("run directory", run.run_dir.name)]
    if m.get("command"):
        facts.append(("command", m["command"]))
    if model:
        shape = ", ".join(f"{fmt(model[k])} {label}" for k, label in (
            ("num_layers", "layers"), ("num_heads", "heads"), ("num_kv_heads", "kv heads"),
            ("head_dim", "head dim")) if k in model)
        facts.append(("model", f"{model.get('name', '?')} ({model.get('class', '?')})"))
        if shape:
            facts.append(("model shape", shape))
        if model.get("sha256"):
            facts.append(("model sha256", model["sha256"]))
    if corpus:
        facts.append(("corpus", f"{corpus.get('name', '?')}: "
                                f"{plural(corpus.get('n_windows'), 'window')} of "
                                f"{fmt(corpus.get('window_length'))} tokens"))
        if corpus.get("sha256"):
            facts.append(("corpus sha256", corpus["sha256"]))
    if "seed" in m:
        facts.append(("seed", m["seed"]))
    for key in ("versions", "timings", "counts"):
        value = m.get(key)
        if isinstance(value, dict) and value:
            facts.append((key, ", ".join(f"{k} {fmt(v)}" for k, v in value.items())))
    if m.get("created"):
        facts.append(("created", m["created"]))
    parts = [facts_html(facts)]
    if m.get("config"):
        parts.append(json_details("configuration", m["config"]))
    parts.append(json_details("full manifest.json", m))
    return "".join(parts)


def _tables_section(run: RunTables) -> str:
    import pandas as pd

    rows = [{"table": name, "file": run.files.get(name, f"{name}.parquet"),
             "rows": len(df), "columns": ", ".join(map(str, df.columns))}
            for name, df in run.tables.items()]
    if not rows:
        return '<p class="note">The manifest lists no tables.</p>'
    df = pd.DataFrame(rows).set_index("table")
    return table_html(df, table_id="table-list")
