# ruff: noqa: E501  (this module holds the page's CSS and JavaScript, not Python lines)
"""The viewer page's inline style and script (no library, no request: ``file://`` works).

The script reads the JSON in ``#attngeom-data`` (``page.view_payload`` per pair) and
draws, for the chosen pair, ranking, distance and N: the geometry on a canvas (keys
at their radius D, angle from the PCA of the contributions; rho_max and rho_min as
circles; a radial density for keys not drawn one by one), the metrics, the regime,
the bars of alpha and alpha ||v|| of the leading keys with their text, and a strip of
both over every position. After each draw the canvas carries ``data-n``,
``data-rho-max-px``, ``data-rho-min-px`` and ``data-selected`` (what the browser test
reads); ``window.attngeomViewer`` exposes ``setPair``, ``setN``, ``setRanking`` and
``setDistance``. A URL fragment picks the pair: ``#L3H2`` (layer 3, head 2, its first
query) or a pair's full id (``#L3H2t47``), so a report can link each head's row.
"""

STYLE = """
:root { --sel: #0072B2; --uns: #9a9a9a; --off: #D55E00; --ghost: #6e6e6e; --rmin: #009E73;
        --z: #CC79A7; --ink: #1d1d1f; --muted: #666; --line: #e3e3e3; }
* { box-sizing: border-box; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; padding: 14px 18px; background: #fff; }
h1 { font-size: 17px; margin: 0 0 2px; }
.sub { color: var(--muted); margin-bottom: 10px; }
.controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; padding: 8px 10px;
            background: #f6f6f7; border: 1px solid var(--line); border-radius: 6px; }
.controls label { white-space: nowrap; }
.controls select { max-width: 420px; }
#n-slider { width: 260px; vertical-align: middle; }
#n-value { font-weight: 600; display: inline-block; min-width: 3.5em; }
.gridn button { font-size: 11px; padding: 1px 5px; margin: 0 1px; border: 1px solid #ccc;
                background: #fff; border-radius: 3px; cursor: pointer; }
.gridn button.on { background: var(--sel); color: #fff; border-color: var(--sel); }
.main { display: flex; flex-wrap: wrap; gap: 18px; margin-top: 12px; }
#geom { border: 1px solid var(--line); border-radius: 6px; background: #fff; flex: none;
        width: 600px; height: 600px; }
.side { min-width: 300px; max-width: 420px; flex: 1; }
table.m { border-collapse: collapse; width: 100%; margin-bottom: 8px; }
table.m td, table.m th { padding: 2px 6px; border-bottom: 1px solid var(--line); text-align: left; }
table.m td.v { text-align: right; font-variant-numeric: tabular-nums; }
.box { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; margin-bottom: 10px; }
.regime { font-weight: 600; }
.legend span { display: inline-block; margin: 2px 10px 2px 0; white-space: nowrap; }
.sw { display: inline-block; width: 11px; height: 11px; vertical-align: -1px; margin-right: 4px;
      border-radius: 50%; }
.bars { margin-top: 14px; }
table.b { border-collapse: collapse; }
table.b td { padding: 1px 5px; white-space: nowrap; }
table.b td.tok { font-family: ui-monospace, Menlo, Consolas, monospace; max-width: 180px;
                 overflow: hidden; text-overflow: ellipsis; }
.bar { height: 10px; background: var(--uns); display: inline-block; vertical-align: middle; }
tr.sel .bar { background: var(--sel); }
tr.sel td.tok { font-weight: 600; }
.barcell { width: 220px; }
.num { font-variant-numeric: tabular-nums; color: var(--muted); font-size: 11px; }
#strip { border: 1px solid var(--line); border-radius: 6px; margin-top: 6px; }
#tip { position: fixed; pointer-events: none; background: rgba(20,20,20,.9); color: #fff;
       padding: 4px 7px; border-radius: 4px; font-size: 12px; display: none; z-index: 9; }
.note { color: var(--muted); font-size: 12px; max-width: 1100px; }
"""

SCRIPT = r"""
(function () {
"use strict";
const DATA = JSON.parse(document.getElementById("attngeom-data").textContent);
const LEVELS = 65535, BINS = 40, BARS = 24;
const state = { pair: 0, ni: 0, ranking: "attention", distance: "euclidean", zoom: true };
const cache = {};
let hits = [];

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function bytes(s) {
  const bin = atob(s), out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
function u16(s) { const b = bytes(s); return new Uint16Array(b.buffer, 0, b.length >> 1); }
function f32(s) { const b = bytes(s); return new Float32Array(b.buffer, 0, b.length >> 2); }
function fmt(x, d) {
  if (x === null || x === undefined) return "n/a";
  if (Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3)) return x.toExponential(2);
  return x.toFixed(d === undefined ? 3 : d);
}
function shown(t) {
  return "'" + String(t).replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5") + "'";
}

function pairData(i) {
  if (cache[i]) return cache[i];
  const p = DATA.pairs[i];
  const keys = p.keys || Array.from({ length: p.num_keys }, (_, j) => j);
  const index = new Map(keys.map((k, j) => [k, j]));
  const rankOf = order => { const m = new Map(); order.forEach((k, r) => m.set(k, r)); return m; };
  const d = {
    p, keys, index, S: p.shown.length, tokens: DATA.sequences[p.seq],
    shownPos: p.shown.map(j => keys[j]),
    angle: Array.from(u16(p.angle), a => a / LEVELS * 2 * Math.PI - Math.PI),
    alpha: f32(p.alpha), contribution: f32(p.contribution), views: {}, ghosts: {}, lead: {}
  };
  for (const k in p.views) {
    const v = p.views[k];
    d.views[k] = { v, radius: u16(v.radius), off: bytes(v.offenders),
                   hist: v.rest_hist ? u16(v.rest_hist) : null, rank: rankOf(v.order) };
  }
  for (const k in p.ghosts) d.ghosts[k] = { g: p.ghosts[k], rank: rankOf(p.ghosts[k].order) };
  for (const r of ["attention", "contribution"]) {
    const score = r === "attention" ? d.alpha : d.contribution;
    const idx = Array.from(keys.keys());
    idx.sort((a, b) => (score[b] - score[a]) || (keys[a] - keys[b]));
    d.lead[r] = idx;
  }
  cache[i] = d;
  return d;
}

function build() {
  document.title = DATA.title;
  const body = document.body;
  body.appendChild(el("h1", {}, DATA.title));
  body.appendChild(el("div", { class: "sub" }, "model " + DATA.model + " \u00b7 " + DATA.source +
    " \u00b7 " + DATA.pairs.length + " head-query pair" + (DATA.pairs.length > 1 ? "s" : "")));
  const c = el("div", { class: "controls" });
  const lab = el("label", {}, "head, query ");
  const sel = el("select", { id: "pair" });
  DATA.pairs.forEach((p, i) => {
    const tok = DATA.sequences[p.seq][p.query];
    sel.appendChild(el("option", { value: i }, "layer " + p.layer + ", head " + p.head +
      ", t = " + p.query + " " + shown(tok) + " \u2014 " + p.regime.regime));
  });
  lab.appendChild(sel); c.appendChild(lab);
  for (const [name, opts] of [["ranking", ["attention", "contribution"]],
                              ["distance", ["euclidean", "cosine"]]]) {
    const g = el("span", {}, name + ": ");
    for (const o of opts) {
      const l = el("label", {});
      const r = el("input", { type: "radio", name, value: o, id: name + "-" + o });
      if (state[name] === o) r.checked = true;
      r.addEventListener("change", () => { state[name] = o; draw(); });
      l.appendChild(r); l.appendChild(document.createTextNode(" " + o + " "));
      g.appendChild(l);
    }
    c.appendChild(g);
  }
  const ns = el("label", {}, "N ");
  const slider = el("input", { type: "range", id: "n-slider", min: 0, max: 0, step: 1, value: 0 });
  slider.addEventListener("input", () => { state.ni = +slider.value; draw(); });
  ns.appendChild(slider); ns.appendChild(el("span", { id: "n-value" }, ""));
  c.appendChild(ns);
  c.appendChild(el("span", { class: "gridn", id: "gridn" }));
  const zl = el("label", { title: "map the band around the circles onto most of the " +
    "picture (piecewise linear, so every key stays on its side of each circle)" });
  const zoom = el("input", { type: "checkbox", id: "zoom" });
  zoom.checked = state.zoom;
  zoom.addEventListener("change", () => { state.zoom = zoom.checked; draw(); });
  zl.appendChild(zoom); zl.appendChild(document.createTextNode(" zoom on the circles"));
  c.appendChild(zl);
  body.appendChild(c);
  const main = el("div", { class: "main" });
  main.appendChild(el("canvas", { id: "geom", width: 600, height: 600 }));
  const side = el("div", { class: "side" });
  side.appendChild(el("div", { class: "box", id: "regime" }));
  side.appendChild(el("div", { class: "box", id: "metrics" }));
  const leg = el("div", { class: "box legend", id: "legend" });
  for (const [color, text, style] of [
      ["var(--sel)", "selected (top-N)", ""], ["var(--uns)", "unselected", ""],
      ["transparent", "inside \u03c1max / outside \u03c1min (flagged)", "border:2px solid var(--off)"],
      ["transparent", "random set of N (ghost)", "border:1.5px dashed var(--ghost)"],
      ["transparent", "sink (t = 0)", "border:1.5px solid #000;border-radius:0"],
      ["var(--z)", "head output z", "border-radius:0;transform:rotate(45deg)"],
      ["transparent", "\u03c1max (solid) / \u03c1min (dashed) / \u2016s_N\u2016 (dotted)",
       "border:2px solid var(--sel)"]]) {
    const s = el("span", {});
    const sw = el("span", { class: "sw", style: "background:" + color + ";" + style });
    s.appendChild(sw); s.appendChild(document.createTextNode(text)); leg.appendChild(s);
  }
  side.appendChild(leg);
  side.appendChild(el("div", { class: "note" },
    "Each key sits at its exact distance D to the aggregate s_N of the selected set (the " +
    "centre); its angle is that of its contribution \u03b1v in the plane of the " +
    "contributions' first two principal axes (only the angle is a projection). The " +
    "current token is a triangle. Shaded rings: keys not drawn one by one, by distance. " +
    "Hover a point for its token."));
  main.appendChild(side);
  body.appendChild(main);
  const bars = el("div", { class: "bars" });
  bars.appendChild(el("div", { id: "bars-title", class: "sub" }, ""));
  bars.appendChild(el("table", { class: "b", id: "bars" }));
  bars.appendChild(el("div", { class: "sub" }, "every position: \u03b1 (up) and \u03b1\u2016v\u2016 (down); blue = selected"));
  bars.appendChild(el("canvas", { id: "strip", width: 1100, height: 120 }));
  body.appendChild(bars);
  body.appendChild(el("div", { id: "tip" }));
  sel.addEventListener("change", () => setPair(+sel.value));
  const geom = document.getElementById("geom");
  geom.addEventListener("mousemove", ev => hover(ev, geom));
  geom.addEventListener("mouseleave", () => { document.getElementById("tip").style.display = "none"; });
}

function setPair(i) {
  state.pair = i;
  document.getElementById("pair").value = String(i);
  const p = DATA.pairs[i];
  const slider = document.getElementById("n-slider");
  slider.max = p.ns.length - 1;
  const at = p.ns.indexOf(p.default_n);
  state.ni = at < 0 ? p.ns.length - 1 : at;
  slider.value = state.ni;
  const g = document.getElementById("gridn");
  g.textContent = "";
  for (const n of p.grid) {
    const b = el("button", { type: "button", "data-n": n }, String(n));
    b.addEventListener("click", () => setN(n));
    g.appendChild(b);
  }
  draw();
}

function setN(n) {
  const p = DATA.pairs[state.pair];
  const i = p.ns.indexOf(n);
  if (i < 0) throw new Error("N " + n + " is not available; expected one of " + p.ns.join(", "));
  state.ni = i;
  document.getElementById("n-slider").value = i;
  draw();
}

function ring(ctx, cx, cy, r0, r1, fill) {
  ctx.beginPath();
  ctx.arc(cx, cy, r1, 0, 2 * Math.PI, false);
  ctx.arc(cx, cy, r0, 0, 2 * Math.PI, true);
  ctx.fillStyle = fill;
  ctx.fill();
}
function circle(ctx, cx, cy, r, color, width, dash) {
  ctx.beginPath();
  ctx.setLineDash(dash || []);
  ctx.arc(cx, cy, Math.max(r, 0), 0, 2 * Math.PI);
  ctx.strokeStyle = color; ctx.lineWidth = width; ctx.stroke();
  ctx.setLineDash([]);
}
function isBit(bytesArr, row, stride, j) { return (bytesArr[row * stride + (j >> 3)] >> (j & 7)) & 1; }

function draw() {
  const d = pairData(state.pair), p = d.p;
  const key = state.ranking + "|" + state.distance;
  const V = d.views[key], v = V.v, G = d.ghosts[state.distance];
  const ni = state.ni, N = p.ns[ni], S = d.S;
  const rad = V.radius.subarray(ni * S, (ni + 1) * S);
  const stride = Math.ceil(S / 8);
  const ext = Math.max(v.ext_q[ni], 1) * 1.04;
  const [lo, hi] = v.band_q[ni];
  const canvas = document.getElementById("geom"), ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, cx = W / 2, cy = H / 2;
  const R = Math.min(W, H) / 2 - 14;
  const zoomed = state.zoom && hi > lo;
  const A = zoomed && lo > 0 ? 0.3 * R : 0, B = 0.92 * R;
  const f = q => {  // stored radius (0..LEVELS) -> pixels; monotone either way
    if (!zoomed) return q / ext * R;
    if (q <= lo) return lo > 0 ? q / lo * A : A;
    if (q <= hi) return A + (q - lo) / (hi - lo) * (B - A);
    return ext > hi ? B + (q - hi) / (ext - hi) * (R - B) : B;
  };
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
  if (V.hist) {
    const h = V.hist.subarray(ni * (BINS + 2), (ni + 1) * (BINS + 2));
    let top = 1; for (const c of h) top = Math.max(top, c);
    const edges = [0, lo];
    for (let b = 1; b <= BINS; b++) edges.push(lo + b * (hi - lo) / BINS);
    edges.push(ext);
    for (let b = 0; b < BINS + 2; b++) if (h[b]) ring(ctx, cx, cy, f(edges[b]), f(edges[b + 1]),
      "rgba(130,130,130," + (0.1 + 0.45 * h[b] / top).toFixed(3) + ")");
  }
  if (zoomed) {
    for (const q of [lo, hi]) circle(ctx, cx, cy, f(q), "#d0d0d0", 1, [1, 4]);
  }
  if (v.snorm_q) circle(ctx, cx, cy, f(v.snorm_q[ni]), "#8c8c8c", 1, [2, 3]);
  const rmax = f(v.rho_max_q[ni]), rmin = f(v.rho_min_q[ni]);
  circle(ctx, cx, cy, rmax, "#0072B2", 2);
  circle(ctx, cx, cy, rmin, "#009E73", 2, [7, 4]);
  hits = [];
  const pts = [];
  let nsel = 0;
  for (let j = 0; j < S; j++) {
    const pos = d.shownPos[j], r = f(rad[j]), a = d.angle[j];
    const x = cx + r * Math.cos(a), y = cy - r * Math.sin(a);
    const rk = V.rank.get(pos), gk = G.rank.get(pos);
    const sel = rk !== undefined && rk < N;
    if (sel) nsel++;
    pts.push({ j, pos, x, y, sel, off: isBit(V.off, ni, stride, j),
               ghost: gk !== undefined && gk < N, r: rad[j] / LEVELS * v.scale });
    hits.push(pts[pts.length - 1]);
  }
  for (const q of pts) if (q.ghost) {
    ctx.beginPath(); ctx.setLineDash([3, 2]); ctx.arc(q.x, q.y, 8, 0, 2 * Math.PI);
    ctx.strokeStyle = "#6e6e6e"; ctx.lineWidth = 1; ctx.stroke(); ctx.setLineDash([]);
  }
  for (const pass of [false, true]) for (const q of pts) if (q.sel === pass) {
    ctx.beginPath(); ctx.arc(q.x, q.y, pass ? 4 : 2.6, 0, 2 * Math.PI);
    ctx.fillStyle = pass ? "#0072B2" : "#9a9a9a"; ctx.fill();
  }
  for (const q of pts) if (q.off) {
    ctx.beginPath(); ctx.arc(q.x, q.y, 6.5, 0, 2 * Math.PI);
    ctx.strokeStyle = "#D55E00"; ctx.lineWidth = 1.6; ctx.stroke();
  }
  for (const q of pts) {
    if (q.pos === 0) { ctx.strokeStyle = "#000"; ctx.lineWidth = 1.4; ctx.strokeRect(q.x - 6, q.y - 6, 12, 12); }
    if (q.pos === p.query) {
      ctx.beginPath(); ctx.moveTo(q.x, q.y - 8); ctx.lineTo(q.x - 7, q.y + 5); ctx.lineTo(q.x + 7, q.y + 5);
      ctx.closePath(); ctx.strokeStyle = "#000"; ctx.lineWidth = 1.4; ctx.stroke();
    }
  }
  const diamond = (r, a, fill, stroke) => {
    const x = cx + r * Math.cos(a), y = cy - r * Math.sin(a);
    ctx.beginPath(); ctx.moveTo(x, y - 7); ctx.lineTo(x + 7, y); ctx.lineTo(x, y + 7); ctx.lineTo(x - 7, y);
    ctx.closePath();
    if (fill) { ctx.fillStyle = fill; ctx.fill(); }
    if (stroke) { ctx.strokeStyle = stroke; ctx.lineWidth = 1.3; ctx.stroke(); }
  };
  diamond(f(v.z_q[ni]), p.z_angle, "#CC79A7", null);
  diamond(f(v.ghost_q[ni]), G.g.angle[ni], null, "#6e6e6e");
  ctx.strokeStyle = "#000"; ctx.lineWidth = 1.6;
  ctx.beginPath(); ctx.moveTo(cx - 8, cy); ctx.lineTo(cx + 8, cy); ctx.moveTo(cx, cy - 8); ctx.lineTo(cx, cy + 8); ctx.stroke();
  ctx.fillStyle = "#333"; ctx.font = "12px system-ui, sans-serif";
  ctx.fillText("s_N (N = " + N + ")", cx + 10, cy - 10);
  const unit = q => fmt(q / LEVELS * v.scale, 4);
  ctx.fillText(state.distance + " D, edge " + unit(ext) + (zoomed ? "; zoomed: D in [" +
    unit(lo) + ", " + unit(hi) + "] (dotted) spans most of the radius" : "; linear"),
    8, H - 8);
  canvas.dataset.n = String(N);
  canvas.dataset.rhoMaxPx = rmax.toFixed(3);
  canvas.dataset.rhoMinPx = rmin.toFixed(3);
  canvas.dataset.rhoMax = String(v.rho_max[ni]);
  canvas.dataset.rhoMin = String(v.rho_min[ni]);
  canvas.dataset.selected = String(nsel);
  canvas.dataset.view = key;
  document.getElementById("n-value").textContent = "N = " + N;
  for (const b of document.querySelectorAll("#gridn button")) b.classList.toggle("on", +b.dataset.n === N);
  panels(d, V, G, N, ni);
  bars(d, V, G, N);
  strip(d, V, N);
}

function row(t, name, value, title) {
  const tr = el("tr", title ? { title } : {});
  tr.appendChild(el("td", {}, name)); tr.appendChild(el("td", { class: "v" }, value));
  t.appendChild(tr);
}
function panels(d, V, G, N, ni) {
  const p = d.p, v = V.v, g = G.g, reg = p.regime;
  const rb = document.getElementById("regime"); rb.textContent = "";
  rb.appendChild(el("div", {}, "layer " + p.layer + ", head " + p.head + ", query t = " + p.query +
    " " + shown(d.tokens[p.query]) + (p.window === null ? "" : ", window " + p.window)));
  const r = el("div", {}); r.appendChild(el("span", { class: "regime" }, String(reg.regime)));
  r.appendChild(document.createTextNode(" \u2014 " + reg.source)); rb.appendChild(r);
  let shares = "winning share " + fmt(reg.winning_share, 2) + ", runner-up " + fmt(reg.runner_up_share, 2);
  if (reg.stability !== undefined && reg.stability !== null) shares += ", stability " + fmt(reg.stability, 2);
  if (reg.top_source_kind && reg.top_source_kind !== "none") shares += "; top other source: " + reg.top_source_kind + " " + reg.top_source;
  rb.appendChild(el("div", { class: "num" }, shares));
  const wi = d.index.get(p.winner);
  rb.appendChild(el("div", {}, "winner (argmax \u03b1\u2016v\u2016): t = " + p.winner + " " +
    shown(d.tokens[p.winner]) + ", \u03b1\u2016v\u2016 = " + fmt(d.contribution[wi])));
  const mb = document.getElementById("metrics"); mb.textContent = "";
  mb.appendChild(el("div", {}, state.ranking + " top-" + N + ", " + state.distance + " distance"));
  const t = el("table", { class: "m", id: "metric-table" });
  const hr = el("tr", {}); hr.appendChild(el("th", {}, "")); hr.appendChild(el("th", {}, "selected"));
  hr.appendChild(el("th", {}, "random set")); t.appendChild(hr);
  const both = (name, a, b, digits) => {
    const tr = el("tr", {}); tr.appendChild(el("td", {}, name));
    tr.appendChild(el("td", { class: "v", "data-metric": name }, fmt(a, digits)));
    tr.appendChild(el("td", { class: "v" }, b === undefined ? "" : fmt(b, digits))); t.appendChild(tr);
  };
  both("P", v.P[ni], g.P[ni]); both("R", v.R[ni], g.R[ni]); both("F", v.F[ni], g.F[ni]);
  both("margin", v.margin[ni], g.margin[ni], 4); both("inversions", v.inv[ni], g.inv[ni], 0);
  both("\u03c1max", v.rho_max[ni], undefined, 4); both("\u03c1min", v.rho_min[ni], undefined, 4);
  both("D(z, s_N)", v.z[ni], undefined, 4); both("D(s_random, s_N)", v.ghost_agg[ni], undefined, 4);
  mb.appendChild(t);
  let flagged = v.intruders[ni] + " unselected inside \u03c1max, " + v.stragglers[ni] +
    " selected outside \u03c1min";
  if (v.rest_inside) flagged += " (" + v.rest_inside[ni] + " of the intruders among the " +
    (p.num_keys - d.S) + " keys drawn as a density)";
  mb.appendChild(el("div", { class: "num" }, flagged));
}

function bars(d, V, G, N) {
  const score = state.ranking === "attention" ? d.alpha : d.contribution;
  const lead = d.lead[state.ranking].slice(0, Math.max(BARS, Math.min(N, 64)));
  let ma = 0, mc = 0;
  for (const j of lead) { ma = Math.max(ma, d.alpha[j]); mc = Math.max(mc, d.contribution[j]); }
  document.getElementById("bars-title").textContent = "top " + lead.length + " keys by " +
    state.ranking + " (" + (state.ranking === "attention" ? "\u03b1" : "\u03b1\u2016v\u2016") + ")";
  const t = document.getElementById("bars"); t.textContent = "";
  const h = el("tr", {});
  for (const x of ["t", "token", "\u03b1", "", "\u03b1\u2016v\u2016", ""]) h.appendChild(el("td", { class: "num" }, x));
  t.appendChild(h);
  for (const j of lead) {
    const pos = d.keys[j], rk = V.rank.get(pos), gk = G.rank.get(pos);
    const tr = el("tr", { class: rk !== undefined && rk < N ? "sel" : "" });
    tr.appendChild(el("td", { class: "num" }, String(pos) + (gk !== undefined && gk < N ? " \u25cc" : "")));
    tr.appendChild(el("td", { class: "tok" }, shown(d.tokens[pos])));
    for (const [val, m] of [[d.alpha[j], ma], [d.contribution[j], mc]]) {
      const c = el("td", { class: "barcell" });
      c.appendChild(el("span", { class: "bar", style: "width:" + (m > 0 ? 200 * val / m : 0).toFixed(1) + "px" }));
      tr.appendChild(c); tr.appendChild(el("td", { class: "num" }, fmt(val)));
    }
    t.appendChild(tr);
  }
  void score;
}

function strip(d, V, N) {
  const c = document.getElementById("strip"), ctx = c.getContext("2d");
  const W = c.width, H = c.height, mid = H / 2;
  ctx.clearRect(0, 0, W, H);
  const T = d.tokens.length, bw = W / T;
  let ma = 0, mc = 0;
  for (let j = 0; j < d.keys.length; j++) { ma = Math.max(ma, d.alpha[j]); mc = Math.max(mc, d.contribution[j]); }
  for (let j = 0; j < d.keys.length; j++) {
    const pos = d.keys[j], rk = V.rank.get(pos);
    ctx.fillStyle = rk !== undefined && rk < N ? "#0072B2" : "#9a9a9a";
    const ha = ma > 0 ? (mid - 4) * d.alpha[j] / ma : 0, hc = mc > 0 ? (mid - 4) * d.contribution[j] / mc : 0;
    ctx.fillRect(pos * bw, mid - ha, Math.max(bw, 1), ha);
    ctx.fillRect(pos * bw, mid, Math.max(bw, 1), hc);
  }
  ctx.fillStyle = "#000"; ctx.fillRect(0, mid, W, 0.5);
  ctx.fillStyle = "#D55E00"; ctx.fillRect(d.p.query * bw, 0, Math.max(bw, 1.5), 4);
}

function hover(ev, canvas) {
  const b = canvas.getBoundingClientRect();
  const x = (ev.clientX - b.left) * canvas.width / b.width, y = (ev.clientY - b.top) * canvas.height / b.height;
  let best = null, bd = 64;
  for (const q of hits) { const dd = (q.x - x) ** 2 + (q.y - y) ** 2; if (dd < bd) { bd = dd; best = q; } }
  const tip = document.getElementById("tip");
  if (!best) { tip.style.display = "none"; return; }
  const d = pairData(state.pair), j = d.p.shown[best.j];
  tip.textContent = "t = " + best.pos + " " + shown(d.tokens[best.pos]) + "  \u03b1 = " + fmt(d.alpha[j]) +
    "  \u03b1\u2016v\u2016 = " + fmt(d.contribution[j]) + "  D \u2248 " + fmt(best.r, 4) +
    (best.sel ? "  selected" : "") + (best.off ? "  flagged" : "") + (best.ghost ? "  in random set" : "");
  tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px";
  tip.style.display = "block";
}

function fromHash() {  // #L3H2 (the first query of layer 3, head 2) or a pair's full id
  const h = decodeURIComponent(location.hash.slice(1));
  if (!h) return 0;
  let i = DATA.pairs.findIndex(p => p.id === h);
  if (i < 0) i = DATA.pairs.findIndex(p => p.id.startsWith(h + "t"));
  return Math.max(i, 0);
}

build();
setPair(fromHash());
window.addEventListener("hashchange", () => setPair(fromHash()));
window.attngeomViewer = {
  state, setPair, setN,
  setRanking: r => { state.ranking = r; document.getElementById("ranking-" + r).checked = true; draw(); },
  setDistance: x => { state.distance = x; document.getElementById("distance-" + x).checked = true; draw(); }
};
})();
"""
