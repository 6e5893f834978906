"""ckptstore: the checkpoint store of ckpt.

A training run, in any framework, writes its checkpoints into one chunked Zarr
v3 store; analyzers read from it and save their results next to the weights.
The store is readable by plain zarr and xarray without this package.

Examples
--------
>>> import ckptstore
>>> w = ckptstore.create("run.zarr", model="mypkg.models:build", config={"d_model": 128},
...                      objective="cross-entropy", framework="torch")  # doctest: +SKIP
>>> w.write(0, model.state_dict(), metrics={"loss": 0.7})              # doctest: +SKIP
>>> w.close()                                                           # doctest: +SKIP
>>> s = ckptstore.open("run.zarr")                                      # doctest: +SKIP

"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal, overload

from ckptstore.errors import (
    CkptError,
    CorruptChunkError,
    DataError,
    ImportFormatError,
    InvalidNameError,
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
    UnsupportedFormatError,
    UnsupportedTensorError,
)
from ckptstore.format import FORMAT_VERSION
from ckptstore.reader import ModelSpec, Store, TensorInfo
from ckptstore.writer import Writer, create

try:
    __version__ = version("ckpt")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"


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
        return Store(path, **kwargs)
    if mode == "a":
        return Writer(path, **kwargs)
    msg = f"mode must be 'r' (read) or 'a' (append), got {mode!r}"
    raise ValueError(msg)


__all__ = [
    "FORMAT_VERSION",
    "CkptError",
    "CorruptChunkError",
    "DataError",
    "ImportFormatError",
    "InvalidNameError",
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
    "UnsupportedFormatError",
    "UnsupportedTensorError",
    "Writer",
    "__version__",
    "create",
    "open",
]
