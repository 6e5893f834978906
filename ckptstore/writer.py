"""Writing checkpoints: :class:`Writer`, :func:`create` and appending with ``open(mode="a")``.

Commit protocol (docs/store-format.md, "Commit protocol"): the data of a
checkpoint is written first, into rows beyond the committed length of every
array; then the root ``zarr.json`` is rewritten with the new committed shapes.
That single atomic put is the commit. A crash before it leaves the previous
commit record in place, so readers never see a partial checkpoint and every
earlier checkpoint is untouched: checkpoint chunks are written once and never
rewritten. The next writer trims what a crashed one left beyond the record.

By concern: the rows of checkpoint and metric arrays are written by :mod:`ckpt.store.writer_rows`,
data splits by :mod:`ckpt.store.writer_data`, a new store's skeleton by :mod:`ckpt.store.creating`
(whose :func:`create` this module re-exports).
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.sync import sync

from ckpt.errors import (
    CorruptChunkError,
    DataError,
    InvalidArgumentError,
    InvalidNameError,
    NonFiniteError,
    ReadOnlyError,
    StepOrderError,
    UnsupportedTensorError,
)
from ckpt.store import _zarr, creating
from ckpt.store.arrays import count_nonfinite, tensor_digest
from ckpt.store.followers import Followers, check_followable, check_names
from ckpt.store.format import (
    CHECKPOINTS,
    DATA,
    DIGESTS,
    FACTORY_RE,
    FINISHED,
    METRIC_DIGESTS,
    METRICS,
    ROOT_ATTR,
    STEP,
    history_entry,
)
from ckpt.store.reader import INCOMPLETE, Store, check_complete, check_format, open_zarr_store
from ckpt.store.writer_data import DATA_CHUNK_BYTES, add_split
from ckpt.store.writer_rows import (
    INITIAL_CAPACITY,
    STEP_CHUNK,
    check_metric_digests,
    check_metric_step,
    check_metrics,
    check_schema,
    check_step,
    convert_tensors,
    create_tensor_arrays,
    ensure_capacity,
    stage_metrics,
    write_rows,
)


def _compressors(compressor: str | None) -> list[Any]:
    if compressor is None:
        # fp32 weights compress by only ~7-12% (ARCHITECTURE.md); not worth the CPU by default
        return [Crc32cCodec()]
    if compressor == "zstd":
        return [ZstdCodec(level=1), Crc32cCodec()]
    msg = f"compressor must be None or 'zstd', got {compressor!r}"
    raise InvalidArgumentError(msg)


def _as_tensor_mapping(tensors: Any) -> Mapping[str, Any]:
    if isinstance(tensors, Mapping):
        return tensors
    state_dict = getattr(tensors, "state_dict", None)
    if callable(state_dict):  # a torch nn.Module (or anything with a state_dict)
        return state_dict()
    msg = f"tensors must be a mapping name -> array or an nn.Module, got {type(tensors).__name__}"
    raise UnsupportedTensorError(msg)


class Writer:
    """A checkpoint store opened for writing.

    Create one with :func:`ckpt.create` or ``ckpt.open(path, mode="a")``.
    Use it as a context manager, or call :meth:`close` when done. One writer
    at a time holds a local store (an advisory ``flock``, released by the
    kernel if the process dies). :meth:`reader` gives a :class:`Store` view of
    what has been committed.

    ``follow=["loss", "grad-norms"]`` starts those analyzers in processes of their own, each
    computing every checkpoint as it is committed (:mod:`ckpt.store.followers`); ``follow_log``
    is where they write (default: ``STORE.follow.log`` beside a local store).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        reject_nonfinite: bool = False,
        compressor: str | None = None,
        follow: Sequence[str] | None = None,
        follow_log: str | os.PathLike[str] | None = None,
        _history: dict[str, Any] | None = None,
        _building: bool = False,
    ) -> None:
        self._where = str(path)
        names = check_names(follow)  # before the store is touched: a wrong name changes nothing
        if names:
            check_followable(self._where, follow_log)
        self._followers: Followers | None = None
        self._storage_options = storage_options
        self._reject_nonfinite = reject_nonfinite
        self._compressors = _compressors(compressor)
        self._zstore = open_zarr_store(self._where, read_only=False, storage_options=storage_options)
        # say "not a store" before trying to lock a directory that may not exist
        check_format(_zarr.read_root(self._zstore, self._where)[0], self._where)
        local = _zarr.local_path(self._where)
        self._lock = _zarr.DirectoryLock(local, CHECKPOINTS)
        busy = f"another process is writing to {self._where}; wait for it to finish (one writer at a time)"
        self._lock.acquire(blocking=False, busy_message=busy)
        self._closed = False
        try:
            self._attrs, self._nodes = _zarr.read_root(self._zstore, self._where)
            check_format(self._attrs, self._where)
            if not _building:  # only the import building it may write to a store marked incomplete
                check_complete(self._attrs, self._where)
            self._open_arrays()
            repaired = self._repair()
            entry = _history or history_entry("open")
            if repaired:
                entry["repaired"] = repaired
            self._attrs[ROOT_ATTR]["history"].append(entry)
            self._state_at_open = self._attrs[ROOT_ATTR].get(FINISHED)
            self._attrs[ROOT_ATTR][FINISHED] = False  # reopened: the run grows again until close()
            self._commit()
            if names:  # after the commit that marks the run open: a follower must not see it finished
                self._followers = Followers(self._where, names, storage_options=storage_options, log=follow_log)
        except BaseException:
            self._lock.release()
            raise

    # -- state -----------------------------------------------------------------------------
    def _group(self) -> zarr.Group:
        return zarr.open_group(self._zstore, mode="r+", use_consolidated=False)

    def _open_arrays(self) -> None:
        """Open every committed checkpoint/metric array for writing, with its real shape."""
        self._ckpt_arrays: dict[str, zarr.AsyncArray] = {}
        self._metric_arrays: dict[str, zarr.AsyncArray] = {}
        for key, node in self._nodes.items():
            if node.get("node_type") != "array":
                continue
            group, _, name = key.partition("/")
            if "/" in name or group not in (CHECKPOINTS, METRICS):
                continue
            if group == CHECKPOINTS:
                self._ckpt_arrays[name] = self._open_array(key, rewritten=name == STEP)
            else:
                self._metric_arrays[name] = self._open_array(key, rewritten=True)
        self._whole_chunks: dict[str, _zarr.WholeChunks] = {}
        self._chunk_writers: ThreadPoolExecutor | None = None  # made at the first write, shut down by close()
        self._find_whole_chunks()
        self._count = int(self._nodes[f"{CHECKPOINTS}/{STEP}"]["shape"][0])
        self._metric_count = int(self._nodes[f"{METRICS}/{STEP}"]["shape"][0])
        self._count_at_open, self._metric_count_at_open = self._count, self._metric_count
        self._steps_cache = self._read_steps(CHECKPOINTS, self._count)
        self._metric_steps_cache = self._read_steps(METRICS, self._metric_count)
        self._metric_columns: dict[str, list[Any]] | None = None
        if self._attrs[ROOT_ATTR].get(METRIC_DIGESTS) is not None:  # v2: kept in memory to digest at each commit
            self._metric_columns = {
                name: np.asarray(sync(array.getitem(slice(0, self._metric_count)))).tolist()
                for name, array in self._metric_arrays.items()
            }
            check_metric_digests(self)
        digests = self._attrs[ROOT_ATTR].get(DIGESTS)
        if digests is not None and sorted(int(k) for k in digests) != self._steps_cache:
            msg = (
                f"the step array of {self._where} does not match its commit record (a chunk of checkpoints/step "
                "is missing or damaged); appending would build on wrong steps: restore the store from a copy"
            )
            raise CorruptChunkError(msg)

    def _find_whole_chunks(self) -> None:
        """Note the checkpoint arrays whose chunks :func:`~ckpt.store.writer_rows.write_rows` writes itself."""
        for name, array in self._ckpt_arrays.items():
            chunks = _zarr.WholeChunks.of(self._zstore, array.store_path.path, array.metadata)
            if chunks is not None:
                self._whole_chunks[name] = chunks

    def _open_array(self, key: str, *, rewritten: bool) -> zarr.AsyncArray:
        # Checkpoint chunks are written once, so the fast zarrs pipeline is safe
        # for them. Arrays whose chunks are rewritten at every commit (step,
        # metrics) go through zarr's own pipeline, whose puts are atomic renames.
        array = zarr.open_array(self._zstore, path=key, mode="r+", zarr_format=3)._async_array
        return array if rewritten else _zarr.fast_io(array)

    def _read_steps(self, group: str, count: int) -> list[int]:
        return [int(s) for s in np.asarray(sync(self._ckpt_or_metric(group, STEP).getitem(slice(0, count))))]

    def _ckpt_or_metric(self, group: str, name: str) -> zarr.AsyncArray:
        return (self._ckpt_arrays if group == CHECKPOINTS else self._metric_arrays)[name]

    def _repair(self) -> dict[str, Any]:
        """Remove what a crashed writer left beyond the commit record; returns what was removed.

        Nodes under ``checkpoints/``, ``metrics/`` and ``data/`` that are not in
        the record are deleted, and so are the chunks of a checkpoint whose
        commit never happened. Metric rows beyond the record are rewritten
        whole by the next row. ``analyses/`` belongs to the engine.
        """
        root = self._group()
        committed = set(self._nodes)
        stray = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # foreign files are not ours to judge
            for name in (CHECKPOINTS, METRICS, DATA):
                members = _zarr.group_at(root, name, self._where).members(max_depth=None)
                stray += [f"{name}/{path}" for path, _ in members if f"{name}/{path}" not in committed]
        stray.sort()
        removed = [p for p in stray if not any(p.startswith(q + "/") for q in stray)]
        for path in removed:
            sync(self._zstore.delete_dir(path))
        # Rows are written in order and committed one at a time, so the only row
        # a crash can leave written-but-uncommitted is row `count`. Deleting
        # its chunks is enough; the spare capacity beyond was never written.
        for name, array in self._ckpt_arrays.items():
            if array.shape[0] > self._count:
                key = array.metadata.encode_chunk_key((self._count,) + (0,) * (array.ndim - 1))
                sync(self._zstore.delete(f"{CHECKPOINTS}/{name}/{key}"))
        return {"removed": removed} if removed else {}

    def _commit(self) -> None:
        # analyses/ belongs to the engine, which may commit while we write
        _zarr.commit(
            self._zstore,
            self._where,
            attributes=self._attrs,
            nodes=self._nodes,
            owns=lambda path: not _zarr.is_analysis_node(path),
        )

    def _check_open(self) -> None:
        if self._closed:
            msg = f"the writer of {self._where} is closed; reopen with ckpt.open(path, mode='a')"
            raise ReadOnlyError(msg)

    # -- what has been committed -------------------------------------------------------------
    @property
    def path(self) -> str:
        """The path or URL of the store."""
        return self._where

    @property
    def steps(self) -> np.ndarray:
        """Committed checkpoint steps (int64 array)."""
        return np.asarray(self._steps_cache, dtype=np.int64)

    def _tensor_order(self) -> list[str]:
        """The tensor order of the first checkpoint (``checkpoints`` attrs), which digests follow."""
        return list(self._nodes[CHECKPOINTS]["attributes"][ROOT_ATTR]["tensors"])

    @property
    def tensor_names(self) -> list[str]:
        """Names of the tensors of a checkpoint (empty before the first one)."""
        return [n for n in self._ckpt_arrays if n != STEP]

    @property
    def followers(self) -> list[subprocess.Popen[bytes]]:
        """The follower processes started with ``follow`` (empty without); the writer never waits for them."""
        return [] if self._followers is None else list(self._followers.processes)

    @property
    def follow_log(self) -> Path | None:
        """The file the followers write to, or None without ``follow``."""
        return None if self._followers is None else self._followers.log

    def reader(self) -> Store:
        """A read-only :class:`Store` on the state committed so far."""
        return Store(self._where, storage_options=self._storage_options)

    def __repr__(self) -> str:
        return f"<ckptstore.Writer {self._where!r}: {self._count} checkpoints committed>"

    # -- checkpoints -----------------------------------------------------------------------
    @property
    def last_step(self) -> int | None:
        """The last committed checkpoint step, or None before the first one."""
        return self._steps_cache[-1] if self._steps_cache else None

    def write(
        self,
        step: int,
        tensors: Mapping[str, Any] | Any,
        metrics: Mapping[str, Any] | None = None,
        *,
        reject_nonfinite: bool | None = None,
    ) -> None:
        """Write and commit one checkpoint.

        Parameters
        ----------
        step
            Training step of the checkpoint; must exceed every committed step.
        tensors
            Mapping name -> array-like (numpy, torch on any device, JAX, ``__array__``
            or DLPack objects), or a torch ``nn.Module`` (its ``state_dict()``).
        metrics
            Scalars logged at this step (``{"loss": 0.7}``), stored in ``metrics/``.
        reject_nonfinite
            Refuse tensors holding NaN or inf (default: the writer's setting).

        Raises
        ------
        StepOrderError, SchemaMismatchError, NonFiniteError, UnsupportedTensorError, InvalidNameError
            Before anything is written: the store is unchanged.

        """
        self._check_open()
        step = check_step(step)
        last = self.last_step
        if last is not None and step <= last:
            kind = "is already committed" if step in self._steps_cache else "comes before the last committed step"
            msg = f"checkpoint step {step} {kind}; steps must strictly increase (last committed step: {last})"
            raise StepOrderError(msg)
        checked_metrics = check_metrics(metrics, step)
        if checked_metrics:
            check_metric_step(self, step)
        arrays = convert_tensors(step, _as_tensor_mapping(tensors))
        reject = self._reject_nonfinite if reject_nonfinite is None else reject_nonfinite
        if reject:
            for name, (array, logical) in arrays.items():
                bad = count_nonfinite(array, logical)
                if bad:
                    msg = (
                        f"tensor {name!r} at step {step} holds {bad} NaN/inf values of {array.size}; "
                        "expected finite values"
                    )
                    raise NonFiniteError(msg)
        if len(self._ckpt_arrays) == 1:  # only `step`: the first checkpoint defines the schema
            create_tensor_arrays(self, arrays)
        else:
            check_schema(self, step, arrays)
        index = self._count
        ensure_capacity(self, CHECKPOINTS, index + 1)
        values = {name: array for name, (array, _) in arrays.items()}
        values[STEP] = np.asarray(step, dtype=np.int64)
        write_rows(self, self._ckpt_arrays, index, values)
        digests = self._attrs[ROOT_ATTR].get(DIGESTS)
        if digests is not None:  # v2: the commit record binds every tensor of the checkpoint to its step
            digests[str(step)] = [tensor_digest(values[name]) for name in self._tensor_order()]
        self._count = index + 1
        self._steps_cache.append(step)
        for name in self._ckpt_arrays:
            self._nodes[f"{CHECKPOINTS}/{name}"]["shape"][0] = self._count
        if checked_metrics:
            stage_metrics(self, step, checked_metrics)
        self._commit()

    # -- metrics ---------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log scalar metrics at ``step`` without a checkpoint (steps strictly increase)."""
        self._check_open()
        step = check_step(step)
        checked = check_metrics(metrics, step)
        if not checked:
            return
        check_metric_step(self, step)
        stage_metrics(self, step, checked)
        self._commit()

    # -- data ------------------------------------------------------------------------------
    def add_data(
        self,
        split: str,
        inputs: Any,
        targets: Any = None,
        mask: Any = None,
        labels: Mapping[str, Any] | None = None,
        text: Sequence[str] | None = None,
        *,
        overwrite: bool = False,
    ) -> None:
        """Store an evaluation data set under ``data/<split>``.

        Parameters
        ----------
        split
            Name of the split (``"eval"``, ``"train"``, ...).
        inputs
            Model inputs, first dim = examples.
        targets
            Targets, first dim = examples (``[N]`` class labels or ``[N, seq]`` tokens).
        mask
            Boolean, same shape as ``targets``: which tokens are datapoints.
        labels
            Name -> per-example ``[N]`` or per-token (shape of ``mask``/``targets``) values.
        text
            One string per example.
        overwrite
            Replace an existing split of that name. In a local store the new split is written
            and committed in a hard-linked clone of the store swapped in at once, so that a
            crash leaves the old split or the new one; in an object store (no swap) the old
            split is removed first and a crash in between leaves the split missing.

        Raises
        ------
        DataError, InvalidNameError
            Before anything is written.
        StoreLockedError
            ``overwrite`` of a local store's split while another process writes a result to it.

        """
        add_split(self, split, inputs, targets, mask, labels or {}, text, overwrite=overwrite)

    def set_model(
        self,
        model: str | None = None,
        config: Mapping[str, Any] | None = None,
        objective: str | None = None,
    ) -> None:
        """Set or change the model spec and/or the objective of the store, and commit.

        Parameters
        ----------
        model
            Model factory ``"package.module:function"`` (unchanged when None).
        config
            Keyword arguments of ``model`` (JSON-serialisable; ``{}`` when None with a model).
        objective
            Per-datapoint loss name (unchanged when None).

        Stored analysis results are kept: their provenance records the model spec and
        objective they were computed with, so the engine recomputes them, never reuses them.
        The change is recorded in the store's history.

        Raises
        ------
        InvalidNameError, DataError
            Before anything is written.
        """
        self._check_open()
        meta = self._attrs[ROOT_ATTR]
        changes: dict[str, Any] = {}
        if model is not None:
            if not isinstance(model, str) or not FACTORY_RE.fullmatch(model):
                msg = f"model must be an importable factory 'package.module:function', got {model!r}"
                raise InvalidNameError(msg)
            try:
                config_json = json.loads(json.dumps(dict(config or {}), allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise DataError(f"config must be JSON-serialisable: {exc}") from None
            meta["model"] = changes["model"] = {"factory": model, "config": config_json}
        if objective is not None:
            meta["objective"] = changes["objective"] = objective
        if changes:
            meta["history"].append(history_entry("set-model", **changes))
            self._commit()

    # -- closing ---------------------------------------------------------------------------
    def _mark_complete(self) -> None:
        """Clear the mark an import set at create; the next commit (``close``) makes the store complete."""
        self._attrs[ROOT_ATTR].pop(INCOMPLETE, None)

    def close(self) -> None:
        """Record the final shapes in every array's own metadata, commit the run as finished, release the lock.

        The commit record then says the run is finished (``Store.finished``): a follower
        (``ckpt analyze --follow``, or one started with ``follow``) computes the last checkpoints
        and stops; ``close`` does not wait for it.
        """
        if self._closed:
            return
        try:
            # Rows beyond the committed count were never written (a crash's rows
            # are trimmed at open), so rewriting each array's zarr.json with the
            # committed shape is enough; zarr's resize would try to delete every
            # chunk of the spare capacity, one by one.
            for path, node in self._nodes.items():
                group, _, name = path.partition("/")
                if group in (CHECKPOINTS, METRICS) and name and node.get("node_type") == "array":
                    _zarr.write_json(self._zstore, f"{path}/{_zarr.ROOT_KEY}", node)
            if (finished := self._finished_at_close()) is None:
                del self._attrs[ROOT_ATTR][FINISHED]  # a store from before the mark stays unknown
            else:
                self._attrs[ROOT_ATTR][FINISHED] = finished
            self._commit()
            if self._followers is not None:  # finished: they complete the run and exit on their own
                self._followers.release()
        finally:
            self._closed = True
            self._lock.release()
            if self._chunk_writers is not None:
                self._chunk_writers.shutdown()

    def _finished_at_close(self) -> bool | None:
        """Finished, unless this writer only attached data or a model to a run left open (or unknown)."""
        grew = self._count > self._count_at_open or self._metric_count > self._metric_count_at_open
        if grew or self._count_at_open == 0 or self._state_at_open is True:
            return True
        return self._state_at_open if isinstance(self._state_at_open, bool) else None

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create(
    path: str | os.PathLike[str],
    *,
    follow: Sequence[str] | None = None,
    follow_log: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> Writer:
    """Create a new checkpoint store and return its :class:`Writer` (:func:`ckpt.store.creating.create`), followed.

    Parameters
    ----------
    path
        Local directory (``"run.zarr"``) or fsspec URL (``"s3://..."``).
    follow
        Analyzers to run as the run trains, each in a process of its own started once the store
        exists (:mod:`ckpt.store.followers`); an unknown name is an error before the store is created.
    follow_log
        The followers' log file (default: ``STORE.follow.log`` beside a local store).
    **kwargs
        ``model``, ``config``, ``objective``, ``framework``, ``attrs``, ``overwrite``,
        ``reject_nonfinite``, ``compressor``, ``storage_options``, ``parent``.

    Raises
    ------
    InvalidArgumentError
        A ``follow`` name no installed analyzer has, or a ``memory://`` store to follow.
    """
    names = check_names(follow)
    if not names:
        return creating.create(path, **kwargs)
    check_followable(str(path), follow_log)
    writer = creating.create(path, **kwargs)
    try:
        writer._followers = Followers(writer.path, names, storage_options=kwargs.get("storage_options"), log=follow_log)
    except BaseException:
        writer.close()  # no follower could start (its log, say): the store stays, unlocked
        raise
    return writer


__all__ = ["DATA_CHUNK_BYTES", "INITIAL_CAPACITY", "STEP_CHUNK", "Writer", "create"]
