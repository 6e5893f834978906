"""The pieces of a ``hessian-basis`` result: written to the run's journal, read back, assembled.

Each search's piece (its vectors and :data:`SEARCH_COLUMNS`) is stored in the basis layout
(:func:`search_dataset`, through :func:`ckpt.numerics.basis_format.basis_dataset`); the later
searches read the earlier vectors back (:func:`journal_basis`), a resumed run its committed
pieces (:func:`saved_eigenpairs`), and the result its tensors (:func:`journal_tensors`,
:func:`lazy_tensors` without a journal). Used by :mod:`ckpt.analyzers.hessian_basis`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.engine.resume import Journal
from ckpt.errors import AnalysisError
from ckpt.numerics.basis_format import BASIS_DIM, FOUND_AT, basis_dataset, basis_rows
from ckpt.numerics.derivatives import ParamSpace
from ckpt.numerics.vector_rows import SpilledRows
from ckpt.plugins import Worker, torch_dtype
from ckpt.store.arrays import read_here

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr


SEARCH_COLUMNS = ("eigenvalue", "residual", "matvecs")
"""What each search records per vector beside it, along ``basis``: its Ritz value, residual and products."""


def _read_journal(journal: Journal, keys: Sequence[Any], into: Mapping[str, Any], *, space: ParamSpace) -> None:
    """Fill ``into`` with the vectors of the pieces ``keys`` from the journal.

    ``into``: each tensor's ``[count, *shape]`` array, or all of them in one ``[count, D]`` array
    ``"vectors"``, or in :class:`ckpt.numerics.lanczos.SpilledRows` ``"spilled"``.

    The journal must hold exactly the pieces of ``keys``. It is read a piece at a time, so that at most one
    piece of one tensor is held beside ``into`` (a whole tensor read at once is read into chunks and then
    joined, twice its size).
    """
    import torch

    loaded = journal.load(keys)
    if loaded is None or len(loaded[1]) != len(keys):
        msg = f"the pieces of {journal.partial} changed while this run read them (another run?); rerun the command"
        raise AnalysisError(msg)
    saved = loaded[0]
    target = next(iter(into.values()))
    count = target.capacity if "spilled" in into else target.shape[0]
    if saved.sizes.get(BASIS_DIM) != count:
        msg = f"{journal.partial} holds {saved.sizes.get(BASIS_DIM)} basis vectors where {count} were committed"
        raise AnalysisError(msg)
    per_piece = count // len(keys)
    for first in range(0, count, per_piece):
        rows = basis_rows(saved, slice(first, first + per_piece))
        for name, start, length in zip(space.names, space.offsets, space.sizes, strict=True):
            values = read_here(rows[name])
            if "vectors" in into:
                into["vectors"][first : first + per_piece, start : start + length] = values.reshape(per_piece, length)
            elif "spilled" in into:
                flat = torch.from_numpy(values.reshape(per_piece, length))
                into["spilled"].write_block(per_piece, slice(start, start + length), flat, first=first)
            else:
                into[name][first : first + per_piece] = values


def journal_basis(
    journal: Journal,
    keys: Sequence[Any],
    count: int,
    *,
    space: ParamSpace,
    device: Any,
    dtype: str,
    spill: bool = False,
) -> list[Any]:
    """The ``count`` vectors of the earlier pieces (``keys``), read from the journal, as one torch ``[count, D]``.

    ``spill``: into :class:`ckpt.numerics.lanczos.SpilledRows` instead (an unlinked temporary file; the CPU only),
    which the caller closes.
    """
    import torch

    if spill:
        rows = SpilledRows(count, space.size, torch_dtype(dtype))
        try:
            _read_journal(journal, keys, {"spilled": rows}, space=space)
        except BaseException:
            rows.close()
            raise
        return [rows]
    vectors = np.empty((count, space.size), np.dtype(dtype))
    _read_journal(journal, keys, {"vectors": vectors}, space=space)
    rows = torch.from_numpy(vectors)
    return [rows if str(device) == "cpu" else rows.to(device)]


def journal_tensors(
    worker: Worker, journal: Journal, keys: Sequence[Any], pieces: Sequence[Any], *, space: ParamSpace, dtype: str
) -> dict[str, np.ndarray]:
    """The whole basis split into the space's tensors, read from the journal once every piece is in it (a task).

    ``pieces``: the values of every piece's task, so that this runs after them (their vectors are in the journal).
    """
    count = sum(len(p["eigenvalue"]) for p in pieces)
    shapes = zip(space.names, space.shapes, strict=True)
    tensors = {name: np.empty((count, *shape), np.dtype(dtype)) for name, shape in shapes}
    _read_journal(journal, keys, tensors, space=space)
    return tensors


def search_dataset(
    piece: Mapping[str, Any],
    space: ParamSpace,
    steps: Sequence[int],
    first: int = 0,
    *,
    tensors: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Vectors found by the searches in the basis layout (:func:`ckpt.numerics.basis_format.basis_dataset`).

    ``piece``'s arrays (numpy or dask) hold the vectors found at ``steps``, k per step, in
    order, and their :data:`SEARCH_COLUMNS`; ``first`` is the index of its first vector in the
    whole basis. ``tensors``: the vectors already split into the space's tensors
    (``[count, *shape]`` each), in place of ``piece["vectors"]``.
    """
    if tensors is None:
        tensors = space.unflatten(piece["vectors"])
    count = piece["eigenvalue"].shape[0]
    found_at = np.repeat(np.asarray(steps, np.int64), count // max(len(steps), 1))
    columns = {name: piece[name] for name in SEARCH_COLUMNS}
    result = basis_dataset(space, tensors, found_at, first=first, columns=columns)
    result["eigenvalue"].attrs["description"] = f"eigenvalue of P H P at {FOUND_AT} (P: complement of earlier vectors)"
    result["residual"].attrs["description"] = "||P H P v - eigenvalue v||"
    return result


def lazy_tensors(pieces: Sequence[Any], space: ParamSpace, k: int, dtype: np.dtype) -> dict[str, Any]:
    """Each tensor of the basis as dask rows, one chunk per piece, each a view of that piece's vectors.

    Why not slices of one dask array of the vectors: dask copies a slice that is at most half of its
    chunk (``dask.array.chunk.getitem``), so every piece was held twice, once for the later searches'
    deflation and once in the copies of its tensors, until the run ended: a piece's vectors more at
    every basis checkpoint. Held once, the four basis
    checkpoints of bench/scale.py's L run (``--samples 8 --tol 1e-2``, default budget) peaked lower,
    with the same products and residuals (docs/performance.md, "Hessian basis").
    """
    import dask
    import dask.array as da

    # one delayed dict of views per piece: a Delayed's item is a plain dict lookup, never a copy
    split = [dask.delayed(space.unflatten, pure=True)(p["vectors"]) for p in pieces]
    return {
        name: da.concatenate([da.from_delayed(views[name], shape=(k, *shape), dtype=dtype) for views in split])
        for name, shape in zip(space.names, space.shapes, strict=True)
    }


def saved_eigenpairs(
    worker: Worker, journal: Journal, keys: Sequence[Any], index: int, *, k: int
) -> dict[str, np.ndarray]:
    """Piece ``index`` of the basis as an interrupted run committed it to ``journal`` (on a worker).

    Its eigenvalues, residuals and products: its vectors stay in the journal, from which the later
    searches and the result read them.
    """
    loaded = journal.load(keys)
    if loaded is None or len(loaded[1]) <= index:
        msg = f"the pieces of {journal.partial} changed while this run read them (another run?); rerun the command"
        raise AnalysisError(msg)
    rows = basis_rows(loaded[0], slice(index * k, (index + 1) * k))
    return {name: read_here(rows[name]) for name in SEARCH_COLUMNS}
