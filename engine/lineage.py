"""One trajectory from a run and the runs it was initialised from (``ckpt train --init-from``).

A child started at its parent's checkpoint ``parent_step``; its step ``s`` is step
``parent_step + s`` of the joined trajectory. :func:`join_lineage` puts the parent's result
(its rows before ``parent_step``) and the child's (from its step 0, which replaces the parent's
row at the junction) on one ``step`` axis, recursively for a parent's own parent. It refuses,
rather than join silently, a parent that is gone or whose checkpoint changed since the child was
made, and results that do not measure the same thing: another analyzer, other options, or other
evaluation data (a child of another seed or ``p`` draws other data: compare such runs side by side).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import xarray as xr

import ckpt.store as ckptstore
from ckpt.errors import AnalysisError
from ckpt.store.lineage import parent_status

MAX_GENERATIONS = 64
"""Most ancestors followed (a record naming itself as an ancestor is refused before that)."""

SAME_MEASURE = ("analyzer", "version", "options", "data_sha256")
"""Provenance fields that must agree for two results to be one trajectory."""


def ancestry(store: ckptstore.Store) -> list[tuple[ckptstore.Store, int]]:
    """``[(ancestor, step its child started from), ...]``, the oldest first; empty for a run without a parent.

    Raises
    ------
    AnalysisError
        When an ancestor is unreachable, lost the step, changed since its child was made, or
        cannot be verified (no digest), or when the lineage loops.
    """
    chain: list[tuple[ckptstore.Store, int]] = []
    seen = {store.path}
    child = store
    while child.parent is not None:
        parent = child.parent
        status = parent_status(parent)
        if not status.ok:
            msg = f"cannot join {child.path} to its parent {parent}: {status.detail}"
            raise AnalysisError(msg)
        if parent.path in seen or len(chain) >= MAX_GENERATIONS:
            msg = f"the lineage of {store.path} loops or is deeper than {MAX_GENERATIONS} runs (at {parent.path})"
            raise AnalysisError(msg)
        seen.add(parent.path)
        opened = ckptstore.open(parent.path)
        chain.append((opened, parent.step))
        child = opened
    return chain[::-1]


def stored_result(name: str) -> Callable[[ckptstore.Store], xr.Dataset]:
    """``result_of`` for :func:`join_lineage` reading stored results only (``ckpt plot --with-parent``)."""

    def read(run: ckptstore.Store) -> xr.Dataset:
        if name not in run.analyses:
            msg = f"{run.path} has no stored result {name!r}: run `ckpt analyze {name} {run.path}` first"
            raise AnalysisError(msg)
        return run.analysis(name)

    return read


def _measure(result: xr.Dataset) -> dict[str, object]:
    record = dict(result.attrs.get("ckpt") or {})
    return {key: record.get(key) for key in SAME_MEASURE}


def join_lineage(store: ckptstore.Store, name: str, result_of: Callable[[ckptstore.Store], xr.Dataset]) -> xr.Dataset:
    """``store``'s result ``name`` preceded by its ancestors', on one continued ``step`` axis.

    Parameters
    ----------
    store
        The child run.
    name
        The result (for messages).
    result_of
        The result of one store (read, or computed where missing).

    Returns
    -------
    xarray.Dataset
        The rows of every generation with ``step`` continued, and the coordinates ``source``
        (the store each row comes from) and ``source_step`` (its step there) along ``step``;
        the child's attributes (its provenance). Dimensions other than ``step`` are outer-joined.

    Raises
    ------
    AnalysisError
        See :func:`ancestry`; also when a generation's result was computed by another analyzer,
        with other options or on other data than the child's.
    """
    own = result_of(store)
    chain = ancestry(store)
    if not chain:
        return _with_sources(own, store.path, 0)
    pieces = []
    offset = 0  # a generation's step 0 is the sum of the junction steps before it
    for run, stop in [*chain, (store, None)]:
        result = own if run is store else result_of(run)
        differ = [key for key, value in _measure(result).items() if value != _measure(own)[key]]
        if differ:
            msg = (
                f"{name} of {run.path} and of {store.path} are not one trajectory: their {', '.join(differ)} "
                "differ (other options, or other evaluation data: a child of another seed or task options "
                "draws other data); compute them alike, or compare the runs side by side (ckpt.analyze_runs)"
            )
            raise AnalysisError(msg)
        if stop is not None:  # the child's step 0 stands for the parent's row at the junction
            result = result.isel(step=np.flatnonzero(result["step"].values < stop))
        pieces.append(_with_sources(result, run.path, offset))
        offset += stop or 0
    joined = xr.concat([p.drop_attrs() for p in pieces], dim="step", join="outer", coords="minimal", compat="override")
    joined.attrs = dict(own.attrs)
    return joined


def _with_sources(result: xr.Dataset, path: str, offset: int) -> xr.Dataset:
    steps = np.asarray(result["step"].values, dtype=np.int64)
    return result.assign_coords(
        step=steps + offset,
        source=("step", np.full(len(steps), str(path), dtype=object)),
        source_step=("step", steps),
    )


__all__ = [
    "MAX_GENERATIONS",
    "SAME_MEASURE",
    "ancestry",
    "join_lineage",
    "stored_result",
]
