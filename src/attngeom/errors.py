"""The package's few exception classes.

Every error a user can cause is one of these, with a one-line message that names
the offending thing and, where there is one, the fix ("expected ..., got ...").
"""

from __future__ import annotations


class AttngeomError(Exception):
    """Base class of every error attngeom raises on purpose."""


class ConfigError(AttngeomError, ValueError):
    """An argument or configuration value is out of range or malformed."""


class StudyError(ConfigError):
    """A study file is malformed; the message names the file, line and key."""


class ModelError(AttngeomError):
    """A model cannot be loaded, or its architecture is not supported."""


class SelfCheckError(ModelError):
    """A model failed one of the load-time self-checks (probabilities, logits, gates)."""


class CorpusError(AttngeomError):
    """A corpus is missing, empty, or too short for one window."""


class RunDirError(AttngeomError):
    """An output or results directory is not what the command needs."""
