"""ckpt: an analysis engine over a checkpoint store, for studying how neural networks learn.

The notebook facade. Everything here is loaded on first use, so ``import ckpt``
costs next to nothing and pulls in neither zarr, xarray, dask nor torch::

    import ckpt

    w = ckpt.create("run.zarr", model="mypkg.models:build", config={"d_model": 128},
                    objective="cross-entropy", framework="torch")
    ...                                          # w.write(step, model) while training
    losses = ckpt.analyze("loss", "run.zarr")    # computes what is missing, saves it
    ckpt.open("run.zarr").analysis("loss")       # reads a stored result

The layers live below this root: :mod:`ckpt.store` (the store: format, writer,
reader, importers), :mod:`ckpt.numerics` (the analyzers' torch math),
:mod:`ckpt.plugins` (the plugin host and the public API for plugin authors),
:mod:`ckpt.engine` (plan, run, commit), :mod:`ckpt.analyzers` (the built-in
analyzers), :mod:`ckpt.sandboxes` (training tasks) and :mod:`ckpt.cli` (the
command line); docs/architecture.md draws them. Errors of every layer derive from
:class:`ckpt.errors.CkptError`; :mod:`ckpt.runtime` holds the process-wide tuning
of the garbage collector and the C allocator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

DISTRIBUTION = "ckpt-dynamics"
"""The name ckpt is published under (``pip install ckpt-dynamics``); the import root and command stay ``ckpt``."""

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from ckpt.engine.entry import analyze, analyze_runs
    from ckpt.errors import CkptError
    from ckpt.store import create, open

# name -> module that defines it; resolved on first access (PEP 562)
_LAZY = {
    # ckpt.engine.entry imports neither dask nor xarray: resolving `ckpt.analyze` (a notebook's tab
    # completion, a check that it is callable) does not load the engine; calling it does
    "analyze": "ckpt.engine.entry",
    "analyze_runs": "ckpt.engine.entry",
    "open": "ckpt.store",
    "create": "ckpt.store",
    "CkptError": "ckpt.errors",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a source tree that was not installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = _version()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        msg = f"module 'ckpt' has no attribute {name!r}"
        raise AttributeError(msg)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, "__version__"])


__all__ = ["DISTRIBUTION", "CkptError", "__version__", "analyze", "analyze_runs", "create", "open"]
