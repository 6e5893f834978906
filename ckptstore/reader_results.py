"""Opening a stored analysis result, checked against the commit record: :meth:`Store.analysis`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr
from zarr.core.sync import sync

from ckpt.errors import CorruptChunkError, MissingDataError, StaleResultError, StoreError
from ckpt.store import _zarr, snapshots
from ckpt.store.chunks import CHUNK_DIGESTS, Recommitted, node_chunks, verified
from ckpt.store.format import ANALYSES, ROOT_ATTR
from ckpt.store.provenance import ANALYZER
from ckpt.store.record import check_claimed_bytes

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.reader import Store


def open_result(store: Store, name: str) -> xr.Dataset:
    """The stored result ``name`` of ``store``, lazy (what :meth:`Store.analysis` returns; see there)."""
    if name not in store.analyses:
        msg = f"no analysis {name!r} in {store._where}; stored analyses: {', '.join(store.analyses) or '(none)'}"
        raise StoreError(msg)
    prefix = f"{ANALYSES}/{name}"
    nodes = [k for k in store._nodes if k == prefix or k.startswith(f"{prefix}/")]
    gone = [k for k in nodes if not sync(store._zstore.exists(f"{k}/zarr.json"))]
    if gone:
        msg = (
            f"analysis {name!r} of {store._where} is committed but {gone[0]} is gone from the store "
            f"({len(gone)} of its {len(nodes)} parts missing; deleted by hand?); "
            f"remove it with `ckpt rm {store._where} {name}` or recompute it with `ckpt analyze {name} --force`"
        )
        raise MissingDataError(msg)
    describe = f"analysis {name!r} of {store._where}"
    remedy = f"recompute it with `ckpt analyze {name} {store._where} --force` or drop it with `ckpt repair`"
    for key in nodes:  # index coordinates are read whole when the result is opened: bound them first
        node = store._nodes[key]
        if node.get("node_type") == "array" and list(node.get("dimension_names") or []) == [key.rsplit("/")[-1]]:
            check_claimed_bytes(node, _zarr.prefix_bytes(store._zstore, key), f"{describe}, {key}", store._where)
    try:
        with _zarr.translated_read_errors(describe, remedy):  # index coordinates are read now
            opened = xr.open_zarr(store._zstore, group=prefix, consolidated=True, chunks=None)
    # xarray: metadata it needs to name dimensions is not there (KeyError), or an attribute it decodes,
    # such as _FillValue, is not of the variable's type (TypeError, ValueError, OverflowError)
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else f"{type(exc).__name__}: {exc}"
        msg = f"{describe} cannot be opened ({reason}); {remedy}"
        raise CorruptChunkError(msg) from None
    return verified(opened, store._nodes, prefix, describe, remedy, _recommitted(store, name, opened.attrs))


def _created(attributes: Any) -> str:
    """The provenance's ``created`` stamp in a result's attributes, for messages (``unknown`` when unrecorded)."""
    record = attributes.get(ROOT_ATTR) if isinstance(attributes, dict) else None
    created = record.get("created") if isinstance(record, dict) else None
    return created if isinstance(created, str) else "unknown"


def _recommitted(store: Store, name: str, opened: dict[str, Any]) -> Recommitted:
    """What a chunk of result ``name`` that failed its check is handed to (:data:`~ckpt.store.chunks.Recommitted`).

    ``opened`` holds the result's attributes as the Dataset opened them. A replaced or regrown
    result is written at the same paths (its earlier folder moved to a kept version,
    :mod:`ckpt.store.snapshots`), so a Dataset opened before reads the new chunks against the
    old digests. The commit record is read once more: when it records the same digest and chunk
    shape for that chunk, the chunk is wrong and the caller raises
    :class:`~ckpt.errors.CorruptChunkError` as before. Otherwise a later commit rewrote it: the
    kept versions are searched for a chunk matching the digest the Dataset opened, and where none
    holds one any more the Dataset is stale (:class:`~ckpt.errors.StaleResultError`). Once the
    record shows the result recommitted, later failed chunks go to the kept versions without
    reading it again (every chunk of a replaced result fails: one read of a large record each).
    """
    prefix = f"{ANALYSES}/{name}"
    earlier = snapshots.earlier_chunks(store._zstore, store._where, name)
    recommitted = False

    def check(
        variable: str, key: str, region: tuple[slice, ...], chunks: tuple[int, ...], digest: str | None
    ) -> np.ndarray | None:
        nonlocal recommitted
        if recommitted:
            kept = earlier(variable, region, digest)
            if kept is not None:
                return kept
        try:
            _, nodes = _zarr.read_root(store._zstore, store._where)
        except StoreError:  # the record itself cannot be read now: the chunk's own error stands
            return None
        group, node = nodes.get(prefix), nodes.get(f"{prefix}/{variable}")
        if group is not None and node is not None and not recommitted:
            digests = node.get("attributes", {}).get(CHUNK_DIGESTS)
            if isinstance(digests, dict) and digests.get(key) == digest and node_chunks(node) == chunks:
                return None
            recommitted = True
        kept = earlier(variable, region, digest)
        if kept is not None:
            return kept
        if group is not None and node is not None:
            msg = (
                f"{prefix} was recomputed (or extended/replaced) after this Dataset was opened "
                f"(opened: {_created(opened)}, now: {_created(group.get('attributes', {}))}) and the version "
                "it opened is no longer kept (docs/store-format.md, section 1.5.1); "
                f'reopen it with ckpt.open({store._where!r}).analysis("{name}")'
            )
        else:
            msg = (
                f"{prefix} was removed after this Dataset was opened (opened: {_created(opened)}); "
                f"compute it again with `ckpt analyze {name} {store._where}`"
            )
        raise StaleResultError(msg)

    return check


def recorded_provenance(store: Store, name: str) -> dict[str, Any]:
    """Result ``name``'s provenance as the commit record holds it (:meth:`Store.recorded_provenance`)."""
    attrs = store._nodes.get(f"{ANALYSES}/{name}", {}).get("attributes", {}).get(ROOT_ATTR, {})
    return attrs if isinstance(attrs, dict) else {}


def result_analyzer(store: Store, name: str) -> str:
    """The analyzer of result ``name`` by the commit record's provenance (:meth:`Store.analyzer_of`)."""
    return str(recorded_provenance(store, name).get(ANALYZER) or name)


__all__ = ["open_result", "recorded_provenance", "result_analyzer"]
