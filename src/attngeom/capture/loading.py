"""Load a model and its tokenizer by local path or hub id (SPEC 7).

Causal LMs load through ``AutoModelForCausalLM``, encoders (BERT-like, SPEC 1's
bidirectional universe) through ``AutoModel``; both in eval mode. Any failure
becomes one ``ModelError`` line naming the model, never a transformers
traceback; a local-looking path that does not exist fails before transformers
is asked at all, so no hub retries can hang on it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from attngeom.errors import ConfigError, ModelError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
# Encoders whose config class also maps to a causal-LM head in transformers
# (e.g. BertLMHeadModel); used only when a config lists no architectures.
_ENCODER_MODEL_TYPES = (
    "albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert", "electra",
    "ernie", "modernbert", "mpnet", "roberta", "xlm-roberta",
)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``torch.float32`` -> ``torch.float32``; ``ConfigError`` otherwise."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ConfigError(f"expected dtype in {sorted(DTYPES)}, got {dtype!r}")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_local(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or name.count("/") > 1
        or os.sep != "/" and os.sep in name
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _is_causal_config(config) -> bool:
    architectures = getattr(config, "architectures", None) or []
    if architectures:
        return any(a.endswith(_CAUSAL_SUFFIXES) for a in architectures)
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    if getattr(config, "model_type", None) in _ENCODER_MODEL_TYPES:
        return bool(getattr(config, "is_decoder", False))
    return type(config) in MODEL_FOR_CAUSAL_LM_MAPPING


def load_model(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = None,
):
    """Load ``(model, tokenizer)``, the model in eval mode on ``device`` in ``dtype``.

    ``attn_implementation=None`` lets transformers choose (sdpa where the family
    supports it, eager otherwise); capture works with either. Raises
    ``ModelError`` (one line) when the path or hub id cannot be loaded, e.g.
    a missing directory, or a hub id not in the local cache with
    ``HF_HUB_OFFLINE=1``.

    >>> model, tokenizer = load_model("shared/assets/stories260K-hf")  # doctest: +SKIP
    """
    torch_dtype = resolve_dtype(dtype)
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if not path.exists() and (_looks_local(name) or isinstance(name_or_path, Path)):
        raise ModelError(f"cannot load model {name!r}: no such local directory")

    import transformers

    source = str(path) if path.exists() else name
    where = "local directory" if path.exists() else (
        "hub id (offline: HF_HUB_OFFLINE=1)" if _offline() else "hub id"
    )
    try:
        config = transformers.AutoConfig.from_pretrained(source)
        cls = (
            transformers.AutoModelForCausalLM
            if _is_causal_config(config)
            else transformers.AutoModel
        )
        kwargs = {"dtype": torch_dtype}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        with _quiet_loading(transformers):
            model = cls.from_pretrained(source, **kwargs)
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise ModelError(f"cannot load model {name!r} ({where}): {_first_line(error)}") from None
    try:
        model = model.to(device)
    except (RuntimeError, AssertionError) as error:
        raise ModelError(
            f"cannot move model {name!r} to {device!r}: {_first_line(error)}"
        ) from None
    model.eval()
    return model, tokenizer


@contextlib.contextmanager
def _quiet_loading(transformers) -> Iterator[None]:
    """Hide transformers' weight-loading bar: attngeom prints its own progress."""
    logging = transformers.utils.logging
    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
