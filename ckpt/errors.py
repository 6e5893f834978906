"""The exception hierarchy of ckpt, every layer's in this one module.

Every error a user can cause derives from :class:`CkptError`: store errors
(:class:`StoreError` and its subclasses), plugin errors (:class:`PluginError`),
analysis errors (:class:`AnalysisError`) and training-task errors
(:class:`TaskError`). The module imports nothing, so every layer (store,
plugins, analyzers, sandboxes, cli) can use it without importing another. Each class also
mixes in the builtin exception a caller would naturally catch (``KeyError``,
``FileNotFoundError``, ``ValueError`` ...), as zarr does, so code that does not
know about ckpt still handles them sensibly. Messages say what was found, what
was expected and what to do; only :mod:`ckpt.cli` turns them into one-line messages.
Warnings derive from :class:`CkptWarning` (a ``UserWarning``) and live here too.
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


class StoreLinkError(StoreError, PermissionError):
    """A local store holds a symbolic link where ckpt would write: ckpt never writes through one."""


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


class TensorNotFoundError(StoreError, KeyError):
    """The store's checkpoints have no tensor of the requested name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SplitNotFoundError(StoreError, KeyError):
    """The requested data split does not exist in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UntrustedFactoryError(StoreError, PermissionError):
    """A store names a model factory that ckpt will not run unless the user trusts it (``ckpt.store.trust``)."""


class ModelConfigError(StoreError, ValueError):
    """A store's model spec cannot be built as it stands (``ckpt.store.factory_config``).

    Its config breaks the factory's declared schema (a key it does not take, a wrong type, a value out
    of bounds) or names code or files (the Hugging Face factory), the model it describes differs from
    the stored tensors or holds more buffers than their bytes justify, or the factory itself failed.
    """


class CorruptRecordError(StoreError, ValueError):
    """The store's metadata (its commit record, a node's ``zarr.json``) breaks the format's rules.

    Raised before anything acts on it: a node name that is a path, a shape its bytes
    cannot hold, a field of the wrong type, JSON nested too deep (docs/store-format.md, "Validation").
    """


class MissingDataError(StoreError, FileNotFoundError):
    """A piece the commit record says was written (a result's files ...) is gone from the store."""


class InvalidArgumentError(StoreError, ValueError):
    """A store function was given a value it does not accept (``open``'s mode, a compressor, a framework ...)."""


class DataError(StoreError, ValueError):
    """Evaluation data passed to ``add_data`` is inconsistent."""


class CorruptChunkError(StoreError, OSError):
    """Stored bytes failed their checksum or could not be decoded."""


class StaleResultError(StoreError):
    """A Dataset opened earlier holds a version of a result that is no longer kept.

    The store is fine, the Dataset is out of date: reopen it. A replaced or regrown
    result's old version is kept for a while (``.snapshots/``, docs/store-format.md
    §1.5.1) and a held Dataset reads it; once that version is deleted (its grace period,
    ``ckpt rm``, ``ckpt repair``) a chunk that no longer matches what the Dataset opened
    raises this instead of :class:`CorruptChunkError`, so a Dataset never mixes two versions.
    """


class ImportFormatError(CkptError, ValueError):
    """A folder of existing checkpoints could not be imported."""


class PluginError(CkptError, TypeError):
    """A plugin registered something malformed (not an Analyzer subclass, a bad option ...).

    Raised at registration; the plugin host turns it into a warning naming the
    plugin, so one broken plugin never takes the others down.
    """


class AnalysisError(CkptError):
    """An analyzer was misused (unknown analyzer or option, bad value) or failed."""


class AnalysisInputError(AnalysisError, ValueError):
    """Arrays or settings given to an analysis function break its contract (a shape, a range, a missing row)."""


class TaskError(CkptError):
    """A training task was asked for something it cannot do (unknown preset, bad option ...)."""


class TaskConfigError(TaskError, ValueError):
    """A sandbox model or data builder was given settings it cannot build (a store's config, a vocabulary size)."""


class CkptWarning(UserWarning):
    """Base class of ckpt's warnings; the command line prints each as one ``Warning:`` line."""


class UnverifiedStoreWarning(CkptWarning):
    """A store has pieces without digests (format v1): what is damaged there reads as data (``ckpt upgrade``)."""


class NonFiniteWarning(CkptWarning):
    """A result was computed from checkpoints holding NaN or inf: its values there mean nothing."""


class LLCWarning(CkptWarning):
    """The SGLD chains of an ``llc`` estimate at a checkpoint diverged, did not mix or flattened: its λ̂ is doubtful."""


class PluginWarning(CkptWarning):
    """A plugin failed to load or registered a name that was taken; the rest keeps working.

    Also importable as ``ckpt.plugins.PluginWarning``.
    """


# every class of this module is public: derived, so that a new error cannot be left out
__all__ = sorted(
    name for name, value in dict(globals()).items() if isinstance(value, type) and value.__module__ == __name__
)
