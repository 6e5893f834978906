"""Saving analysis results into ``analyses/<name>`` and committing them: :class:`ResultSink`.

Results are xarray Datasets written with xarray's own Zarr encoding, then
committed into the store's commit record like everything else
(docs/store-format.md, section 4): a result, or a block of steps appended to
one, becomes visible in a single atomic write of the root ``zarr.json``. An
analysis interrupted mid-write leaves the previously committed result intact;
the next write trims the leftovers before appending. Commits of results and
of checkpoints merge, so an analysis may run while training writes.

One object owns writing a result, :class:`ResultSink`: the result's lock, the
open store, the provenance (:class:`~ckpt.store.provenance.Provenance`) and each
commit, appended or replacing::

    request = Provenance(analyzer="loss", version="1", options={...}, data_sha256=..., model_sha256=...,
                         requires={}, steps=covered)       # steps: those already committed and kept
    with ResultSink.open(store, "loss", request) as sink:  # StoreLockedError if another sink holds it
        sink.append(block)          # rows after the covered steps (with none covered: the result anew)
        sink.replace(dataset)       # the whole result; covers its ``step`` coordinate (or ``steps=``)
        sink.provenance, sink.steps # the record last committed, the steps it covers

- ``ResultSink.open(store, name, provenance=None, *, blocking=False, storage_options=None)``: takes
  the result lock (:func:`result_lock`'s; ``blocking`` waits for another holder, as a journal's
  parallel pieces do); ``store`` is a path, URL or opened :class:`~ckpt.store.Store`.
- ``append(block, *, dim="step", provenance=None)`` and ``replace(dataset, *, steps=None,
  provenance=None)`` each commit once and return the record committed, stamped with the steps
  covered, ``created`` (now) and ``ckpt_version``; ``provenance=`` changes the record from then on
  (a journal's record, ``partial``, names its pieces itself: there ``append`` extends the stored
  pieces unless the record names one piece). Steps appended must follow the covered ones, each
  once (:class:`~ckpt.errors.InvalidArgumentError`, nothing written).
- A failed or killed commit leaves the result as last committed; the sink's record and steps stay
  those of the last commit, so the next ``append`` follows it.
- ``close()`` (or leaving the ``with``) releases the lock.

:func:`result_lock` and :func:`write_analysis` (lock and commit taken apart) stay, over the same
lock and the same commit (:meth:`ResultSink.write`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import xarray as xr
import zarr
from zarr.core.sync import sync

from ckpt.errors import InvalidArgumentError, InvalidNameError, StoreError
from ckpt.store import _zarr, snapshots
from ckpt.store.chunks import CHUNK_DIGESTS, digest_variable
from ckpt.store.format import ANALYSES, ROOT_ATTR, STEP, check_name
from ckpt.store.provenance import Provenance, utc_now
from ckpt.store.reader import check_format, open_zarr_store
from ckpt.store.result_locks import STORE_LOCK, ResultLock, result_lock, store_lock


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


def write_analysis(
    path: str | os.PathLike[str],
    name: str,
    dataset: xr.Dataset,
    *,
    append_dim: str | None = None,
    attrs: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Write an analysis result to ``analyses/<name>`` and commit it (the lock is the caller's: :func:`result_lock`).

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
    ResultSink(path, name, storage_options=storage_options).write(dataset, append_dim=append_dim, attrs=attrs)


def _where(store: Any, storage_options: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """The path and fsspec options of a store given as a path or as an opened :class:`~ckpt.store.Store`."""
    from ckpt.store.reader import Store

    if isinstance(store, Store):
        return store.path, storage_options if storage_options is not None else store._storage_options
    return str(store), storage_options


class ResultSink:
    """What writes one analysis result: its lock, the open store, its provenance, each commit.

    Made by :meth:`open` (which takes the result's lock) and used as a context manager; see
    the module's docstring. Constructed directly it holds no lock (what :func:`write_analysis`
    does: the caller holds :func:`result_lock`).

    Parameters
    ----------
    store
        The store: a path, URL or opened :class:`~ckpt.store.Store`.
    name
        The result's name, ``analyses/<name>``.
    provenance
        The record of the request (its ``steps``: those already committed and kept).
    storage_options
        fsspec options for URLs (default: an opened store's own).
    """

    def __init__(
        self,
        store: Any,
        name: str,
        provenance: Provenance | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        problem = check_name(name, "analysis")
        if problem:
            raise InvalidNameError(problem)
        self.where, self._storage_options = _where(store, storage_options)
        self.name = name
        self._provenance = provenance
        self._steps: tuple[int, ...] = () if provenance is None else tuple(provenance.steps or ())
        self._lock: ResultLock | None = None
        self._zstore: Any = None

    @classmethod
    def open(
        cls,
        store: Any,
        name: str,
        provenance: Provenance | None = None,
        *,
        blocking: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> ResultSink:
        """Take the lock of result ``name`` of ``store`` and return its sink (release it with :meth:`close`).

        Raises
        ------
        StoreLockedError
            Another sink (this process's or another's) holds the result, or the store is being
            replaced; with ``blocking``, waits for another sink of the result instead.
        InvalidNameError
            ``name`` is not a valid result name.
        """
        sink = cls(store, name, provenance, storage_options=storage_options)
        sink._lock = ResultLock(sink.where, name, blocking=blocking)
        return sink

    @property
    def provenance(self) -> Provenance | None:
        """The record last committed by this sink (before any commit: the one it was given)."""
        return self._provenance

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps the committed result covers, by this sink's record."""
        return self._steps

    def append(self, block: xr.Dataset, *, dim: str = STEP, provenance: Provenance | None = None) -> Provenance:
        """Commit ``block`` after the rows of the result along ``dim``; the record then covers its steps too.

        When the record covers no step yet (a result computed anew), ``block`` replaces whatever
        is stored. A journal's record (``partial``) names its pieces itself: ``block`` extends the
        stored one unless the record names this piece alone.

        Parameters
        ----------
        block
            The rows to add (computed), with the result's variables.
        dim
            The dimension to append along; ``"step"`` for a result.
        provenance
            The record from now on (default: the sink's).

        Returns
        -------
        Provenance
            The record committed.

        Raises
        ------
        InvalidArgumentError
            A result's block whose steps are not after those the record covers, or one not along ``step``.
        """
        record = self._record(provenance)
        if record.partial is not None:
            extend = len(record.partial["keys"]) > 1
            record = dataclasses.replace(record, created=utc_now())
        else:
            if dim != STEP or STEP not in block.coords:
                msg = f"a block of result {self.name!r} is appended along {STEP!r}, with its steps; got dim {dim!r}"
                raise InvalidArgumentError(msg)
            new = [int(s) for s in np.atleast_1d(block[STEP].values)]
            if sorted(set(new)) != new or (self._steps and new and new[0] <= self._steps[-1]):
                msg = (
                    f"the block of steps {new[:5]} of result {self.name!r} does not follow the steps it covers "
                    f"({list(self._steps[-3:])} last): steps must increase, each once"
                )
                raise InvalidArgumentError(msg)
            extend = bool(self._steps)
            record = record.with_steps([*self._steps, *new])
        return self._commit(block, dim if extend else None, record)

    def replace(
        self, dataset: xr.Dataset, *, steps: Sequence[int] | None = None, provenance: Provenance | None = None
    ) -> Provenance:
        """Commit ``dataset`` as the whole result; the record covers ``steps`` (default: its ``step`` coordinate).

        A dataset without a ``step`` coordinate (a per-run result) covers the record's steps
        unless ``steps`` are given. Returns the record committed.
        """
        record = self._record(provenance)
        if record.partial is not None:
            record = dataclasses.replace(record, created=utc_now())
        else:
            if steps is None:
                steps = (
                    [int(s) for s in np.atleast_1d(dataset[STEP].values)]
                    if STEP in dataset.coords
                    else list(record.steps or ())
                )
            record = record.with_steps(steps)
        return self._commit(dataset, None, record)

    def _record(self, provenance: Provenance | None) -> Provenance:
        record = provenance if provenance is not None else self._provenance
        if record is None:
            msg = f"result {self.name!r} is committed with its provenance: give the sink a Provenance"
            raise InvalidArgumentError(msg)
        return record

    def _commit(self, dataset: xr.Dataset, append_dim: str | None, record: Provenance) -> Provenance:
        self.write(dataset, append_dim=append_dim, attrs={ROOT_ATTR: record.to_attrs()})
        self._provenance = record
        if record.partial is None:
            self._steps = tuple(record.steps or ())
        return record

    def write(self, dataset: xr.Dataset, *, append_dim: str | None, attrs: dict[str, Any] | None) -> None:
        """Write ``dataset`` (appended along ``append_dim``, or replacing the result) with ``attrs``, committed.

        The raw commit beneath :meth:`append` and :meth:`replace` (and :func:`write_analysis`):
        the group attributes are ``attrs`` as given (``dataset.attrs`` when None), unchecked.
        """
        where = self.where
        if self._zstore is None:
            self._zstore = open_zarr_store(where, read_only=False, storage_options=self._storage_options)
        zstore = self._zstore
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
            _write(zstore, where, self.name, dataset, append_dim, committed)
        except BaseException:
            # nothing of this write is committed; leave no half-written files behind (a full disk
            # needs the space back, and plain zarr readers would see them): best effort
            with contextlib.suppress(Exception):
                _trim_to_committed(zstore, self.name, _zarr.read_root(zstore, where)[1])
            raise

    def close(self) -> None:
        """Release the result's lock (nothing is committed that was not already)."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release()

    def __enter__(self) -> ResultSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
            if exists:  # readers must stop seeing the old result before it is moved away
                _zarr.commit(zstore, where, attributes=None, nodes={}, owns=owned)
                _retire_result_node(zstore, where, name)
            else:  # leftovers of an interrupted first write: nobody opened them
                _delete_result_node(zstore, where, prefix)
            dataset.to_zarr(
                zstore, group=prefix, mode="w", consolidated=False, zarr_format=3, encoding=_checksummed(dataset)
            )
    appended = append_dim if append_dim is not None and exists else None
    nodes = _with_digests(zstore, name, _disk_nodes(zstore, name), committed, appended)
    _zarr.commit(zstore, where, attributes=None, nodes=nodes, owns=owned)
    snapshots.quietly_prune(zstore, name)


def _retire_result_node(zstore: Any, where: str, name: str) -> None:
    """Keep the committed result's folder for the Datasets that opened it (:mod:`ckpt.store.snapshots`).

    A plain file or a link in its place (a damaged store) is deleted as before: nobody could read it.
    """
    local = _zarr.local_path(where)
    node = None if local is None else local / _prefix(name)
    if node is not None and (node.is_symlink() or not node.is_dir()):
        _delete_result_node(zstore, where, _prefix(name))
        return
    snapshots.retire(zstore, where, name)


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
    """Remove ``analyses/<name>`` from the commit record, then from the store, kept versions too (under its lock).

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
        snapshots.drop(zstore, name)  # removed, not replaced: a Dataset held still is stale


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
    "ResultSink",
    "delete_analysis",
    "load_result",
    "result_lock",
    "store_lock",
    "threads_unless_configured",
    "write_analysis",
]
