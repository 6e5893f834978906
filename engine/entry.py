"""The engine's public entry points, :func:`analyze` and :func:`analyze_runs` (``ckpt.analyze``, ``ckpt.analyze_runs``).

Their signatures and the Parameters entries of the engine settings are generated from
:class:`~ckpt.engine.settings.EngineSettings`. This module imports neither dask nor xarray:
the engine is loaded when they are called, so that resolving ``ckpt.analyze`` (a notebook's
completion, a check that it is callable) stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ckpt.engine.settings import with_engine_settings

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

    from ckpt.store import Store


@with_engine_settings
def analyze(name: str, store: str | os.PathLike[str] | Store, **kwargs: Any) -> xr.Dataset:
    """Run an analyzer on a store and return its complete result.

    Stored results whose provenance matches are reused; only what is missing (new
    checkpoints) is computed, and saved in the store before it is returned.

    Parameters
    ----------
    name
        Registered analyzer name (``ckpt plugins`` lists them).
    store
        Path or URL of the checkpoint store (or a :class:`ckpt.store.Store` opened on it).
    {engine_settings}
    **options
        The analyzer's options (``split="eval"``; ``ckpt analyze NAME --help`` lists them).

    Returns
    -------
    xarray.Dataset
        The stored result (lazy), with its provenance in ``attrs["ckpt"]`` (``result.ckpt``).

    Examples
    --------
    >>> import ckpt
    >>> losses = ckpt.analyze("loss", "run.zarr", split="eval")  # doctest: +SKIP
    >>> losses["mean_loss"].plot()                                 # doctest: +SKIP
    """
    from ckpt.engine.runner import run

    report = run(name, store, **kwargs)
    assert report.dataset is not None
    return report.dataset


@with_engine_settings
def analyze_runs(
    name: str, stores: Sequence[str | os.PathLike[str]], *, lineage: bool = False, **kwargs: Any
) -> xr.Dataset:
    """Run an analyzer on several stores and return one Dataset with a ``run`` dimension.

    Each store keeps its own result in ``analyses/<name>`` (computed only where missing);
    the results are concatenated along ``run`` (an outer join on ``step``: runs of other
    lengths are padded with NaN), with each run's path and recorded settings (seed, weight
    decay, ...) as coordinates.

    Parameters
    ----------
    name
        Registered analyzer name.
    stores
        Paths or URLs of the runs.
    lineage
        Prefix each run with the runs it was initialised from (``ckpt train --init-from``),
        as one trajectory: a child's step ``s`` becomes ``parent_step + s`` (see
        :func:`ckpt.engine.lineage.join_lineage`; the ancestors' results are computed where
        missing, in their own stores). Coordinates ``source`` and ``source_step`` along ``step``
        name the store and step each row comes from.
    {engine_settings}
    **options
        The analyzer's options, as for :func:`analyze`.

    Returns
    -------
    xarray.Dataset
        The runs' results concatenated along ``run``, with each run's recorded settings as coordinates.

    Examples
    --------
    >>> import glob, ckpt
    >>> geometry = ckpt.analyze_runs("loss", sorted(glob.glob("runs/wd*.zarr")))  # doctest: +SKIP
    >>> geometry["mean_loss"].groupby("weight_decay").mean("run")                     # doctest: +SKIP
    """
    from ckpt.engine.runs import analyze_runs as _analyze_runs

    return _analyze_runs(name, stores, lineage=lineage, **kwargs)


__all__ = ["analyze", "analyze_runs"]
