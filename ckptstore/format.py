"""Constants and small rules of the store format (see docs/store-format.md).

Everything that defines the on-disk layout lives here so that the reader, the
writer and the format document can be checked against one place.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
from typing import Any

FORMAT_NAME = "ckpt-store"
"""Value of ``attrs["ckpt"]["format"]`` in the root group of every store."""

FORMAT_VERSION = 2
"""The format version this code writes (2: checkpoint digests, docs/store-format.md §4.5)."""

READABLE_VERSIONS = (1, 2)
"""Format versions this code reads; a v1 store is appended to as v1 (no digests)."""

METRIC_DIGESTS = "metric_digests"
"""Key of ``attrs["ckpt"]``: ``{"step" or metric name: digest of the committed column}`` (format v2)."""

DIGESTS = "digests"
"""Key of ``attrs["ckpt"]``: ``{"<step>": [digest of each tensor, in the order of checkpoints' tensors]}``."""

PARENT = "parent"
"""Key of ``attrs["ckpt"]``: the run this one was initialised from (path, step, digest; §2.1), or absent."""

FINISHED = "finished"
"""Key of ``attrs["ckpt"]``: true once a writer closed the run, false while one has it open; absent: unknown (§2)."""

ROOT_ATTR = "ckpt"
"""Key of the ckpt metadata inside the root group's attributes."""

CHECKPOINTS = "checkpoints"
METRICS = "metrics"
DATA = "data"
ANALYSES = "analyses"
LABELS = "labels"
STEP = "step"
TOP_LEVEL_GROUPS = (CHECKPOINTS, METRICS, DATA, ANALYSES)
PARTIAL_SUFFIX = ".partial"
"""``analyses/<name>.partial``: the pieces an unfinished run of result ``<name>`` committed (a killed
``hessian-basis``), which a rerun of the same request resumes from (docs/store-format.md)."""

LOCKS = ".locks"
"""``.locks/analyses/<name>``: the lock file of result ``<name>`` while a process writes it (local
stores). Not a Zarr node, and not a node name any store can hold at its root (docs/store-format.md)."""

SNAPSHOTS = ".snapshots"
"""``.snapshots/analyses/<name>/<version>``: earlier versions of a result kept for the Datasets that opened them
(:mod:`ckpt.store.snapshots`). Not a Zarr node (no ``zarr.json`` of its own), like :data:`LOCKS`."""

RENAMED_FACTORIES: dict[str, str] = {
    f"sandboxes.{module}:build_model": f"ckpt.sandboxes.{module}:build_model"
    for module in ("addition", "modular_addition", "sparse_modular_addition", "tiny_lm")
}
"""Model factories that stores written before ckpt 0.2 name, and where they live now.

ckpt 0.1 installed its layers as top-level packages (``sandboxes``, ``plugins`` ...);
from 0.2 they live under the one import root ``ckpt``. Stores record the factory
name they were written with, so the old names are mapped here, in this one place,
when a model is rebuilt (:meth:`ckpt.store.ModelSpec.build`). Only these exact names
are mapped: a user's own package that happens to be called ``sandboxes`` is left alone.
"""


FACTORY_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)
"""A model factory name, ``package.module:function`` (``fullmatch``): one attribute of a module, no more."""


def current_factory(factory: str) -> str:
    """The importable name of a recorded model factory (an old ckpt name mapped to its new one)."""
    return RENAMED_FACTORIES.get(factory, factory) if isinstance(factory, str) else factory


DATA_VARIABLES = ("inputs", "targets", "mask", "text")
"""Arrays a data split may hold directly; labels live in the ``labels/`` subgroup."""

STEP_FILL_VALUE = -1
"""Fill value of ``step`` arrays: steps are non-negative, so -1 never is a real step."""

# dtypes that numpy (and so zarr v3) cannot hold natively. They are stored as
# unsigned integers of the same width (their bit patterns, lossless) and the
# array attribute ``ckpt.dtype`` names the logical dtype.
ENCODED_DTYPES: dict[str, str] = {
    "bfloat16": "uint16",
    "float8_e4m3fn": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2": "uint8",
    "float8_e5m2fnuz": "uint8",
}

NATIVE_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
)

_RESERVED_NAMES = {STEP, ".", "..", "zarr.json"}  # zarr.json: a node named so would be its parent's metadata file


def check_name(name: object, what: str) -> str | None:
    r"""Return why ``name`` cannot be used as a node name, or None when it can.

    The rule readers apply to every name in a store (:func:`ckpt.store.record.name_problem`:
    at most 255 printable characters, no ``/`` or ``\\``, not ``.``/``..``), plus what zarr
    reserves (a leading ``__``) and the store's own names (``step``, ``zarr.json``).
    """
    from ckpt.store.record import name_problem

    problem = name_problem(name, what)
    if problem is not None:
        return problem
    assert isinstance(name, str)  # name_problem refuses every other type
    if name.startswith("__"):
        return f"{what} name {name!r} starts with '__', which zarr reserves"
    if name in _RESERVED_NAMES:
        return f"{what} name {name!r} is reserved by the store format"
    return None


def utc_now() -> str:
    """The current time as the store records it: UTC, ISO 8601 to the second, ``Z`` suffix."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def history_entry(event: str, **details: Any) -> dict[str, Any]:
    """One entry of ``attrs["ckpt"]["history"]``: what happened to the store, when, by which ckpt, where.

    Parameters
    ----------
    event
        What happened (``"create"``, ``"open"``, ``"repair"``, ``"upgrade"`` ...).
    **details
        Further JSON fields of the entry.
    """
    from ckpt import __version__  # the package's version: ckpt imports this module, not the reverse at import

    return {"event": event, "time": utc_now(), "ckpt": __version__, "host": socket.gethostname(), **details}


__all__ = [
    "ANALYSES",
    "CHECKPOINTS",
    "DATA",
    "DATA_VARIABLES",
    "DIGESTS",
    "ENCODED_DTYPES",
    "FACTORY_RE",
    "FINISHED",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LABELS",
    "LOCKS",
    "METRICS",
    "METRIC_DIGESTS",
    "NATIVE_DTYPES",
    "PARENT",
    "PARTIAL_SUFFIX",
    "READABLE_VERSIONS",
    "RENAMED_FACTORIES",
    "ROOT_ATTR",
    "SNAPSHOTS",
    "STEP",
    "STEP_FILL_VALUE",
    "TOP_LEVEL_GROUPS",
    "check_name",
    "current_factory",
    "history_entry",
    "utc_now",
]
