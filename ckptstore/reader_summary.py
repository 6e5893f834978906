"""What a store is, in one JSON-able summary, and what of it cannot be verified: :meth:`Store.info`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.store.chunks import CHUNK_DIGESTS
from ckpt.store.format import ANALYSES, METRIC_DIGESTS, METRICS, ROOT_ATTR, STEP, current_factory
from ckpt.store.reader_data import split_summary
from ckpt.store.trust import trust_reason

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.reader import Store


def unverifiable_counts(store: Store) -> dict[str, int]:
    """How many pieces of ``store`` have no digest to check them against, by kind (:attr:`Store.unverifiable`)."""
    meta = store._attrs.get(ROOT_ATTR, {})
    metric_digests = meta.get(METRIC_DIGESTS) or {}
    columns = [k.split("/", 1)[1] for k, n in store._nodes.items() if k.startswith(f"{METRICS}/") and n["shape"][0]]
    results = 0
    for name in store.analyses:
        prefix = f"{ANALYSES}/{name}/"
        arrays = [n for k, n in store._nodes.items() if k.startswith(prefix) and n.get("node_type") == "array"]
        results += any(CHUNK_DIGESTS not in (n.get("attributes") or {}) for n in arrays)
    return {
        "checkpoints": len(store._steps) if store._digests is None else 0,
        "metrics": sum(c not in metric_digests for c in columns) if METRICS in store._nodes else 0,
        "splits": sum(not store.split_hash(s) or store.split_hash(s) == "None" for s in store.splits),
        "results": results,
    }


def unverifiable_sentence(store: Store) -> str | None:
    """One sentence saying what of ``store`` cannot be checked, or None (:meth:`Store.unverifiable_summary`)."""
    counts = {kind: n for kind, n in unverifiable_counts(store).items() if n}
    if not counts:
        return None
    names = {"checkpoints": "checkpoint(s)", "metrics": "metric column(s)", "splits": "data split(s)"}
    listed = ", ".join(f"{n} {names.get(kind, 'result(s)')}" for kind, n in counts.items())
    version = f"format v{store.format_version}"
    return (
        f"{store._where} cannot be verified: {listed} have no digest in its commit record ({version}), so "
        f"a missing, swapped or changed chunk there reads as data; `ckpt upgrade {store._where}` adds digests "
        "(trusting the store as it is now)"
    )


def store_info(store: Store) -> dict[str, Any]:
    """The JSON-able summary of ``store`` (:meth:`Store.info`)."""
    steps = store._steps
    return {
        "path": store._where,
        "format_version": store.format_version,
        "framework": store.framework,
        "model": None
        if store.model is None
        else {
            "factory": store.model.factory,
            "current": current_factory(store.model.factory),
            "config": store.model.config,
            "trusted": trust_reason(store.model.factory),
        },
        "objective": store.objective,
        "unverifiable": store.unverifiable_summary(),
        "created": store.created,
        "finished": store.finished,
        "checkpoints": {
            "count": len(steps),
            "first": int(steps[0]) if len(steps) else None,
            "last": int(steps[-1]) if len(steps) else None,
        },
        "tensors": [
            {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes}
            for t in store._schema.values()
        ],
        "parameters": int(sum(int(np.prod(t.shape, dtype=np.int64)) for t in store._schema.values())),
        "bytes_per_checkpoint": int(sum(t.nbytes for t in store._schema.values())),
        "metrics": [
            k.split("/", 1)[1] for k in store._nodes if k.startswith(f"{METRICS}/") and k != f"{METRICS}/{STEP}"
        ],
        "splits": {s: split_summary(store, s) for s in store.splits},
        "analyses": store.analyses,
        "analyzers": {name: store.analyzer_of(name) for name in store.analyses},
        "parent": None if store.parent is None else store.parent.to_json(),
        "history": store.history,
    }


__all__ = ["store_info", "unverifiable_counts", "unverifiable_sentence"]
