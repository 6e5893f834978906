"""Reading the data splits and metrics of a store, checked against their digests: :meth:`Store.data`, ``metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from ckpt.errors import CorruptChunkError, SplitNotFoundError
from ckpt.store.arrays import tensor_digest
from ckpt.store.data import data_digest
from ckpt.store.format import DATA, LABELS, METRIC_DIGESTS, METRICS, ROOT_ATTR, STEP

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.reader import Store

StoredArray = tuple[np.ndarray, tuple[str, ...]]
"""An array of a split as stored, with its dimension names."""


def read_split(store: Store, split: str) -> xr.Dataset:
    """The evaluation data of ``split`` of ``store`` (what :meth:`Store.data` returns; see there)."""
    if split not in store.splits:
        msg = f"no data split {split!r} in {store._where}; splits are: {', '.join(store.splits) or '(none)'}"
        raise SplitNotFoundError(msg)
    variables, stored, labels = split_arrays(store, split)
    group_attrs = store._nodes[f"{DATA}/{split}"].get("attributes", {}).get(ROOT_ATTR, {})
    expected = group_attrs.get("sha256")
    if expected is not None and data_digest(stored) != expected:
        # zarr reads a missing chunk as its fill value: a split is checked whole against its hash
        msg = (
            f"data split {split!r} of {store._where} does not match the content hash recorded when it was "
            "written (a chunk is missing, was replaced, or was changed); restore the store from a copy or "
            f"write the split again (Writer.add_data({split!r}, ..., overwrite=True))"
        )
        raise CorruptChunkError(msg)
    attrs = {"split": split, "labels": sorted(labels), **group_attrs}
    return xr.Dataset(variables, attrs=attrs)


def split_arrays(
    store: Store, split: str
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, tuple[str, ...]]], list]:
    """A split's arrays, unchecked: (variables by name, arrays by stored path with dims, label names)."""
    base = f"{DATA}/{split}"
    variables: dict[str, Any] = {}
    stored: dict[str, StoredArray] = {}
    labels = []
    for key, node in store._nodes.items():
        if not key.startswith(base + "/") or node.get("node_type") != "array":
            continue
        rel = key[len(base) + 1 :]
        name = rel.removeprefix(f"{LABELS}/")
        if name != rel:
            labels.append(name)
        values = store._read_whole(key, f"data split {split!r} array {rel!r}")
        if values.dtype.kind in "OTU":  # text: compared as the list of strings it was written as
            values = values.astype(object)
        dims = tuple(node["dimension_names"])
        variables[name] = (dims, values)
        stored[rel] = (values, dims)
    return variables, stored, labels


def split_summary(store: Store, split: str) -> dict[str, Any]:
    """A split's counts of examples and datapoints and its label names, from the commit record."""
    attrs = store._nodes[f"{DATA}/{split}"].get("attributes", {}).get(ROOT_ATTR, {})
    return {
        "examples": attrs.get("examples"),
        "datapoints": attrs.get("datapoints"),
        "labels": attrs.get("labels", []),
    }


def read_metrics(store: Store) -> xr.Dataset:
    """The metrics of ``store``, checked against their digests (what :attr:`Store.metrics` returns)."""
    prefix = f"{METRICS}/"
    names = [k[len(prefix) :] for k in store._nodes if k.startswith(prefix) and k != f"{METRICS}/{STEP}"]
    step_path = f"{METRICS}/{STEP}"
    steps = store._read_whole(step_path, "metrics") if step_path in store._nodes else np.zeros(0, np.int64)
    variables = {n: (STEP, store._read_whole(f"{prefix}{n}", f"metrics {n!r}")) for n in names}
    damaged = damaged_metrics(store, {STEP: steps, **{n: v for n, (_, v) in variables.items()}})
    if damaged:
        msg = (
            f"metrics {damaged[0]!r} of {store._where} do not match the commit record (a chunk is missing "
            "and read as fill values, or was changed); drop them with `ckpt repair` or restore the store "
            "from a copy"
        )
        raise CorruptChunkError(msg)
    return xr.Dataset(variables, coords={STEP: steps})


def damaged_metrics(store: Store, columns: dict[str, np.ndarray] | None = None) -> list[str]:
    """The metrics columns (``step`` included) that do not match their digests (v2; a v1 store has none)."""
    recorded = store._attrs.get(ROOT_ATTR, {}).get(METRIC_DIGESTS)
    if not recorded:
        return []
    if columns is None:
        names = [k.split("/", 1)[1] for k in store._nodes if k.startswith(f"{METRICS}/")]
        columns = {n: store._read_whole(f"{METRICS}/{n}", f"metrics {n!r}") for n in names}
    return [n for n, values in columns.items() if n in recorded and tensor_digest(values) != recorded[n]]


__all__ = ["damaged_metrics", "read_metrics", "read_split", "split_arrays", "split_summary"]
