"""How often a per-key candidate certificate would spare a row its full pass (docs/choices.md).

Every key u lies within ``alpha_u ||v_u||`` of ``||s_N||`` (``|D[u] - ||s_N||| <=
alpha_u ||v_u||``). Keep as candidates the C unselected keys with the largest
contributions ``alpha_u ||v_u||``; every other key then has ``D >= ||s_N|| - c*``, c* the
largest contribution left out. When that bound exceeds ``rho_max`` (the farthest
selected key) no key left out is an intruder or takes part in an inversion, and when a
candidate lies at or below it, the nearest unselected key (``rho_min``) is a candidate
too: the row's counts and margin could then come from the candidates alone, O(C) work
instead of O(T). Where the certificate fails the row needs its full pass anyway.

This script measures how often it holds on real models, at the ``final`` query of real
windows, for the attention rule and for random selections (the control: 16 of the 18
orders the paper's protocol evaluates), per N of the grid and candidate count C. Each
row is computed densely in float64 (a probe, not the toolkit's kernels)::

    python benchmarks/certificate_rate.py --json benchmarks/results-certificate-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

GRID = (1, 2, 4, 8, 16, 32)
CANDIDATES = (32, 64, 128)


def certified(alpha: torch.Tensor, values: torch.Tensor, selected: torch.Tensor,
              candidates: int) -> bool:
    """Whether one row's counts follow from its ``candidates`` largest unselected
    contributions alone: ``alpha`` (T,), ``values`` (T, d) float64, ``selected`` (N,)
    key indices."""
    t = alpha.shape[0]
    s = (alpha[selected, None] * values[selected]).sum(0)
    dist = (alpha[:, None] * values - s).norm(dim=-1)
    unselected = torch.ones(t, dtype=torch.bool)
    unselected[selected] = False
    count = int(unselected.sum())
    if count <= candidates:  # every unselected key is a candidate: nothing to spare
        return False
    contrib = torch.where(unselected, alpha * values.norm(dim=-1), -1.0)
    top = torch.topk(contrib, candidates + 1)
    floor = s.norm() - top.values[-1]  # every key left out lies at least this far
    return bool(floor > dist[selected].max()) and bool(dist[top.indices[:-1]].min() <= floor)


def rates(alpha: torch.Tensor, values: torch.Tensor, kv_of_head: torch.Tensor,
          gen: torch.Generator) -> dict[tuple[str, int, int], list[int]]:
    """[certified, rows] per (rule, N, C) over the heads of one window's final row:
    ``alpha`` (H, T), ``values`` (G, T, d)."""
    out: dict[tuple[str, int, int], list[int]] = {}
    t = alpha.shape[-1]
    for h in range(alpha.shape[0]):
        a, v = alpha[h], values[kv_of_head[h]]
        orders = {"attention": torch.argsort(-a, stable=True),
                  "random": torch.randperm(t, generator=gen)}
        for rule, order in orders.items():
            for n in GRID:
                if n >= t:
                    continue
                for c in CANDIDATES:
                    cell = out.setdefault((rule, n, c), [0, 0])
                    cell[0] += certified(a, v, order[:n], c)
                    cell[1] += 1
    return out


def measure(model_name: str, corpus_name: str, length: int, windows: int) -> list[dict]:
    from attngeom.assets import asset
    from attngeom.capture import capture_attention, load_model
    from attngeom.corpora.corpus import WIKITEXT_ARTICLES, read_documents
    from attngeom.corpora.windows import make_windows

    model, tokenizer = load_model(asset(model_name))
    # the documents a run reads (WikiText as articles, as make bench-real takes them)
    docs, _ = read_documents(asset(corpus_name, "--corpus"), separator=WIKITEXT_ARTICLES
                             if corpus_name.startswith("wikitext") else None)
    ids = torch.stack([w.input_ids for w in make_windows(docs, tokenizer, length,
                                                         n_windows=windows)])
    captured = []
    with torch.inference_mode(), capture_attention(
            model, lambda cap: captured.append((cap.alpha.double(), cap.values.double())),
            query_rows=[-1]):
        model(input_ids=ids)
    gen = torch.Generator().manual_seed(0)
    totals: dict[tuple[str, int, int], list[int]] = {}
    for alpha, values in captured:  # (B, H, 1, T), (B, G, T, d)
        h, g = alpha.shape[1], values.shape[1]
        kv = torch.arange(h) // (h // g)
        for b in range(alpha.shape[0]):
            for key, (ok, rows) in rates(alpha[b, :, 0], values[b], kv, gen).items():
                cell = totals.setdefault(key, [0, 0])
                cell[0] += ok
                cell[1] += rows
    return [{"model": model_name, "corpus": corpus_name, "T": length, "rule": rule, "N": n,
             "candidates": c, "rows": rows, "certified_share": ok / rows}
            for (rule, n, c), (ok, rows) in sorted(totals.items())]


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--windows", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = (measure("stories260K", "tinystories", 256, args.windows)
            + measure("smollm2-135m", "wikitext-2-test", 1024, args.windows))
    for model, length in (("stories260K", 256), ("smollm2-135m", 1024)):
        for c in CANDIDATES:
            for rule in ("attention", "random"):
                mine = [r for r in rows if (r["model"], r["rule"], r["candidates"])
                        == (model, rule, c)]
                cells = " ".join(f"N={r['N']}: {r['certified_share']:.2f}" for r in mine)
                print(f"{model:13s} T={length:<5d} C={c:<4d} {rule:9s} {cells}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        print(f"written {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
