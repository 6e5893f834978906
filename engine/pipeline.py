"""The engine's pipeline, one request's path through its modules (and their names, re-exported).

:func:`analyze` is what ``ckpt analyze`` and notebooks call. For an analyzer and its options

1. :mod:`~ckpt.engine.settings` checks the engine settings (one :class:`EngineSettings`);
2. :mod:`~ckpt.engine.runner` opens the store once and runs the analyzers it requires first
   (each through the same path, on the same open store);
3. :mod:`~ckpt.engine.plan` compares the stored result's provenance (analyzer version, options,
   data hash, results of requirements) with the request: on a match the stored steps are
   reused and only the missing ones computed (new checkpoints = new work only), otherwise
   everything is (:func:`plan`, pure: nothing is computed);
4. :mod:`~ckpt.engine.compute` asks the analyzer for a lazy Dataset over the missing steps and
   computes it in blocks of steps on the scheduler :mod:`~ckpt.engine.schedule` chooses,
   committing each block to ``analyses/<name>`` as it finishes, so that a run killed mid-way
   resumes where it stopped (:mod:`~ckpt.engine.failures` turns a failure mid-way into one error);
5. the runner returns the stored result, lazily read back from the store.

The names below are kept importable from here, as they were before the pipeline was split.
"""

from __future__ import annotations

from ckpt.engine.compute import COMMIT_SECONDS
from ckpt.engine.entry import analyze, analyze_runs
from ckpt.engine.failures import out_of_memory as _out_of_memory  # noqa: F401 - its old name, for old imports
from ckpt.engine.plan import Plan, data_hash, model_hash, plan, stored_identity, stored_provenance
from ckpt.engine.runner import RunReport, run
from ckpt.engine.runs import run_coordinates
from ckpt.engine.schedule import compute_settings, parallel_tasks
from ckpt.engine.settings import SCHEDULERS, EngineSettings

__all__ = [
    "COMMIT_SECONDS",
    "SCHEDULERS",
    "EngineSettings",
    "Plan",
    "RunReport",
    "analyze",
    "analyze_runs",
    "compute_settings",
    "data_hash",
    "model_hash",
    "parallel_tasks",
    "plan",
    "run",
    "run_coordinates",
    "stored_identity",
    "stored_provenance",
]
