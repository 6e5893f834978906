"""ckpt.plugins: the plugin host and everything a plugin author uses.

Plugin authors (and ckpt's own analyzers, which register exactly like theirs)
import from this package only; its private modules (``_analyzer``,
``_manager`` ...) and the layers it re-exports from (:mod:`ckpt.engine`,
:mod:`ckpt.numerics`) may change without notice::

    from ckpt.plugins import Analyzer, AnalysisContext, Option, Worker, hookimpl

Notebooks run analyzers with :func:`analyze` (also ``ckpt.analyze``). Importing
this package imports neither zarr, xarray, dask nor torch: they are loaded when
an analysis runs, so that listing plugins and ``--help`` stay fast.
Imports :mod:`ckpt.numerics` and :mod:`ckpt.store`; the names of :mod:`ckpt.engine`
load on first use, so that the engine, which imports the host, is never imported by it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ckpt.errors import AnalysisError, PluginError, PluginWarning, TaskError
from ckpt.numerics.activations import capture, iter_activations, select_modules
from ckpt.numerics.compiled import directional_derivatives
from ckpt.numerics.derivatives import (
    DTYPES,
    BlockLoss,
    MeanLossHessian,
    ParamSpace,
    basis_dims,
    check_basis,
    chunks,
    forward_mode,
    graph_bytes,
    held_basis,
    hessian_vector_product,
    load_basis,
    load_basis_rows,
    loss_function,
    parameter_space,
    stored_basis,
    torch_dtype,
    trainable,
)
from ckpt.numerics.footprint import held_bytes, peak_bytes
from ckpt.numerics.lanczos import (
    DOT_BLOCK_BYTES,
    MIN_VECTORS_BEYOND_K,
    Eigenpairs,
    SpilledRows,
    lanczos_bytes,
    product_limit,
    top_eigenpairs,
)
from ckpt.plugins._analyzer import (
    ENGINE_SETTINGS,
    PER_CHECKPOINT,
    PER_PAIR,
    PER_RUN,
    Analyzer,
    Option,
    declared_options,
)
from ckpt.plugins._importers import Importer
from ckpt.plugins._manager import Provider, Registry, load_registry, registry, reset_registry
from ckpt.plugins._objectives import CAUSAL_LM, CROSS_ENTROPY, TOKEN_CROSS_ENTROPY, Objective, logits_of
from ckpt.plugins._task import Dataset, LazyTask, Task, resolve_task
from ckpt.plugins.hookspecs import hookimpl, hookspec
from ckpt.runtime import freed_memory_kept_for_reuse, release_freed_memory, use_one_heap
from ckpt.store.arrays import read_here
from ckpt.store.chunks import DIGEST_READ_BYTES
from ckpt.store.factory_config import config_bounds

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

    from ckpt.engine.context import AnalysisContext
    from ckpt.engine.lineage import join_lineage, stored_result
    from ckpt.engine.memory import format_size, parse_size
    from ckpt.engine.pipeline import data_hash, model_hash, run, stored_identity
    from ckpt.engine.resume import Journal
    from ckpt.engine.worker import TaskSpec, Worker, clear_cache, datapoint_index, objective_for, resolve_device
    from ckpt.store import Store

# The engine's names load on first use (PEP 562): the host imports no engine module when it is
# imported (imports point down: docs/architecture.md), and the engine's pipeline imports dask,
# xarray and zarr, which importing ckpt.plugins (every plugin does) and `ckpt --help` must not.
_ENGINE_NAMES = {
    "ckpt.engine.context": ("AnalysisContext",),
    "ckpt.engine.lineage": ("join_lineage", "stored_result"),
    "ckpt.engine.memory": ("format_size", "parse_size"),
    "ckpt.engine.pipeline": ("data_hash", "model_hash", "run", "stored_identity"),
    "ckpt.engine.resume": ("Journal",),
    "ckpt.engine.worker": ("TaskSpec", "Worker", "clear_cache", "datapoint_index", "objective_for", "resolve_device"),
}
_LAZY = {name: module for module, names in _ENGINE_NAMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'ckpt.plugins' has no attribute {name!r}")
    from ckpt.runtime import collection_paused

    with collection_paused():  # dask, xarray, zarr: see ckpt.runtime
        module = importlib.import_module(_LAZY[name])
    value = globals()[name] = getattr(module, name)  # resolved once
    return value


def analyze(name: str, store: str | os.PathLike[str], **kwargs: Any) -> xr.Dataset:
    """Run analyzer ``name`` on ``store`` and return its complete result (see :func:`ckpt.engine.pipeline.analyze`).

    Parameters
    ----------
    name
        A registered analyzer (``ckpt plugins`` lists them).
    store
        Path or URL of the checkpoint store.
    **kwargs
        Analyzer options and engine settings (``scheduler``, ``workers``, ``device``, ``force`` ...).

    Returns
    -------
    xarray.Dataset
        The stored result (lazy); ``result.ckpt`` holds its provenance.
    """
    from ckpt.engine.pipeline import analyze as _analyze

    return _analyze(name, store, **kwargs)


def analyze_runs(
    name: str, stores: Sequence[str | os.PathLike[str]], *, lineage: bool = False, **kwargs: Any
) -> xr.Dataset:
    """Run ``name`` on several stores: one Dataset with a ``run`` dim (see :func:`ckpt.engine.pipeline.analyze_runs`).

    Parameters
    ----------
    name
        A registered analyzer.
    stores
        Paths or URLs of the runs.
    lineage
        Draw each run with the runs it was initialised from (``ckpt train --init-from``) as one
        trajectory, the child's steps continuing its parent's (``parent_step + s``).
    **kwargs
        As for :func:`analyze`.

    Returns
    -------
    xarray.Dataset
        The runs' results concatenated along ``run``, with each run's recorded settings as coordinates.
    """
    from ckpt.engine.pipeline import analyze_runs as _analyze_runs

    return _analyze_runs(name, stores, lineage=lineage, **kwargs)


def stored_provenance(store: Store, name: str) -> dict[str, Any] | None:
    """The provenance record of a stored result of ``store``, or None when there is none."""
    from ckpt.engine.pipeline import stored_provenance as _stored_provenance

    return _stored_provenance(store, name)


__all__ = [
    "CAUSAL_LM",
    "CROSS_ENTROPY",
    "DIGEST_READ_BYTES",
    "DOT_BLOCK_BYTES",
    "DTYPES",
    "ENGINE_SETTINGS",
    "MIN_VECTORS_BEYOND_K",
    "PER_CHECKPOINT",
    "PER_PAIR",
    "PER_RUN",
    "TOKEN_CROSS_ENTROPY",
    "AnalysisContext",
    "AnalysisError",
    "Analyzer",
    "BlockLoss",
    "Dataset",
    "Eigenpairs",
    "Importer",
    "Journal",
    "LazyTask",
    "MeanLossHessian",
    "Objective",
    "Option",
    "ParamSpace",
    "PluginError",
    "PluginWarning",
    "Provider",
    "Registry",
    "SpilledRows",
    "Task",
    "TaskError",
    "TaskSpec",
    "Worker",
    "analyze",
    "analyze_runs",
    "basis_dims",
    "capture",
    "check_basis",
    "chunks",
    "clear_cache",
    "config_bounds",
    "data_hash",
    "datapoint_index",
    "declared_options",
    "directional_derivatives",
    "format_size",
    "forward_mode",
    "freed_memory_kept_for_reuse",
    "graph_bytes",
    "held_basis",
    "held_bytes",
    "hessian_vector_product",
    "hookimpl",
    "hookspec",
    "iter_activations",
    "join_lineage",
    "lanczos_bytes",
    "load_basis",
    "load_basis_rows",
    "load_registry",
    "logits_of",
    "loss_function",
    "model_hash",
    "objective_for",
    "parameter_space",
    "parse_size",
    "peak_bytes",
    "product_limit",
    "read_here",
    "registry",
    "release_freed_memory",
    "reset_registry",
    "resolve_device",
    "resolve_task",
    "run",
    "select_modules",
    "stored_basis",
    "stored_identity",
    "stored_provenance",
    "stored_result",
    "top_eigenpairs",
    "torch_dtype",
    "trainable",
    "use_one_heap",
]
