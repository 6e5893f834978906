"""The layout of a basis result, in one place: its one writer, its one validator and its readers.

A *basis* result (``hessian-basis``, ``random-basis`` or a plugin's, stored under
``analyses/<name>`` and read by POLCA, Fisher and their plugins through ``--basis``) holds
K directions in parameter space:

- one variable per trainable tensor, named like it (the names of
  :func:`ckpt.numerics.params.parameter_space`), of dims :func:`basis_dims`:
  :data:`BASIS_DIM` then the checkpoint array's own dims (``NAME.0``, ``NAME.1`` ...),
  shaped ``[K, *shape]``, floating-point; the rows should be orthonormal in the flat
  ``[D]`` space (the reader does not check it: that would read every vector);
- a coordinate :data:`FOUND_AT` along :data:`BASIS_DIM`: the integer checkpoint step each
  vector was found at;
- optionally an index coordinate :data:`BASIS_DIM` and per-vector variables along it
  (``hessian-basis``'s eigenvalues, residuals and products).

:func:`basis_dataset` writes that layout, :func:`basis_problem` and :func:`check_basis`
validate it, and :func:`stored_basis`, :func:`load_basis`, :func:`held_basis` and
:func:`load_basis_rows` read a stored one on a worker (all of it, cached, or some rows).
Nothing else spells the layout: the analyzers import these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.errors import AnalysisError
from ckpt.numerics.params import ParamSpace, torch_dtype
from ckpt.store.arrays import read_here

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

BASIS_DIM = "basis"
"""The dim along which a basis result holds its vectors."""

FOUND_AT = "found_at_step"
"""The coordinate along :data:`BASIS_DIM`: the checkpoint step where each vector was found."""


def basis_dims(name: str, ndim: int) -> tuple[str, ...]:
    """Dims of a basis variable: ``basis`` and the checkpoint tensor's own dims (``NAME.0`` ...).

    Examples
    --------
    >>> basis_dims("0.weight", 2)
    ('basis', '0.weight.0', '0.weight.1')
    """
    return (BASIS_DIM, *(f"{name}.{axis}" for axis in range(ndim)))


def basis_dataset(
    space: ParamSpace,
    tensors: Mapping[str, Any],
    found_at: Sequence[int] | np.ndarray,
    *,
    first: int = 0,
    columns: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """The basis layout: ``tensors`` as one variable per tensor of ``space``, along ``basis``.

    Parameters
    ----------
    space
        The trainable tensors the vectors live in.
    tensors
        ``{name: [K, *shape]}`` (numpy or dask) for every name of ``space``.
    found_at
        ``[K]``: the step each vector was found at.
    first
        The index of the first vector in the whole basis (a piece of one: ``hessian-basis``'s journal).
    columns
        Per-vector variables ``{name: [K]}`` beside the vectors.

    Raises
    ------
    AnalysisError
        When the arrays do not have the layout (:func:`basis_problem`): a tensor of ``space``
        missing or misshapen, ``found_at`` or a column not of length K.
    """
    import xarray as xr

    missing = [name for name in space.names if name not in tensors]
    if missing:
        msg = f"a basis needs one array per parameter tensor; missing {missing[:3]}"
        raise AnalysisError(msg)
    steps = np.asarray(found_at, np.int64)
    count = len(steps)
    variables: dict[str, Any] = {
        name: (basis_dims(name, len(shape)), tensors[name])
        for name, shape in zip(space.names, space.shapes, strict=True)
    }
    for name, values in (columns or {}).items():
        variables[name] = (BASIS_DIM, values)
    try:
        result = xr.Dataset(
            variables, coords={BASIS_DIM: np.arange(first, first + count), FOUND_AT: (BASIS_DIM, steps)}
        )
    except ValueError as exc:  # xarray: conflicting sizes along basis
        msg = f"a basis needs {count} vectors in every array (one per found_at step): {exc}"
        raise AnalysisError(msg) from None
    problem = basis_problem(result, space, count=count)
    if problem is not None:
        msg = f"not a basis: {problem}"
        raise AnalysisError(msg)
    return result


def basis_problem(
    result: Any, space: ParamSpace, *, count: int | None = None, found_at: Sequence[int] | None = None
) -> str | None:
    """What keeps ``result`` from being a basis of ``space``, or None when it is one.

    Checks the layout of the module docstring from the metadata only (nothing is read but
    the :data:`FOUND_AT` coordinate when ``found_at`` is given): the ``basis`` dim with at
    least one vector (``count`` of them when given), every tensor of ``space`` present with
    :func:`basis_dims` and ``[K, *shape]`` and a floating-point dtype, and an integer
    :data:`FOUND_AT` along ``basis`` (equal to ``found_at`` when given).
    """
    if BASIS_DIM not in result.dims:
        return f"it has no {BASIS_DIM!r} dim"
    size = int(result.sizes[BASIS_DIM])
    if size < 1:
        return "it holds no vector"
    if count is not None and size != count:
        return f"it holds {size} vectors where {count} were expected"
    missing = [tensor for tensor in space.names if tensor not in result.data_vars]
    if missing:
        return f"it needs one variable per parameter tensor; missing {missing[:3]}" + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
    for tensor, shape in zip(space.names, space.shapes, strict=True):
        variable = result[tensor]
        dims = basis_dims(tensor, len(shape))
        if tuple(variable.dims) != dims:
            return f"{tensor} has dims {tuple(variable.dims)}, a basis variable has {dims}"
        if tuple(variable.shape[1:]) != shape:
            return f"{tensor} has vectors of shape {tuple(variable.shape[1:])}, the parameter has {shape}"
        if not np.issubdtype(variable.dtype, np.floating):
            return f"{tensor} holds {variable.dtype}, not floating-point vectors"
    if FOUND_AT not in result.coords:
        return f"it has no {FOUND_AT!r} coordinate (the step each vector was found at)"
    steps = result[FOUND_AT]
    if tuple(steps.dims) != (BASIS_DIM,) or not np.issubdtype(steps.dtype, np.integer):
        return f"its {FOUND_AT!r} coordinate must be integer steps along {BASIS_DIM!r}, not {steps.dtype} {steps.dims}"
    if found_at is not None and np.asarray(steps.values).tolist() != [int(s) for s in found_at]:
        return f"its vectors were found at other steps than {list(found_at)[:4]}"
    return None


def check_basis(result: Any, space: ParamSpace, name: str) -> int:
    """Validate a stored basis result against the parameters (:func:`basis_problem`); return K.

    Raises
    ------
    AnalysisError
        Naming what is wrong, when ``result`` does not have the basis layout.
    """
    problem = basis_problem(result, space)
    if problem is not None:
        msg = (
            f"analysis {name!r} is not a basis of this store's parameters: {problem}; "
            "recompute it, or pass --basis an analyzer whose result has the basis layout (docs/plugins.md)"
        )
        raise AnalysisError(msg)
    return int(result.sizes[BASIS_DIM])


def stored_basis(worker: Any, name: str, created: str) -> Any:
    """The stored basis result ``name`` (lazy), the one created at ``created`` (re-read when it was recomputed).

    Opened once per worker: opening a result reads its commit record and index coordinates, which
    per call made a small POLCA run markedly slower (docs/performance.md, "POLCA passes").
    """

    def opened() -> Any:
        result = worker.analysis(name)
        if result.ckpt.created != created:
            worker.store.refresh()
            result = worker.store.analysis(name)
        return result

    return worker.cached(("stored-basis", name, created), opened)


def load_basis(worker: Any, name: str, created: str, space: ParamSpace, dtype: str = "float32") -> dict[str, Any]:
    """A stored basis result as ``{tensor: [K, *shape]}`` torch tensors on the worker's device.

    Cached per worker for (name, created): a recomputed basis is read again.
    """
    import torch

    precision = torch_dtype(dtype)

    def read() -> dict[str, Any]:
        result = stored_basis(worker, name, created)
        return {
            tensor: torch.from_numpy(read_here(result[tensor])).to(device=worker.device, dtype=precision)
            for tensor in space.names
        }

    return worker.cached(_basis_key(name, created, dtype), read)


def held_basis(worker: Any, name: str, created: str, dtype: str = "float32") -> dict[str, Any] | None:
    """The basis :func:`load_basis` holds on this worker, or None where it holds none (nothing is read)."""
    return worker.held(_basis_key(name, created, dtype))


def _basis_key(name: str, created: str, dtype: str) -> tuple[str, ...]:
    """The worker cache's key of a whole basis (:func:`load_basis`, :func:`held_basis`)."""
    return ("basis", name, created, dtype)


def load_basis_rows(
    worker: Any, name: str, created: str, space: ParamSpace, rows: slice, dtype: str = "float32", tensors: Any = None
) -> dict[str, Any]:
    """Rows ``rows`` of a stored basis result as ``{tensor: [rows, *shape]}`` torch tensors, read now (not cached).

    For a basis too large to hold whole beside the passes that use it (:func:`load_basis` holds it
    for the worker's life): only the stored chunks holding these rows are read, each checked
    against its digest. ``tensors``: read only these tensors (default: every tensor of ``space``).
    """
    import torch

    precision = torch_dtype(dtype)
    result = stored_basis(worker, name, created)
    return {
        tensor: torch.from_numpy(read_here(basis_rows(result[tensor], rows))).to(device=worker.device, dtype=precision)
        for tensor in (space.names if tensors is None else tensors)
    }


def basis_rows(result: Any, rows: slice) -> Any:
    """Vectors ``rows`` of a basis result or of one of its variables (lazy: nothing is read)."""
    return result.isel({BASIS_DIM: rows})


__all__ = [
    "BASIS_DIM",
    "FOUND_AT",
    "basis_dataset",
    "basis_dims",
    "basis_problem",
    "basis_rows",
    "check_basis",
    "held_basis",
    "load_basis",
    "load_basis_rows",
    "stored_basis",
]
