"""``attngeom compare``: how stable the regimes are between two runs of one model (method §7).

Agreement and Cohen's kappa over the heads labelled in both runs
(``core.agreement``), the confusion table, and the label stability of each run:
agreement among the heads whose labels are stable (>= ``names.STABLE``) in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attngeom.errors import RunDirError
from attngeom.names import STABLE

FEW_WINDOWS = 10  # below this many windows a run's labels are read with a caveat


@dataclass
class Comparison:
    """Regime stability between two runs (method §7)."""

    agreement: float
    kappa: float
    n_heads: int
    excluded: int
    confusion: object
    merged: object
    stable_agreement: float = float("nan")
    n_stable: int = 0
    stability_threshold: float = 0.8
    windows: tuple = ()  # windows of each run (where its manifest says)

    def __str__(self) -> str:
        kappa = (f"{self.kappa:.3f}" if self.kappa == self.kappa
                 else "undefined (a single regime in both runs)")
        lines = [
            f"heads compared: {self.n_heads} (excluded: {self.excluded})",
            f"same regime: {self.agreement:.1%}   Cohen's kappa: {kappa}",
        ]
        few = [n for n in self.windows if n is not None and n < FEW_WINDOWS]
        if few:
            lines.insert(0, f"caveat: a run of only {min(few)} window"
                         f"{'s' if min(few) != 1 else ''}: its labels, and so the agreement "
                         "and kappa, can change with more windows (kappa below 0 is less "
                         "agreement than chance)")
        if "stability_a" in self.merged.columns:
            sa, sb = self.merged["stability_a"], self.merged["stability_b"]
            stable = (f"{self.stable_agreement:.1%}" if self.n_stable else "no such head")
            lines.append(
                f"label stability (window bootstrap): median {sa.median():.3f} and "
                f"{sb.median():.3f}; heads stable (>= {self.stability_threshold:g}) in both: "
                f"{self.n_stable}, same regime among them: {stable}"
            )
        lines.append(self.confusion.to_string())
        return "\n".join(lines)


def compare_runs(run_a: str | Path, run_b: str | Path) -> Comparison:
    """How stable the Retriever/Mixer/Reset regimes are between two runs."""
    import pandas as pd

    from attngeom.core.agreement import regime_agreement
    from attngeom.results.io import read_manifest, read_table

    runs = []
    for run in (run_a, run_b):
        manifest = read_manifest(run)
        if "taxonomy" not in manifest.get("tables", {}):
            raise RunDirError(f"{run} has no taxonomy table; run 'attngeom analyze' with taxonomy")
        runs.append((manifest, read_table(run, "taxonomy")))
    (ma, ta), (mb, tb) = runs
    ida, idb = ma.get("model", {}), mb.get("model", {})
    def identity(m: dict) -> tuple:
        # a local model is known by its files' hash; a hub model (no hash) by its id
        return (m.get("sha256") or m.get("name"), m.get("class"), m.get("num_layers"),
                m.get("num_heads"))

    if identity(ida) != identity(idb):
        raise RunDirError(
            f"{run_a} and {run_b} analyse different models ({ida.get('name')} vs "
            f"{idb.get('name')}); compare needs runs of the same model"
        )
    cols = ["layer", "head", "regime"] + (
        ["stability"] if "stability" in ta.columns and "stability" in tb.columns else [])
    merged = ta[cols].merge(tb[cols], on=["layer", "head"], suffixes=("_a", "_b"))
    agr = regime_agreement(list(merged["regime_a"]), list(merged["regime_b"]))
    stable_agreement, n_stable = float("nan"), 0
    if "stability_a" in merged.columns:
        both = merged[(merged["stability_a"] >= STABLE) & (merged["stability_b"] >= STABLE)]
        n_stable = len(both)
        if n_stable:
            stable_agreement = float((both["regime_a"] == both["regime_b"]).mean())
    long = pd.DataFrame(agr.confusion)
    confusion = long.pivot_table(index="regime_a", columns="regime_b", values="count",
                                 aggfunc="sum", sort=False)
    confusion.index.name = f"{_run_name(ma, run_a)} \\ {_run_name(mb, run_b)}"
    confusion.columns.name = None
    return Comparison(
        agreement=float(agr.agreement), kappa=float(agr.kappa), n_heads=int(agr.n_heads),
        excluded=int(agr.n_excluded), confusion=confusion, merged=merged,
        stable_agreement=stable_agreement, n_stable=n_stable, stability_threshold=STABLE,
        windows=(_windows(ma), _windows(mb)),
    )


def _windows(manifest: dict) -> int | None:
    n = manifest.get("counts", {}).get("windows", manifest.get("corpus", {}).get("n_windows"))
    return None if n is None else int(n)


def _run_name(manifest: dict, run) -> str:
    corpus = manifest.get("config", {}).get("corpus_label") or Path(str(run)).name
    return str(corpus)
