"""chute's exceptions. The Rust errors are mapped to these in one place (python/src/errors.rs).

Besides these, chute raises Python's own ``FileNotFoundError`` / ``PermissionError`` /
``OSError`` for operating-system errors (with ``errno`` and ``filename``), and an exception
raised by your transform comes back from ``next()`` as itself.
"""

__all__ = ["ChuteError", "ConfigError", "CorruptDataError", "StateError"]


class ChuteError(Exception):
    """Base class of chute's own errors (a failed batch, a worker panic...)."""


class CorruptDataError(ChuteError):
    """The data is malformed: the message names the shard, the byte offset and the problem."""


class ConfigError(ChuteError, ValueError):
    """An invalid argument: the message names the option, the value and the valid range."""


class StateError(ChuteError):
    """A ``state_dict`` that does not fit this loader (another dataset, seed, version...)."""
