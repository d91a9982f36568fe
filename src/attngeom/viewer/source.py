"""Where the viewer's rows come from: a prompt, or a window of a run, re-captured.

A run directory holds tables, not value vectors, so the viewer recomputes what it
draws through the capture path (``capture.capture_attention``: the model's own
probabilities at the chosen query rows, the value states per kv head, the key mask)
from what the run recorded:

- ``manifest.json``'s ``config``: the model, the corpus and how it was cut into
  windows (``window_length``, ``start_window``, ``windows_per_document``,
  ``sample_documents``, ``seed``, text column, separator, document boundaries), so
  window i is the same tokens as in the run (``corpora.documents.load_windows``);
  ``query_mode`` gives the analysed query (``final``: the last content token);
- ``taxonomy.parquet``: the head's regime as the run labelled it.

A run without these is refused in one line naming what is missing. Bad positions,
heads and layers are refused in one line naming the valid range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attngeom.errors import ConfigError, RunDirError

# the manifest's config keys the viewer needs to cut a run's windows again
# what a run's manifest config must hold to cut its windows again (how many it read is
# the manifest's corpus record: analyze's n_windows, the interventions' n_eval_windows)
RUN_KEYS = ("model", "corpus", "window_length", "start_window")
_WINDOW_KEYS = ("n_windows", "query_mode")


@dataclass
class LayerRows:
    """One layer's captured rows of one sequence (batch of one).

    ``alpha`` (H, Q, T) float32, ``values`` (G, T, d) float32, ``visible`` (H or 1, Q, T)
    bool, ``rows`` (Q,) int64 the query positions of the rows.
    """

    layer: int
    alpha: torch.Tensor
    values: torch.Tensor
    visible: torch.Tensor
    rows: torch.Tensor

    def row(self, head: int, query: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(alpha (T,), values (T, d) of the head's kv head, universe (T,)) of one row."""
        i = int(torch.nonzero(self.rows == int(query)).flatten()[0])
        h, g = self.alpha.shape[0], self.values.shape[0]
        vis = self.visible[head if self.visible.shape[0] > 1 else 0, i]
        return self.alpha[head, i], self.values[head // (h // g)], vis


@dataclass
class RunWindow:
    """A run's window re-cut: its index, token ids, special mask, the run's settings."""

    run_dir: Path
    manifest: dict
    index: int
    input_ids: torch.Tensor
    special: torch.Tensor | None
    config: object


def check_head(layout, layer: int, head: int) -> None:
    """One line naming the valid range for a layer or head out of range."""
    for name, value, count in (("layer", layer, layout.num_layers),
                               ("head", head, layout.num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise ConfigError(f"{name}: expected an integer in [0, {count - 1}] for "
                              f"{layout.model_class} ({count} {name}s), got {value!r}")


def resolve_query(query: int, num_tokens: int, *, causal: bool) -> int:
    """The query position of ``query`` (negatives count from the end), range-checked.

    A causal query needs at least two visible keys (t >= 1) for any N to be valid.
    """
    low = 1 if causal else 0
    if isinstance(query, bool) or not hasattr(query, "__index__"):
        raise ConfigError(f"query: expected an integer position, got {query!r}")
    q = int(query.__index__())
    t = q + num_tokens if q < 0 else q
    if not low <= t < num_tokens:
        raise ConfigError(f"query: expected a position in [{low}, {num_tokens - 1}] (or "
                          f"[-{num_tokens - low}, -1] from the end) for a window of "
                          f"{num_tokens} tokens, got {query!r}")
    return t


def check_length(num_tokens: int, layout) -> None:
    """A prompt longer than the model's positions: one line naming the limit."""
    limit = layout.max_positions
    if limit is not None and num_tokens > limit:
        raise ConfigError(f"prompt: {num_tokens} tokens is longer than {layout.model_class}'s "
                          f"{limit} positions; expected at most {limit} tokens")
    if num_tokens < 2:
        raise ConfigError(f"prompt: expected at least 2 tokens, got {num_tokens}")


def prompt_ids(text_or_ids, tokenizer) -> torch.Tensor:
    """(T,) int64 token ids of a prompt: text through the tokenizer (its special tokens
    added, e.g. BOS, as the model saw its training text), or ids as given."""
    if isinstance(text_or_ids, str):
        if tokenizer is None:
            raise ConfigError("a text prompt needs a tokenizer: pass tokenizer= or a model "
                              "path that has one")
        ids = tokenizer(text_or_ids, return_tensors="pt")["input_ids"][0]
    else:
        try:
            ids = torch.as_tensor(text_or_ids)
        except (TypeError, ValueError, RuntimeError):
            raise ConfigError(f"prompt: expected text or a sequence of token ids, got "
                              f"{type(text_or_ids).__name__}") from None
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ConfigError(f"prompt: expected a 1-D sequence of integer token ids, got "
                              f"shape {tuple(ids.shape)} of {ids.dtype}")
    return ids.to(torch.int64)


def capture_layers(model, input_ids: torch.Tensor, layers: Sequence[int],
                   rows: Sequence[int]) -> dict[int, LayerRows]:
    """The rows ``rows`` of each layer in ``layers`` for one sequence, by the capture
    path (the model's own probabilities, value states and key mask; method §2)."""
    from attngeom.capture import capture_attention, input_device

    wanted = set(int(x) for x in layers)
    query_rows = torch.tensor(sorted(set(int(r) for r in rows)), dtype=torch.int64)
    out: dict[int, list] = {}

    def consume(cap) -> None:
        if cap.layer in wanted:
            out.setdefault(cap.layer, []).append(cap)

    device = input_device(model)
    ids = input_ids.to(device)[None]
    with torch.inference_mode(), capture_attention(model, consume,
                                                   query_rows=query_rows.to(device)):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    captured = {}
    for layer in sorted(wanted):
        caps = out.get(layer)
        if not caps:
            raise ConfigError(f"layer {layer}: nothing was captured; its attention does not go "
                              "through the transformers attention interface")
        captured[layer] = LayerRows(
            layer=layer,
            alpha=torch.cat([c.alpha[0] for c in caps], dim=1).float().cpu(),
            values=caps[0].values[0].float().cpu(),
            visible=torch.cat([c.visible[0] for c in caps], dim=1).cpu(),
            rows=torch.cat([c.query_rows for c in caps]).cpu())
    return captured


def read_run(run_dir) -> tuple[Path, dict]:
    """The run's manifest, checked for what the viewer needs (one line otherwise)."""
    from attngeom.results.io import read_manifest

    run = Path(run_dir)
    manifest = read_manifest(run)
    config = manifest.get("config")
    if not isinstance(config, dict):
        raise RunDirError(f"run {run} cannot be viewed: its manifest has no config (the "
                          "model, corpus and windows to capture again)")
    missing = [k for k in RUN_KEYS if k not in config or (k in ("model", "corpus")
                                                          and not config[k])]
    if missing:
        raise RunDirError(f"run {run} cannot be viewed: its manifest's config lacks "
                          f"{', '.join(missing)} (needed to capture its windows again)")
    corpus = manifest.get("corpus") or {}
    if not corpus.get("n_windows"):
        raise RunDirError(f"run {run} cannot be viewed: it is a run of "
                          f"{manifest.get('command')!r}, which reads no window of the "
                          "corpus; view an analyze or atlas run (attngeom analyze, attngeom "
                          "atlas), or pass --prompt")
    return run, manifest


def has_taxonomy(run: Path) -> bool:
    """Whether the run holds the regimes of its heads (an analyze or atlas run with the
    taxonomy); without, the viewer computes a head's regime from the rows it captures."""
    return (Path(run) / "taxonomy.parquet").is_file()


def run_config(manifest: dict):
    """An ``AnalysisConfig`` with the run's model, corpus and window settings (every
    option of ``RunConfig``, the options all commands share, so that a new way of
    cutting windows comes along; plus the analysed windows and queries)."""
    from dataclasses import fields

    from attngeom.config import AnalysisConfig, RunConfig

    given = manifest["config"]
    names = {f.name for f in fields(RunConfig)} | set(_WINDOW_KEYS)
    kwargs = {k: given[k] for k in names if k in given}
    kwargs.update(device="cpu", device_map=None)  # windows are cut on the host
    try:
        return AnalysisConfig(**kwargs)
    except ConfigError as e:
        raise RunDirError(f"run settings cannot be read back: {e}") from None


def run_window(run: Path, manifest: dict, tokenizer, window: int | None) -> RunWindow:
    """Window ``window`` of the run (default: its first), cut again as the run cut it."""
    from attngeom.corpora.documents import load_windows

    config = run_config(manifest)
    corpus_meta = manifest.get("corpus") or {}
    first = int(corpus_meta.get("first_window", config.start_window))
    count = corpus_meta.get("n_windows", config.n_windows)
    index = first if window is None else window
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"window: expected an integer window index, got {window!r}")
    if count is not None and not first <= index < first + int(count):
        raise ConfigError(f"window: expected a window of the run in [{first}, "
                          f"{first + int(count) - 1}], got {index}")
    corpus = Path(str(config.corpus)).expanduser()
    if not corpus.exists() and ("/" in str(config.corpus) or corpus.suffix):
        raise RunDirError(f"run {run} cannot be viewed: its corpus {config.corpus} is not "
                          "here (the windows are cut again from it)")
    windows, _, _ = load_windows(config, tokenizer, n_windows=1, start_window=index)
    if not windows or int(windows[0].index) != index:
        raise RunDirError(f"run {run}: window {index} could not be cut again from "
                          f"{config.corpus}")
    w = windows[0]
    return RunWindow(run_dir=run, manifest=manifest, index=index, input_ids=w.input_ids,
                     special=getattr(w, "special", None), config=config)


def run_regime(run: Path, layer: int, head: int, model_label: str | None = None) -> dict:
    """The head's row of the run's taxonomy table, as a dict (regime and its support)."""
    from attngeom.results.io import read_table

    df = read_table(run, "taxonomy")
    if model_label is not None and "model" in df.columns and df["model"].nunique() > 1:
        df = df[df["model"] == model_label]
    rows = df[(df["layer"] == layer) & (df["head"] == head)]
    if len(rows) == 0:
        raise RunDirError(f"run {run} has no taxonomy row for layer {layer}, head {head}")
    row = rows.iloc[0]
    keep = ("regime", "regime_rule", "n_queries", "f_self", "f_sink", "f_other",
            "winning_share", "runner_up_share", "top_source_kind", "top_source",
            "top_source_share", "stability")
    out = {k: _plain(row[k]) for k in keep if k in row.index}
    out["source"] = (f"run taxonomy table ({int(row['n_queries'])} counted queries"
                     f"{', corpus ' + str(row['corpus']) if 'corpus' in row.index else ''})")
    return out


def _plain(x):
    if hasattr(x, "item"):
        x = x.item()
    return x
