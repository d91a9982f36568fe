"""Freeze the top-N metric tensors and tables, to prove a refactor changes no bit.

``save DIR`` computes, on fixed inputs, every metric tensor of
``topn_metrics_variants`` (several shapes, GQA, ties, masks, non-finite rows, both
distances, both variants, all three rules, both ``<v_u, s_N>`` paths, compiled and
not) and runs ``attngeom.analyze`` on the real stories260K model (final and all
queries, a few short windows); ``compare DIR`` recomputes everything and compares it
bit for bit (``torch.equal`` on tensors, ``DataFrame.equals`` on the metrics and
summary tables). Run it before and after a change to the geometry core::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/freeze_metrics.py save /tmp/frozen
    # ... change the code ...
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/freeze_metrics.py compare /tmp/frozen

Matrix products may round differently on another machine or BLAS: compare on the
machine that saved.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from attngeom.core.geometry import topn_metrics_variants
from attngeom.core.kernels import compiling

# the tensors of a TopNMetrics compared (the metric stack holds every metric)
FIELDS = ("stacked", "valid", "trivial", "nonfinite", "sink_selected", "top", "universe")
GRID = (1, 2, 3, 5, 8, 40)


def _cases():
    """(name, alpha, values, visible, query_positions) of the fixed inputs."""
    gen = torch.Generator().manual_seed(29)
    out = []
    for h, g, t, q, d in ((4, 2, 24, 24, 8), (6, 3, 40, 5, 4), (2, 1, 64, 64, 16),
                          (4, 4, 17, 1, 3)):
        logits = torch.randn(h, q, t, generator=gen) * 2
        pos = torch.arange(t - q, t)
        vis = (torch.arange(t)[None, :] <= pos[:, None])[None]
        alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
        values = torch.randn(g, t, d, generator=gen)
        values[:, 0] *= 0.05  # a small sink value, as real models have
        alpha[..., 0] += 0.5 * (pos >= 0)  # a strong sink
        alpha = alpha / alpha.sum(-1, keepdim=True)
        out.append((f"rand_h{h}g{g}t{t}q{q}", alpha, values, None, pos))
        # ties: alphas and values from a small set, many equal scores
        tie_a = torch.softmax(torch.randint(0, 3, (h, q, t), generator=gen).float()
                              .masked_fill(~vis, float("-inf")), -1)
        tie_v = torch.randint(-1, 2, (g, t, d), generator=gen).float()
        out.append((f"ties_h{h}g{g}t{t}q{q}", tie_a, tie_v, None, pos))
        # a padded mask (some keys hidden, per head) and a non-finite row
        mask = vis.expand(h, q, t).clone()
        mask[:, :, 1:3] = False
        masked = alpha.masked_fill(~mask, 0.0)
        masked = masked / masked.sum(-1, keepdim=True).clamp_min(1e-30)
        if q > 2:
            masked[0, 1, -1] = float("nan")
        vals = values.clone()
        if t > 10:
            vals[0, 5, 0] = float("inf")
        out.append((f"mask_h{h}g{g}t{t}q{q}", masked, vals, mask, pos))
    return out


def metric_tensors() -> dict[str, torch.Tensor]:
    """Every compared tensor, keyed by case, distance, path, compile, variant, rule, field."""
    out = {}
    for name, alpha, values, visible, pos in _cases():
        for distance in ("euclidean", "cosine"):
            for path in ("direct", "gram"):
                for comp in (False, True):
                    with compiling(comp):
                        res = topn_metrics_variants(
                            alpha, values, GRID, rules=("attention", "contribution", "random"),
                            variants=("full", "no_sink"), distance=distance, visible=visible,
                            query_positions=pos, repeats=3, seed=7, window=2, layer=1,
                            path=path)
                    for variant, rules in res.items():
                        for rule, r in rules.items():
                            for f in FIELDS:
                                key = f"{name}/{distance}/{path}/c{int(comp)}/{variant}/{rule}/{f}"
                                out[key] = getattr(r, f).clone()
                    # each variant alone too (no read-off), with a small chunk
                    for variant in ("full", "no_sink"):
                        with compiling(comp):
                            res = topn_metrics_variants(
                                alpha, values, GRID, rules=("contribution", "random"),
                                variants=(variant,), distance=distance, visible=visible,
                                query_positions=pos, repeats=2, seed=3, path=path,
                                chunk_rows=3)
                        for rule, r in res[variant].items():
                            key = f"{name}/{distance}/{path}/c{int(comp)}/alone-{variant}/{rule}"
                            out[key + "/stacked"] = r.stacked.clone()
    return out


def analyze_tables(where: Path) -> dict[str, pd.DataFrame]:
    """metrics and summary tables of stories260K runs (final and all queries)."""
    import attngeom
    from attngeom.assets import asset

    out = {}
    for mode, comp in (("final", "off"), ("all", "off"), ("all", "on")):
        run = where / f"{mode}-{comp}"
        attngeom.analyze(asset("stories260K"), asset("tinystories", "--corpus"), run,
                         query_mode=mode, n_windows=3, window_length=48, compile=comp,
                         distances=("euclidean", "cosine"), bootstrap=20, progress=False,
                         device="cpu", overwrite=True)
        for table in ("metrics", "summary"):
            out[f"{mode}-{comp}/{table}"] = pd.read_parquet(run / f"{table}.parquet")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("save", "compare"))
    p.add_argument("dir", type=Path)
    p.add_argument("--no-model", action="store_true", help="skip the stories260K runs")
    a = p.parse_args(argv)
    torch.set_num_threads(1)  # one thread: products round the same way every run
    tensors = metric_tensors()
    with tempfile.TemporaryDirectory() as tmp:
        tables = {} if a.no_model else analyze_tables(Path(tmp))
    if a.action == "save":
        a.dir.mkdir(parents=True, exist_ok=True)
        torch.save(tensors, a.dir / "tensors.pt")
        for key, df in tables.items():
            df.to_pickle(a.dir / (key.replace("/", "__") + ".pkl"))
        print(f"saved {len(tensors)} tensors and {len(tables)} tables to {a.dir}")
        return 0
    old = torch.load(a.dir / "tensors.pt")
    def bits(x: torch.Tensor) -> torch.Tensor:  # -0.0 and NaN payloads count too
        x = x.contiguous()
        return x.view(torch.int64) if x.dtype == torch.float64 else x

    bad = [k for k in old if k not in tensors or old[k].dtype != tensors[k].dtype
           or not torch.equal(bits(old[k]), bits(tensors[k]))]
    bad += [k for k in tensors if k not in old]
    for key, df in tables.items():
        before = pd.read_pickle(a.dir / (key.replace("/", "__") + ".pkl"))
        if not before.equals(df):
            bad.append(key)
    print(f"compared {len(tensors)} tensors and {len(tables)} tables: "
          f"{len(bad)} differ" + ("".join(f"\n  {k}" for k in bad[:40])))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
