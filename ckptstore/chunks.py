"""Chunk digests of analysis results: what binds a stored result to the values it was committed with.

A result's arrays are committed with the xxh3-64 digest of every chunk, as
values, in the array's node of the commit record (attribute
``ckpt_chunk_digests``, docs/store-format.md section 4). Readers check each
chunk as it is loaded, so a chunk that is missing (zarr would read its fill
value, NaN), copied from elsewhere or changed raises
:class:`~ckpt.errors.CorruptChunkError` instead of returning values.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ckpt.errors import CorruptChunkError
from ckpt.store.arrays import tensor_digest

CHUNK_DIGESTS = "ckpt_chunk_digests"

Recommitted = Callable[[str, str, tuple[slice, ...], tuple[int, ...], "str | None"], "np.ndarray | None"]
"""``(variable, chunk key, region, chunk shape, digest)`` as a Dataset opened them. When a commit since
rewrote that chunk: the values it opened, from a kept earlier version (:mod:`ckpt.store.snapshots`),
or :class:`~ckpt.errors.StaleResultError` where none holds them. When the commit record still
records that chunk as opened: None (the chunk itself is wrong: the caller's CorruptChunkError).

Called only when a chunk fails its check, so a read that matches costs nothing more."""


def block_digest(values: Any) -> str:
    """The digest of one chunk's values: xxh3-64 of its bytes, or of its strings (text, labels) as JSON."""
    values = np.asarray(values)
    if values.dtype.kind in "OTU":
        import xxhash

        document = json.dumps({"shape": list(values.shape), "values": [str(v) for v in values.ravel().tolist()]})
        return xxhash.xxh3_64_hexdigest(document.encode())
    return tensor_digest(values)


def chunk_regions(
    shape: tuple[int, ...], chunks: tuple[int, ...], *, axis: int | None = None, first: int = 0
) -> Iterator[tuple[str, tuple[slice, ...]]]:
    """Yield ``(key, region)`` for every chunk of an array; along ``axis`` only from chunk ``first`` on.

    The key is the chunk's grid index joined with dots (``"0.3"``; ``""`` for a 0-d array).
    """
    grid = [range(math.ceil(size / chunk)) for size, chunk in zip(shape, chunks, strict=True)]
    if axis is not None:
        grid[axis] = range(first, len(grid[axis]))
    for index in itertools.product(*grid):
        region = tuple(
            slice(i * chunk, min((i + 1) * chunk, size)) for i, chunk, size in zip(index, chunks, shape, strict=True)
        )
        yield ".".join(map(str, index)), region


def node_chunks(node: dict[str, Any]) -> tuple[int, ...]:
    """The chunk shape recorded in an array's metadata document."""
    return tuple(node["chunk_grid"]["configuration"]["chunk_shape"])


DIGEST_READ_BYTES = 64 * 2**20
"""Most bytes :func:`digest_variable` reads at once (unless one row of chunks alone is larger; then chunk by chunk).
Why: it read each variable whole, so committing hessian-basis's result at GPT-2 small held, beside the
basis, its largest tensor (the token embedding, 0.15 GB) once per basis vector."""


def digest_variable(
    variable: Any, node: dict[str, Any], previous: dict[str, Any] | None, appended_along: int | None
) -> dict[str, str]:
    """Digests of every chunk of ``variable`` (lazily opened by xarray, so decoded as readers see it).

    With ``previous`` (the committed node) and ``appended_along`` (the axis rows
    were appended to), only the chunks at or after the first one the append
    touched are read; the earlier digests are kept from the commit record. The
    values are read in slabs along the first axis of at most :data:`DIGEST_READ_BYTES`.
    """
    shape, chunks = tuple(node["shape"]), node_chunks(node)
    known = (previous or {}).get("attributes", {}).get(CHUNK_DIGESTS)
    if previous is None or known is None or appended_along is None:
        first, digests, axis = 0, {}, None
    else:
        axis = appended_along
        first = previous["shape"][axis] // chunks[axis]
        digests = {k: v for k, v in known.items() if int(k.split(".")[axis]) < first}
    offset = first * chunks[axis] if axis is not None else 0
    regions = list(chunk_regions(shape, chunks, axis=axis, first=first))
    if not shape:
        for key, _ in regions:
            digests[key] = block_digest(variable.values)
        return digests
    row_bytes = variable.dtype.itemsize * math.prod(shape[1:])
    for rows, group in _slabs(regions, row_bytes):
        if (rows.stop - rows.start) * row_bytes > DIGEST_READ_BYTES:  # one row of chunks: each chunk alone
            for key, region in group:
                digests[key] = block_digest(np.asarray(variable[region].values))
            continue
        start = (rows.start, *(offset if i == axis else 0 for i in range(1, len(shape))))
        selection = (rows, *(slice(offset, None) if i == axis else slice(None) for i in range(1, len(shape))))
        values = np.asarray(variable[selection].values)
        for key, region in group:
            local = tuple(slice(r.start - s, r.stop - s) for r, s in zip(region, start, strict=True))
            digests[key] = block_digest(values[local])
    return digests


def _slabs(
    regions: list[tuple[str, tuple[slice, ...]]], row_bytes: int
) -> Iterator[tuple[slice, list[tuple[str, tuple[slice, ...]]]]]:
    """The chunks' regions grouped into reads ``(rows, regions)`` along the first axis.

    Consecutive rows of chunks, together at most :data:`DIGEST_READ_BYTES` (``row_bytes``: one row
    of the array), or one row of chunks alone. A row whose chunks were trimmed along another axis
    (an append) counts in full: a bound.
    """
    rows: list[tuple[slice, list[tuple[str, tuple[slice, ...]]]]] = []
    for key, region in regions:  # the first axis varies slowest: one row of chunks after another
        if rows and rows[-1][0] == region[0]:
            rows[-1][1].append((key, region))
        else:
            rows.append((region[0], [(key, region)]))
    slab: tuple[slice, list[tuple[str, tuple[slice, ...]]]] | None = None
    for span, group in rows:
        if slab is not None and (span.stop - slab[0].start) * row_bytes <= DIGEST_READ_BYTES:
            slab = (slice(slab[0].start, span.stop), slab[1] + group)
            continue
        if slab is not None:
            yield slab
        slab = (span, group)
    if slab is not None:
        yield slab


def verified(
    dataset: Any,
    nodes: dict[str, dict[str, Any]],
    prefix: str,
    describe: str,
    remedy: str,
    recommitted: Recommitted | None = None,
) -> Any:
    """``dataset`` (opened lazily, ``chunks=None``) as dask arrays whose every chunk is checked when read.

    Each dask chunk is one stored chunk: it is read (decoded by xarray, as the
    digests were taken), a decoding failure becomes CorruptChunkError, and its
    digest is compared with the commit record. Variables already in memory
    (index coordinates) are checked now. A variable whose node records no
    digests (results written before ckpt 0.2) is returned as opened. A chunk
    that fails is first handed to ``recommitted``: a result committed again
    since it was opened was moved to a kept version, whose chunk is read instead
    when it matches; where none does the Dataset is stale, not the store corrupt
    (:class:`~ckpt.errors.StaleResultError`).
    """
    import dask.array as da
    import xarray as xr

    variables = {}
    for name, variable in dataset.variables.items():
        # The digests come with the variable: xarray read its shape and attributes from one read of
        # the commit record, while ``nodes`` may be an earlier one (a writer appending meanwhile).
        variable = variable.copy(deep=False)
        digests = variable.attrs.pop(CHUNK_DIGESTS, None)
        if digests is None and nodes.get(f"{prefix}/{name}", {}).get("attributes", {}).get(CHUNK_DIGESTS):
            msg = f"{describe}: variable {name!r} lost its chunk digests between two reads of the commit record"
            raise CorruptChunkError(msg)
        if digests is not None:
            what = (f"{describe}, variable {name!r}", remedy)
            chunks = tuple(variable.encoding.get("chunks") or node_chunks(nodes[f"{prefix}/{name}"]))
            if isinstance(variable, xr.IndexVariable):  # read now, with the record: nothing to look up
                values = np.asarray(variable.values)
                for key, region in chunk_regions(values.shape, chunks):
                    _compare(values[region], digests, key, what)
            else:
                stale = _stale_check(recommitted, str(name), chunks, digests)
                source = _CheckedChunks(variable, chunks, digests, what, stale)
                lazy = da.from_array(source, chunks=chunks or (), name=False, asarray=False, fancy=False)
                variable = xr.Variable(variable.dims, lazy, variable.attrs, variable.encoding)
        variables[name] = variable
    coords = {name: variables[name] for name in dataset.coords}
    data_vars = {name: variables[name] for name in dataset.data_vars}
    return xr.Dataset(data_vars, coords=coords, attrs=dataset.attrs)


_Stale = Callable[[str, tuple[slice, ...]], "np.ndarray | None"]


def _stale_check(
    recommitted: Recommitted | None, name: str, chunks: tuple[int, ...], digests: dict[str, str]
) -> _Stale | None:
    """What a failed chunk ``key`` (at ``region``) of variable ``name`` is handed to (see :data:`Recommitted`)."""
    if recommitted is None:
        return None
    return lambda key, region: recommitted(name, key, region, chunks, digests.get(key))


class _CheckedChunks:
    """Array-like source for dask: reads one stored chunk at a time and checks it against its digest."""

    def __init__(
        self,
        variable: Any,
        chunks: tuple[int, ...],
        digests: dict[str, str],
        what: tuple[str, str],
        stale: _Stale | None = None,
    ):
        self.variable, self.chunks, self.digests, self.what, self.stale = variable, chunks, digests, what, stale
        self.shape, self.dtype, self.ndim = variable.shape, variable.dtype, variable.ndim

    def __getitem__(self, key: tuple[slice, ...]) -> np.ndarray:
        from ckpt.store._zarr import translated_read_errors

        key = key if isinstance(key, tuple) else (key,)
        starts = [k.start or 0 for k in key]
        aligned = all(start % chunk == 0 for start, chunk in zip(starts, self.chunks, strict=True))
        if not aligned:  # dask only asks for whole chunks (chunks= above); never read unchecked
            raise AssertionError(f"{self.what[0]}: read of {key} is not aligned with the stored chunks")
        index = ".".join(str(start // chunk) for start, chunk in zip(starts, self.chunks, strict=True))
        region = tuple(slice(k.start or 0, k.stop) for k in key)
        try:
            # a chunk rewritten by a later commit may not even decode at the shape this Dataset opened
            with translated_read_errors(*self.what):
                values = np.asarray(self.variable[key].values)
            _compare(values, self.digests, index, self.what)
        except CorruptChunkError:
            earlier = self.stale(index, region) if self.stale is not None else None
            if earlier is None:
                raise
            return earlier
        return values


def _compare(values: np.ndarray, digests: dict[str, str], key: str, what: tuple[str, str]) -> None:
    if values.size == 0:
        return
    expected = digests.get(key)
    if expected is None or block_digest(values) != expected:
        where = f"chunk {key or '(only)'}"
        reason = "has no digest in the commit record" if expected is None else "does not match its digest"
        describe, remedy = what
        msg = (
            f"{describe}: {where} {reason} (a chunk is missing and read as fill values, was changed, or was "
            f"written after the last commit); {remedy}"
        )
        raise CorruptChunkError(msg)


__all__ = [
    "CHUNK_DIGESTS",
    "Recommitted",
    "block_digest",
    "chunk_regions",
    "digest_variable",
    "node_chunks",
    "verified",
]
