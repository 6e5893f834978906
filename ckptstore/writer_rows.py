"""The rows of a store's checkpoint and metric arrays: their layout, growth and writes (:class:`Writer`'s).

Checkpoint arrays hold one chunk per tensor per step, allocated ahead and grown by doubling;
metric arrays hold :data:`STEP_CHUNK` rows per chunk, rewritten at each commit. Functions of the
:class:`~ckpt.store.writer.Writer` they write for.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import StorePath

from ckpt.errors import (
    CorruptChunkError,
    DataError,
    InvalidNameError,
    SchemaMismatchError,
    StepOrderError,
    UnsupportedTensorError,
)
from ckpt.store import _zarr
from ckpt.store.arrays import column_digest, to_numpy
from ckpt.store.format import CHECKPOINTS, METRIC_DIGESTS, METRICS, ROOT_ATTR, STEP, check_name

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.writer import Writer

STEP_CHUNK = 4096
"""Rows per chunk of ``step`` and metric arrays (rewritten, atomically, at each commit)."""
INITIAL_CAPACITY = 16
"""Rows allocated in checkpoint arrays before the first growth (grown by doubling)."""


def check_step(step: Any) -> int:
    """``step`` as an int, or :class:`~ckpt.errors.StepOrderError` when it cannot be a step."""
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


def check_metrics(metrics: Mapping[str, Any] | None, step: int) -> dict[str, float]:
    """``metrics`` as floats by name, or :class:`~ckpt.errors.DataError` naming the one that is not a number."""
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


def check_metric_digests(writer: Writer) -> None:
    """Raise unless the metric columns read at open are those the commit record binds (format v2)."""
    recorded = writer._attrs[ROOT_ATTR][METRIC_DIGESTS]
    assert writer._metric_columns is not None
    for name, values in writer._metric_columns.items():
        if name in recorded and column_digest(name, values) != recorded[name]:
            msg = (
                f"metrics {name!r} of {writer._where} do not match the commit record (a chunk is missing or "
                "damaged); appending would build on them: restore the store from a copy"
            )
            raise CorruptChunkError(msg)


def convert_tensors(step: int, tensors: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, str]]:
    """Each tensor of the checkpoint at ``step`` as an array and its logical dtype, its name checked."""
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


def check_schema(writer: Writer, step: int, arrays: Mapping[str, tuple[np.ndarray, str]]) -> None:
    """Refuse a checkpoint whose tensors, shapes or dtypes differ from the first checkpoint's."""
    expected = {n: a for n, a in writer._ckpt_arrays.items() if n != STEP}
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
        node = writer._nodes[f"{CHECKPOINTS}/{name}"]
        shape = tuple(node["shape"][1:])
        want = node["attributes"][ROOT_ATTR]["dtype"]
        if array.shape != shape:
            msg = f"tensor {name!r} at step {step} has shape {array.shape}; expected {shape} as in the first checkpoint"
            raise SchemaMismatchError(msg)
        if logical != want:
            msg = f"tensor {name!r} at step {step} has dtype {logical}; expected {want} as in the first checkpoint"
            raise SchemaMismatchError(msg)


def create_tensor_arrays(writer: Writer, arrays: Mapping[str, tuple[np.ndarray, str]]) -> None:
    """Create the arrays of a first checkpoint's tensors, and record their order (part of the schema)."""
    capacity = max(INITIAL_CAPACITY, 2 * writer._count)

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
                    compressors=writer._compressors,
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
            *(writer._zstore.set(f"{path}/{_zarr.ROOT_KEY}", doc) for path, doc in zip(paths, documents, strict=True))
        )
        return [
            zarr.AsyncArray(metadata=array.metadata, store_path=StorePath(writer._zstore, path), config=array.config)
            for path, array in zip(paths, made, strict=True)
        ]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        created = [_zarr.fast_io(array) for array in sync(create_all())]
    for name, array in zip(arrays, created, strict=True):
        node = _zarr.node_json(array)
        node["shape"][0] = writer._count
        writer._nodes[f"{CHECKPOINTS}/{name}"] = node
        writer._ckpt_arrays[name] = array
    writer._find_whole_chunks()
    # the tensor order of the first checkpoint (a state_dict's order) is part of the schema
    group = _zarr.empty_group_json({ROOT_ATTR: {"tensors": list(arrays)}})
    _zarr.write_json(
        writer._zstore,
        f"{CHECKPOINTS}/{_zarr.ROOT_KEY}",
        {k: v for k, v in group.items() if k != "consolidated_metadata"},
    )
    writer._nodes[CHECKPOINTS] = group


def ensure_capacity(writer: Writer, group: str, rows: int) -> None:
    """Grow the arrays of ``group`` to hold ``rows`` rows, by doubling."""
    arrays = writer._ckpt_arrays if group == CHECKPOINTS else writer._metric_arrays
    short = [a for a in arrays.values() if a.shape[0] < rows]
    if not short:
        return
    # grow by doubling: one metadata write per array every so often, not every step
    target = max(rows, 2 * (rows - 1), INITIAL_CAPACITY)

    async def grow() -> None:
        await asyncio.gather(*(a.resize((target, *a.shape[1:])) for a in short))

    sync(grow())


def write_rows(writer: Writer, arrays: Mapping[str, zarr.AsyncArray], index: int, values: Mapping[str, Any]) -> None:
    """Write row ``index`` of every array: checkpoint chunks straight to their files where they can be.

    The chunk files are written on the writer's threads while zarr writes the rest
    (the ``step`` array) in this one. Why threads: creating a file is most of a chunk's
    cost and varies with the file system journal's load (other processes deleting or
    syncing files); threads overlap slow creates and cost nothing when creates are fast
    (docs/performance.md, "Checkpoint I/O"; bench/store.py, "write bf16" and "write fp32").
    """
    direct = [name for name in values if name in writer._whole_chunks and arrays is writer._ckpt_arrays]
    pending: dict[str, Future[bool]] = {}
    if direct:
        if writer._chunk_writers is None:
            writer._chunk_writers = ThreadPoolExecutor(4, thread_name_prefix="ckpt-chunk-writer")
        submit, chunks = writer._chunk_writers.submit, writer._whole_chunks
        pending = {name: submit(chunks[name].write, index, np.asarray(values[name])) for name in direct}

    def write_with_zarr(rows: Mapping[str, Any]) -> None:
        async def write_all() -> None:
            await asyncio.gather(*(arrays[name].setitem(index, value) for name, value in rows.items()))

        if rows:
            sync(write_all())

    write_with_zarr({name: value for name, value in values.items() if name not in pending})
    # arrays not in their stored layout (WholeChunks.write returned False) go through zarr
    write_with_zarr({name: values[name] for name, future in pending.items() if not future.result()})


def check_metric_step(writer: Writer, step: int) -> None:
    """Raise unless ``step`` comes after the last logged metrics step."""
    if writer._metric_steps_cache and step <= writer._metric_steps_cache[-1]:
        msg = (
            f"metrics step {step} is not after the last logged metrics step "
            f"{writer._metric_steps_cache[-1]}; log each step once, in increasing order"
        )
        raise StepOrderError(msg)


def stage_metrics(writer: Writer, step: int, metrics: Mapping[str, float]) -> None:
    """Write the metrics row of ``step`` (NaN for metrics it lacks) and bind it in the record, to be committed."""
    index = writer._metric_count
    for name in metrics:
        if name not in writer._metric_arrays:
            create_metric_array(writer, name)
    ensure_capacity(writer, METRICS, index + 1)
    row: dict[str, Any] = {name: np.float64(metrics.get(name, np.nan)) for name in writer._metric_arrays}
    row[STEP] = np.int64(step)
    write_rows(writer, writer._metric_arrays, index, row)
    if writer._metric_columns is not None:  # v2: bind the metric columns, as they will be committed
        for name, value in row.items():
            writer._metric_columns.setdefault(name, [float("nan")] * index).append(value.item())
        writer._attrs[ROOT_ATTR][METRIC_DIGESTS] = {
            name: column_digest(name, values) for name, values in writer._metric_columns.items()
        }
    writer._metric_count = index + 1
    writer._metric_steps_cache.append(step)
    for name in writer._metric_arrays:
        writer._nodes[f"{METRICS}/{name}"]["shape"][0] = writer._metric_count


def create_metric_array(writer: Writer, name: str) -> None:
    """Create the array ``metrics/<name>`` (rows logged before it existed read as NaN, its fill value)."""
    key = f"{METRICS}/{name}"
    created = zarr.create_array(
        writer._zstore,
        name=key,
        shape=(max(INITIAL_CAPACITY, 2 * writer._metric_count),),
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
    node["shape"][0] = writer._metric_count
    writer._nodes[key] = node
    # rows logged before this metric existed read as NaN, the fill value
    writer._metric_arrays[name] = created._async_array


__all__ = [
    "INITIAL_CAPACITY",
    "STEP_CHUNK",
    "check_metric_digests",
    "check_metric_step",
    "check_metrics",
    "check_step",
    "create_metric_array",
    "create_tensor_arrays",
    "ensure_capacity",
    "stage_metrics",
    "write_rows",
]
