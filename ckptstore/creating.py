"""Creating a store: :func:`create` writes a new store's skeleton aside, then swaps it in, and opens its writer.

A local store is built in a staging folder and published with one rename (replacing what was
there only with ``overwrite``); an object store, which has no rename, gets its root record
written last, so that there is no store until its skeleton is complete (docs/store-format.md
§4.3.1). Re-exported by :mod:`ckpt.store.writer`, where it was first defined.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import zarr
from zarr.codecs import Crc32cCodec

from ckpt.errors import DataError, InvalidNameError, StoreExistsError, StoreNotFoundError
from ckpt.store import _zarr
from ckpt.store.format import (
    CHECKPOINTS,
    DIGESTS,
    FACTORY_RE,
    FORMAT_NAME,
    FORMAT_VERSION,
    METRIC_DIGESTS,
    METRICS,
    PARENT,
    ROOT_ATTR,
    STEP,
    STEP_FILL_VALUE,
    TOP_LEVEL_GROUPS,
    history_entry,
    utc_now,
)
from ckpt.store.lineage import Parent, parent_problem
from ckpt.store.publish import lock_replaceable, occupied, publish, publish_url, remove_store, staging_path, staging_url
from ckpt.store.reader import INCOMPLETE
from ckpt.store.writer_rows import STEP_CHUNK

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.writer import Writer


def create(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    config: Mapping[str, Any] | None = None,
    objective: str | None = None,
    framework: str | None = None,
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    reject_nonfinite: bool = False,
    compressor: str | None = None,
    storage_options: dict[str, Any] | None = None,
    parent: Parent | None = None,
    _incomplete: str | None = None,
) -> Writer:
    """Create a new checkpoint store and return its :class:`Writer`.

    Parameters
    ----------
    path
        Local directory (``"run.zarr"``) or fsspec URL (``"memory://run.zarr"``, ``"s3://..."``).
    model
        Model factory as ``"package.module:function"``; analyzers rebuild the model with it.
    config
        JSON-serialisable keyword arguments of the factory.
    objective
        Name of the per-datapoint loss (``"cross-entropy"``, ``"token-cross-entropy"``).
    framework
        Framework that trains the run (``"torch"``, ``"jax"``, ...), informative.
    attrs
        Free-form JSON metadata of the run (seed, hyper-parameters ...).
    overwrite
        Replace whatever is at ``path``.
    reject_nonfinite
        Make :meth:`Writer.write` refuse tensors with NaN/inf.
    compressor
        ``None`` (checksums only, fastest) or ``"zstd"``.
    storage_options
        Passed to fsspec for URLs.
    parent
        The run whose checkpoint initialised this one (:class:`ckpt.store.lineage.Parent`),
        recorded as ``attrs["ckpt"]["parent"]`` (docs/store-format.md §2.1).

    Raises
    ------
    StoreExistsError
        When ``path`` exists and ``overwrite`` is false.

    """
    if model is not None and (not isinstance(model, str) or not FACTORY_RE.fullmatch(model)):
        msg = f"model must be an importable factory 'package.module:function', got {model!r}"
        raise InvalidNameError(msg)
    try:
        config_json = json.loads(json.dumps(dict(config or {}), allow_nan=False))
        attrs_json = json.loads(json.dumps(dict(attrs or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        msg = f"config and attrs must be JSON-serialisable: {exc}"
        raise DataError(msg) from None
    where = str(path)
    local = _zarr.local_path(where)
    exists = occupied(where, local, storage_options)
    if exists and not overwrite:
        msg = (
            f"{where} already exists; append to it with ckpt.open({where!r}, mode='a'), "
            "choose another path, or pass overwrite=True to replace it"
        )
        raise StoreExistsError(msg)
    if local is not None and not local.parent.exists():
        msg = f"cannot create {where}: the folder {local.parent} does not exist"
        raise StoreNotFoundError(msg)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "framework": framework,
        "model": None if model is None else {"factory": model, "config": config_json},
        "objective": objective,
        "created": utc_now(),
        "attrs": attrs_json,
        "history": [],
        DIGESTS: {},
        METRIC_DIGESTS: {},
    }
    if parent is not None:
        problem = parent_problem(parent.to_json())
        if problem is not None:  # never write what readers refuse
            field, found, expected = problem
            raise DataError(f"cannot record the parent run: {field} is {found!r}, expected {expected}")
        meta[PARENT] = parent.to_json()
    if _incomplete:  # an import marks what it builds until its last commit (Writer.mark_complete)
        meta[INCOMPLETE] = _incomplete
    if local is None:  # object stores have no rename (docs/store-format.md §4.3.1)
        if exists:  # built aside, so the old store stays until the new one is complete
            lock_replaceable(where, None, storage_options).release()
            staged_url = staging_url(where)
            try:
                _write_skeleton(
                    _zarr.open_zarr_store(staged_url, read_only=False, storage_options=storage_options), meta
                )
                publish_url(staged_url, where, storage_options)
            finally:
                remove_store(staged_url, storage_options)
        else:  # the root record is written last: no store until the skeleton is complete
            _write_skeleton(_zarr.open_zarr_store(where, read_only=False, storage_options=storage_options), meta)
    else:
        old_lock = lock_replaceable(where, local, storage_options) if exists else None
        staged = staging_path(local)
        try:
            _write_skeleton(_zarr.open_zarr_store(staged, read_only=False), meta)
            publish(staged, local, replace=exists)
        finally:
            if old_lock is not None:
                old_lock.release()
            shutil.rmtree(staged, ignore_errors=True)  # left only when something failed before publishing
    from ckpt.store.writer import Writer  # the writer module re-exports this one's create

    return Writer(
        where,
        storage_options=storage_options,
        reject_nonfinite=reject_nonfinite,
        compressor=compressor,
        _history=history_entry("create") | ({} if parent is None else {"init_from": str(parent)}),
        _building=bool(_incomplete),
    )


def _write_skeleton(zstore: Any, meta: dict[str, Any]) -> None:
    """The groups and empty ``step`` arrays of a new store, then its root record (written last)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The root zarr.json is written once, last: an object store (built in place) holds no root,
        # so no store, until the skeleton is complete. zarr writes the parents' zarr.json of every
        # node it creates, so the documents are made in memory and put here by hand.
        nodes: dict[str, dict[str, Any]] = {name: _zarr.empty_group_json() for name in TOP_LEVEL_GROUPS}
        for group in (CHECKPOINTS, METRICS):
            step = zarr.create_array(
                zarr.storage.MemoryStore(),
                name=STEP,
                shape=(0,),
                chunks=(STEP_CHUNK,),
                dtype="int64",
                fill_value=STEP_FILL_VALUE,
                compressors=[Crc32cCodec()],
                dimension_names=(STEP,),
                config={"write_empty_chunks": True},
            )
            nodes[f"{group}/{STEP}"] = _zarr.node_json(step)
        for path, document in nodes.items():
            # on disk as zarr writes a group: no (empty) consolidated metadata, which listings would trust
            on_disk = {k: v for k, v in document.items() if k != "consolidated_metadata"}
            _zarr.write_json(zstore, f"{path}/{_zarr.ROOT_KEY}", on_disk)
    _zarr.write_json(zstore, _zarr.ROOT_KEY, _zarr.root_document({ROOT_ATTR: meta}, nodes))


__all__ = ["create"]
