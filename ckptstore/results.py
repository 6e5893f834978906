"""Saving analysis results into ``analyses/<name>`` and committing them.

Results are xarray Datasets written with xarray's own Zarr encoding, then
committed into the store's commit record like everything else
(docs/store-format.md, section 4): a result, or a block of steps appended to
one, becomes visible in a single atomic write of the root ``zarr.json``. An
analysis interrupted mid-write leaves the previously committed result intact;
the next write trims the leftovers before appending. Commits of results and
of checkpoints merge, so an analysis may run while training writes.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import xarray as xr
import zarr
from zarr.core.sync import sync

from ckpt.errors import InvalidNameError, StoreError, StoreLockedError
from ckpt.store import _zarr
from ckpt.store.chunks import CHUNK_DIGESTS, digest_variable
from ckpt.store.format import ANALYSES, LOCKS, STEP, check_name
from ckpt.store.reader import check_format, open_zarr_store


def _prefix(name: str) -> str:
    return f"{ANALYSES}/{name}"


def _owned_by(name: str) -> Any:
    prefix = _prefix(name)
    return lambda path: path == prefix or path.startswith(prefix + "/")


def _disk_nodes(zstore: Any, name: str) -> dict[str, dict[str, Any]]:
    """Metadata documents of the result's nodes as they are on disk now."""
    prefix = _prefix(name)
    group = zarr.open_group(zstore, path=prefix, mode="r", use_consolidated=False)
    nodes = {prefix: _zarr.empty_group_json(dict(group.attrs.asdict()))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path, node in group.members(max_depth=None):
            document = _zarr.node_json(node)
            if isinstance(node, zarr.Group):
                document = _zarr.empty_group_json(document.get("attributes"))
            nodes[f"{prefix}/{path}"] = document
    return nodes


def _trim_to_committed(zstore: Any, name: str, committed: dict[str, dict[str, Any]]) -> None:
    """Undo what an interrupted write left: uncommitted nodes and rows beyond the committed shapes."""
    owned = _owned_by(name)
    disk = _disk_nodes(zstore, name)
    for path in sorted(p for p in disk if p not in committed and owned(p)):
        sync(zstore.delete_dir(path))
    for path, node in committed.items():
        if not owned(path) or node.get("node_type") != "array":
            continue
        array = zarr.open_array(zstore, path=path, mode="r+", zarr_format=3)
        if list(array.shape) != list(node["shape"]):
            array.resize(tuple(node["shape"]))


STORE_LOCK = "store"
"""``.locks/store``: held shared by every process writing a result, exclusively by one replacing the store."""
_STORE_LOCK_TRIES = 20
"""Non-blocking tries, 50 ms apart, for a shared store lock: a last shared holder holds it exclusively
for the instant it takes to remove the file; a replacement holds it for minutes, and is refused."""


_REPLACING: set[Any] = set()
"""Local stores this process holds the store-wide lock of exclusively: its own result writes (``ckpt repair``
dropping results) need no shared lock there, and would be refused by their own process's lock."""


class _ExclusiveStoreLock(_zarr.FileLock):
    def __init__(self, root: Path, key: Any) -> None:
        super().__init__(root, f"{LOCKS}/{STORE_LOCK}", LOCKS)
        self._key = key

    def release(self) -> None:
        _REPLACING.discard(self._key)
        super().release()


def store_lock(path: str | os.PathLike[str], *, exclusive: bool) -> _zarr.FileLock:
    """Take the store-wide lock ``.locks/store`` of a local store (a no-op lock for a URL), held; release it.

    Shared by every process that writes a result (``ckpt analyze``, ``ckpt rm``, through
    :func:`result_lock`), exclusive for one that replaces the whole store (``ckpt import`` or
    ``ckpt create`` with ``--overwrite``, ``ckpt repair``): a result computed from the old store
    must never be committed into the new one, with the old one's provenance. Neither side waits:
    whichever comes second is refused with :class:`StoreLockedError`.
    """
    import time

    local = _zarr.local_path(path)
    key = None if local is None else local.resolve()
    if local is None or (not exclusive and key in _REPLACING):
        return _zarr.FileLock(None)
    lock: _zarr.FileLock
    if exclusive:
        lock = _ExclusiveStoreLock(local, key)
        busy = (
            f"an analysis is being computed or removed in {path} by another process; it cannot be replaced "
            "until that finishes: wait for it (or stop it), then run again"
        )
        lock.acquire(blocking=False, busy_message=busy)
        _REPLACING.add(key)
        return lock
    lock = _zarr.FileLock(local, f"{LOCKS}/{STORE_LOCK}", LOCKS, shared=True)
    busy = (
        f"{path} is being replaced by another process (ckpt import or create with --overwrite, or ckpt repair); "
        "run again once it is done"
    )
    for _ in range(_STORE_LOCK_TRIES - 1):
        try:
            lock.acquire(blocking=False, busy_message=busy)
            return lock
        except StoreLockedError:
            time.sleep(0.05)
    lock.acquire(blocking=False, busy_message=busy)
    return lock


@contextlib.contextmanager
def result_lock(path: str | os.PathLike[str], name: str, *, blocking: bool = False) -> Iterator[None]:
    """Hold the lock of result ``name``: one process writes a result at a time.

    An advisory ``flock`` on the lock file ``.locks/analyses/<name>`` of a local store
    (:class:`~ckpt.store._zarr.FileLock`), not on the result's folder, which is made anew when
    the result is replaced. Without ``blocking`` (``ckpt analyze``, ``ckpt rm``), a second
    process gets :class:`StoreLockedError` instead of interleaving its blocks with the first
    one's; with it (a journal's pieces, committed by parallel tasks) it waits its turn. Results
    of other names are not held up. A crashed holder never leaves a stale lock (the kernel
    releases it). The store-wide lock is held shared meanwhile (:func:`store_lock`), so that the
    store is not replaced under the result. Remote stores have no lock: there the user must make
    sure one process writes a result at a time.
    """
    problem = check_name(name, "analysis")
    if problem:
        raise InvalidNameError(problem)
    local = _zarr.local_path(path)
    lock = _zarr.FileLock(local, f"{LOCKS}/{ANALYSES}/{name}", LOCKS)
    busy = (
        f"analysis {name!r} of {path} is being computed by another process; wait for it to finish "
        "(or stop it), then run again"
    )
    whole = store_lock(path, exclusive=False)
    try:
        lock.acquire(blocking=blocking, busy_message=busy)
        try:
            yield
        finally:
            lock.release()
    finally:
        whole.release()


def write_analysis(
    path: str | os.PathLike[str],
    name: str,
    dataset: xr.Dataset,
    *,
    append_dim: str | None = None,
    attrs: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Write an analysis result to ``analyses/<name>`` and commit it.

    Parameters
    ----------
    path
        The store.
    name
        Analyzer name (a valid node name).
    dataset
        The (computed) result.
    append_dim
        ``None`` replaces any stored result; ``"step"`` appends ``dataset``
        along that dimension to the committed result.
    attrs
        Group attributes to set (provenance); replaces the stored ones.
    storage_options
        fsspec options for URLs.
    """
    problem = check_name(name, "analysis")
    if problem:
        raise InvalidNameError(problem)
    where = str(path)
    zstore = open_zarr_store(where, read_only=False, storage_options=storage_options)
    root_attrs, committed = _zarr.read_root(zstore, where)
    check_format(root_attrs, where)
    dataset = dataset.copy()
    dataset.attrs = dict(attrs if attrs is not None else dataset.attrs)
    for key, variable in list(dataset.variables.items()):
        if variable.dtype.kind == "U":
            # fixed-width unicode has no stable zarr v3 encoding (zarr and zarrs warn); strings do
            if key in dataset.coords:
                dataset = dataset.assign_coords({key: variable.astype(object)})
            else:
                dataset[key] = variable.astype(object)
    try:
        _write(zstore, where, name, dataset, append_dim, committed)
    except BaseException:
        # nothing of this write is committed; leave no half-written files behind (a full disk
        # needs the space back, and plain zarr readers would see them): best effort
        with contextlib.suppress(Exception):
            _trim_to_committed(zstore, name, _zarr.read_root(zstore, where)[1])
        raise


def _check_analyses_group(zstore: Any, where: str) -> None:
    """Read the ``analyses`` group's own metadata bounded, as zarr will read it to create a result below it.

    zarr parses it with an unbounded JSON parser (a hostile document is a RecursionError deep inside
    zarr): checked first, before anything of the old result is deleted.
    """
    group = _zarr.read_json(zstore, f"{ANALYSES}/{_zarr.ROOT_KEY}", f"{where} ({ANALYSES}/)")
    if group is not None and group.get("node_type") != "group":
        msg = (
            f"{ANALYSES}/{_zarr.ROOT_KEY} of {where} is not a group's metadata (node_type "
            f"{group.get('node_type')!r}): it is damaged; restore the store from a copy, or run ckpt repair"
        )
        raise StoreError(msg)


def _delete_result_node(zstore: Any, where: str, prefix: str) -> None:
    """Delete what is stored at ``prefix`` before a result is written there anew.

    A damaged store can hold a plain file (or a link) where the result's folder belongs: zarr's
    ``delete_dir`` refuses a file (a traceback), so it is unlinked, as the folder would have been
    deleted. A link is removed itself, never followed.
    """
    local = _zarr.local_path(where)
    node = None if local is None else local / prefix
    if node is not None and (node.is_symlink() or node.is_file()):
        node.unlink()
        return
    sync(zstore.delete_dir(prefix))


def _write(
    zstore: Any,
    where: str,
    name: str,
    dataset: xr.Dataset,
    append_dim: str | None,
    committed: dict[str, dict[str, Any]],
) -> None:
    prefix, owned, exists = _prefix(name), _owned_by(name), _prefix(name) in committed
    with warnings.catch_warnings():
        # zarr: string/vlen dtypes and consolidated metadata are not in the v3 core spec yet
        warnings.simplefilter("ignore")
        if append_dim is not None and exists:
            _trim_to_committed(zstore, name, committed)
            dataset.to_zarr(zstore, group=prefix, mode="a", append_dim=append_dim, consolidated=False, zarr_format=3)
            zarr.open_group(zstore, path=prefix, mode="r+", use_consolidated=False).attrs.put(dataset.attrs)
        else:
            _check_analyses_group(zstore, where)
            if exists:  # readers must stop seeing the old result before it is deleted
                _zarr.commit(zstore, where, attributes=None, nodes={}, owns=owned)
            _delete_result_node(zstore, where, prefix)
            dataset.to_zarr(
                zstore, group=prefix, mode="w", consolidated=False, zarr_format=3, encoding=_checksummed(dataset)
            )
    appended = append_dim if append_dim is not None and exists else None
    nodes = _with_digests(zstore, name, _disk_nodes(zstore, name), committed, appended)
    _zarr.commit(zstore, where, attributes=None, nodes=nodes, owns=owned)


def _checksummed(dataset: xr.Dataset) -> dict[Hashable, dict[str, Any]]:
    """Encodings that end every chunk of every variable with a crc32c, like the rest of the store."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return {name: {"compressors": (ZstdCodec(level=0), Crc32cCodec())} for name in dataset.variables}


def _with_digests(
    zstore: Any,
    name: str,
    nodes: dict[str, dict[str, Any]],
    committed: dict[str, dict[str, Any]],
    appended: str | None,
) -> dict[str, dict[str, Any]]:
    """The result's nodes with the digest of every chunk recorded (chunks.py); appends hash only new chunks.

    The values are read back through xarray, decoded as readers will see them.
    """
    prefix = _prefix(name)
    opened = xr.open_zarr(zstore, group=prefix, consolidated=False, chunks=None)
    for path, node in nodes.items():
        if node.get("node_type") != "array":
            continue
        dims = list(node.get("dimension_names") or [])
        axis = dims.index(appended) if appended in dims and path in committed else None
        variable = opened.variables[path.removeprefix(prefix + "/")]
        node["attributes"] = {
            **node.get("attributes", {}),
            CHUNK_DIGESTS: digest_variable(variable, node, committed.get(path), axis),
        }
    return nodes


def delete_analysis(path: str | os.PathLike[str], name: str, storage_options: dict[str, Any] | None = None) -> None:
    """Remove ``analyses/<name>`` from the commit record, then from the store (under its result lock).

    Raises
    ------
    StoreError
        No result of that name is committed or on disk.
    StoreLockedError
        Another process is computing it.
    """
    where = str(path)
    zstore = open_zarr_store(where, read_only=False, storage_options=storage_options)
    root_attrs, committed = _zarr.read_root(zstore, where)
    check_format(root_attrs, where)
    on_disk = sync(zstore.exists(f"{_prefix(name)}/{_zarr.ROOT_KEY}"))
    if _prefix(name) not in committed and not on_disk:
        stored = sorted(
            k.removeprefix(f"{ANALYSES}/") for k in committed if k.startswith(f"{ANALYSES}/") and k.count("/") == 1
        )
        msg = f"no analysis {name!r} in {where}; stored analyses: {', '.join(stored) or '(none)'}"
        raise StoreError(msg)
    with result_lock(where, name):
        _zarr.commit(zstore, where, attributes=None, nodes={}, owns=_owned_by(name))
        sync(zstore.delete_dir(_prefix(name)))


@contextlib.contextmanager
def threads_unless_configured() -> Iterator[None]:
    """Within: dask computes on its threads, given as the scheduler itself, unless the user configured one.

    For the commands that read stored results lazily in many places (figures, the report): with no
    scheduler configured, dask imports ``distributed`` at the first compute to look for a cluster's
    client (see :func:`load_result`).
    """
    import dask
    import dask.threaded

    if dask.config.get("scheduler", None) is not None:
        yield
        return
    with dask.config.set(scheduler=dask.threaded.get):
        yield


def load_result(dataset: xr.Dataset) -> xr.Dataset:
    """A stored result (Dask-backed, as :meth:`ckpt.store.Store.analysis` opens it) read into memory.

    On dask's threads, given as the scheduler itself: given none, or one by name, dask imports
    ``distributed`` to look for a cluster's client first, a large share of a short command's time
    (docs/performance.md, "Start-up and imports"). A scheduler the user configured is used as it is.
    """
    with threads_unless_configured():
        return dataset.load()


__all__ = [
    "STEP",
    "STORE_LOCK",
    "delete_analysis",
    "load_result",
    "result_lock",
    "store_lock",
    "threads_unless_configured",
    "write_analysis",
]
