"""``ckpt upgrade``: give a store without digests (format v1) the digests of format v2.

A v1 store, or pieces of a store written before ckpt recorded digests (data splits
without their sha256, results without chunk digests), cannot be verified: a chunk that is
missing, swapped or changed reads as data. Upgrading reads every such piece *as it is
now*, computes its digest exactly as the writer would have, and records them in one
atomic put of the commit record, with a history entry saying that the digests were
taken on trust at first use: what was damaged before the upgrade stays undetected, what
is damaged after it is caught (docs/store-format.md §4.5.1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from ckpt.errors import StoreError
from ckpt.store import _zarr
from ckpt.store.arrays import tensor_digest
from ckpt.store.chunks import CHUNK_DIGESTS, digest_variable
from ckpt.store.data import data_digest
from ckpt.store.format import (
    ANALYSES,
    CHECKPOINTS,
    DATA,
    DIGESTS,
    FORMAT_VERSION,
    METRIC_DIGESTS,
    METRICS,
    ROOT_ATTR,
    STEP,
    history_entry,
)
from ckpt.store.reader import Store, open_zarr_store
from ckpt.store.reader_data import split_arrays


@dataclass
class UpgradeReport:
    """What :func:`upgrade` recorded digests for (all zero: the store needed nothing)."""

    checkpoints: int = 0
    metrics: int = 0
    splits: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    from_version: int = FORMAT_VERSION

    @property
    def changed(self) -> bool:
        """Whether anything was recorded."""
        return bool(
            self.checkpoints or self.metrics or self.splits or self.results or self.from_version != FORMAT_VERSION
        )


def upgrade(path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> UpgradeReport:
    """Record the digests a store lacks (trust on first use) and make it format v2; atomic.

    Parameters
    ----------
    path
        The store (local path or fsspec URL).
    storage_options
        Passed to fsspec for URLs.

    Returns
    -------
    UpgradeReport
        What was digested; nothing when the store was already fully verifiable.

    Raises
    ------
    StoreLockedError
        A writer holds the store.
    CorruptChunkError
        A piece that does have a digest fails it: a damaged store is not blessed.
    """
    where = str(path)
    zstore = open_zarr_store(where, read_only=False, storage_options=storage_options)
    local = _zarr.local_path(where)
    lock = _zarr.DirectoryLock(local if local is not None and (local / CHECKPOINTS).is_dir() else None, CHECKPOINTS)
    lock.acquire(blocking=False, busy_message=f"another process is writing to {where}; upgrade it when it is done")
    try:
        store = Store(where, storage_options=storage_options)
        meta = store.metadata
        report = UpgradeReport(from_version=store.format_version)
        nodes: dict[str, dict[str, Any]] = {}
        if meta.get(DIGESTS) is None:
            meta[DIGESTS] = {str(int(s)): _checkpoint_digests(store, int(s)) for s in store.steps}
            report.checkpoints = len(store.steps)
        metric_digests = dict(meta.get(METRIC_DIGESTS) or {})
        columns = store.metrics if METRICS in store._nodes else None
        if columns is not None and len(columns[STEP]):
            for name in [STEP, *columns.data_vars]:
                if name not in metric_digests:
                    values = np.asarray(columns[name].values, dtype=np.int64 if name == STEP else np.float64)
                    metric_digests[name] = tensor_digest(values)
                    report.metrics += 1
        meta[METRIC_DIGESTS] = metric_digests
        for split in store.splits:
            node = store._nodes[f"{DATA}/{split}"]
            attrs = node.get("attributes", {}).get(ROOT_ATTR, {})
            if not attrs.get("sha256"):
                _, stored, _ = split_arrays(store, split)
                node = _with_ckpt_attr(node, "sha256", data_digest(stored))
                nodes[f"{DATA}/{split}"] = node
                report.splits.append(split)
        for name in store.analyses:
            digested = _result_digests(zstore, store, name)
            if digested:
                nodes.update(digested)
                report.results.append(name)
        if not report.changed:
            return report
        meta["format_version"] = FORMAT_VERSION
        meta.setdefault("history", []).append(_history(report))
        attributes = {**store._attrs, ROOT_ATTR: meta}
        _zarr.commit(zstore, where, attributes=attributes, nodes=nodes, owns=lambda key: key in nodes)
        return report
    finally:
        lock.release()


def _checkpoint_digests(store: Store, step: int) -> list[str]:
    """The digests of one checkpoint's tensors as stored, in the order the record lists them."""
    order = store._nodes.get(CHECKPOINTS, {}).get("attributes", {}).get(ROOT_ATTR, {}).get("tensors") or list(
        store.schema
    )
    values = store.stored_tensors(step, order)
    return [tensor_digest(values[name]) for name in order]


def _with_ckpt_attr(node: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    node = dict(node)
    attributes = dict(node.get("attributes") or {})
    attributes[ROOT_ATTR] = {**attributes.get(ROOT_ATTR, {}), key: value}
    node["attributes"] = attributes
    return node


def _result_digests(zstore: Any, store: Store, name: str) -> dict[str, dict[str, Any]]:
    """The nodes of result ``name`` whose arrays lack chunk digests, with them (empty: nothing lacked)."""
    prefix = f"{ANALYSES}/{name}"
    missing = {
        key: node
        for key, node in store._nodes.items()
        if key.startswith(f"{prefix}/")
        and node.get("node_type") == "array"
        and CHUNK_DIGESTS not in (node.get("attributes") or {})
    }
    if not missing:
        return {}
    try:
        opened = xr.open_zarr(zstore, group=prefix, consolidated=False, chunks=None)
    except Exception as exc:  # xarray and zarr fail in many ways on a damaged result
        msg = f"cannot read analysis {name!r} of {store.path} to digest it ({exc}); remove it with `ckpt rm` first"
        raise StoreError(msg) from None
    digested = {}
    for key, node in missing.items():
        variable = opened.variables[key.removeprefix(prefix + "/")]
        node = dict(node)
        node["attributes"] = {
            **(node.get("attributes") or {}),
            CHUNK_DIGESTS: digest_variable(variable, node, None, None),
        }
        digested[key] = node
    return digested


def _history(report: UpgradeReport) -> dict[str, Any]:
    return history_entry(
        "upgrade",
        from_format=report.from_version,
        to_format=FORMAT_VERSION,
        digested={
            "checkpoints": report.checkpoints,
            "metric_columns": report.metrics,
            "splits": report.splits,
            "results": report.results,
        },
        trust="digests taken from the bytes as they were at upgrade (trust on first use)",
    )


__all__ = ["UpgradeReport", "upgrade"]
