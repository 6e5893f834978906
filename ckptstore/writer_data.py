"""Writing the evaluation data splits of a store (``data/<split>``): what :meth:`Writer.add_data` does.

A split is checked whole (:func:`~ckpt.store.data.check_data`) before anything is written, written
below ``data/<split>``, read back and hashed as readers will, then committed. Replacing a split of a
local store writes it in a hard-linked clone swapped in at once (:func:`replace_split`).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.core.sync import sync

from ckpt.errors import DataError, InvalidNameError, StoreLockedError
from ckpt.store import _zarr
from ckpt.store.data import check_data, data_digest
from ckpt.store.format import CHECKPOINTS, DATA, LABELS, LOCKS, ROOT_ATTR, check_name, utc_now
from ckpt.store.publish import publish, staging_path
from ckpt.store.reader import open_zarr_store

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.writer import Writer

DATA_CHUNK_BYTES = 8 << 20
"""Bytes per chunk of a data split's arrays (whole rows)."""


def write_split(
    writer: Writer, zstore: Any, split: str, variables: Mapping[str, Any], group_attrs: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Write the checked split ``variables`` under ``data/<split>`` of ``zstore``; its nodes, to commit."""
    base = f"{DATA}/{split}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: variable-length strings are not in the v3 core spec yet
        group = zarr.open_group(zstore, path=base, mode="w", zarr_format=3, attributes=group_attrs)
        nodes = {base: _zarr.empty_group_json(group_attrs)}
        for name, (array, dims) in variables.items():
            if name.startswith(f"{LABELS}/") and f"{base}/{LABELS}" not in nodes:
                group.create_group(LABELS)
                nodes[f"{base}/{LABELS}"] = _zarr.empty_group_json()
            row_bytes = max(1, array[:1].nbytes if array.dtype.kind != "O" else 64)
            rows = int(max(1, min(len(array), DATA_CHUNK_BYTES // row_bytes)))
            created = group.create_array(
                name,
                shape=array.shape,
                chunks=(rows, *array.shape[1:]),
                dtype=str if array.dtype.kind in "OU" else array.dtype,
                compressors=[Crc32cCodec()],
                dimension_names=dims,
            )
            created[...] = array
            nodes[f"{base}/{name}"] = _zarr.node_json(created)
        # never commit what verify would refuse: the split is read back and hashed as readers will
        if _read_back_digest(group, variables) != group_attrs[ROOT_ATTR]["sha256"]:
            sync(zstore.delete_dir(base))  # not in the record yet: nothing else saw it
            msg = (
                f"data split {split!r} did not read back as it was given (its content hash differs), so it "
                f"was not added to {writer._where}: this is a bug of ckpt, please report it with the arrays' dtypes"
            )
            raise DataError(msg)
    return nodes


def replace_split(
    writer: Writer, local: Path, split: str, variables: Mapping[str, Any], group_attrs: dict[str, Any]
) -> None:
    """Replace the committed split ``split`` of the local store ``local``: old or new at every instant.

    The new split is written and committed in a hard-linked clone of the store
    (:func:`ckpt.store.clone.link_clone`, the old split and the lock files left out), which is
    swapped in (:func:`ckpt.store.publish.publish`); until then the store is not changed. The
    store-wide lock is held exclusively meanwhile, as ``ckpt repair`` holds it: a result
    committed into the old store during the swap would be lost. The writer lock is taken on the
    clone's ``checkpoints/`` before the swap, so that this writer stays the store's one writer.
    """
    from ckpt.store.clone import link_clone
    from ckpt.store.results import store_lock

    base = f"{DATA}/{split}"
    try:
        store_wide = store_lock(writer._where, exclusive=True)
    except StoreLockedError:
        msg = (
            f"an analysis is being computed or removed in {writer._where} by another process; data split "
            f"{split!r} cannot be replaced until that finishes: wait for it (or stop it), then run again"
        )
        raise StoreLockedError(msg) from None
    real = local.resolve()  # the user's path may be a link to the store: the store is swapped, not the link
    staged = staging_path(real)
    try:
        link_clone(real, staged, leave_out=(base, LOCKS), where=writer._where)
        zstore = open_zarr_store(str(staged), read_only=False)
        nodes = {k: v for k, v in writer._nodes.items() if k != base and not k.startswith(base + "/")}
        nodes.update(write_split(writer, zstore, split, variables, group_attrs))
        _zarr.commit(
            zstore, str(staged), attributes=writer._attrs, nodes=nodes, owns=lambda p: not _zarr.is_analysis_node(p)
        )
        writer_lock = _zarr.DirectoryLock(staged, CHECKPOINTS)
        writer_lock.acquire(blocking=False)  # nobody else knows the clone
        try:
            publish(staged, real, replace=True)
        except BaseException:
            writer_lock.release()
            raise
        writer._lock.release()  # the old store's, now gone
        writer._lock, writer._nodes = writer_lock, nodes
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # left only when something failed before the swap
        store_wide.release()


def add_split(
    writer: Writer,
    split: str,
    inputs: Any,
    targets: Any,
    mask: Any,
    labels: Mapping[str, Any],
    text: Sequence[str] | None,
    *,
    overwrite: bool,
) -> None:
    """Check a data split and store it as ``data/<split>`` of ``writer``'s store, committed.

    What :meth:`~ckpt.store.Writer.add_data` does (see there): nothing is written before every check passed.
    """
    writer._check_open()
    problem = check_name(split, "split")
    if problem:
        raise InvalidNameError(problem)
    base = f"{DATA}/{split}"
    if base in writer._nodes and not overwrite:
        msg = f"data split {split!r} already exists in {writer._where}; pass overwrite=True to replace it"
        raise DataError(msg)
    variables = check_data(split, inputs, targets, mask, labels, text)
    n = len(variables["inputs"][0])
    token_mask = variables.get("mask", (None,))[0]
    datapoints = int(token_mask.sum()) if token_mask is not None else n
    group_attrs = {
        ROOT_ATTR: {
            "examples": n,
            "datapoints": datapoints,
            "labels": sorted(k.removeprefix(f"{LABELS}/") for k in variables if k.startswith(f"{LABELS}/")),
            "sha256": data_digest(variables),
            "created": utc_now(),
        }
    }
    if overwrite and base in writer._nodes:
        local = _zarr.local_path(writer._where)
        if local is not None:
            replace_split(writer, local, split, variables, group_attrs)
            return
        # an object store cannot swap folders: the old split leaves the record before the new one is written
        for key in [k for k in writer._nodes if k == base or k.startswith(base + "/")]:
            del writer._nodes[key]
        writer._commit()
        sync(writer._zstore.delete_dir(base))
    writer._nodes.update(write_split(writer, writer._zstore, split, variables, group_attrs))
    writer._commit()


def _read_back_digest(group: zarr.Group, variables: Mapping[str, tuple[np.ndarray, tuple[str, ...]]]) -> str:
    """The content hash of a split's arrays as written to ``group``, read as the reader reads them."""
    stored = {}
    for name, (_, dims) in variables.items():
        values = np.asarray(_zarr.array_at(group, name)[...])
        stored[name] = (values.astype(object) if values.dtype.kind in "OTU" else values, dims)
    return data_digest(stored)


__all__ = ["DATA_CHUNK_BYTES", "add_split", "replace_split", "write_split"]
