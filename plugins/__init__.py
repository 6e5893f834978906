"""ckpt.plugins: the plugin host, and the names a plugin author uses.

``__all__`` is the stable plugin API, and it is what docs/plugins.md teaches, nothing
else (at most 30 names): a name is in it when a code block of that guide or a file of
the example plugin (``docs/examples/``) uses it, or when it completes a set they use part
of (``PER_CHECKPOINT`` beside ``PER_PAIR`` and ``PER_RUN``; the built-in objectives beside
``Objective``) or is the warning a broken plugin raises (``PluginWarning``).
``tests/test_packaging.py`` holds it to that::

    from ckpt.plugins import Analyzer, AnalysisContext, Option, Worker, hookimpl

Beneath it, importable from their own modules: the rest of the host
(:mod:`~ckpt.plugins.manager`, the registry; :mod:`~ckpt.plugins.analyzer`,
:mod:`~ckpt.plugins.objectives`, :mod:`~ckpt.plugins.tasks`, :mod:`~ckpt.plugins.hookspecs`)
and, provisional (they may change without a deprecation), the torch math of
:mod:`ckpt.numerics` and the engine of :mod:`ckpt.engine`. ckpt's built-in analyzers,
sandboxes and CLI import from there, as pytest's own plugins use ``_pytest``. The names
this package exported during 0.2's development and no longer does still resolve until
0.3, with a :class:`DeprecationWarning` naming their home (:data:`DEPRECATED`).

Importing this package imports neither zarr, xarray, dask nor torch: they are loaded
when an analysis runs, so that listing plugins and ``--help`` stay fast. Imports
:mod:`ckpt.numerics` and :mod:`ckpt.store`; the names of :mod:`ckpt.engine` load on
first use, so that the engine, which imports the host, is never imported by it.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from ckpt.errors import AnalysisError, PluginWarning
from ckpt.numerics.activations import capture, iter_activations, select_modules
from ckpt.numerics.derivatives import basis_dims, chunks, loss_function, parameter_space, torch_dtype, trainable
from ckpt.plugins._importers import Importer
from ckpt.plugins.analyzer import PER_CHECKPOINT, PER_PAIR, PER_RUN, Analyzer, Option
from ckpt.plugins.hookspecs import hookimpl
from ckpt.plugins.manager import Registry, load_registry
from ckpt.plugins.objectives import CAUSAL_LM, CROSS_ENTROPY, TOKEN_CROSS_ENTROPY, Objective
from ckpt.plugins.tasks import Dataset, Task
from ckpt.store.factory_config import config_bounds

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.engine.context import AnalysisContext
    from ckpt.engine.worker import Worker, datapoint_index

# The engine's names load on first use (PEP 562): the host imports no engine module when it is
# imported (imports point down: docs/architecture.md), and the engine's pipeline imports dask,
# xarray and zarr, which importing ckpt.plugins (every plugin does) and `ckpt --help` must not.
_ENGINE_NAMES = {
    "ckpt.engine.context": ("AnalysisContext",),
    "ckpt.engine.worker": ("Worker", "datapoint_index"),
}

# Names exported in 0.2's development that left the API: their home now, for one release.
_MOVED = {
    "ckpt": ("analyze", "analyze_runs"),
    "ckpt.errors": ("PluginError", "TaskError"),
    "ckpt.runtime": ("freed_memory_kept_for_reuse", "release_freed_memory", "use_one_heap"),
    "ckpt.store.arrays": ("read_here",),
    "ckpt.store.chunks": ("DIGEST_READ_BYTES",),
    "ckpt.numerics.compiled": ("directional_derivatives",),
    "ckpt.numerics.basis_format": ("check_basis", "held_basis", "load_basis", "load_basis_rows", "stored_basis"),
    "ckpt.numerics.derivatives": (
        "BlockLoss",
        "MeanLossHessian",
        "forward_mode",
        "graph_bytes",
        "hessian_vector_product",
    ),
    "ckpt.numerics.footprint": ("held_bytes", "peak_bytes"),
    "ckpt.numerics.lanczos": ("Eigenpairs", "top_eigenpairs"),
    "ckpt.numerics.lanczos_sizes": ("DOT_BLOCK_BYTES", "MIN_VECTORS_BEYOND_K", "lanczos_bytes", "product_limit"),
    "ckpt.numerics.params": ("DTYPES", "ParamSpace"),
    "ckpt.numerics.vector_rows": ("SpilledRows",),
    "ckpt.plugins.analyzer": ("ENGINE_SETTINGS", "declared_options"),
    "ckpt.plugins.hookspecs": ("hookspec",),
    "ckpt.plugins.manager": ("Provider", "registry", "reset_registry"),
    "ckpt.plugins.objectives": ("logits_of",),
    "ckpt.plugins.tasks": ("LazyTask", "resolve_task"),
    "ckpt.engine.lineage": ("join_lineage", "stored_result"),
    "ckpt.engine.memory": ("format_size", "parse_size"),
    "ckpt.engine.plan": ("data_hash", "model_hash", "stored_identity", "stored_provenance"),
    "ckpt.engine.runner": ("run",),
    "ckpt.engine.resume": ("Journal",),
    "ckpt.engine.worker": ("TaskSpec", "clear_cache", "objective_for", "resolve_device"),
}
_LAZY = {name: module for module, names in _ENGINE_NAMES.items() for name in names}
DEPRECATED = {name: module for module, names in _MOVED.items() for name in names}
"""Each deprecated alias of this package and the module it is imported from instead (removed in 0.3)."""


def _load(module: str, name: str) -> Any:
    from ckpt.runtime import collection_paused

    with collection_paused():  # dask, xarray, zarr: see ckpt.runtime
        return getattr(importlib.import_module(module), name)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = globals()[name] = _load(_LAZY[name], name)  # resolved once
        return value
    if name in DEPRECATED:  # not cached: each use warns
        home = DEPRECATED[name]
        msg = f"ckpt.plugins.{name} is deprecated and will be removed in 0.3; import it from {home}"
        warnings.warn(msg, DeprecationWarning, stacklevel=2)
        return _load(home, name)
    raise AttributeError(f"module 'ckpt.plugins' has no attribute {name!r}")


__all__ = [
    "CAUSAL_LM",
    "CROSS_ENTROPY",
    "PER_CHECKPOINT",
    "PER_PAIR",
    "PER_RUN",
    "TOKEN_CROSS_ENTROPY",
    "AnalysisContext",
    "AnalysisError",
    "Analyzer",
    "Dataset",
    "Importer",
    "Objective",
    "Option",
    "PluginWarning",
    "Registry",
    "Task",
    "Worker",
    "basis_dims",
    "capture",
    "chunks",
    "config_bounds",
    "datapoint_index",
    "hookimpl",
    "iter_activations",
    "load_registry",
    "loss_function",
    "parameter_space",
    "select_modules",
    "torch_dtype",
    "trainable",
]
