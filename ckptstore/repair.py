"""``ckpt repair``: turn a damaged store back into a consistent one, saying exactly what was dropped.

What can be rebuilt from the commit record is rebuilt: a lost chunk of
``checkpoints/step`` is rewritten from the record's ``digests`` (its keys are the
committed steps). What cannot be trusted is dropped, never kept as fill values:
a checkpoint with a missing or damaged tensor, a data split that fails its
sha256, a metrics column that fails its digest (all metrics when their ``step``
column does), an analysis result that is unreadable, incomplete, disagrees with
its provenance, holds a dropped checkpoint or covers a step that is not a committed
checkpoint. Leftovers of a crashed writer are removed as on every open for append
(docs/store-format.md §4.3), and so are the kept earlier versions of results (§1.5.1).

Everything is decided first, from the store as it is, and then done in one step: one
commit of the record (with the ``repair`` history event), after which the files of what
was dropped are deleted (no reader can reach them any more). Dropping a checkpoint in the
middle of a run moves the rows after it, so on a local store it is done, with everything
else, on a copy that replaces the store in one atomic swap (§4.3.1). Either way a repair
killed at any point leaves the damaged store or the repaired one. Object stores cannot
swap; for them it refuses and says so.
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.errors
from zarr.core.sync import sync

from ckpt.errors import CkptError, CorruptChunkError, StoreError
from ckpt.store import _zarr, snapshots
from ckpt.store.arrays import column_digest
from ckpt.store.format import (
    ANALYSES,
    CHECKPOINTS,
    DATA,
    DIGESTS,
    METRIC_DIGESTS,
    METRICS,
    ROOT_ATTR,
    STEP,
    history_entry,
)
from ckpt.store.publish import lock_replaceable, publish, staging_path
from ckpt.store.reader import Store, check_format
from ckpt.store.reader_data import damaged_metrics
from ckpt.store.results import load_result


@dataclass
class RepairReport:
    """What :func:`repair` did to a store."""

    path: str
    restored_steps: bool = False
    dropped_steps: list[int] = field(default_factory=list)
    dropped_splits: list[str] = field(default_factory=list)
    dropped_metrics: list[str] = field(default_factory=list)
    dropped_analyses: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    dropped_versions: list[str] = field(default_factory=list)
    checkpoints: int = 0

    @property
    def dropped_anything(self) -> bool:
        """Whether anything was dropped (as opposed to rebuilt or tidied)."""
        return bool(self.dropped_steps or self.dropped_splits or self.dropped_metrics or self.dropped_analyses)

    def lines(self) -> list[str]:
        """One line per thing repaired, dropped or removed, for the command line."""
        lines = []
        if self.restored_steps:
            lines.append("rewrote checkpoints/step from the commit record (a chunk of it was lost or damaged)")
        lines += [f"dropped checkpoint {step} (a tensor is missing or damaged)" for step in self.dropped_steps]
        lines += [f"dropped data split {split!r} (fails its sha256)" for split in self.dropped_splits]
        lines += [f"dropped metrics {name!r} (fails its digest)" for name in self.dropped_metrics]
        lines += [f"dropped analysis {name!r} ({why})" for name, why in self.dropped_analyses.items()]
        lines += [f"removed uncommitted {path}" for path in self.removed]
        lines += [
            f"removed kept earlier version {path} (held views of it are now stale)" for path in self.dropped_versions
        ]
        return lines


def analysis_problems(store: Store, name: str) -> list[str]:
    """What is wrong with the stored result ``name``: files gone, chunks damaged, rows its provenance does not claim."""
    try:
        result = load_result(store.analysis(name))
    except CkptError as exc:
        return [f"analysis {name!r}: {str(exc).split(';')[0]}"]
    except (ValueError, OSError, RuntimeError) as exc:  # zarr could not decode a chunk of a pre-0.2 result
        return [f"analysis {name!r}: unreadable ({type(exc).__name__}: {exc})"]
    claimed = result.ckpt.steps
    held = [int(s) for s in result[STEP].values] if STEP in result.coords else []
    # a per-run result (lca, hessian-basis) holds some of the steps it was computed from, the others
    # exactly those: here only what holds for both is checked, the engine checks the rest by analyzer
    if STEP in result.dims and claimed and (not set(held) <= set(claimed) or len(set(held)) != len(held)):
        return [
            f"analysis {name!r}: holds steps {held[:3]}... ({len(held)}) that its provenance does not claim "
            f"(it claims {len(claimed)}), or holds one twice"
        ]
    committed = {int(s) for s in store.steps}
    uncommitted = sorted(set(claimed or held) - committed)
    if uncommitted:  # computed from checkpoints the store no longer holds: it describes another run
        shown = ", ".join(map(str, uncommitted[:5])) + (" ..." if len(uncommitted) > 5 else "")
        return [f"analysis {name!r}: covers step(s) {shown}, which are not committed checkpoints"]
    return []


def repair(path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> RepairReport:
    """Make the store at ``path`` consistent: rebuild what the commit record allows, drop what cannot be trusted.

    Parameters
    ----------
    path
        The store (a local folder or an fsspec URL).
    storage_options
        fsspec options for URLs.

    Returns
    -------
    RepairReport
        Everything rebuilt, dropped or removed; also recorded in the store's
        ``history`` as a ``repair`` event.

    Raises
    ------
    StoreLockedError
        A writer is appending to the store.
    StoreError
        Damaged checkpoints in an object store (dropping them needs an atomic swap).
    """
    try:
        return _repair(str(path), storage_options)
    except (CkptError, KeyboardInterrupt):
        raise
    except OSError as exc:
        if exc.errno in _ENVIRONMENT:  # a read-only or full file system: the command line says so
            raise
        raise _beyond_repair(path, exc) from None
    except (ValueError, TypeError, KeyError, LookupError, RecursionError, zarr.errors.BaseZarrError) as exc:
        raise _beyond_repair(path, exc) from None


_ENVIRONMENT = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def _beyond_repair(path: Any, exc: BaseException) -> StoreError:
    """The error for a store whose node metadata or folders are themselves gone or replaced.

    Repair rebuilds what the commit record describes; such a store is past that. Each step
    it took was its own atomic commit, and dropping checkpoints works on a copy: nothing is half-done.
    """
    first = " ".join(str(exc).split())[:200]
    msg = (
        f"cannot repair {path}: {type(exc).__name__}: {first}. Its damage is beyond what repair rebuilds from "
        "the commit record (a node's metadata or folder is missing or not what ckpt wrote); restore the store "
        "from a copy"
    )
    return StoreError(msg)


def _repair(where: str, storage_options: dict[str, Any] | None) -> RepairReport:
    report = RepairReport(where)
    local = _zarr.local_path(where)
    lock = lock_replaceable(where, local, storage_options)  # a store, and no writer appending to it
    try:
        zstore = _zarr.open_zarr_store(where, read_only=False, storage_options=storage_options)
        report.restored_steps = _restore_step_array(zstore, where)
        store = Store(where, storage_options=storage_options)
        _find_damaged_data(store, report)
        report.dropped_steps = _damaged_checkpoints(store)
        if report.dropped_steps and local is None:
            msg = (
                f"checkpoints {report.dropped_steps} of {where} are damaged; dropping them needs an atomic swap "
                "that object stores lack: copy the store to a local folder, repair it there, and copy it back"
            )
            raise StoreError(msg)
        report.dropped_analyses = _damaged_analyses(store, report.dropped_steps)
        attrs, nodes = _zarr.read_root(zstore, where)
        report.removed = _uncommitted(zstore, nodes)
        entry = history_entry("repair", **{k: v for k, v in _details(report).items() if v})
        if report.removed:
            entry["repaired"] = {"removed": report.removed}
        attrs[ROOT_ATTR].setdefault("history", []).append(entry)
        gone = _drop_from_record(attrs, nodes, report)
        if report.dropped_steps:
            assert local is not None
            _drop_on_a_copy(local, attrs, nodes, report.dropped_steps, [*gone, *report.removed])
        else:
            # one commit drops every piece, then their files go: readers no longer reach them
            _zarr.commit(zstore, where, attributes=attrs, nodes=nodes, owns=lambda path: True)
            _delete(zstore, [*gone, *report.removed])
            _tidy_arrays(zstore, nodes)
        # earlier versions of results are kept only for Datasets held meanwhile (snapshots.py): repair frees them
        report.dropped_versions = snapshots.drop(zstore, where=where)
        report.checkpoints = len(store.steps) - len(report.dropped_steps)
    finally:
        lock.release()
    return report


def _details(report: RepairReport) -> dict[str, Any]:
    return {
        "restored_steps": report.restored_steps,
        "dropped_steps": report.dropped_steps,
        "dropped_splits": report.dropped_splits,
        "dropped_metrics": report.dropped_metrics,
        "dropped_analyses": report.dropped_analyses,
    }


def _damaged_analyses(store: Store, dropped_steps: list[int]) -> dict[str, str]:
    """Results to drop, each with why: damaged, or holding a checkpoint that is dropped."""
    dropped = {}
    for name in store.analyses:
        problems = analysis_problems(store, name)
        if problems:
            dropped[name] = problems[0].split(": ", 1)[1]
        elif set(_held_steps(store, name)) & set(dropped_steps):
            dropped[name] = "holds a dropped checkpoint"
    return dropped


def _held_steps(store: Store, name: str) -> list[int]:
    result = store.analysis(name)
    return [int(s) for s in result[STEP].values] if STEP in result.coords else []


def _uncommitted(zstore: Any, nodes: dict[str, dict[str, Any]]) -> list[str]:
    """Nodes under ``checkpoints/``, ``metrics/`` and ``data/`` that a crashed writer left beyond the record.

    As a writer opening the store for append finds them (§4.3); ``analyses/`` belongs to the engine.
    """
    root = zarr.open_group(zstore, mode="r", use_consolidated=False)
    stray = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # foreign files are not ours to judge
        for name in (CHECKPOINTS, METRICS, DATA):
            if name in root:
                stray += [f"{name}/{path}" for path, _ in _zarr.group_at(root, name).members(max_depth=None)]
    stray = sorted(p for p in stray if p not in nodes)
    return [p for p in stray if not any(p.startswith(q + "/") for q in stray)]


def _drop_from_record(attrs: dict[str, Any], nodes: dict[str, dict[str, Any]], report: RepairReport) -> list[str]:
    """Take the dropped splits, metrics and results out of ``attrs`` and ``nodes``; the paths whose files go."""
    damaged = report.dropped_metrics
    gone = [f"{DATA}/{split}" for split in report.dropped_splits]
    gone += [f"{METRICS}/{name}" for name in damaged if name != STEP]
    gone += [f"{ANALYSES}/{name}" for name in report.dropped_analyses]
    for key in [k for k in nodes if any(k == g or k.startswith(g + "/") for g in gone)]:
        del nodes[key]
    if STEP in damaged:  # an empty metrics table, as in a new store
        nodes[f"{METRICS}/{STEP}"]["shape"] = [0]
    digests = attrs[ROOT_ATTR].get(METRIC_DIGESTS)
    if digests is not None and damaged:
        kept_digests = {name: d for name, d in digests.items() if name not in damaged}
        attrs[ROOT_ATTR][METRIC_DIGESTS] = {STEP: column_digest(STEP, [])} if STEP in damaged else kept_digests
    return gone


def _delete(zstore: Any, paths: list[str]) -> None:
    for path in paths:
        sync(zstore.delete_dir(path))


def _tidy_arrays(zstore: Any, nodes: dict[str, dict[str, Any]]) -> None:
    """Give every checkpoint and metrics array its committed shape on disk, as a writer's close does.

    A crashed writer may have grown an array and written the row after the last committed one: that
    row's chunks are deleted (rows beyond it were never written), and the array's own ``zarr.json``
    rewritten, so that plain zarr readers agree with the record.
    """
    for key, node in nodes.items():
        group, _, name = key.partition("/")
        if group not in (CHECKPOINTS, METRICS) or not name or "/" in name or node.get("node_type") != "array":
            continue
        on_disk = _zarr.read_json(zstore, f"{key}/{_zarr.ROOT_KEY}", key)
        if on_disk == node:
            continue
        count = int(node["shape"][0])
        if group == CHECKPOINTS and on_disk is not None and int(on_disk["shape"][0]) > count:
            array = zarr.open_array(zstore, path=key, mode="r", zarr_format=3)
            chunk = array.metadata.encode_chunk_key((count,) + (0,) * (array.ndim - 1))
            sync(zstore.delete(f"{key}/{chunk}"))
        _zarr.write_json(zstore, f"{key}/{_zarr.ROOT_KEY}", node)


def _restore_step_array(zstore: Any, where: str) -> bool:
    """Rewrite ``checkpoints/step`` from the record's digests when it disagrees with them (v2)."""
    attrs, nodes = _zarr.read_root(zstore, where)
    check_format(attrs, where)
    recorded = attrs.get(ROOT_ATTR, {}).get(DIGESTS)
    if recorded is None:
        return False
    steps = sorted(int(k) for k in recorded)
    array = zarr.open_array(zstore, path=f"{CHECKPOINTS}/{STEP}", mode="r+", zarr_format=3)
    count = int(nodes[f"{CHECKPOINTS}/{STEP}"]["shape"][0])
    try:
        stored = np.asarray(array[:count]).tolist()
    except (ValueError, RuntimeError, OSError):  # a chunk that does not decode
        stored = None
    if stored == steps:
        return False
    array[:count] = np.asarray(steps, dtype=np.int64)
    return True


def _find_damaged_data(store: Store, report: RepairReport) -> None:
    """Note the data splits and metrics columns that fail their hashes (every column when ``step`` does)."""
    for split in store.splits:
        try:
            store.data(split)
        except CorruptChunkError:
            report.dropped_splits.append(split)
    try:
        damaged = damaged_metrics(store)
    except CorruptChunkError:  # a chunk that does not decode: every column is suspect
        damaged = [STEP]
    metric_names = [k.split("/", 1)[1] for k in store._nodes if k.startswith(f"{METRICS}/")]
    if STEP in damaged:  # the rows' steps are unknown: no metric can be trusted
        damaged = metric_names
    report.dropped_metrics = sorted(damaged)


def _damaged_checkpoints(store: Store) -> list[int]:
    """Steps one of whose tensors is missing, damaged or not the tensor written there."""
    bad = []
    for step in store.steps:
        try:
            store.tensors(int(step))
        except CorruptChunkError:
            bad.append(int(step))
    return bad


def _drop_on_a_copy(
    local: Path, attrs: dict[str, Any], nodes: dict[str, dict[str, Any]], bad_steps: list[int], gone: list[str]
) -> None:
    """Drop checkpoints ``bad_steps`` and the paths ``gone`` on a copy of the store, then swap it in.

    ``attrs`` and ``nodes`` are the repaired record but for the checkpoints: the old store stays
    whole until the swap, and the copy becomes the store with all of the repair done at once.
    """
    staged = staging_path(local)
    try:
        shutil.copytree(local, staged, symlinks=True)
        zstore = _zarr.open_zarr_store(staged, read_only=False)
        _delete(zstore, gone)
        _tidy_arrays(zstore, nodes)
        count = int(nodes[f"{CHECKPOINTS}/{STEP}"]["shape"][0])
        steps = np.asarray(zarr.open_array(zstore, path=f"{CHECKPOINTS}/{STEP}", mode="r")[:count]).tolist()
        keep = [i for i, step in enumerate(steps) if step not in bad_steps]
        for key, node in nodes.items():
            group, _, name = key.partition("/")
            if group != CHECKPOINTS or not name or node.get("node_type") != "array":
                continue
            array = zarr.open_array(zstore, path=key, mode="r+", zarr_format=3)
            for new, old in enumerate(keep):
                if new != old:  # rows move up over the dropped ones, as stored (bfloat16 as its bits)
                    array[new] = array[old]
            for row in range(len(keep), count):  # no stale rows beyond the new end for plain zarr readers
                chunk = array.metadata.encode_chunk_key((row,) + (0,) * (array.ndim - 1))
                sync(zstore.delete(f"{key}/{chunk}"))
            node["shape"][0] = len(keep)
            _zarr.write_json(zstore, f"{key}/{_zarr.ROOT_KEY}", node)
        digests = attrs[ROOT_ATTR].get(DIGESTS)
        if digests is not None:
            attrs[ROOT_ATTR][DIGESTS] = {k: v for k, v in digests.items() if int(k) not in bad_steps}
        _zarr.write_json(zstore, _zarr.ROOT_KEY, _zarr.root_document(attrs, nodes))
        publish(staged, local, replace=True)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # left only when something failed before publishing


__all__ = ["RepairReport", "analysis_problems", "repair"]
