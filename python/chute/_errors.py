"""chute's exceptions. The Rust errors are mapped to these in one place (python/src/errors.rs).

Besides these, chute raises Python's own ``FileNotFoundError`` / ``PermissionError`` /
``OSError`` for operating-system errors (with ``errno`` and ``filename``), and an exception
raised by your transform comes back from ``next()`` as itself.
"""

from typing import Optional

__all__ = ["ChuteError", "ConfigError", "CorruptDataError", "StateError"]


class ChuteError(Exception):
    """Base class of chute's own errors (a failed batch, a worker panic...)."""


class CorruptDataError(ChuteError):
    """The data is malformed: the message names the shard, the byte offset and the problem.

    Attributes (``None`` when unknown): ``kind``, the damage: ``"truncated"`` (a cut copy or
    download), ``"checksum"`` (a CRC mismatch), ``"malformed"`` (bytes that break the format),
    ``"stale_index"`` (an index or manifest older than its shard: run ``chute index``),
    ``"too_large"`` (a size beyond a limit) or ``"unsupported"`` (valid data chute does not
    read); ``path``, the shard, index or manifest; ``offset``, the byte in it.
    """

    kind: Optional[str] = None
    path: Optional[str] = None
    offset: Optional[int] = None


class ConfigError(ChuteError, ValueError):
    """An invalid argument: the message names the option, the value and the valid range."""


class StateError(ChuteError):
    """A ``state_dict`` that does not fit this loader (another dataset, seed, version...)."""
