"""Read access to a checkpoint store: :class:`Store`.

A Store shows the committed state of a run (see :mod:`ckpt.store._zarr` for the
commit record). It never sees a checkpoint that is still being written, and
:meth:`Store.refresh` picks up checkpoints committed since it was opened.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from zarr.core.sync import sync

from ckpt.errors import (
    CorruptChunkError,
    InvalidArgumentError,
    MissingDataError,
    SplitNotFoundError,
    StepNotFoundError,
    StoreError,
    StoreNotFoundError,
    TensorNotFoundError,
)
from ckpt.runtime import collection_paused
from ckpt.store import _zarr, accessor  # noqa: F401 (registers ds.ckpt)
from ckpt.store.arrays import decode_numpy, decode_torch, tensor_digest
from ckpt.store.chunks import CHUNK_DIGESTS, verified
from ckpt.store.data import data_digest
from ckpt.store.format import (
    ANALYSES,
    CHECKPOINTS,
    DATA,
    DIGESTS,
    LABELS,
    METRIC_DIGESTS,
    METRICS,
    PARENT,
    ROOT_ATTR,
    STEP,
    current_factory,
)
from ckpt.store.lineage import Parent, read_parent
from ckpt.store.model_build import build_model, check_model, model_on_meta
from ckpt.store.record import check_claimed_bytes, is_compressed, row_bound, validate_meta
from ckpt.store.selection import TensorSelection
from ckpt.store.trust import check_trusted, trust_reason


@dataclass(frozen=True)
class ModelSpec:
    """How to rebuild the model of a run: an importable factory and its JSON config."""

    factory: str
    """``"package.module:function"``; called as ``function(**config)``."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the factory (JSON-serialisable)."""
    source: str = field(default="", compare=False)
    """The store the spec was read from (named in errors)."""
    checkpoint: Mapping[str, tuple[Any, ...]] | None = field(default=None, compare=False, repr=False)
    """Tensor name -> (shape, bytes) of one of the store's checkpoints: the model built must fit it.

    :attr:`Store.model` sets it (with each tensor's logical dtype, a third entry); None (a spec made to
    train a model) checks the config's schema only.
    """
    selection: TensorSelection | None = field(default=None, compare=False, repr=False)
    """The store's tensor selection (``ckpt import --tensors``): ``checkpoint`` is that subset of the model's."""

    def build(self) -> Any:
        """Import the factory and call it with the config; returns the model.

        The factory must be trusted (:mod:`ckpt.store.trust`): it is checked
        before its module is imported, since importing runs code. A factory
        named by an older ckpt is imported under its current name
        (:data:`ckpt.store.format.RENAMED_FACTORIES`). The config is data: it is
        checked against the factory's schema (:mod:`ckpt.store.factory_config`)
        and, for a spec read from a store, the model is built on torch's ``meta``
        device first and compared with the stored tensors, its own buffers bounded
        by the stored bytes, before anything is allocated (:mod:`ckpt.store.model_build`).

        Raises
        ------
        UntrustedFactoryError
            The factory is neither ckpt's, nor an installed plugin package's, nor allowed by the user.
        StoreError
            The factory cannot be imported.
        ModelConfigError
            The config does not fit the factory or the checkpoints, or the factory failed.
        """
        check_trusted(self.factory, self.source or "the model spec")
        with collection_paused():  # imports its library (transformers: seconds); see ckpt.runtime
            factory = self._import()
            name, where = current_factory(self.factory), self.source or "the model spec"
            return build_model(factory, self.config, name, where, self.checkpoint, self.selection)

    def check(self) -> bool:
        """Check the spec as :meth:`build` does, allocating nothing: whether it could be checked.

        The factory's schema, then the model built on ``meta`` and compared with the stored
        tensors (``ckpt verify`` uses this). False when the factory is not trusted (its code is
        never imported to check it), or when its code cannot run on ``meta``.

        Raises
        ------
        StoreError
            A trusted factory that cannot be imported.
        ModelConfigError
            The config does not fit the factory or the checkpoints, or the factory failed.
        """
        if trust_reason(self.factory) is None or self.checkpoint is None:
            return False
        with collection_paused():
            factory = self._import()
            name, where = current_factory(self.factory), self.source or "the model spec"
            return check_model(factory, self.config, name, where, self.checkpoint, self.selection)

    def on_meta(self) -> Any:
        """The model as :meth:`check` builds it on ``meta``: modules, names, shapes and dtypes, no values.

        For looking the model's structure up without allocating it, on a store imported with
        ``--tensors`` too (only its stored tensors are compared). None when the spec records no
        checkpoint or its factory's code cannot run on ``meta``.

        Raises
        ------
        UntrustedFactoryError, StoreError, ModelConfigError
            As :meth:`build`.
        """
        check_trusted(self.factory, self.source or "the model spec")
        if self.checkpoint is None:
            return None
        with collection_paused():
            factory = self._import()
            name, where = current_factory(self.factory), self.source or "the model spec"
            return model_on_meta(factory, self.config, name, where, self.checkpoint, self.selection)

    def _import(self) -> Callable[..., Any]:
        module_name, _, attr = current_factory(self.factory).partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            msg = f"cannot import the model factory {self.factory!r} ({exc}); install the package that defines it"
            top = module_name.split(".")[0]
            here = Path.cwd()
            missing = isinstance(exc, ModuleNotFoundError) and exc.name == top
            if missing and ((here / f"{top}.py").is_file() or (here / top).is_dir()):
                # the ckpt command does not put the current folder on Python's path, as `python -c` would
                msg += f" (pip install -e .), or put this folder on Python's path: PYTHONPATH={here}"
            raise StoreError(msg) from exc


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one tensor of the checkpoint schema."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """Logical dtype name (``bfloat16`` even though the bits are stored as uint16)."""
    nbytes: int
    """Bytes of one checkpoint of this tensor."""


def _logical_dtype(node: dict[str, Any]) -> str:
    return node.get("attributes", {}).get(ROOT_ATTR, {}).get("dtype") or str(node["data_type"])


class _ChunkSource:
    """Array-like handed to ``dask.array.from_array``: reads a region, names what was corrupt."""

    def __init__(
        self,
        array: zarr.Array,
        name: str,
        steps: np.ndarray,
        verify: Callable[..., None],
        check_rows: Callable[..., None],
    ) -> None:
        self.array = array
        self.name = name
        self.steps = steps
        self.verify = verify
        self.check_rows = check_rows
        self.shape = array.shape
        self.dtype = array.dtype
        self.ndim = array.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        step_key = key[0] if isinstance(key, tuple) else key
        steps = self.steps[step_key]
        where = f"tensor {self.name!r} at step {np.atleast_1d(steps).tolist()}"
        self.check_rows([self.name], np.atleast_1d(np.arange(len(self.steps))[step_key]).tolist())
        with _zarr.translated_read_errors(where):
            values = np.asarray(self.array[key])
        rest = key[1:] if isinstance(key, tuple) else ()
        whole = all(
            isinstance(k, slice) and k.indices(n) == (0, n, 1) for k, n in zip(rest, self.shape[1:], strict=False)
        )
        if whole and len(rest) == len(self.shape) - 1:  # dask reads whole tensors (one chunk per step)
            for row, step in zip(values.reshape(-1, *self.shape[1:]), np.atleast_1d(steps), strict=True):
                self.verify(self.name, int(step), row)
        return values


def nonfinite_counts(values: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """Tensor name -> (NaN count, inf count) for the floating-point tensors holding any (decoded values)."""
    found = {}
    for name, value in values.items():
        array = np.asarray(value)
        if array.dtype.kind not in "fc" and "float" not in str(array.dtype):  # bf16/float8 are ml_dtypes
            continue
        finite = np.isfinite(array)
        if not finite.all():
            nan = int(np.isnan(array).sum())
            found[name] = (nan, int(finite.size - finite.sum()) - nan)
    return found


def describe_nonfinite(step: int, counts: dict[str, tuple[int, int]]) -> str:
    """``tensor 'w' at step 3 (2 NaN, 1 inf)``, one per tensor, joined."""
    return "; ".join(f"tensor {n!r} at step {step} ({nan} NaN, {inf} inf)" for n, (nan, inf) in counts.items())


def _span(steps: list[int]) -> str:
    return f"{len(steps)} steps ({steps[0]}..{steps[-1]})" if steps else "no steps"


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
            dtype = _logical_dtype(node)
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
                f"{_span(self._steps.tolist())} where {_span(sorted(self._digests))} were committed (a chunk of "
                "checkpoints/step is missing or damaged); rewrite it from the record with `ckpt repair`"
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
                _ChunkSource(array, name, self._steps, self._verify, self._check_rows),
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
        prefix = f"{METRICS}/"
        names = [k[len(prefix) :] for k in self._nodes if k.startswith(prefix) and k != f"{METRICS}/{STEP}"]
        step_path = f"{METRICS}/{STEP}"
        steps = self._read_whole(step_path, "metrics") if step_path in self._nodes else np.zeros(0, np.int64)
        variables = {n: (STEP, self._read_whole(f"{prefix}{n}", f"metrics {n!r}")) for n in names}
        damaged = self._damaged_metrics({STEP: steps, **{n: v for n, (_, v) in variables.items()}})
        if damaged:
            msg = (
                f"metrics {damaged[0]!r} of {self._where} do not match the commit record (a chunk is missing "
                "and read as fill values, or was changed); drop them with `ckpt repair` or restore the store "
                "from a copy"
            )
            raise CorruptChunkError(msg)
        return xr.Dataset(variables, coords={STEP: steps})

    def _damaged_metrics(self, columns: dict[str, np.ndarray] | None = None) -> list[str]:
        """The metrics columns (``step`` included) that do not match their digests (v2; a v1 store has none)."""
        recorded = self._attrs.get(ROOT_ATTR, {}).get(METRIC_DIGESTS)
        if not recorded:
            return []
        if columns is None:
            names = [k.split("/", 1)[1] for k in self._nodes if k.startswith(f"{METRICS}/")]
            columns = {n: self._read_whole(f"{METRICS}/{n}", f"metrics {n!r}") for n in names}
        return [n for n, values in columns.items() if n in recorded and tensor_digest(values) != recorded[n]]

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
        if split not in self.splits:
            msg = f"no data split {split!r} in {self._where}; splits are: {', '.join(self.splits) or '(none)'}"
            raise SplitNotFoundError(msg)
        variables, stored, labels = self._split_arrays(split)
        group_attrs = self._nodes[f"{DATA}/{split}"].get("attributes", {}).get(ROOT_ATTR, {})
        expected = group_attrs.get("sha256")
        if expected is not None and data_digest(stored) != expected:
            # zarr reads a missing chunk as its fill value: a split is checked whole against its hash
            msg = (
                f"data split {split!r} of {self._where} does not match the content hash recorded when it was "
                "written (a chunk is missing, was replaced, or was changed); restore the store from a copy or "
                f"write the split again (Writer.add_data({split!r}, ..., overwrite=True))"
            )
            raise CorruptChunkError(msg)
        attrs = {"split": split, "labels": sorted(labels), **group_attrs}
        return xr.Dataset(variables, attrs=attrs)

    def _split_arrays(self, split: str) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, tuple[str, ...]]], list]:
        """A split's arrays, unchecked: (variables by name, arrays by stored path with dims, label names)."""
        base = f"{DATA}/{split}"
        variables: dict[str, Any] = {}
        stored: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {}
        labels = []
        for key, node in self._nodes.items():
            if not key.startswith(base + "/") or node.get("node_type") != "array":
                continue
            rel = key[len(base) + 1 :]
            name = rel.removeprefix(f"{LABELS}/")
            if name != rel:
                labels.append(name)
            values = self._read_whole(key, f"data split {split!r} array {rel!r}")
            if values.dtype.kind in "OTU":  # text: compared as the list of strings it was written as
                values = values.astype(object)
            dims = tuple(node["dimension_names"])
            variables[name] = (dims, values)
            stored[rel] = (values, dims)
        return variables, stored, labels

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
        """A stored analysis result as a lazy :class:`xarray.Dataset` (no analyzer code imported).

        Raises
        ------
        StoreError
            No result of that name is committed.
        MissingDataError
            It is committed but its files are gone (deleted by hand): reading it would
            give fill values, so it is refused; ``ckpt rm`` or a rerun with ``--force`` repairs it.
        """
        if name not in self.analyses:
            msg = f"no analysis {name!r} in {self._where}; stored analyses: {', '.join(self.analyses) or '(none)'}"
            raise StoreError(msg)
        prefix = f"{ANALYSES}/{name}"
        nodes = [k for k in self._nodes if k == prefix or k.startswith(f"{prefix}/")]
        gone = [k for k in nodes if not sync(self._zstore.exists(f"{k}/zarr.json"))]
        if gone:
            msg = (
                f"analysis {name!r} of {self._where} is committed but {gone[0]} is gone from the store "
                f"({len(gone)} of its {len(nodes)} parts missing; deleted by hand?); "
                f"remove it with `ckpt rm {self._where} {name}` or recompute it with `ckpt analyze {name} --force`"
            )
            raise MissingDataError(msg)
        describe = f"analysis {name!r} of {self._where}"
        remedy = f"recompute it with `ckpt analyze {name} {self._where} --force` or drop it with `ckpt repair`"
        for key in nodes:  # index coordinates are read whole when the result is opened: bound them first
            node = self._nodes[key]
            if node.get("node_type") == "array" and list(node.get("dimension_names") or []) == [key.rsplit("/")[-1]]:
                check_claimed_bytes(node, _zarr.prefix_bytes(self._zstore, key), f"{describe}, {key}", self._where)
        try:
            with _zarr.translated_read_errors(describe, remedy):  # index coordinates are read now
                opened = xr.open_zarr(self._zstore, group=prefix, consolidated=True, chunks=None)
        except KeyError as exc:  # xarray: metadata it needs to name dimensions is not there
            msg = f"{describe} cannot be opened ({exc.args[0] if exc.args else exc}); {remedy}"
            raise CorruptChunkError(msg) from None
        return verified(opened, self._nodes, prefix, describe, remedy)

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
        meta = self._attrs.get(ROOT_ATTR, {})
        metric_digests = meta.get(METRIC_DIGESTS) or {}
        columns = [k.split("/", 1)[1] for k, n in self._nodes.items() if k.startswith(f"{METRICS}/") and n["shape"][0]]
        results = 0
        for name in self.analyses:
            prefix = f"{ANALYSES}/{name}/"
            arrays = [n for k, n in self._nodes.items() if k.startswith(prefix) and n.get("node_type") == "array"]
            results += any(CHUNK_DIGESTS not in (n.get("attributes") or {}) for n in arrays)
        return {
            "checkpoints": len(self._steps) if self._digests is None else 0,
            "metrics": sum(c not in metric_digests for c in columns) if METRICS in self._nodes else 0,
            "splits": sum(not self.split_hash(s) or self.split_hash(s) == "None" for s in self.splits),
            "results": results,
        }

    def unverifiable_summary(self) -> str | None:
        """One sentence saying what of the store cannot be checked, or None when everything can."""
        counts = {kind: n for kind, n in self.unverifiable.items() if n}
        if not counts:
            return None
        names = {"checkpoints": "checkpoint(s)", "metrics": "metric column(s)", "splits": "data split(s)"}
        listed = ", ".join(f"{n} {names.get(kind, 'result(s)')}" for kind, n in counts.items())
        version = f"format v{self.format_version}"
        return (
            f"{self._where} cannot be verified: {listed} have no digest in its commit record ({version}), so "
            f"a missing, swapped or changed chunk there reads as data; `ckpt upgrade {self._where}` adds digests "
            "(trusting the store as it is now)"
        )

    # -- summary ---------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """A JSON-able summary: metadata, steps, tensors, data splits and analyses."""
        steps = self._steps
        return {
            "path": self._where,
            "format_version": self.format_version,
            "framework": self.framework,
            "model": None
            if self.model is None
            else {
                "factory": self.model.factory,
                "current": current_factory(self.model.factory),
                "config": self.model.config,
                "trusted": trust_reason(self.model.factory),
            },
            "objective": self.objective,
            "unverifiable": self.unverifiable_summary(),
            "created": self.created,
            "checkpoints": {
                "count": len(steps),
                "first": int(steps[0]) if len(steps) else None,
                "last": int(steps[-1]) if len(steps) else None,
            },
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes}
                for t in self._schema.values()
            ],
            "parameters": int(sum(int(np.prod(t.shape, dtype=np.int64)) for t in self._schema.values())),
            "bytes_per_checkpoint": int(sum(t.nbytes for t in self._schema.values())),
            "metrics": [
                k.split("/", 1)[1] for k in self._nodes if k.startswith(f"{METRICS}/") and k != f"{METRICS}/{STEP}"
            ],
            "splits": {s: self._split_summary(s) for s in self.splits},
            "analyses": self.analyses,
            "analyzers": {name: self.analyzer_of(name) for name in self.analyses},
            "parent": None if self.parent is None else self.parent.to_json(),
            "history": self.history,
        }

    def analyzer_of(self, name: str) -> str:
        """The analyzer that computed result ``name``, from the commit record (no result is opened).

        Its provenance's ``analyzer``; the name itself when unrecorded. Differs from ``name`` for
        results kept under another name (``ckpt analyze ... --as NAME``).
        """
        attrs = self._nodes.get(f"{ANALYSES}/{name}", {}).get("attributes", {}).get(ROOT_ATTR, {})
        return str(attrs.get("analyzer") or name) if isinstance(attrs, dict) else name

    def _split_summary(self, split: str) -> dict[str, Any]:
        attrs = self._nodes[f"{DATA}/{split}"].get("attributes", {}).get(ROOT_ATTR, {})
        return {
            "examples": attrs.get("examples"),
            "datapoints": attrs.get("datapoints"),
            "labels": attrs.get("labels", []),
        }

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
