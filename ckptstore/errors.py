"""The exception hierarchy of ckpt.

Every error a user can cause derives from :class:`CkptError`. Each class also
mixes in the builtin exception a caller would naturally catch (``KeyError``,
``FileNotFoundError``, ``ValueError`` ...), as zarr does, so code that does not
know about ckpt still handles them sensibly. Messages say what was found, what
was expected and what to do; only ``cli/`` turns them into one-line messages.
"""

from __future__ import annotations


class CkptError(Exception):
    """Base class of every error raised by ckpt for a user mistake or bad data."""


class StoreError(CkptError):
    """Something is wrong with a checkpoint store or with what was asked of it."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path or URL does not exist."""


class NotAStoreError(StoreError, ValueError):
    """The path exists but is not a ckpt store (no ``ckpt`` root attributes)."""


class UnsupportedFormatError(StoreError, ValueError):
    """The store was written in a format version this ckpt cannot read."""


class StoreExistsError(StoreError, FileExistsError):
    """``create`` was asked to write where a store (or other data) already exists."""


class ReadOnlyError(StoreError, PermissionError):
    """A write was attempted through a read-only handle."""


class StoreLockedError(StoreError, BlockingIOError):
    """Another process holds the writer lock of this store."""


class StepOrderError(StoreError, ValueError):
    """A checkpoint step is not greater than the last committed step."""


class SchemaMismatchError(StoreError, ValueError):
    """A tensor's name, shape or dtype differs from the store's first checkpoint."""


class NonFiniteError(StoreError, ValueError):
    """A tensor holds NaN or inf and the writer was asked to reject them."""


class UnsupportedTensorError(StoreError, TypeError):
    """A value could not be converted to an array, or has an unsupported dtype."""


class InvalidNameError(StoreError, ValueError):
    """A tensor, metric, split or label name cannot be stored."""


class StepNotFoundError(StoreError, KeyError):
    """The requested step is not a committed checkpoint."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class SplitNotFoundError(StoreError, KeyError):
    """The requested data split does not exist in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DataError(StoreError, ValueError):
    """Evaluation data passed to ``add_data`` is inconsistent."""


class CorruptChunkError(StoreError, OSError):
    """Stored bytes failed their checksum or could not be decoded."""


class ImportFormatError(CkptError, ValueError):
    """A folder of existing checkpoints could not be imported."""
