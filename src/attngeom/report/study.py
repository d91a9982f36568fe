"""``build_study_report(study_dir)``: one self-contained page for a whole study.

It reads ``study.json`` and the combined tables of ``tables/`` (written by
``attngeom reproduce``) and shows the models side by side: the top-N curves overlaid,
the sink's geometry by depth, regime shares with their stability and their agreement
between corpora, pruning and restriction curves, N*_tau, the geometry-versus-loss
correlation, the sparse-attention policies against the oracle (``report/policies.py``),
the published reference values beside the measured ones, and a link to every run's own
report. Figures are embedded (base64 PNG), PDFs sit beside the page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attngeom.errors import RunDirError
from attngeom.figures.study import STUDY_FIGURES
from attngeom.figures.style import DPI, save
from attngeom.report.findings import main_rows, main_setting
from attngeom.report.html import esc, facts_html, figure_html, fmt, json_details, page, table_html
from attngeom.report.policies import study_policy_findings, study_policy_tables
from attngeom.report.tables import keyed
from attngeom.results.io import read_table
from attngeom.results.schemas import SCHEMAS


def _load(study_dir: Path) -> tuple[dict, dict]:
    try:
        record = json.loads((study_dir / "study.json").read_text(encoding="utf-8"))
    except OSError:
        raise RunDirError(f"{study_dir} is not a study directory: no study.json") from None
    except ValueError as e:
        raise RunDirError(f"cannot read {study_dir / 'study.json'}: {e}") from None
    tables = {}
    for name in record.get("tables", {}):
        if name in SCHEMAS:
            tables[name] = read_table(study_dir / "tables", name)
    return record, tables


def build_study_report(study_dir, *, formats=("png", "pdf")) -> Path:
    """Write ``study_dir/report/index.html`` and return its path."""
    study_dir = Path(study_dir)
    record, tables = _load(study_dir)
    out = study_dir / "report"
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    blocks = [("study", "Study", _study_section(record, study_dir))]
    findings = study_findings(tables)
    if findings:
        items = "".join(f"<li>{esc(s)}</li>" for s in findings)
        blocks.append(("findings", "Findings", f'<ul class="findings">{items}</ul>'))
    notes = []
    figures = []
    for fig_id, title, table, draw, caption in STUDY_FIGURES:
        df = tables.get(table)
        if df is None or not len(df):
            continue
        try:
            drawn = draw(df, models=list(record.get("models", {})),
                         corpora=list(record.get("corpora", {})))
        except (KeyError, ValueError) as e:  # a table without what the figure needs
            notes.append(f"figure {fig_id} not drawn: {type(e).__name__}: {e}")
            continue
        paths = save(drawn.figure, fig_dir, fig_id, formats=formats)
        png = next(p for p in paths if p.suffix == ".png")
        pdf = next((p for p in paths if p.suffix == ".pdf"), None)
        figures.append(figure_html(fig_id, title, caption, png, pdf, [table], DPI, out))
    if figures:
        blocks.append(("figures", "Models side by side", "".join(figures)))
    tab_html = "".join(table_html(df, caption=cap) for cap, df in
                       study_tables(tables) + new_part_tables(tables, record)
                       + study_policy_tables(tables))
    if tab_html:
        blocks.append(("tables", "Tables across models and corpora", tab_html))
    blocks.append(("references", "Published values",
                   _references_section(tables, record.get("reference_notes", {}))))
    blocks.append(("files", "Files", _files_section(record, study_dir)))
    if notes:
        blocks.append(("notes", "Notes",
                       "".join(f'<p class="note">{esc(n)}</p>' for n in notes)))
    body = "".join(f'<section id="{esc(a)}"><h2>{esc(h)}</h2>{c}</section>'
                   for a, h, c in blocks)
    from attngeom.report.html import plural

    subtitle = " | ".join(x for x in (
        plural(len(record.get('cells', [])), "run"), f"created {record.get('created', '?')}",
        f"attngeom {record.get('attngeom_version', '?')}") if x)
    html = page(record.get("title") or f"attngeom study {record.get('study')}", subtitle,
                [(a, h) for a, h, _ in blocks], body)
    index = out / "index.html"
    index.write_text(html, encoding="utf-8")
    return index


# --------------------------------------------------------------------------- sections


def _study_section(record: dict, study_dir: Path) -> str:
    from attngeom.report.build import portable
    from attngeom.report.text import format_protocol

    record = portable(record)  # no absolute path of this machine in a shared report
    facts = [("study", record.get("study")), ("file", record.get("file")),
             ("file sha256", record.get("sha256")),
             ("analyses", ", ".join(record.get("analyses", []))),
             ("wall time", f"{fmt(record.get('wall_s'))} s")]
    for line in format_protocol(record.get("protocol") or {}):
        command, _, text = line.partition(": ")
        facts.append((f"protocol of {command}", text))
    for label, m in record.get("models", {}).items():
        shape = m.get("shape") or {}
        kind = "decoder" if m.get("is_causal") else "encoder" if m.get("is_causal") is False \
            else "?"
        facts.append((f"model {label}", f"{m.get('model')} ({kind}, "
                      f"{fmt(shape.get('layers'))} layers x {fmt(shape.get('heads'))} heads, "
                      f"{fmt(shape.get('kv_heads'))} kv heads)"))
    for label, c in record.get("corpora", {}).items():
        extra = ", ".join(f"{k} {v}" for k, v in c.items() if k != "corpus")
        facts.append((f"corpus {label}", c.get("corpus") + (f" ({extra})" if extra else "")))
    parts = []
    if record.get("description"):
        parts.append(f"<p>{esc(record['description'])}</p>")
    parts.append(facts_html(facts))
    rows = []
    reports = record.get("run_reports", {})
    for cell in record.get("cells", []):
        link = reports.get(cell["directory"])
        href = f'<a href="../{esc(link)}">report</a>' if link else ""
        rows.append(
            f"<tr><td>{esc(cell['model'])}</td><td>{esc(cell['corpus'])}</td>"
            f"<td>{esc(cell['command'])}</td><td>{esc(cell['status'])}</td>"
            f"<td>{fmt(cell.get('wall_s'))}</td><td><code>{esc(cell['directory'])}</code></td>"
            f"<td>{href}</td></tr>")
    parts.append(
        '<h3>Runs</h3><div class="tablewrap" id="run-list"><table class="data"><thead><tr>'
        "<th>model</th><th>corpus</th><th>command</th><th>status</th><th>wall s</th>"
        "<th>directory</th><th>run report</th></tr></thead><tbody>" + "".join(rows)
        + "</tbody></table></div>")
    parts.append(json_details("study.json", record))
    return "".join(parts)


def _files_section(record: dict, study_dir: Path) -> str:
    rows = [{"table": name, "file": path, "rows": _rows(study_dir / path)}
            for name, path in record.get("tables", {}).items()]
    if not rows:
        return '<p class="note">No tables.</p>'
    return table_html(pd.DataFrame(rows).set_index("table"), table_id="table-list")


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, ValueError):
        return -1


_VERDICT_ORDER = {"match": 0, "context": 1}


def _paper_model_text(models: str, size: str) -> str:
    names = [m for m in str(models).split(",") if m]
    who = names[0] if len(names) == 1 else f"{len(names)} models"
    return f"{who} ({size})" if size and size != "?" else who


def _lengths(text: str) -> str:
    """``256,512,1024,2048`` -> ``256..2048 (4)``; ``-`` where there is no L."""
    values = [x for x in str(text or "").split(",") if x]
    if len(values) > 1:
        return f"{values[0]}..{values[-1]} ({len(values)})"
    return values[0] if values else "-"


REFERENCE_WRAP = ("quantity and setting", "what differs", "note")
REFERENCE_NARROW = ("ours: model (size), corpus", "paper's: model (size), corpus")


def reference_table(ref) -> pd.DataFrame:
    """The measured rows of ``reference_values`` as the report shows them: the verdict,
    both models with their sizes and both window lengths first (the first screen), then
    the value, ours, and what differs."""
    rows = ref[ref["kind"].isin(list(_VERDICT_ORDER))].copy()
    rows["order"] = rows["kind"].map(_VERDICT_ORDER)
    keys = ["order", *(["paper_order"] if "paper_order" in rows.columns else []),
            "model", "corpus"]
    rows = rows.sort_values(keys, kind="stable")  # within a verdict, the paper's order
    out = pd.DataFrame({
        "verdict": rows["kind"],
        "ours: model (size), corpus": [
            f"{m} ({z}), {c}" for m, z, c in zip(rows["model"], rows["our_size"],
                                                 rows["corpus"], strict=True)],
        "paper's: model (size), corpus": [
            f"{_paper_model_text(m, z)}, {c}" for m, z, c in
            zip(rows["paper_models"], rows["paper_size"], rows["paper_corpus"],
                strict=True)],
        "L ours / paper": [f"{_lengths(a)} / {_lengths(b)}" for a, b in
                           zip(rows["our_length"], rows["paper_length"], strict=True)],
        "published": rows["published_text"],
        "ours": rows["measured"],
        "ours - published": rows["difference"],
        "quantity and setting": [f"{q}: {setting_text(p)}" for q, p in
                                 zip(rows["quantity"], rows["params"], strict=True)],
        "what differs": rows["differs"].replace("", "-"),
        "where": rows["location"],
        "note": rows["quote"],
    })
    return out.reset_index(drop=True)


def setting_text(params: str) -> str:
    """A reference's setting (its JSON ``params``) in a few words: ``attention, deleted,
    tau 5%, L 1024, all targets``; the probes' settings say which (``nested context``,
    ``bAbI qa1``, ``background 1K``); the fixed protocol and document count stay in the
    table."""
    try:
        p = json.loads(params)
    except (TypeError, ValueError):
        return str(params)
    parts = []
    for key in ("ranking", "rule"):
        if key in p:
            parts.append(str(p[key]))
    if "renormalize" in p:
        parts.append("renormalised" if p["renormalize"] else "deleted")
    if p.get("scope", "model") != "model":
        parts.append(f"{p['scope']} only")
    if "tau" in p:
        parts.append(f"tau {fmt(100 * float(p['tau']))}%")
    if "tau_nats" in p:
        parts.append(f"tau {p['tau_nats']} nat")
    for key, label in (("n", "N = "), ("n_min", "N >= "), ("distance", ""),
                       ("layer", "layer "), ("head", "head "),
                       ("window_length", "L "), ("background", "background "),
                       ("regime", "")):
        if key in p:
            parts.append(f"{label}{p[key]}")
    if "scoring" in p:
        parts.append("all targets" if p["scoring"] == "all" else "final 128 targets")
    if p.get("n_star_rule") == "stable":
        parts.append("every larger N passing")
    protocol = {"context": "nested context", "qa": "bAbI qa1"}.get(p.get("protocol"))
    if protocol:
        parts.insert(0, protocol)
    return ", ".join(parts) or "-"


def _references_section(tables: dict, unavailable: dict) -> str:
    """Published values beside ours, one row each with its verdict: *match* where the
    model, corpus and protocol agree (``studies.comparable``), else *context* with what
    differs; then, folded, the paper's values for our models in settings we did not run."""
    parts = []
    ref = tables.get("reference_values")
    if ref is not None and len(ref) and "kind" in ref.columns:
        shown = reference_table(ref)
        kinds = ref["kind"].value_counts()
        if len(shown):
            parts.append(
                f"<p>{int(kinds.get('match', 0))} published values match a measurement of "
                f"this study (same model, corpus, tau, ranking, renormalisation, scope, "
                f"window length L, windows, scoring and N* search); "
                f"{int(kinds.get('context', 0))} more are shown as context, with what "
                "differs (sizes are parameter counts; a paper's range over its models is "
                "never a match).</p>")
            parts.append(table_html(shown, index=False, table_id="reference-values",
                                    wrap=REFERENCE_WRAP, narrow=REFERENCE_NARROW))
        rest = ref[ref["kind"] == "not measured"]
        if len(rest):
            cols = ["model", "corpus", "quantity", "published_text", "setting",
                    "location", "quote"]
            rest = rest.assign(setting=rest["params"].map(setting_text))
            parts.append(f"<details><summary>{len(rest)} published values of the study's "
                         "models in settings this study did not run</summary>" + table_html(
                             rest[cols].rename(columns={"published_text": "published",
                                                        "quote": "note"}),
                             index=False, table_id="reference-unmeasured",
                             wrap=("setting", "note")) + "</details>")
    elif ref is not None and len(ref):
        shown = ref.set_index(["model", "corpus", "quantity", "params"])[
            ["published", "measured", "source", "location", "quote"]]
        parts.append(table_html(shown, table_id="reference-values"))
    if not parts:
        parts.append('<p class="note">No published value matches a model and corpus of this '
                     "study (values are matched by preset and corpus name), and none of the "
                     "paper's settings was measured here for context.</p>")
    for source, why in unavailable.items():
        parts.append(f'<p class="note">{esc(source)}: {esc(why)}</p>')
    return "".join(parts)


# --------------------------------------------------------------------------- tables, prose


def _first_n(summary, wanted: int = 8) -> int | None:
    ns = sorted(int(n) for n in summary["n"].unique())
    ns = [n for n in ns if n > 1] or ns
    return min(ns, key=lambda n: abs(n - wanted)) if ns else None


def _headline(summary) -> pd.DataFrame | None:
    if summary is None or not len(summary):
        return None
    rows = summary[(summary["scope"] == "model") & (summary["metric"] == "f_score")
                   & (summary["variant"] == "full")]
    if not len(rows):
        return None
    return keyed(rows, ["model", "corpus", "distance", "rule"], "n", "mean", "summary")


def _regime_shares(taxonomy) -> pd.DataFrame | None:
    if taxonomy is None or not len(taxonomy):
        return None
    t = taxonomy.copy()
    share = pd.crosstab([t["model"], t["corpus"]], t["regime"], normalize="index")
    if "stability" in t:
        share["median stability"] = t.groupby(["model", "corpus"])["stability"].median()
    return share


def _ns_text(ns: str) -> str:
    """``"1,2,4,8,16"`` -> ``1..16 (5 sizes)``."""
    values = [x for x in str(ns).split(",") if x]
    return f"{values[0]}..{values[-1]} ({len(values)} sizes)" if values else "none"


def _spearman_table(gl) -> pd.DataFrame:
    """Table 1's layout: a column per N_min, each with the N its correlation ran over."""
    index = ["model", "corpus", "distance", "rule", "renormalize"]
    rho = keyed(gl, index, "n_min", "spearman", "geometry_loss")
    over = keyed(gl.assign(ns=gl["ns"].map(_ns_text)), index, "n_min", "ns",
                 "geometry_loss")
    out = pd.DataFrame(index=rho.index)
    for k in rho.columns:
        out[f"N >= {k}"] = rho[k]
        out[f"N >= {k}: N over"] = over[k]
    return out


def study_tables(tables: dict) -> list[tuple[str, pd.DataFrame]]:
    out = []
    h = _headline(tables.get("summary"))
    if h is not None:
        out.append(("F_N (whole model) by N", h))
    r = _regime_shares(tables.get("taxonomy"))
    if r is not None:
        out.append(("Regime shares and label stability", r))
    st = tables.get("regime_stability")
    if st is not None and len(st):
        out.append(("Regime agreement between corpora", st.set_index(
            ["model", "corpus", "other_corpus"])))
    sink = tables.get("sink")
    if sink is not None and len(sink):
        s = sink[sink["n"] == sink["n"].min()]
        out.append(("Sink (median over heads and layers)", s.groupby(["model", "corpus"])[
            ["norm_ratio", "sink_cos_mean", "sink_mass"]].median()))
    ns = tables.get("restrict_nstar")
    if ns is not None and len(ns):
        m = ns[ns["scope"] == "model"]
        if "ranking" not in m.columns:
            m = m.assign(ranking="attention")
        m = m.assign(treatment=m["renormalize"].map(
            lambda x: "renormalised" if bool(x) else "deleted"))
        index = ["model", "corpus", "ranking", "treatment"]
        values = ["n_star", *(["grid_n_star"] if "grid_n_star" in m.columns else [])]
        wide = pd.concat({v: keyed(m, index, "tau", v, "restrict_nstar") for v in values},
                         axis=1)
        wide.columns = [f"{v} tau={fmt(t)}" for v, t in wide.columns]
        out.append(("Effective set size N*_tau (whole model; n_star: the integer search, "
                    "grid_n_star: the smallest power of two passing)", wide))
    gl = tables.get("geometry_loss")
    if gl is not None and len(gl):
        if "n_min" in gl.columns:
            out.append(("Geometry against loss (the follow-up's Table 1, whose columns are "
                        "N >= 1, 2, 8 over the nine sizes 1..256): Spearman over N of F_N "
                        "and relative delta-NLL, each averaged over the corpora first "
                        "(corpus a+b), then each corpus alone; 'N over' names the sizes "
                        "each correlation ran over", _spearman_table(gl)))
        else:
            out.append(("Geometry against loss: Spearman of F_N and relative delta-NLL "
                        "over N", gl.set_index(["model", "corpus", "distance",
                                                "renormalize"])[["n_points", "ns",
                                                                 "spearman"]]))
    pr = tables.get("pruning")
    if pr is not None and len(pr):
        pr = pr.assign(order=pr["order"].fillna("").astype(str))
        mean = pr.groupby(["model", "corpus", "ranker", "order", "keep_fraction"],
                          as_index=False)["perplexity"].mean()
        wide = keyed(mean, ["model", "corpus", "ranker", "order"], "keep_fraction",
                     "perplexity", "pruning")
        wide = wide[sorted(wide.columns, reverse=True)]
        wide.columns = [f"keep {fmt(c)}" for c in wide.columns]
        out.append(("Pruning: perplexity by ranker (and taxonomy order) and fraction of heads "
                    "kept (mean over seeds)", wide))
    hs = tables.get("head_scan")
    if hs is not None and len(hs):
        critical = hs[hs["critical"].astype(bool)]  # only heads marked critical
        top = (critical if len(critical) else hs).sort_values(
            "delta_nll_rel", ascending=False).groupby(["model", "corpus"]).head(3)
        out.append(("Most critical heads (single-head removal)" if len(critical) else
                    "No head is critical: the largest single-head effects", top.set_index(
            ["model", "corpus", "layer", "head"])[["delta_nll_rel", "critical"]]))
    return out


def study_findings(tables: dict) -> list[str]:
    """Plain sentences with the study's main numbers, one group per model and corpus."""
    out = []
    summary = tables.get("summary")
    if summary is not None and len(summary):
        n = _first_n(summary)
        rows = main_rows(summary)
        rows = rows[(rows["metric"] == "f_score") & (rows["n"] == n)]
        for (m, c), g in rows.groupby(["model", "corpus"], sort=True):
            by = {r: g[g["rule"] == r] for r in ("attention", "random")}
            if len(by["attention"]) and len(by["random"]):
                a, r = by["attention"].iloc[0], by["random"].iloc[0]
                out.append(f"{m} on {c} ({main_setting(g)}): F_{n} = {fmt(a['mean'])} "
                           f"[{fmt(a['ci_low'])}, {fmt(a['ci_high'])}] for the "
                           f"attention-selected set against {fmt(r['mean'])} for random "
                           "sets of the same size.")
    st = tables.get("regime_stability")
    if st is not None:
        for row in st.itertuples(index=False):
            out.append(f"{row.model}: the same regime on {row.corpus} and {row.other_corpus} "
                       f"for {fmt(100 * row.agreement)}% of {row.n_heads} heads (Cohen's kappa "
                       f"{fmt(row.kappa)}).")
    ns = tables.get("restrict_nstar")
    if ns is not None and len(ns):
        m = ns[(ns["scope"] == "model") & (~ns["renormalize"].astype(bool))]
        if "ranking" not in m.columns:
            m = m.assign(ranking="attention")
        for (model, corpus, ranking), g in m.groupby(["model", "corpus", "ranking"],
                                                     sort=True):
            parts = ", ".join(f"N*_{fmt(100 * t)}% = {fmt(v)}" for t, v in
                              zip(g["tau"], g["n_star"], strict=True))
            out.append(f"{model} on {corpus}, top-N restriction by {ranking} without "
                       f"renormalisation: {parts}.")
    gl = tables.get("geometry_loss")
    if gl is not None and len(gl) and "n_min" in gl.columns:
        main = gl[gl["n_min"] == 1]
        if main["averaged"].any():
            main = main[main["averaged"].astype(bool)]
        gl = main
    if gl is not None:
        for row in gl.itertuples(index=False):
            rule = f" ({row.rule} ranking, {row.distance})" if hasattr(row, "n_min") else ""
            paper = " (the follow-up's Table 1: the nine N = 1..256)" \
                if hasattr(row, "n_min") else ""
            out.append(f"{row.model} on {row.corpus}{rule}: Spearman correlation of F_N with "
                       f"the restriction's relative delta-NLL over N = {row.ns}"
                       f"{paper}: {fmt(row.spearman)}.")
    return out + study_policy_findings(tables)


# --------------------------------------------------------------------------- issue 31-32


def _background_label(tokens: int) -> str | None:
    """0 -> "0K", 1024 -> "1K" (the paper's background names); None for other lengths."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else None


def _published(tables: dict, model: str, corpus: str, quantity: str, **setting
               ) -> tuple[float, str]:
    """The published value of ``quantity`` for study model ``model`` on study corpus
    ``corpus`` in ``setting``, and its verdict, as the study's ``reference_values``
    lists it (``studies.combine.reference_values``: only where the model is one the paper
    ran and the corpus one it ran it on); (NaN, "") otherwise."""
    refs = tables.get("reference_values")
    if refs is None or not len(refs):
        return float("nan"), ""
    rows = refs[(refs["model"] == model) & (refs["corpus"] == corpus)
                & (refs["quantity"] == quantity) & refs["published"].notna()]
    for r in rows.itertuples():
        try:
            p = json.loads(r.params)
        except (TypeError, ValueError):
            continue
        if "n_star_rule" in p and "n_star_rule" not in setting:
            continue  # App. C.4's second reading of a non-monotone curve: another value
        same = all(k in p and (p[k] == v or (isinstance(v, float) and isinstance(
            p[k], int | float) and abs(float(p[k]) - v) < 1e-9)) for k, v in setting.items())
        if same:
            return float(r.published), str(getattr(r, "kind", ""))
    return float("nan"), ""


def _beside(frame, lookup) -> pd.DataFrame:
    """``frame`` with the ``published`` value and ``verdict`` of ``lookup(row)``."""
    found = [lookup(r) for r in frame.itertuples()]
    return frame.assign(published=[v for v, _ in found], verdict=[k for _, k in found])


def new_part_tables(tables: dict, record: dict) -> list[tuple[str, pd.DataFrame]]:
    """The atlas contingency across models, the qa probe's screen and N* by model and
    background, and the context sweep's N* by model and L, with the follow-up's published
    value beside ours where the study model is one the paper ran (matched by preset)."""
    out = []
    c = tables.get("atlas_contingency")
    if c is not None and len(c):
        out.append(("Head atlas: heads by regime and head type, across models",
                    c.pivot_table(index=["model", "corpus", "regime"], columns="head_type",
                                  values="count", aggfunc="sum", fill_value=0)))
    k = tables.get("atlas_kappa")
    if k is not None and len(k):
        out.append(("Head atlas: Cohen's kappa of regime and head type, across models",
                    k.pivot_table(index=["model", "corpus", "regime"], columns="head_type",
                                  values="kappa", aggfunc="first")))
    a = tables.get("qa_answers")
    if a is not None and len(a):
        cols = [x for x in ("prompt_format", "n_examples", "accuracy", "loss", "screen")
                if x in a.columns]
        out.append(("qa: answers and the competence screen by model and background",
                    a.set_index(["model", "corpus", "background"])[cols]))
    q = tables.get("qa_nstar")
    if q is not None and len(q):
        q = _beside(q, lambda r: _published(
            tables, r.model, r.corpus, "n_star_qa", ranking=r.ranking,
            renormalize=r.mode == "renormalisation", tau_nats=float(r.tau),
            background=_background_label(int(r.background)))
            if _background_label(int(r.background)) else (float("nan"), ""))
        out.append(("qa: N* by model, background corpus and background (published: the "
                    "follow-up's Table 6 / 10 value for the same model; verdict: match or "
                    "context, as under Published values)",
                    q.set_index(["model", "corpus", "ranking", "mode", "tau", "background"])[
                        ["nstar", "nstar_low", "nstar_high", "published", "verdict"]]))
    n = tables.get("context_nstar")
    if n is not None and len(n):
        n = _beside(n, lambda r: _published(
            tables, r.model, r.corpus, "n_star", ranking=r.ranking,
            renormalize=r.mode == "renormalisation", tau=float(r.tau),
            window_length=int(r.length), protocol="context",
            scoring="tail128" if r.scoring == "tail" else "all"))
        keys = ["model", "corpus", "scoring", "ranking", "mode", "tau"]
        wide = keyed(n, keys, "length", "nstar", "context_nstar")
        paper = keyed(n, keys, "length", "published", "context_nstar")
        lengths = list(wide.columns)
        wide.columns = [f"ours L={L}" for L in lengths]
        for L in lengths:
            wide[f"paper L={L}"] = paper[L]
        verdict = n.groupby(keys)["verdict"].agg(
            lambda v: ", ".join(sorted({x for x in v if x})))
        wide["verdict"] = verdict.reindex(wide.index).fillna("")
        out.append(("Context sweep: N* by model, corpus and length L (paper: the follow-up's "
                    "Tables 4 / 5 value for the same model and corpus, where it ran them; "
                    "verdict as under Published values)", wide))
    lo = tables.get("restrict_local")
    if lo is not None and len(lo):
        top = lo[lo["rank"] == 1]
        out.append(("Localised restriction: the most sensitive layer and head per model "
                    "(head -1: the layer scope, every head of the layer restricted)",
                    top.set_index(["model", "corpus", "scope", "ranking", "renormalize",
                                   "n"])[["layer", "head", "mean_doc_delta_rel"]]))
    return out
