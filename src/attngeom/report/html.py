"""Small HTML building blocks for the self-contained report page.

Everything the page needs is inline: the style sheet below, figures as base64
``data:`` URIs, no scripts, no web fonts, no external links that load anything.
"""

from __future__ import annotations

import base64
import html
import json
import math
import struct
from pathlib import Path

CSS = """
:root { --fg: #1d1d1f; --muted: #5f6368; --rule: #d9dce1; --accent: #0072B2;
        --bg-alt: #f5f7fa; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff;
       font: 15px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; }
main { max-width: 1040px; margin: 0 auto; padding: 24px 28px 64px; }
header.top { border-bottom: 2px solid var(--accent); margin-bottom: 18px; padding-bottom: 8px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 34px 0 10px; padding-bottom: 4px;
     border-bottom: 1px solid var(--rule); }
h3 { font-size: 16px; margin: 22px 0 6px; }
.sub { color: var(--muted); margin: 0; }
nav.toc { background: var(--bg-alt); border: 1px solid var(--rule); border-radius: 6px;
          padding: 8px 14px; margin: 14px 0; font-size: 14px; }
nav.toc a { margin-right: 14px; color: var(--accent); text-decoration: none; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 18px; margin: 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace;
              font-size: 13px; overflow-wrap: anywhere; }
ul.findings li { margin: 4px 0; }
figure { margin: 18px 0 26px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--rule); }
figcaption { color: var(--muted); font-size: 13.5px; margin-top: 6px; max-width: 900px; }
figcaption b { color: var(--fg); }
.tablewrap { overflow-x: auto; margin: 8px 0 18px; }
table.data { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
table.data th, table.data td { border-bottom: 1px solid var(--rule); padding: 3px 9px;
                               text-align: right; white-space: nowrap; }
table.data th { background: var(--bg-alt); font-weight: 600; }
table.data tbody th { text-align: left; }
#reference-values th, #reference-values td, #reference-unmeasured th,
#reference-unmeasured td { text-align: left; vertical-align: top; }
#reference-values td.wrap, #reference-unmeasured td.wrap { white-space: normal;
                                                         min-width: 22em; max-width: 34em; }
#reference-values td.narrow { white-space: normal; min-width: 11em; max-width: 15em; }
#table-list td:last-child { white-space: normal; text-align: left; font-size: 12px;
                            color: var(--muted); min-width: 420px; }
details { margin: 10px 0; }
details pre { background: var(--bg-alt); padding: 10px; border-radius: 4px; font-size: 12px;
              overflow-x: auto; }
.note { color: #8a4b00; background: #fff6e5; border-left: 3px solid #e69f00;
        padding: 6px 10px; margin: 8px 0; font-size: 14px; }
code { font-size: 13px; }
"""


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def fmt(value, digits: int = 3) -> str:
    """A number for prose and tables: 3 significant digits, "n/a" for NaN/None."""
    if value is None:
        return "n/a"
    if isinstance(value, (bool,)):
        return "yes" if value else "no"
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return "n/a"
    if x.is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.{digits}g}"


def plural(n, word: str, words: str | None = None) -> str:
    """``1 window``, ``2 windows``, ``1 pass``, ``3 passes`` (``words``: an irregular
    plural)."""
    many = words or (word + "es" if word.endswith(("s", "x", "ch", "sh")) else word + "s")
    try:
        one = int(n) == 1
    except (TypeError, ValueError):
        one = False
    return f"{fmt(n)} {word if one else many}"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def figure_html(fig_id: str, title: str, caption: str, png: Path, pdf: Path | None,
                tables, dpi: int, base: Path) -> str:
    data = Path(png).read_bytes()
    width, _ = png_size(data)
    css_width = round(width * 96 / dpi * 1.35)
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    pdf_link = ""
    if pdf is not None and Path(pdf).exists():
        rel = Path(pdf).relative_to(base).as_posix()
        pdf_link = f' <a href="{esc(rel)}">PDF</a>'
    source = ", ".join(f"<code>{esc(t)}.parquet</code>" for t in tables)
    return (
        f'<figure id="fig-{esc(fig_id)}" data-figure="{esc(fig_id)}">'
        f'<img src="{uri}" alt="{esc(title)}" style="width:{css_width}px">'
        f"<figcaption><b>{esc(title)}</b> (<code>{esc(fig_id)}</code>). {esc(caption)} "
        f"From {source}.{pdf_link}</figcaption></figure>"
    )


def table_html(df, *, index: bool = True, caption: str | None = None,
               table_id: str | None = None, wrap=(), narrow=()) -> str:
    """A pandas frame as an escaped, styled HTML table with numbers formatted by ``fmt``;
    the cells of the ``wrap`` columns (long text) wrap instead of widening the table, those
    of the ``narrow`` columns wrap within a narrow width (class names of the page's CSS)."""
    shown = df.copy()
    for column in shown.columns:
        if shown[column].dtype.kind in "fcib":
            shown[column] = shown[column].map(fmt)
    body = shown.to_html(index=index, escape=True, border=0, classes="data", na_rep="n/a")
    for names, css in ((wrap, "wrap"), (narrow, "narrow")):
        if names:
            body = _wrap_cells(body, [i for i, c in enumerate(shown.columns) if c in names],
                               css)
    head = f"<h3>{esc(caption)}</h3>" if caption else ""
    attr = f' id="{esc(table_id)}"' if table_id else ""
    return f'{head}<div class="tablewrap"{attr}>{body}</div>'


def _wrap_cells(body: str, columns: list[int], css: str) -> str:
    """Mark the ``<td>`` of the given column positions (counted among a body row's
    ``<td>``, after its header cells) with ``class="css"``."""
    import re

    def row(match):
        cells = re.split(r"(<td>)", match.group(0))
        out, k = [], -1
        for part in cells:
            if part == "<td>":
                k += 1
                out.append(f'<td class="{css}">' if k in columns else part)
            else:
                out.append(part)
        return "".join(out)

    head, sep, tail = body.partition("<tbody>")
    return head + sep + re.sub(r"<tr>.*?</tr>", row, tail, flags=re.S) if sep else body


def facts_html(pairs) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs)
    return f'<dl class="facts">{rows}</dl>'


def json_details(summary: str, obj) -> str:
    text = json.dumps(obj, indent=2, sort_keys=True, default=str)
    return f"<details><summary>{esc(summary)}</summary><pre>{esc(text)}</pre></details>"


def page(title: str, subtitle: str, toc, body: str) -> str:
    links = "".join(f'<a href="#{esc(anchor)}">{esc(label)}</a>' for anchor, label in toc)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
        f'<header class="top"><h1>{esc(title)}</h1><p class="sub">{esc(subtitle)}</p></header>'
        f'<nav class="toc">{links}</nav>{body}</main></body></html>\n'
    )
