"""One declaration per name: commands, analyses, rankers and regimes are each declared
once, and whatever reads them reads the declaration. The contracts run over every
registered analysis and ranker, so a new one is tested the moment it is registered."""

from __future__ import annotations

import ast
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from attngeom.config import COMMANDS, AnalysisConfig, loss_commands
from attngeom.engine.analyses import AnalysisContext
from attngeom.names import ANALYSES as REGISTRY
from attngeom.names import ANALYSIS_ALIASES, NO_REGIME, REGIMES
from attngeom.results import schemas
from tests.core.batches import assert_columns_equal, batch_of, causal

SRC = Path(__file__).resolve().parents[1] / "src" / "attngeom"


# --------------------------------------------------------------------------- commands


def test_every_command_is_one_declaration_read_everywhere() -> None:
    from attngeom.cli import build_parser
    from attngeom.studies import presets, study

    parser = build_parser()
    sub = next(a for a in parser._actions if getattr(a, "choices", None))
    for name, spec in COMMANDS.items():
        assert spec.config.command == name
        p = sub.choices[name]
        flags = {s for a in p._actions for s in a.option_strings}
        from attngeom.config import option_fields

        assert {f"--{n.replace('_', '-')}" for n, *_ in option_fields(spec.config)} <= flags
        assert study.run_dir(name) == spec.folder
        if spec.study:
            assert study.interventions()[spec.study] == name
    assert presets.LOSS_COMMANDS == loss_commands() == (
        "prune", "scan-heads", "restrict", "competition", "competition-qa",
        "competition-context", "restrict-local", "restrict-policies")
    assert [study.run_dir(n) for n in COMMANDS] == [
        "analyze", "prune", "scan", "restrict", "atlas", "competition", "qa", "context",
        "restrict-local", "policies"]


def test_every_option_and_positional_has_help_and_out_is_declared_once() -> None:
    from attngeom.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if getattr(a, "choices", None))
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help, f"{name}: {action.dest} has no help"
    check = {s for a in sub.choices["check"]._actions for s in a.option_strings}
    assert {"--model", "--device", "--dtype"} <= check
    source = (SRC / "cli.py").read_text()
    assert source.count('"--out"') == 1


def test_summaries_are_declared_and_importable() -> None:
    import importlib

    for spec in COMMANDS.values():
        module, _, attr = spec.summary.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))
        module, _, attr = spec.work.partition(":")
        assert hasattr(importlib.import_module(module), attr)


# --------------------------------------------------------------------------- regimes


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


# published numbers quote the papers' regime names as data (H3's reference table)
QUOTED = {"studies/references.py"}


def test_regime_names_are_written_only_in_names() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "names.py" or rel in QUOTED:
            continue
        found = _string_constants(path) & set(REGIMES)
        if found:
            offenders.append(f"{rel}: {sorted(found)}")
    assert not offenders, offenders


def test_regime_colours_follow_the_declared_regimes() -> None:
    pytest.importorskip("matplotlib")
    from attngeom.figures.style import REGIME_COLORS

    assert tuple(REGIME_COLORS) == (*REGIMES, NO_REGIME)


# --------------------------------------------------------------------------- analyses


def test_analyses_have_one_name_set() -> None:
    assert tuple(REGISTRY) == tuple(dict.fromkeys(schemas.WRITTEN_BY.values()))
    cfg = AnalysisConfig(model="m", corpus="c", analyses="geometry,sink,diagnostics")
    assert cfg.analyses == ("metrics", "sink", "assumptions")
    assert set(ANALYSIS_ALIASES.values()) <= set(REGISTRY)
    from attngeom.studies.study import analyze_parts, canonical

    assert analyze_parts() == tuple(REGISTRY)
    assert canonical("geometry") == "metrics" and canonical("taxonomy") == "taxonomy"


def _config() -> AnalysisConfig:
    return AnalysisConfig(model="m", corpus="c", n_grid=(1, 2), query_mode="all",
                          bootstrap=20, repeats=2)


def _rows(seed: int, t: int = 7):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(2, t, 3, generator=gen)
    qpos = torch.arange(1, t)
    logits = torch.randn(4, t - 1, t, generator=gen).masked_fill(~causal(qpos, t), -math.inf)
    return v, torch.softmax(logits, -1), qpos, torch.randint(0, 9, (t,), generator=gen)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_a_non_finite_row_counts_nowhere(name: str) -> None:
    """Every registered analysis: the tables with a NaN attention row equal the tables of
    the same batch without that row (the non-finite count aside)."""
    v, alpha, qpos, tokens = _rows(21)
    bad = alpha.clone()
    bad[:, 2, 1] = float("nan")
    keep = torch.tensor([0, 1, 3, 4, 5])
    spec, cfg = REGISTRY[name], _config()
    acc_bad, acc_ref = spec.make(cfg, AnalysisContext()), spec.make(cfg, AnalysisContext())
    acc_bad.update(batch_of(v, bad, qpos, tokens=tokens))
    acc_ref.update(batch_of(v, alpha[:, keep], qpos[keep], tokens=tokens))
    got, ref = acc_bad.compute(), acc_ref.compute()
    assert list(got) == list(ref)
    for table in ref:
        # the columns that count skipped entries record the row, as they should
        skips = [c for c in ref[table] if c.startswith("n_skipped")]
        for c in skips:
            assert (np.asarray(got[table][c]) >= np.asarray(ref[table][c])).all()
        assert_columns_equal({k: x for k, x in got[table].items() if k not in skips},
                             {k: x for k, x in ref[table].items() if k not in skips})


@pytest.mark.parametrize("name", list(REGISTRY))
def test_merge_is_exact_and_survives_a_shard(name: str) -> None:
    """Every registered analysis: units merged in unit order give the same tables bit
    for bit whether each unit's state was kept in memory or written to a shard and read
    back (what a resumed or data-parallel run does), and merging returns the target."""
    spec, cfg = REGISTRY[name], _config()
    batches = []
    for w in range(4):
        v, alpha, qpos, tokens = _rows(100 + w, t=9)
        batches.append(batch_of(v, alpha, qpos, window=w, tokens=tokens))

    def units():
        out = []
        for b in batches:
            acc = spec.make(cfg, AnalysisContext())
            acc.update(b)
            out.append(acc)
        return out

    direct, shards = spec.make(cfg, AnalysisContext()), spec.make(cfg, AnalysisContext())
    for acc in units():
        assert direct.merge(acc) is direct
    for acc in units():
        shards.merge(pickle.loads(pickle.dumps(acc)))
    got, ref = shards.compute(), direct.compute()
    assert list(got) == list(ref)
    for table in ref:
        assert_columns_equal(got[table], ref[table], rtol=0.0)


# --------------------------------------------------------------------------- rankers


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def _taxonomy(layers: int, heads: int):
    import pandas as pd

    rows = [{"layer": layer, "head": h, "regime": (*REGIMES, NO_REGIME)[(layer + h) % 4],
             "mean_output_norm": float((layer * heads + h) % 5)}
            for layer in range(layers) for h in range(heads)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("name", ["taxonomy", "magnitude", "entropy", "random", "gradient",
                                  "sensitivity"])
def test_the_rankers_of_the_contract_are_the_registry(name) -> None:
    from attngeom.interventions.rankers import RANKERS

    assert name in RANKERS  # the contract below runs over RANKERS itself


def test_every_registered_ranker_keeps_the_contract(tiny_llama) -> None:
    """Every registered ranker: all heads once each, scores of shape (L, H), the same
    order on the same input, and the same ranking when its statistics are summed over
    two batches as over one (so a run can stream and shard them)."""
    from attngeom.interventions.rankers import RANKERS, add_stats

    layers, heads = 2, 4
    ids = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(0))
    kwargs = dict(taxonomy=_taxonomy(layers, heads), seed=3)
    for name, ranker in RANKERS.items():
        stats = None
        if ranker.batch_stats is not None:
            whole = ranker.batch_stats(tiny_llama, ids)
            stats = add_stats(add_stats(None, ranker.batch_stats(tiny_llama, ids[:2])),
                              ranker.batch_stats(tiny_llama, ids[2:]))
            for k in whole:
                torch.testing.assert_close(stats[k], whole[k], rtol=1e-5, atol=1e-6)
        a = ranker.make(tiny_llama, stats=stats, **kwargs)
        b = ranker.make(tiny_llama, stats=stats, **kwargs)
        assert sorted(a.heads) == [(i, j) for i in range(layers) for j in range(heads)], name
        assert a.heads == b.heads, name
        assert tuple(np.asarray(a.scores).shape) == (layers, heads), name
        assert a.ranker == name
