"""Writing checkpoints: :class:`Writer`, :func:`create` and appending with ``open(mode="a")``.

Commit protocol (docs/store-format.md, "Commit protocol"): the data of a
checkpoint is written first, into rows beyond the committed length of every
array; then the root ``zarr.json`` is rewritten with the new committed shapes.
That single atomic put is the commit. A crash before it leaves the previous
commit record in place, so readers never see a partial checkpoint and every
earlier checkpoint is untouched: checkpoint chunks are written once and never
rewritten. The next writer trims what a crashed one left beyond the record.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import StorePath

from ckpt.errors import (
    CorruptChunkError,
    DataError,
    InvalidArgumentError,
    InvalidNameError,
    NonFiniteError,
    ReadOnlyError,
    SchemaMismatchError,
    StepOrderError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    UnsupportedTensorError,
)
from ckpt.store import _zarr
from ckpt.store.arrays import column_digest, count_nonfinite, tensor_digest, to_numpy
from ckpt.store.data import check_data, data_digest
from ckpt.store.format import (
    CHECKPOINTS,
    DATA,
    DIGESTS,
    FACTORY_RE,
    FORMAT_NAME,
    FORMAT_VERSION,
    LABELS,
    LOCKS,
    METRIC_DIGESTS,
    METRICS,
    PARENT,
    ROOT_ATTR,
    STEP,
    STEP_FILL_VALUE,
    TOP_LEVEL_GROUPS,
    check_name,
    history_entry,
    utc_now,
)
from ckpt.store.lineage import Parent, parent_problem
from ckpt.store.publish import lock_replaceable, occupied, publish, publish_url, remove_store, staging_path, staging_url
from ckpt.store.reader import INCOMPLETE, Store, check_complete, check_format, open_zarr_store

STEP_CHUNK = 4096
"""Rows per chunk of ``step`` and metric arrays (rewritten, atomically, at each commit)."""
INITIAL_CAPACITY = 16
"""Rows allocated in checkpoint arrays before the first growth (grown by doubling)."""
DATA_CHUNK_BYTES = 8 << 20


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


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer):
        msg = f"step must be a non-negative integer, got {step!r} ({type(step).__name__})"
        raise StepOrderError(msg)
    if step < 0:
        msg = f"step must be a non-negative integer, got {step}"
        raise StepOrderError(msg)
    if step > np.iinfo(np.int64).max:  # steps are stored as int64
        msg = f"step must be below 2**63 (steps are stored as int64), got {step}"
        raise StepOrderError(msg)
    return int(step)


def _check_metrics(metrics: Mapping[str, Any] | None, step: int) -> dict[str, float]:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        msg = f"metrics must be a mapping name -> number, got {type(metrics).__name__}"
        raise DataError(msg)
    checked = {}
    for name, value in metrics.items():
        problem = check_name(name, "metric")
        if problem:
            raise InvalidNameError(problem)
        try:
            checked[name] = float(value)
        except (TypeError, ValueError):
            msg = f"metric {name!r} at step {step} must be a number, got {value!r}"
            raise DataError(msg) from None
    return checked


class Writer:
    """A checkpoint store opened for writing.

    Create one with :func:`ckpt.create` or ``ckpt.open(path, mode="a")``.
    Use it as a context manager, or call :meth:`close` when done. One writer
    at a time holds a local store (an advisory ``flock``, released by the
    kernel if the process dies). :meth:`reader` gives a :class:`Store` view of
    what has been committed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        storage_options: dict[str, Any] | None = None,
        reject_nonfinite: bool = False,
        compressor: str | None = None,
        _history: dict[str, Any] | None = None,
        _building: bool = False,
    ) -> None:
        self._where = str(path)
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
            self._commit()
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
        self._steps_cache = self._read_steps(CHECKPOINTS, self._count)
        self._metric_steps_cache = self._read_steps(METRICS, self._metric_count)
        self._metric_columns: dict[str, list[Any]] | None = None
        if self._attrs[ROOT_ATTR].get(METRIC_DIGESTS) is not None:  # v2: kept in memory to digest at each commit
            self._metric_columns = {
                name: np.asarray(sync(array.getitem(slice(0, self._metric_count)))).tolist()
                for name, array in self._metric_arrays.items()
            }
            self._check_metric_digests()
        digests = self._attrs[ROOT_ATTR].get(DIGESTS)
        if digests is not None and sorted(int(k) for k in digests) != self._steps_cache:
            msg = (
                f"the step array of {self._where} does not match its commit record (a chunk of checkpoints/step "
                "is missing or damaged); appending would build on wrong steps: restore the store from a copy"
            )
            raise CorruptChunkError(msg)

    def _find_whole_chunks(self) -> None:
        """Note the checkpoint arrays whose chunks :meth:`_write_rows` writes to their files itself."""
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

    def _check_metric_digests(self) -> None:
        recorded = self._attrs[ROOT_ATTR][METRIC_DIGESTS]
        assert self._metric_columns is not None
        for name, values in self._metric_columns.items():
            if name in recorded and column_digest(name, values) != recorded[name]:
                msg = (
                    f"metrics {name!r} of {self._where} do not match the commit record (a chunk is missing or "
                    "damaged); appending would build on them: restore the store from a copy"
                )
                raise CorruptChunkError(msg)

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
        step = _check_step(step)
        last = self.last_step
        if last is not None and step <= last:
            kind = "is already committed" if step in self._steps_cache else "comes before the last committed step"
            msg = f"checkpoint step {step} {kind}; steps must strictly increase (last committed step: {last})"
            raise StepOrderError(msg)
        checked_metrics = _check_metrics(metrics, step)
        if checked_metrics:
            self._check_metric_step(step)
        arrays = self._convert(step, _as_tensor_mapping(tensors))
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
            self._create_tensor_arrays(arrays)
        else:
            self._check_schema(step, arrays)
        index = self._count
        self._ensure_capacity(CHECKPOINTS, index + 1)
        values = {name: array for name, (array, _) in arrays.items()}
        values[STEP] = np.asarray(step, dtype=np.int64)
        self._write_rows(self._ckpt_arrays, index, values)
        digests = self._attrs[ROOT_ATTR].get(DIGESTS)
        if digests is not None:  # v2: the commit record binds every tensor of the checkpoint to its step
            digests[str(step)] = [tensor_digest(values[name]) for name in self._tensor_order()]
        self._count = index + 1
        self._steps_cache.append(step)
        for name in self._ckpt_arrays:
            self._nodes[f"{CHECKPOINTS}/{name}"]["shape"][0] = self._count
        if checked_metrics:
            self._stage_metrics(step, checked_metrics)
        self._commit()

    def _convert(self, step: int, tensors: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, str]]:
        if not tensors:
            msg = f"checkpoint at step {step} has no tensors"
            raise SchemaMismatchError(msg)
        converted = {}
        for name, value in tensors.items():
            problem = check_name(name, "tensor")
            if problem:
                raise InvalidNameError(f"{problem} (step {step})")
            try:
                converted[name] = to_numpy(value)
            except UnsupportedTensorError as exc:
                raise UnsupportedTensorError(f"tensor {name!r} at step {step}: {exc}") from None
        return converted

    def _check_schema(self, step: int, arrays: Mapping[str, tuple[np.ndarray, str]]) -> None:
        expected = {n: a for n, a in self._ckpt_arrays.items() if n != STEP}
        missing = [n for n in expected if n not in arrays]
        extra = [n for n in arrays if n not in expected]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing tensor(s) {', '.join(map(repr, missing[:5]))}")
            if extra:
                parts.append(f"unexpected tensor(s) {', '.join(map(repr, extra[:5]))}")
            msg = (
                f"checkpoint at step {step} has {' and '.join(parts)}; every checkpoint must hold the same "
                f"{len(expected)} tensors as the first one"
            )
            raise SchemaMismatchError(msg)
        for name, (array, logical) in arrays.items():
            node = self._nodes[f"{CHECKPOINTS}/{name}"]
            shape = tuple(node["shape"][1:])
            want = node["attributes"][ROOT_ATTR]["dtype"]
            if array.shape != shape:
                msg = (
                    f"tensor {name!r} at step {step} has shape {array.shape}; "
                    f"expected {shape} as in the first checkpoint"
                )
                raise SchemaMismatchError(msg)
            if logical != want:
                msg = f"tensor {name!r} at step {step} has dtype {logical}; expected {want} as in the first checkpoint"
                raise SchemaMismatchError(msg)

    def _create_tensor_arrays(self, arrays: Mapping[str, tuple[np.ndarray, str]]) -> None:
        capacity = max(INITIAL_CAPACITY, 2 * self._count)

        async def create_all() -> list[zarr.AsyncArray]:
            # Made in memory, then every zarr.json put in one batch: create_array on the store itself
            # also checks and writes each array's parent groups, which made the first write several times
            # slower (docs/performance.md, "Checkpoint I/O"; bench/store.py, "1st write").
            scratch = zarr.storage.MemoryStore()
            made = await asyncio.gather(
                *(
                    zarr.api.asynchronous.create_array(
                        scratch,
                        name=f"{CHECKPOINTS}/{name}",
                        shape=(capacity, *array.shape),
                        chunks=(1, *array.shape),
                        # "." keeps every chunk of a tensor in one folder (c.<row>.0.0): creating
                        # a folder per step was a large share of a checkpoint write (bench/store.py)
                        chunk_key_encoding={"name": "default", "separator": "."},
                        dtype=array.dtype,
                        fill_value=0,
                        compressors=self._compressors,
                        dimension_names=(STEP, *(f"{name}.{k}" for k in range(array.ndim))),
                        attributes={ROOT_ATTR: {"dtype": logical}},
                        config={"write_empty_chunks": True},
                        zarr_format=3,
                    )
                    for name, (array, logical) in arrays.items()
                )
            )
            paths = [f"{CHECKPOINTS}/{name}" for name in arrays]
            documents = [array.metadata.to_buffer_dict(default_buffer_prototype())[_zarr.ROOT_KEY] for array in made]
            await asyncio.gather(
                *(self._zstore.set(f"{path}/{_zarr.ROOT_KEY}", doc) for path, doc in zip(paths, documents, strict=True))
            )
            return [
                zarr.AsyncArray(metadata=array.metadata, store_path=StorePath(self._zstore, path), config=array.config)
                for path, array in zip(paths, made, strict=True)
            ]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            created = [_zarr.fast_io(array) for array in sync(create_all())]
        for name, array in zip(arrays, created, strict=True):
            node = _zarr.node_json(array)
            node["shape"][0] = self._count
            self._nodes[f"{CHECKPOINTS}/{name}"] = node
            self._ckpt_arrays[name] = array
        self._find_whole_chunks()
        # the tensor order of the first checkpoint (a state_dict's order) is part of the schema
        group = _zarr.empty_group_json({ROOT_ATTR: {"tensors": list(arrays)}})
        _zarr.write_json(
            self._zstore,
            f"{CHECKPOINTS}/{_zarr.ROOT_KEY}",
            {k: v for k, v in group.items() if k != "consolidated_metadata"},
        )
        self._nodes[CHECKPOINTS] = group

    def _ensure_capacity(self, group: str, rows: int) -> None:
        arrays = self._ckpt_arrays if group == CHECKPOINTS else self._metric_arrays
        short = [a for a in arrays.values() if a.shape[0] < rows]
        if not short:
            return
        # grow by doubling: one metadata write per array every so often, not every step
        target = max(rows, 2 * (rows - 1), INITIAL_CAPACITY)

        async def grow() -> None:
            await asyncio.gather(*(a.resize((target, *a.shape[1:])) for a in short))

        sync(grow())

    def _write_rows(self, arrays: Mapping[str, zarr.AsyncArray], index: int, values: Mapping[str, Any]) -> None:
        """Write row ``index`` of every array: checkpoint chunks straight to their files where they can be.

        The chunk files are written on the writer's threads while zarr writes the rest
        (the ``step`` array) in this one. Why threads: creating a file is most of a chunk's
        cost and varies with the file system journal's load (other processes deleting or
        syncing files); threads overlap slow creates and cost nothing when creates are fast
        (docs/performance.md, "Checkpoint I/O"; bench/store.py, "write bf16" and "write fp32").
        """
        direct = [name for name in values if name in self._whole_chunks and arrays is self._ckpt_arrays]
        pending: dict[str, Future[bool]] = {}
        if direct:
            if self._chunk_writers is None:
                self._chunk_writers = ThreadPoolExecutor(4, thread_name_prefix="ckpt-chunk-writer")
            submit, chunks = self._chunk_writers.submit, self._whole_chunks
            pending = {name: submit(chunks[name].write, index, np.asarray(values[name])) for name in direct}

        def write_with_zarr(rows: Mapping[str, Any]) -> None:
            async def write_all() -> None:
                await asyncio.gather(*(arrays[name].setitem(index, value) for name, value in rows.items()))

            if rows:
                sync(write_all())

        write_with_zarr({name: value for name, value in values.items() if name not in pending})
        # arrays not in their stored layout (WholeChunks.write returned False) go through zarr
        write_with_zarr({name: values[name] for name, future in pending.items() if not future.result()})

    # -- metrics ---------------------------------------------------------------------------
    def _check_metric_step(self, step: int) -> None:
        if self._metric_steps_cache and step <= self._metric_steps_cache[-1]:
            msg = (
                f"metrics step {step} is not after the last logged metrics step "
                f"{self._metric_steps_cache[-1]}; log each step once, in increasing order"
            )
            raise StepOrderError(msg)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log scalar metrics at ``step`` without a checkpoint (steps strictly increase)."""
        self._check_open()
        step = _check_step(step)
        checked = _check_metrics(metrics, step)
        if not checked:
            return
        self._check_metric_step(step)
        self._stage_metrics(step, checked)
        self._commit()

    def _stage_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        index = self._metric_count
        for name in metrics:
            if name not in self._metric_arrays:
                self._create_metric_array(name)
        self._ensure_capacity(METRICS, index + 1)
        row: dict[str, Any] = {name: np.float64(metrics.get(name, np.nan)) for name in self._metric_arrays}
        row[STEP] = np.int64(step)
        self._write_rows(self._metric_arrays, index, row)
        if self._metric_columns is not None:  # v2: bind the metric columns, as they will be committed
            for name, value in row.items():
                self._metric_columns.setdefault(name, [float("nan")] * index).append(value.item())
            self._attrs[ROOT_ATTR][METRIC_DIGESTS] = {
                name: column_digest(name, values) for name, values in self._metric_columns.items()
            }
        self._metric_count = index + 1
        self._metric_steps_cache.append(step)
        for name in self._metric_arrays:
            self._nodes[f"{METRICS}/{name}"]["shape"][0] = self._metric_count

    def _create_metric_array(self, name: str) -> None:
        key = f"{METRICS}/{name}"
        created = zarr.create_array(
            self._zstore,
            name=key,
            shape=(max(INITIAL_CAPACITY, 2 * self._metric_count),),
            chunks=(STEP_CHUNK,),
            dtype="float64",
            fill_value=float("nan"),
            compressors=[Crc32cCodec()],
            dimension_names=(STEP,),
            config={"write_empty_chunks": True},
            overwrite=True,
            zarr_format=3,
        )
        node = _zarr.node_json(created)
        node["shape"][0] = self._metric_count
        self._nodes[key] = node
        # rows logged before this metric existed read as NaN, the fill value
        self._metric_arrays[name] = created._async_array

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
        self._check_open()
        problem = check_name(split, "split")
        if problem:
            raise InvalidNameError(problem)
        base = f"{DATA}/{split}"
        if base in self._nodes and not overwrite:
            msg = f"data split {split!r} already exists in {self._where}; pass overwrite=True to replace it"
            raise DataError(msg)
        variables = check_data(split, inputs, targets, mask, labels or {}, text)
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
        if overwrite and base in self._nodes:
            local = _zarr.local_path(self._where)
            if local is not None:
                self._replace_split(local, split, variables, group_attrs)
                return
            # an object store cannot swap folders: the old split leaves the record before the new one is written
            for key in [k for k in self._nodes if k == base or k.startswith(base + "/")]:
                del self._nodes[key]
            self._commit()
            sync(self._zstore.delete_dir(base))
        self._nodes.update(self._write_split(self._zstore, split, variables, group_attrs))
        self._commit()

    def _write_split(
        self, zstore: Any, split: str, variables: Mapping[str, Any], group_attrs: dict[str, Any]
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
                    f"was not added to {self._where}: this is a bug of ckpt, please report it with the arrays' dtypes"
                )
                raise DataError(msg)
        return nodes

    def _replace_split(
        self, local: Path, split: str, variables: Mapping[str, Any], group_attrs: dict[str, Any]
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
            store_wide = store_lock(self._where, exclusive=True)
        except StoreLockedError:
            msg = (
                f"an analysis is being computed or removed in {self._where} by another process; data split "
                f"{split!r} cannot be replaced until that finishes: wait for it (or stop it), then run again"
            )
            raise StoreLockedError(msg) from None
        real = local.resolve()  # the user's path may be a link to the store: the store is swapped, not the link
        staged = staging_path(real)
        try:
            link_clone(real, staged, leave_out=(base, LOCKS), where=self._where)
            zstore = open_zarr_store(str(staged), read_only=False)
            nodes = {k: v for k, v in self._nodes.items() if k != base and not k.startswith(base + "/")}
            nodes.update(self._write_split(zstore, split, variables, group_attrs))
            _zarr.commit(
                zstore, str(staged), attributes=self._attrs, nodes=nodes, owns=lambda p: not _zarr.is_analysis_node(p)
            )
            writer_lock = _zarr.DirectoryLock(staged, CHECKPOINTS)
            writer_lock.acquire(blocking=False)  # nobody else knows the clone
            try:
                publish(staged, real, replace=True)
            except BaseException:
                writer_lock.release()
                raise
            self._lock.release()  # the old store's, now gone
            self._lock, self._nodes = writer_lock, nodes
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # left only when something failed before the swap
            store_wide.release()

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
        """Record the final shapes in every array's own metadata, commit, release the lock."""
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
            self._commit()
        finally:
            self._closed = True
            self._lock.release()
            if self._chunk_writers is not None:
                self._chunk_writers.shutdown()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    config: Mapping[str, Any] | None = None,
    objective: str | None = None,
    framework: str | None = None,
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    reject_nonfinite: bool = False,
    compressor: str | None = None,
    storage_options: dict[str, Any] | None = None,
    parent: Parent | None = None,
    _incomplete: str | None = None,
) -> Writer:
    """Create a new checkpoint store and return its :class:`Writer`.

    Parameters
    ----------
    path
        Local directory (``"run.zarr"``) or fsspec URL (``"memory://run.zarr"``, ``"s3://..."``).
    model
        Model factory as ``"package.module:function"``; analyzers rebuild the model with it.
    config
        JSON-serialisable keyword arguments of the factory.
    objective
        Name of the per-datapoint loss (``"cross-entropy"``, ``"token-cross-entropy"``).
    framework
        Framework that trains the run (``"torch"``, ``"jax"``, ...), informative.
    attrs
        Free-form JSON metadata of the run (seed, hyper-parameters ...).
    overwrite
        Replace whatever is at ``path``.
    reject_nonfinite
        Make :meth:`Writer.write` refuse tensors with NaN/inf.
    compressor
        ``None`` (checksums only, fastest) or ``"zstd"``.
    storage_options
        Passed to fsspec for URLs.
    parent
        The run whose checkpoint initialised this one (:class:`ckpt.store.lineage.Parent`),
        recorded as ``attrs["ckpt"]["parent"]`` (docs/store-format.md §2.1).

    Raises
    ------
    StoreExistsError
        When ``path`` exists and ``overwrite`` is false.

    """
    if model is not None and (not isinstance(model, str) or not FACTORY_RE.fullmatch(model)):
        msg = f"model must be an importable factory 'package.module:function', got {model!r}"
        raise InvalidNameError(msg)
    try:
        config_json = json.loads(json.dumps(dict(config or {}), allow_nan=False))
        attrs_json = json.loads(json.dumps(dict(attrs or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        msg = f"config and attrs must be JSON-serialisable: {exc}"
        raise DataError(msg) from None
    where = str(path)
    local = _zarr.local_path(where)
    exists = occupied(where, local, storage_options)
    if exists and not overwrite:
        msg = (
            f"{where} already exists; append to it with ckpt.open({where!r}, mode='a'), "
            "choose another path, or pass overwrite=True to replace it"
        )
        raise StoreExistsError(msg)
    if local is not None and not local.parent.exists():
        msg = f"cannot create {where}: the folder {local.parent} does not exist"
        raise StoreNotFoundError(msg)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "framework": framework,
        "model": None if model is None else {"factory": model, "config": config_json},
        "objective": objective,
        "created": utc_now(),
        "attrs": attrs_json,
        "history": [],
        DIGESTS: {},
        METRIC_DIGESTS: {},
    }
    if parent is not None:
        problem = parent_problem(parent.to_json())
        if problem is not None:  # never write what readers refuse
            field, found, expected = problem
            raise DataError(f"cannot record the parent run: {field} is {found!r}, expected {expected}")
        meta[PARENT] = parent.to_json()
    if _incomplete:  # an import marks what it builds until its last commit (Writer.mark_complete)
        meta[INCOMPLETE] = _incomplete
    if local is None:  # object stores have no rename (docs/store-format.md §4.3.1)
        if exists:  # built aside, so the old store stays until the new one is complete
            lock_replaceable(where, None, storage_options).release()
            staged_url = staging_url(where)
            try:
                _write_skeleton(
                    _zarr.open_zarr_store(staged_url, read_only=False, storage_options=storage_options), meta
                )
                publish_url(staged_url, where, storage_options)
            finally:
                remove_store(staged_url, storage_options)
        else:  # the root record is written last: no store until the skeleton is complete
            _write_skeleton(_zarr.open_zarr_store(where, read_only=False, storage_options=storage_options), meta)
    else:
        old_lock = lock_replaceable(where, local, storage_options) if exists else None
        staged = staging_path(local)
        try:
            _write_skeleton(_zarr.open_zarr_store(staged, read_only=False), meta)
            publish(staged, local, replace=exists)
        finally:
            if old_lock is not None:
                old_lock.release()
            shutil.rmtree(staged, ignore_errors=True)  # left only when something failed before publishing
    return Writer(
        where,
        storage_options=storage_options,
        reject_nonfinite=reject_nonfinite,
        compressor=compressor,
        _history=history_entry("create") | ({} if parent is None else {"init_from": str(parent)}),
        _building=bool(_incomplete),
    )


def _read_back_digest(group: zarr.Group, variables: Mapping[str, tuple[np.ndarray, tuple[str, ...]]]) -> str:
    """The content hash of a split's arrays as written to ``group``, read as the reader reads them."""
    stored = {}
    for name, (_, dims) in variables.items():
        values = np.asarray(_zarr.array_at(group, name)[...])
        stored[name] = (values.astype(object) if values.dtype.kind in "OTU" else values, dims)
    return data_digest(stored)


def _write_skeleton(zstore: Any, meta: dict[str, Any]) -> None:
    """The groups and empty ``step`` arrays of a new store, then its root record (written last)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The root zarr.json is written once, last: an object store (built in place) holds no root,
        # so no store, until the skeleton is complete. zarr writes the parents' zarr.json of every
        # node it creates, so the documents are made in memory and put here by hand.
        nodes: dict[str, dict[str, Any]] = {name: _zarr.empty_group_json() for name in TOP_LEVEL_GROUPS}
        for group in (CHECKPOINTS, METRICS):
            step = zarr.create_array(
                zarr.storage.MemoryStore(),
                name=STEP,
                shape=(0,),
                chunks=(STEP_CHUNK,),
                dtype="int64",
                fill_value=STEP_FILL_VALUE,
                compressors=[Crc32cCodec()],
                dimension_names=(STEP,),
                config={"write_empty_chunks": True},
            )
            nodes[f"{group}/{STEP}"] = _zarr.node_json(step)
        for path, document in nodes.items():
            # on disk as zarr writes a group: no (empty) consolidated metadata, which listings would trust
            on_disk = {k: v for k, v in document.items() if k != "consolidated_metadata"}
            _zarr.write_json(zstore, f"{path}/{_zarr.ROOT_KEY}", on_disk)
    _zarr.write_json(zstore, _zarr.ROOT_KEY, _zarr.root_document({ROOT_ATTR: meta}, nodes))


__all__ = ["Writer", "create"]
