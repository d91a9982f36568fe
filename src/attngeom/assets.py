"""Where the offline default model and corpora live (a leaf module).

The defaults of ``attngeom analyze`` and ``make demo`` are real, small files: the
llama2.c stories260K model, SmolLM2-135M-Instruct as GGUF, a TinyStories sample and
WikiText-2's test split. They are found, in this order, in

1. the folder named by the environment variable ``ATTNGEOM_ASSETS``;
2. the ``assets`` setting of ``~/.config/attngeom/settings.toml`` (or of the file
   ``ATTNGEOM_SETTINGS`` names), e.g. ``assets = "/data/attngeom-assets"``;
3. a ``shared/assets`` folder beside the repository (how this project's machines
   hold them).

Without any of these, a command that needs a default says which option to pass; with
``--model`` and ``--corpus`` given, nothing here is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from attngeom.errors import ConfigError

# asset name -> (path inside the assets folder, what it is)
KNOWN = {
    "stories260K": ("stories260K-hf", "the llama2.c stories260K model (Hugging Face format)"),
    "smollm2-135m": ("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "SmolLM2-135M-Instruct as GGUF"),
    "tinystories": ("corpora/tinystories/TinyStories-train.head2MiB.txt",
                    "the first 2 MiB of TinyStories"),
    "wikitext-2-test": ("corpora/wikitext-2-raw/wiki.test.lf.txt",
                        "WikiText-2's raw test split (LF line ends)"),
}
DEFAULT_MODEL = "stories260K"
DEFAULT_CORPUS = "tinystories"


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
    """The assets folder, or None when none is configured or present."""
    for candidate in (os.environ.get("ATTNGEOM_ASSETS"), _settings_assets()):
        if candidate:
            return Path(candidate).expanduser()
    here = Path(__file__).resolve()
    for parent in here.parents:
        sibling = parent / "shared" / "assets"
        if sibling.is_dir():
            return sibling
    return None


def asset(name: str, option: str = "--model") -> str:
    """The path of asset ``name``; ``ConfigError`` naming ``option`` when it is absent."""
    rel, what = KNOWN[name]
    base = assets_dir()
    if base is None or not (base / rel).exists():
        where = f"{base / rel} does not exist" if base is not None else (
            "no assets folder is configured (ATTNGEOM_ASSETS)")
        raise ConfigError(
            f"no default for {option}: {what} is not available ({where}); pass {option}"
        )
    return str(base / rel)
