"""Read access to a checkpoint store: :class:`Store`.

A Store shows the committed state of a run (see :mod:`ckpt.store._zarr` for the
commit record). It never sees a checkpoint that is still being written, and
:meth:`Store.refresh` picks up checkpoints committed since it was opened. What it reads besides
checkpoints is read by :mod:`~ckpt.store.reader_data`, :mod:`~ckpt.store.reader_results` and
:mod:`~ckpt.store.reader_summary`; :class:`ModelSpec` and :class:`TensorInfo` are re-exported here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xarray as xr
import zarr
from zarr.core.sync import sync

from ckpt.errors import (
    CorruptChunkError,
    InvalidArgumentError,
    SplitNotFoundError,
    StepNotFoundError,
    StoreError,
    StoreNotFoundError,
    TensorNotFoundError,
)
from ckpt.store import _zarr, accessor  # noqa: F401 (registers ds.ckpt)
from ckpt.store.arrays import decode_numpy, decode_torch, tensor_digest
from ckpt.store.chunk_source import (
    ChunkSource,
    TensorInfo,
    describe_nonfinite,
    logical_dtype,
    nonfinite_counts,
    steps_span,
)
from ckpt.store.format import (
    ANALYSES,
    CHECKPOINTS,
    DATA,
    DIGESTS,
    FINISHED,
    PARENT,
    ROOT_ATTR,
    STEP,
)
from ckpt.store.lineage import Parent, read_parent
from ckpt.store.model_spec import ModelSpec
from ckpt.store.reader_data import read_metrics, read_split
from ckpt.store.reader_results import open_result, recorded_provenance, result_analyzer
from ckpt.store.reader_summary import store_info, unverifiable_counts, unverifiable_sentence
from ckpt.store.record import check_claimed_bytes, is_compressed, row_bound, validate_meta
from ckpt.store.selection import TensorSelection


def open_zarr_store(where: str, *, read_only: bool, storage_options: dict[str, Any] | None = None) -> Any:
    """Open the zarr store at ``where``, saying clearly when a local path does not exist."""
    local = _zarr.local_path(where)
    if local is not None and not local.exists():
        msg = f"no store at {where}: the path does not exist"
        raise StoreNotFoundError(msg)
    return _zarr.open_zarr_store(where, read_only=read_only, storage_options=storage_options)


def check_format(attrs: dict[str, Any], where: str) -> None:
    """Raise unless ``attrs`` are the root attributes of a store in a format we read, every field well-typed."""
    validate_meta(attrs, where)


INCOMPLETE = "incomplete"
"""Root attribute set while an import builds a store in place (object stores), cleared by its last commit."""


def check_complete(attrs: dict[str, Any], where: str) -> None:
    """Raise StoreError for a store an import was building in place when it stopped (docs/store-format.md §4.3.1)."""
    what = attrs.get(ROOT_ATTR, {}).get(INCOMPLETE)
    if what:
        msg = (
            f"{where} holds an interrupted {what}: it stopped before its last checkpoint and is not a complete "
            "run; run the same `ckpt import` again (it replaces an interrupted import without --overwrite)"
        )
        raise StoreError(msg)


class Store:
    """A checkpoint store opened for reading.

    Use :func:`ckpt.open`; attributes reflect the state committed when
    the store was opened or last refreshed.

    Examples
    --------
    >>> s = ckpt.open("run.zarr")                 # doctest: +SKIP
    >>> s.steps, s.tensors(s.steps[-1])["fc.weight"].shape  # doctest: +SKIP

    """

    def __init__(self, path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> None:
        self._where = str(path)
        self._storage_options = storage_options
        self._zstore = open_zarr_store(self._where, read_only=True, storage_options=storage_options)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the commit record, making newly committed checkpoints visible."""
        root = _zarr.open_root_group(self._zstore, self._where)  # the record is validated first
        consolidated = root.metadata.consolidated_metadata
        self._root = root
        self._attrs: dict[str, Any] = dict(root.attrs.asdict())  # JSON from the store: check_format vets it
        check_format(self._attrs, self._where)
        check_complete(self._attrs, self._where)
        flattened = consolidated.flattened_metadata if consolidated else {}
        self._nodes: dict[str, dict[str, Any]] = {key: node.to_dict() for key, node in flattened.items()}
        self._load_index()
        self._whole_chunks: dict[str, _zarr.WholeChunks] = {}  # what Store.tensors reads without zarr
        for name in self._schema:
            metadata = flattened.get(f"{CHECKPOINTS}/{name}")  # none without consolidated metadata: zarr reads
            chunks = _zarr.WholeChunks.of(self._zstore, f"{CHECKPOINTS}/{name}", metadata)
            if chunks is not None:
                self._whole_chunks[name] = chunks

    def _load_index(self) -> None:
        self._arrays: dict[str, zarr.Array] = {}
        step_path = f"{CHECKPOINTS}/{STEP}"
        steps: np.ndarray | list[int] = (
            self._read_whole(step_path, "the checkpoints' step array") if step_path in self._nodes else []
        )
        self._steps = np.asarray(steps, dtype=np.int64)
        self._step_index = {int(s): i for i, s in enumerate(self._steps)}
        prefix = f"{CHECKPOINTS}/"
        schema = {}
        for key, node in self._nodes.items():
            if not key.startswith(prefix) or node.get("node_type") != "array":
                continue
            name = key[len(prefix) :]
            if name == STEP or "/" in name:
                continue
            shape = tuple(int(n) for n in node["shape"][1:])
            dtype = logical_dtype(node)
            itemsize = 2 if dtype == "bfloat16" else 1 if dtype.startswith("float8") else np.dtype(dtype).itemsize
            schema[name] = TensorInfo(name, shape, dtype, int(np.prod(shape, dtype=np.int64)) * itemsize)
        order = self._nodes.get(CHECKPOINTS, {}).get("attributes", {}).get(ROOT_ATTR, {}).get("tensors", [])
        self._schema = {name: schema[name] for name in order if name in schema}
        self._schema.update({name: info for name, info in schema.items() if name not in self._schema})
        self._digest_index = {name: i for i, name in enumerate(order)}
        recorded = self._attrs.get(ROOT_ATTR, {}).get(DIGESTS)
        self._digests = None if recorded is None else {int(k): v for k, v in recorded.items()}
        if self._digests is not None and sorted(self._digests) != self._steps.tolist():
            # the record names every committed step; the `step` array must agree (plain xarray reads it)
            msg = (
                f"the step array of {self._where} does not match its commit record: it reads "
                f"{steps_span(self._steps.tolist())} where {steps_span(sorted(self._digests))} were committed (a "
                "chunk of checkpoints/step is missing or damaged); rewrite it from the record with `ckpt repair`"
            )
            raise CorruptChunkError(msg)

    def _read_whole(self, path: str, what: str) -> np.ndarray:
        """A committed array read whole, once its claimed size is bounded by the bytes it has stored."""
        check_claimed_bytes(self._nodes[path], _zarr.prefix_bytes(self._zstore, path), what, self._where)
        with _zarr.translated_read_errors(what):
            return np.asarray(_zarr.array_at(self._root, path, self._where)[...])

    def _check_rows(self, names: Iterable[str], indices: Iterable[int]) -> None:
        """Raise CorruptChunkError unless each row's chunks hold the bytes its shape needs (before any read).

        The shape in the record sets what a read allocates; a row is read only when the bytes
        on disk can hold it (:func:`ckpt.store.record.row_bound`), so an edited shape can never
        make ckpt allocate memory the store does not back, and a missing chunk is never read as zeros.
        """
        for name in names:
            path = f"{CHECKPOINTS}/{name}"
            node = self._nodes[path]
            array = self._array(name)
            grid = [-(-n // c) for n, c in zip(node["shape"][1:], array.chunks[1:], strict=True)]
            for index in indices:
                keys = [array.metadata.encode_chunk_key((index, *position)) for position in np.ndindex(*grid)]
                sizes = [_zarr.stored_bytes(self._zstore, f"{path}/{key}") for key in keys]
                known = [size for size in sizes if size is not None]
                problem = row_bound(node, sum(known) if len(known) == len(sizes) else None)
                if problem is not None:
                    msg = (
                        f"tensor {name!r} at step {int(self._steps[index])} of {self._where} cannot be read: "
                        f"{problem} (a chunk file is missing, truncated, not a regular file, or its shape in "
                        "the commit record was changed); restore the store from a copy, or re-import the checkpoint"
                    )
                    raise CorruptChunkError(msg)

    def _verify(self, name: str, step: int, stored: np.ndarray) -> None:
        """Raise CorruptChunkError unless ``stored`` (one tensor of one step, as stored) has its recorded digest."""
        if self._digests is None:  # a v1 store: written before digests existed
            return
        expected = self._digests[int(step)][self._digest_index[name]]
        if tensor_digest(stored) != expected:
            msg = (
                f"tensor {name!r} at step {step} of {self._where} is not the tensor written there: its digest "
                "does not match the commit record (its chunk is missing and read as fill values, was copied from "
                "another step or tensor, or was changed); restore the store from a copy, or re-import the checkpoint"
            )
            raise CorruptChunkError(msg)

    # -- metadata --------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The path or URL the store was opened from."""
        return self._where

    @property
    def metadata(self) -> dict[str, Any]:
        """The run metadata (``attrs["ckpt"]`` of the root group), as a dict."""
        return dict(self._attrs[ROOT_ATTR])

    @property
    def finished(self) -> bool | None:
        """Whether the run is finished, from the commit record (validated when read).

        True once its writer closed it; False while a writer has it open, or was killed before
        closing; None for a store written before ckpt recorded it (unknown: treat it as open).
        """
        mark = self.metadata.get(FINISHED)
        return None if mark is None else bool(mark)

    @property
    def format_version(self) -> int:
        """Store format version (1)."""
        return int(self.metadata["format_version"])

    @property
    def framework(self) -> str | None:
        """Training framework that wrote the run (``"torch"``, ``"jax"``, ...), if given."""
        return self.metadata.get("framework")

    @property
    def model(self) -> ModelSpec | None:
        """The model spec (factory + config), or None when the run did not record one."""
        spec = self.metadata.get("model")
        if spec is None:
            return None
        checkpoint = {name: (info.shape, info.nbytes, info.dtype) for name, info in self._schema.items()}
        return ModelSpec(
            spec["factory"],
            dict(spec.get("config") or {}),
            source=str(self._where),
            checkpoint=checkpoint,
            selection=TensorSelection.of_store(self.attrs, str(self._where)),
        )

    @property
    def objective(self) -> str | None:
        """Name of the per-datapoint loss the run was trained with, if given."""
        return self.metadata.get("objective")

    @property
    def created(self) -> str:
        """ISO 8601 UTC time the store was created."""
        return str(self.metadata.get("created"))

    @property
    def history(self) -> list[dict[str, Any]]:
        """What was done to the store, oldest first (create, append, import, repair ...)."""
        return list(self.metadata.get("history", []))

    @property
    def parent(self) -> Parent | None:
        """The run this one was initialised from (``ckpt train --init-from``), or None.

        Checked with the rest of the record when the store is opened;
        :func:`ckpt.store.lineage.parent_status` says whether the parent is still reachable
        and still holds the checkpoint recorded here.
        """
        return read_parent(self.metadata.get(PARENT))  # validated with the record (validate_meta)

    @property
    def attrs(self) -> dict[str, Any]:
        """Free-form user metadata given at creation (``attrs=`` of :func:`ckpt.create`)."""
        return dict(self.metadata.get("attrs") or {})

    # -- checkpoints -----------------------------------------------------------------------
    @property
    def steps(self) -> np.ndarray:
        """Committed checkpoint steps, increasing (int64 array)."""
        return self._steps.copy()

    @property
    def schema(self) -> dict[str, TensorInfo]:
        """Every tensor of a checkpoint: name -> :class:`TensorInfo`."""
        return dict(self._schema)

    @property
    def tensor_names(self) -> list[str]:
        """Tensor names in stored order."""
        return list(self._schema)

    def __len__(self) -> int:
        return len(self._steps)

    def __contains__(self, step: object) -> bool:
        """Whether ``step`` is a committed checkpoint (``1000 in store``)."""
        try:
            # any object: int() takes what it can (1000, np.int64, "1000") and refuses the rest, caught below
            return int(step) in self._step_index  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False

    def __repr__(self) -> str:
        span = f"steps {self._steps[0]}..{self._steps[-1]}" if len(self._steps) else "no checkpoints"
        return (
            f"<ckptstore.Store {self._where!r}: {len(self._steps)} checkpoints ({span}), {len(self._schema)} tensors>"
        )

    def _index_of(self, step: int) -> int:
        try:
            return self._step_index[int(step)]
        except (KeyError, TypeError, ValueError):
            if len(self._steps):
                have = f"it has {len(self._steps)} checkpoints, steps {self._steps[0]}..{self._steps[-1]}"
            else:
                have = "it has no checkpoints yet"
            msg = f"step {step!r} is not a committed checkpoint of {self._where}; {have}"
            raise StepNotFoundError(msg) from None

    def _check_names(self, names: Iterable[str] | None) -> list[str]:
        if names is None:
            return list(self._schema)
        names = [names] if isinstance(names, str) else list(names)
        unknown = [n for n in names if n not in self._schema]
        if unknown:
            msg = f"no tensor named {unknown[0]!r} in {self._where}; tensors are: {', '.join(self._schema)}"
            raise TensorNotFoundError(msg)
        return names

    def _array(self, name: str) -> zarr.Array:
        # opened once per refresh: opening costs a round trip to zarr's event loop
        # thread, as much as reading the tensor (bench/store.py)
        array = self._arrays.get(name)
        if array is None:
            array = _zarr.array_at(self._root, f"{CHECKPOINTS}/{name}", self._where)
            # zarrs decodes zstd in Rust, to whatever size a frame says: a compressed array is read by
            # zarr's own pipeline, whose zstd codec is bounded by the chunk's shape (ckpt.store.codecs)
            if not is_compressed(self._nodes[f"{CHECKPOINTS}/{name}"]):
                array = _zarr.fast_io(array)
            self._arrays[name] = array
        return array

    def tensors(
        self,
        step: int,
        names: Iterable[str] | None = None,
        *,
        framework: str = "numpy",
        device: Any = None,
    ) -> dict[str, Any]:
        """Load the tensors of one checkpoint.

        Parameters
        ----------
        step
            A committed step (see :attr:`steps`).
        names
            Tensors to load; all by default.
        framework
            ``"numpy"`` (bfloat16/float8 as ml_dtypes arrays) or ``"torch"``.
        device
            Torch device to put the tensors on; implies ``framework="torch"``.

        Returns
        -------
        dict
            Tensor name -> array, in schema order. From a local store, the arrays of one
            call are views of one block of memory (read at once, see
            :func:`ckpt.store._zarr.read_rows`): one kept while the others are dropped keeps
            the whole block alive; ``.copy()`` (numpy) or ``.clone()`` (torch) it to keep it alone.

        """
        names = self._check_names(names)
        if device is not None:
            framework = "torch"
        if framework not in ("numpy", "torch"):
            msg = f"framework must be 'numpy' or 'torch', got {framework!r}"
            raise InvalidArgumentError(msg)
        values = self.stored_tensors(step, names)
        if framework == "torch":
            return {n: decode_torch(v, self._schema[n].dtype, device) for n, v in values.items()}
        return {n: decode_numpy(v, self._schema[n].dtype) for n, v in values.items()}

    def stored_tensors(self, step: int, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """The tensors of one checkpoint as stored (bfloat16 as its uint16 bits), checked against their digests."""
        index = self._index_of(step)
        names = self._check_names(names)
        values = dict.fromkeys(names) | _zarr.read_rows(
            {name: self._whole_chunks[name] for name in names if name in self._whole_chunks}, index
        )
        rest = [name for name, value in values.items() if value is None]
        if rest:  # remote stores, other codecs, or a chunk that failed its checks: zarr reads and names it
            self._check_rows(rest, [index])
            values.update(zip(rest, self._read_rows(rest, index, step), strict=True))
        for name, value in values.items():
            self._verify(name, step, value)
        return values

    def _read_rows(self, names: list[str], index: int, step: int) -> list[np.ndarray]:
        """Row ``index`` of the arrays of ``names``, read by zarr in one event-loop call."""
        arrays = [self._array(n)._async_array for n in names]

        async def read_all() -> list[Any]:
            return list(await asyncio.gather(*(a.getitem(index) for a in arrays)))

        values: list[Any] | None
        with _zarr.translated_read_errors(f"a tensor of step {step} ({len(names)} tensors read)"):
            try:
                values = sync(read_all())
            except (ValueError, RuntimeError, OSError):
                values = None
        if values is None:  # find and name the corrupt tensor
            values = []
            for name, array in zip(names, arrays, strict=True):
                with _zarr.translated_read_errors(f"tensor {name!r} at step {step}"):
                    values.append(sync(array.getitem(index)))
        return [np.asarray(v) for v in values]

    def checkpoint_digest(self, step: int) -> str | None:
        """One digest of checkpoint ``step``'s tensors, from the commit record (None in a format-v1 store).

        Two stores, or one store at two times, hold the same weights at ``step`` when the
        digests agree: what a resumed computation checks before it takes earlier pieces.
        """
        index = self._index_of(int(step))
        if self._digests is None:
            return None
        recorded = self._digests.get(int(self._steps[index]))
        return hashlib.sha256(json.dumps(recorded).encode()).hexdigest()

    def nonfinite(self, step: int) -> dict[str, tuple[int, int]]:
        """The tensors of checkpoint ``step`` holding NaN or inf: name -> (NaN count, inf count)."""
        return nonfinite_counts(self.tensors(step))

    def read_tensor(self, name: str, steps: Sequence[int] | None = None) -> np.ndarray:
        """One tensor across checkpoints, stacked on a leading step axis (all steps by default)."""
        (name,) = self._check_names([name])
        array = self._array(name)
        rows = range(len(self._steps)) if steps is None else [self._index_of(s) for s in steps]
        self._check_rows([name], rows)
        where = f"tensor {name!r} (steps {'all' if steps is None else list(steps)})"
        with _zarr.translated_read_errors(where):
            selected = array[:] if steps is None else array.get_orthogonal_selection(np.asarray(rows, dtype=np.int64))
            values = np.asarray(selected)
        for row, step in zip(values, self._steps if steps is None else steps, strict=True):
            self._verify(name, int(step), row)
        return decode_numpy(values, self._schema[name].dtype)

    @property
    def checkpoints(self) -> xr.Dataset:
        """All checkpoints as a lazy, dask-backed :class:`xarray.Dataset` on dim ``step``.

        One dask chunk per (tensor, step); nothing is read until computed. A
        corrupt chunk raises :class:`~ckpt.errors.CorruptChunkError`
        naming the tensor and step.
        """
        import dask.array as da

        variables = {}
        for name, info in self._schema.items():
            array = self._array(name)
            dims = tuple(self._nodes[f"{CHECKPOINTS}/{name}"].get("dimension_names") or ()) or (
                STEP,
                *(f"{name}.{k}" for k in range(len(info.shape))),
            )
            data = da.from_array(
                ChunkSource(array, name, self._steps, self._verify, self._check_rows),
                chunks=(1, *info.shape),
                name=f"ckpt-{self._where}-{name}-{len(self._steps)}",
                asarray=False,
                fancy=False,
            )
            if info.dtype != str(array.dtype):
                data = data.map_blocks(
                    decode_numpy, info.dtype, dtype=decode_numpy(np.zeros(0, array.dtype), info.dtype).dtype
                )
            variables[name] = (dims, data, {"dtype": info.dtype})
        return xr.Dataset(variables, coords={STEP: (STEP, self._steps)}, attrs={"store": self._where})

    # -- metrics, data, analyses -------------------------------------------------------------
    @property
    def metrics(self) -> xr.Dataset:
        """Scalars logged by training (loss, lr, ...) on their own ``step`` coordinate."""
        return read_metrics(self)

    @property
    def splits(self) -> list[str]:
        """Names of the committed data splits."""
        prefix = f"{DATA}/"
        return sorted(
            k[len(prefix) :]
            for k, node in self._nodes.items()
            if k.startswith(prefix) and "/" not in k[len(prefix) :] and node.get("node_type") == "group"
        )

    def split_hash(self, split: str) -> str:
        """The SHA-256 content hash of a data split (``attrs["ckpt"]["sha256"]`` of its group)."""
        if split not in self.splits:
            msg = f"no data split {split!r} in {self._where}; splits are: {', '.join(self.splits) or '(none)'}"
            raise SplitNotFoundError(msg)
        return str(self._nodes[f"{DATA}/{split}"].get("attributes", {}).get(ROOT_ATTR, {}).get("sha256"))

    def data(self, split: str) -> xr.Dataset:
        """The evaluation data of ``split``: ``inputs``, ``targets``, ``mask``, ``text`` and labels.

        Labels appear as variables named after the label (``ds["carry"]``) and
        are listed in ``ds.attrs["labels"]``. The split's content hash is
        ``ds.attrs["sha256"]``.
        """
        return read_split(self, split)

    @property
    def analyses(self) -> list[str]:
        """Names of the analyses stored in ``analyses/``."""
        prefix = f"{ANALYSES}/"
        return sorted(
            k[len(prefix) :]
            for k, node in self._nodes.items()
            if k.startswith(prefix) and "/" not in k[len(prefix) :] and node.get("node_type") == "group"
        )

    def analysis(self, name: str) -> xr.Dataset:
        """A stored result as a lazy :class:`xarray.Dataset` reading the version it opened (§1.5.1 of the format).

        Raises
        ------
        StoreError
            No result of that name is committed.
        MissingDataError
            It is committed but its files are gone (deleted by hand): reading it would
            give fill values, so it is refused; ``ckpt rm`` or a rerun with ``--force`` repairs it.
        """
        return open_result(self, name)

    # -- what cannot be checked ----------------------------------------------------------------
    @property
    def unverifiable(self) -> dict[str, int]:
        """How many pieces of the store have no digest to check them against, by kind.

        ``checkpoints`` (every one of a store without ``digests``: format v1), ``metrics``
        (columns without a metric digest), ``splits`` (data splits without their sha256) and
        ``results`` (analyses whose arrays record no chunk digests: written by ckpt 0.1). All
        zeros for a store every piece of which can be verified. ``ckpt upgrade`` adds what is
        missing, trusting the bytes as they are (docs/store-format.md §4.5.1).
        """
        return unverifiable_counts(self)

    def unverifiable_summary(self) -> str | None:
        """One sentence saying what of the store cannot be checked, or None when everything can."""
        return unverifiable_sentence(self)

    def info(self) -> dict[str, Any]:
        """A JSON-able summary: metadata, steps, tensors, data splits and analyses."""
        return store_info(self)

    def analyzer_of(self, name: str) -> str:
        """The analyzer that computed result ``name``, from the commit record (no result is opened).

        Its provenance's ``analyzer``; the name itself when unrecorded. Differs from ``name`` for
        results kept under another name (``ckpt analyze ... --as NAME``).
        """
        return result_analyzer(self, name)

    def recorded_provenance(self, name: str) -> dict[str, Any]:
        """Result ``name``'s provenance as the commit record holds it, unchecked (no result is opened).

        A cheap version of a result (its ``steps`` and ``created`` change with each commit of it);
        ``{}`` when unrecorded. :meth:`analysis` checks it and returns the values.
        """
        return recorded_provenance(self, name)

    def close(self) -> None:
        """Release the store (a no-op for readers; writers release their lock)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "INCOMPLETE",
    "ModelSpec",
    "Store",
    "TensorInfo",
    "check_complete",
    "check_format",
    "describe_nonfinite",
    "nonfinite_counts",
    "open_zarr_store",
]
