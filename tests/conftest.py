"""Test session settings: offline, one thread.

STYLE habit 8: no network in tests, so a mistyped path fails at once rather than
retrying the hub; one thread keeps the tiny models fast and the timings stable.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
# converted GGUF tokenizers are cached here, not in the user's ~/.cache
os.environ.setdefault("ATTNGEOM_CACHE", str(Path(tempfile.gettempdir()) / "attngeom-test-cache"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

torch.set_num_threads(1)
