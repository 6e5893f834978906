"""ckpt.store: the checkpoint store of ckpt.

A training run, in any framework, writes its checkpoints into one chunked Zarr
v3 store; analyzers read from it and save their results next to the weights.
The store is readable by plain zarr and xarray without this package.

Examples
--------
>>> import ckpt
>>> w = ckpt.create("run.zarr", model="mypkg.models:build", config={"d_model": 128},
...                      objective="cross-entropy", framework="torch")  # doctest: +SKIP
>>> w.write(0, model.state_dict(), metrics={"loss": 0.7})              # doctest: +SKIP
>>> w.close()                                                           # doctest: +SKIP
>>> s = ckpt.open("run.zarr")                                      # doctest: +SKIP

"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, Literal, overload

from ckpt.errors import (
    CkptError,
    CorruptChunkError,
    CorruptRecordError,
    DataError,
    ImportFormatError,
    InvalidArgumentError,
    InvalidNameError,
    MissingDataError,
    NonFiniteError,
    NotAStoreError,
    ReadOnlyError,
    SchemaMismatchError,
    SplitNotFoundError,
    StepNotFoundError,
    StepOrderError,
    StoreError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    TensorNotFoundError,
    UnsupportedFormatError,
    UnsupportedTensorError,
    UntrustedFactoryError,
)
from ckpt.store.format import FORMAT_VERSION
from ckpt.store.trust import allow, trust_reason

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.reader import ModelSpec, Store, TensorInfo
    from ckpt.store.upgrading import upgrade
    from ckpt.store.writer import Writer, create

# The reader and writer import zarr and xarray, a visible share of start-up: loaded on first use
# (PEP 562), so that `ckpt --help` and the plugin host's registration stay cheap (docs/performance.md,
# "Start-up and imports").
_LAZY = {
    "ModelSpec": "ckpt.store.reader",
    "Store": "ckpt.store.reader",
    "TensorInfo": "ckpt.store.reader",
    "Writer": "ckpt.store.writer",
    "create": "ckpt.store.writer",
    "upgrade": "ckpt.store.upgrading",  # not a module named `upgrade`: importing it would shadow the function
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        import ckpt

        return ckpt.__version__
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    msg = f"module 'ckpt.store' has no attribute {name!r}"
    raise AttributeError(msg)


@overload
def open(path: str | os.PathLike[str], mode: Literal["r"] = "r", **kwargs: Any) -> Store: ...
@overload
def open(path: str | os.PathLike[str], mode: Literal["a"], **kwargs: Any) -> Writer: ...


def open(path: str | os.PathLike[str], mode: str = "r", **kwargs: Any) -> Store | Writer:
    """Open an existing checkpoint store.

    Parameters
    ----------
    path
        Local directory or fsspec URL.
    mode
        ``"r"`` for a read-only :class:`Store`, ``"a"`` for a :class:`Writer`
        that appends after the last committed checkpoint (repairing what a
        crashed writer left behind).
    **kwargs
        ``storage_options`` (fsspec); for ``"a"`` also ``reject_nonfinite``.

    Raises
    ------
    StoreNotFoundError, NotAStoreError, UnsupportedFormatError, StoreLockedError

    """
    if mode == "r":
        from ckpt.store.reader import Store

        return Store(path, **kwargs)
    if mode == "a":
        from ckpt.store.writer import Writer

        return Writer(path, **kwargs)
    msg = f"mode must be 'r' (read) or 'a' (append), got {mode!r}"
    raise InvalidArgumentError(msg)


__all__ = [
    "FORMAT_VERSION",
    "CkptError",
    "CorruptChunkError",
    "CorruptRecordError",
    "DataError",
    "ImportFormatError",
    "InvalidArgumentError",
    "InvalidNameError",
    "MissingDataError",
    "ModelSpec",
    "NonFiniteError",
    "NotAStoreError",
    "ReadOnlyError",
    "SchemaMismatchError",
    "SplitNotFoundError",
    "StepNotFoundError",
    "StepOrderError",
    "Store",
    "StoreError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "TensorInfo",
    "TensorNotFoundError",
    "UnsupportedFormatError",
    "UnsupportedTensorError",
    "UntrustedFactoryError",
    "Writer",
    "__version__",
    "allow",
    "create",
    "open",
    "trust_reason",
    "upgrade",
]
