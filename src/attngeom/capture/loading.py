"""Load a model and its tokenizer by local path, GGUF file or hub id (method §10).

Causal LMs load through ``AutoModelForCausalLM``, encoders (BERT-like, the method's
bidirectional universe) through ``AutoModel``; both in eval mode. A ``.gguf`` file
(or a directory holding exactly one, and no ``config.json``) loads through
transformers' own GGUF reader, dequantised to the requested dtype (float32 by
default); its tokenizer conversion takes seconds, so the converted tokenizer is
cached (``cache_dir()``, keyed by the file's path, size and modification time).
``quantization="8bit"`` / ``"4bit"`` loads the weights through bitsandbytes
(LLM.int8 with outlier threshold 6.0, or nf4 computing in the requested dtype), placed
on one CUDA device by ``device_map``; what it needs (bitsandbytes, a CUDA GPU, a
non-GGUF source) is checked before any weights are read.
Any failure becomes one ``ModelError`` line naming the model, never a transformers
traceback; a local-looking path that does not exist fails before transformers is
asked at all, so no hub retries can hang on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from attngeom.errors import ConfigError, ModelError
from attngeom.names import DTYPES, QUANTIZATIONS

# the torch dtype of each name ``--dtype`` takes (``names.DTYPES`` declares them)
TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
# Encoders whose config class also maps to a causal-LM head in transformers
# (e.g. BertLMHeadModel); used only when a config lists no architectures.
_ENCODER_MODEL_TYPES = (
    "albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert", "electra",
    "ernie", "modernbert", "mpnet", "roberta", "xlm-roberta",
)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``torch.float32`` -> ``torch.float32``; ``ConfigError`` otherwise."""
    if isinstance(dtype, torch.dtype) and dtype in TORCH_DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return TORCH_DTYPES[dtype]
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


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``source`` for ``from_pretrained``, plus a GGUF file name."""

    name: str
    source: str
    local: bool
    gguf_file: str | None = None

    @property
    def gguf_path(self) -> Path | None:
        return Path(self.source) / self.gguf_file if self.gguf_file else None

    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    @property
    def where(self) -> str:
        if self.gguf_file:
            return "GGUF file"
        if self.local:
            return "local directory"
        return "hub id (offline: HF_HUB_OFFLINE=1)" if _offline() else "hub id"


def resolve_source(name_or_path: str | os.PathLike) -> ModelSource:
    """Tell a local directory, a GGUF file and a hub id apart (``ModelError`` if missing);
    ``asset:NAME`` is a bundled asset (``attngeom.assets``: one line listing the known
    ones when NAME is not)."""
    name = os.fspath(name_or_path)
    if name.startswith("asset:"):
        from attngeom.assets import asset

        name = asset(name.split(":", 1)[1], "--model")
    path = Path(name).expanduser()
    if not path.exists():
        if _looks_local(name) or isinstance(name_or_path, Path) or name.endswith(".gguf"):
            raise ModelError(f"cannot load model {name!r}: no such local directory or file")
        return ModelSource(name, name, local=False)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(
                f"cannot load model {name!r}: expected a model directory or a .gguf file, "
                f"got a {path.suffix or 'plain'} file"
            )
        return ModelSource(name, str(path.parent), local=True, gguf_file=path.name)
    if not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(name, str(path), local=True, gguf_file=ggufs[0])
        if len(ggufs) > 1:
            raise ModelError(
                f"cannot load model {name!r}: the directory holds {len(ggufs)} GGUF files "
                f"({', '.join(ggufs[:4])}); pass the file itself"
            )
    return ModelSource(name, str(path), local=True)


def cache_dir() -> Path:
    """attngeom's cache folder: ``$ATTNGEOM_CACHE``, else ``$XDG_CACHE_HOME/attngeom``,
    else ``~/.cache/attngeom``."""
    explicit = os.environ.get("ATTNGEOM_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attngeom"


def _gguf_tokenizer(transformers, src: ModelSource):
    """The GGUF file's tokenizer, converted once and then read from the cache."""
    path = src.gguf_path
    st = path.stat()
    key = hashlib.sha256(
        f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}".encode()
    ).hexdigest()[:32]
    cached = cache_dir() / "gguf-tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        try:
            return transformers.AutoTokenizer.from_pretrained(str(cached))
        except (OSError, ValueError, KeyError):
            shutil.rmtree(cached, ignore_errors=True)  # a damaged cache entry: convert again
    tokenizer = transformers.AutoTokenizer.from_pretrained(src.source, gguf_file=src.gguf_file)
    with contextlib.suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.parent / f".{key}.{uuid.uuid4().hex}.tmp"
        tokenizer.save_pretrained(str(tmp))
        try:
            os.replace(tmp, cached)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer of a model (cheap next to the model: windows are cut before it loads).

    Raises ``ModelError`` (one line) when it cannot be loaded.
    """
    src = resolve_source(name_or_path)
    import transformers

    try:
        if src.gguf_file:
            return _gguf_tokenizer(transformers, src)
        return transformers.AutoTokenizer.from_pretrained(src.source)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise ModelError(
            f"cannot load the tokenizer of {src.name!r} ({src.where}): {_first_line(error)}"
        ) from None


def inspect_model(name_or_path: str | os.PathLike) -> dict | None:
    """Kind and shape of a model from its configuration alone (no weights are read).

    Returns ``is_causal``, ``layers``, ``heads``, ``kv_heads``, ``head_dim``, ``hidden``,
    ``vocab`` and an estimate of the parameters in billions (``params_b``: embeddings,
    attention and MLP matrices), or ``None`` for a hub id that cannot be resolved here
    (offline and not cached). A missing local path is a ``ModelError``.
    """
    src = resolve_source(name_or_path)
    key = _file_key(src)
    if key is not None and key in _SHAPES:
        return dict(_SHAPES[key])
    shape = _inspect(src)
    if key is not None:
        _SHAPES[key] = dict(shape)
    return shape


# shapes read from local files, by (file, size, mtime): a GGUF file's configuration is
# parsed from its whole header (the tokenizer's vocabulary too, seconds for a 49k-token
# one), and a study asks it of every cell before any weight is read
_SHAPES: dict[tuple, dict] = {}


def _file_key(src: ModelSource) -> tuple | None:
    if not src.local:
        return None
    path = src.gguf_path or Path(src.source) / "config.json"
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _inspect(src: ModelSource) -> dict:
    import transformers

    try:
        with _quiet_loading(transformers, gguf=bool(src.gguf_file)):
            config = transformers.AutoConfig.from_pretrained(src.source, **src.kwargs())
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        if not src.local:
            return None
        raise ModelError(
            f"cannot read the configuration of {src.name!r} ({src.where}): "
            f"{_first_line(error)}"
        ) from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def get(*names, default=None):
        for n in names:
            value = getattr(text, n, None)
            if value is not None:
                return value
        return default

    hidden = int(get("hidden_size", "n_embd", "d_model", default=0))
    heads = int(get("num_attention_heads", "n_head", default=1))
    layers = int(get("num_hidden_layers", "n_layer", default=0))
    kv = int(get("num_key_value_heads", default=heads) or heads)
    head_dim = int(get("head_dim", default=0) or (hidden // max(heads, 1)))
    vocab = int(get("vocab_size", default=0))
    inter = int(get("intermediate_size", "n_inner", default=0) or 4 * hidden)
    gated = str(get("hidden_act", "activation_function", default="")) in ("silu", "swiglu",
                                                                           "gelu_pytorch_tanh")
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    mlp = (3 if gated else 2) * hidden * inter
    tied = bool(getattr(config, "tie_word_embeddings", True))
    params = layers * (attention + mlp) + vocab * hidden * (1 if tied else 2)
    positions = get("max_position_embeddings", "n_positions", "max_seq_len")
    return {"is_causal": _is_causal_config(config), "layers": layers, "heads": heads,
            "kv_heads": kv, "head_dim": head_dim, "hidden": hidden, "vocab": vocab,
            "params_b": params / 1e9, "max_positions": int(positions) if positions else None,
            "bos_token_id": _bos_id(config, text), "model_class": _class_name(config)}


def _class_name(config) -> str:
    archs = getattr(config, "architectures", None) or []
    return str(archs[0]) if archs else type(config).__name__.replace("Config", "")


def model_shape(name_or_path: str | os.PathLike):
    """``validate.ModelShape`` of a model from its configuration alone (no weights), for
    the checks every option makes against the model before it loads; ``None`` for a hub
    id that cannot be resolved here (the checks then run after the load)."""
    from attngeom.validate import ModelShape

    facts = inspect_model(name_or_path)
    if facts is None:
        return None
    return ModelShape.from_dict(facts, name=facts["model_class"])


def check_device(device: str) -> None:
    """One line, before anything loads, for a device this machine does not have."""
    try:
        place = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device: expected cpu, cuda, cuda:N or mps, got {device!r}") from None
    if place.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device: {device!r} asked, but torch sees no CUDA GPU here "
                              "(use --device cpu)")
        if place.index is not None and place.index >= count:
            raise ConfigError(f"device: {device!r} asked, but torch sees {count} CUDA GPU"
                              f"{'s' if count > 1 else ''} (valid: cuda:0..cuda:{count - 1})")
    elif place.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(f"device: {device!r} asked, but MPS is not available here "
                              "(use --device cpu)")


def _bos_id(config, text) -> int | None:
    """The configuration's ``bos_token_id`` (the top level's, else the text model's)."""
    for c in (config, text):
        value = getattr(c, "bos_token_id", None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


LLM_INT8_THRESHOLD = 6.0  # LLM.int8's outlier threshold, as the follow-up ran it


def resolve_quantization(quantization: str) -> str:
    """``"none"``, ``"8bit"`` or ``"4bit"``; ``ConfigError`` otherwise."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"expected quantization in {list(QUANTIZATIONS)}, "
                          f"got {quantization!r}")
    return quantization


def _quantization_config(transformers, src: ModelSource, quantization: str,
                         torch_dtype: torch.dtype, device, device_map):
    """The ``BitsAndBytesConfig`` of an 8-bit or 4-bit load, after checking what it
    needs, so a load that cannot work fails before a single weight is read."""
    what = f"cannot load model {src.name!r} in {quantization}"
    if src.gguf_file:
        raise ModelError(f"{what}: a GGUF file is already quantised (it loads dequantised "
                         "to the dtype); use quantization none")
    if device_map is None:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):
            raise ModelError(f"{what}: unknown device {str(device)!r}") from None
        if kind != "cuda":
            raise ModelError(f"{what}: bitsandbytes 8-bit/4-bit weights need a CUDA GPU, "
                             f"got device {str(device)!r}")
    if not torch.cuda.is_available():
        raise ModelError(f"{what}: bitsandbytes 8-bit/4-bit weights need a CUDA GPU, and "
                         "torch sees none")
    try:
        import bitsandbytes  # noqa: F401  (imported only to know that it is there)
    except ImportError:
        raise ModelError(f"quantization {quantization} needs bitsandbytes: "
                         "pip install bitsandbytes") from None
    if quantization == "8bit":
        return transformers.BitsAndBytesConfig(load_in_8bit=True,
                                               llm_int8_threshold=LLM_INT8_THRESHOLD)
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                           bnb_4bit_compute_dtype=torch_dtype)


def load_model(
    name_or_path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = None,
    tokenizer=None,
    device_map: str | dict | None = None,
    quantization: str = "none",
):
    """Load ``(model, tokenizer)``, the model in eval mode on ``device`` in ``dtype``.

    ``attn_implementation=None`` lets transformers choose (sdpa where the family
    supports it, eager otherwise); capture works with either. ``tokenizer``: one
    already loaded (``load_tokenizer``), else it is loaded here. ``device_map="auto"``
    spreads a model too large for one device over the GPUs of the machine (transformers
    with accelerate places the layers; ``device`` is then ignored). ``quantization``:
    ``"8bit"`` (bitsandbytes LLM.int8, outlier threshold 6.0) or ``"4bit"`` (nf4,
    computing in ``dtype``) on a CUDA ``device`` (placed there by ``device_map``, as a
    bitsandbytes model cannot be moved), or ``"none"``. Raises
    ``ModelError`` (one line) when the path or hub id cannot be loaded, e.g. a
    missing directory, or a hub id not in the local cache with ``HF_HUB_OFFLINE=1``.

    >>> from attngeom.assets import asset
    >>> model, tokenizer = load_model(asset("stories260K"))
    >>> type(model).__name__, tokenizer.bos_token
    ('LlamaForCausalLM', '<s>')
    """
    torch_dtype = resolve_dtype(dtype)
    quantization = resolve_quantization(quantization)
    src = resolve_source(name_or_path)
    import transformers

    quantized = quantization != "none"
    if quantized:
        bnb = _quantization_config(transformers, src, quantization, torch_dtype, device,
                                   device_map)
        if device_map is None:  # the whole model on the one GPU asked for
            place = torch.device(device)
            device_map = {"": str(place) if place.index is not None
                          else f"cuda:{torch.cuda.current_device()}"}
    try:
        config = transformers.AutoConfig.from_pretrained(src.source, **src.kwargs())
        cls = (
            transformers.AutoModelForCausalLM
            if _is_causal_config(config)
            else transformers.AutoModel
        )
        # the configuration read once (a GGUF file's is parsed from its whole header)
        kwargs = {"dtype": torch_dtype, "config": config, **src.kwargs()}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        if device_map is not None:
            kwargs["device_map"] = device_map
        if quantized:
            kwargs["quantization_config"] = bnb
        with _quiet_loading(transformers, gguf=bool(src.gguf_file)):
            model = cls.from_pretrained(src.source, **kwargs)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        raise ModelError(
            f"cannot load model {src.name!r} ({src.where}): {_first_line(error)}"
        ) from None
    if tokenizer is None:
        tokenizer = load_tokenizer(name_or_path)
    try:
        if device_map is None:
            model = model.to(device)
    except (RuntimeError, AssertionError) as error:
        raise ModelError(
            f"cannot move model {src.name!r} to {device!r}: {_first_line(error)}"
        ) from None
    model.eval()
    return model, tokenizer


@contextlib.contextmanager
def _quiet_loading(transformers, gguf: bool = False) -> Iterator[None]:
    """Hide transformers' weight-loading bars: attngeom prints its own progress.

    The GGUF reader draws its dequantisation bar with tqdm directly, which the logging
    switch does not reach, so its stderr is held back for the load.
    """
    logging = transformers.utils.logging
    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        if gguf:
            with contextlib.redirect_stderr(io.StringIO()):
                yield
        else:
            yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
