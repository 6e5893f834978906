"""Opening a stored analysis result, checked against the commit record: :meth:`Store.analysis`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import xarray as xr
from zarr.core.sync import sync

from ckpt.errors import CorruptChunkError, MissingDataError, StoreError
from ckpt.store import _zarr
from ckpt.store.chunks import verified
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
    except KeyError as exc:  # xarray: metadata it needs to name dimensions is not there
        msg = f"{describe} cannot be opened ({exc.args[0] if exc.args else exc}); {remedy}"
        raise CorruptChunkError(msg) from None
    return verified(opened, store._nodes, prefix, describe, remedy)


def result_analyzer(store: Store, name: str) -> str:
    """The analyzer of result ``name`` by the commit record's provenance (:meth:`Store.analyzer_of`)."""
    attrs = store._nodes.get(f"{ANALYSES}/{name}", {}).get("attributes", {}).get(ROOT_ATTR, {})
    return str(attrs.get(ANALYZER) or name) if isinstance(attrs, dict) else name


__all__ = ["open_result", "result_analyzer"]
