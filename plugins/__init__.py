"""The plugin host of ckpt: hookspecs, the plugin manager, the Analyzer API and the engine.

Plugin authors need only what is exported here::

    from plugins import Analyzer, AnalysisContext, Option, Worker, hookimpl

Notebooks run analyzers with :func:`analyze`. Depends on :mod:`ckptstore` only.
"""

from __future__ import annotations

from typing import Any

from plugins.analyzer import AnalysisContext, AnalysisError, Analyzer, Option
from plugins.hookspecs import hookimpl, hookspec
from plugins.runtime import Worker


def analyze(name: str, store: Any, **kwargs: Any) -> Any:
    """Run analyzer ``name`` on ``store`` (see :func:`plugins.engine.analyze`)."""
    from plugins.engine import analyze as _analyze

    return _analyze(name, store, **kwargs)


def analyze_runs(name: str, stores: Any, **kwargs: Any) -> Any:
    """Run ``name`` on several stores: one Dataset with a ``run`` dim (:func:`plugins.engine.analyze_runs`)."""
    from plugins.engine import analyze_runs as _analyze_runs

    return _analyze_runs(name, stores, **kwargs)


__all__ = [
    "AnalysisContext",
    "AnalysisError",
    "Analyzer",
    "Option",
    "Worker",
    "analyze",
    "analyze_runs",
    "hookimpl",
    "hookspec",
]
