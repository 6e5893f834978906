"""ckpt.engine: turns analyzers into computations over a store and commits their results.

One request's path (``ckpt.analyze``, ``ckpt analyze``): :mod:`~ckpt.engine.entry` holds the
public entry points, whose signatures come from :mod:`~ckpt.engine.settings` (one typed
:class:`~ckpt.engine.settings.EngineSettings`, also the CLI's options); :mod:`~ckpt.engine.runner`
opens the store once and runs the dependencies, then :mod:`~ckpt.engine.plan` decides what is
reused and what computed (pure: nothing is computed), :mod:`~ckpt.engine.compute` computes the
missing steps block by block on the scheduler :mod:`~ckpt.engine.schedule` chooses and commits
them, and :mod:`~ckpt.engine.failures` turns a failure mid-run into one error. Beside them:
:mod:`~ckpt.engine.runs` (one analyzer over several runs), :mod:`~ckpt.engine.worker` (the
per-process runtime a task computes in: the cached model and data, devices, the computation
slots), :mod:`~ckpt.engine.context` (the :class:`~ckpt.engine.context.AnalysisContext` an
analyzer builds its graph from), :mod:`~ckpt.engine.resume` (the journal an interrupted run
resumes from), :mod:`~ckpt.engine.lineage` (results drawn across runs initialised from one
another) and :mod:`~ckpt.engine.memory` (the memory budget, ``--max-memory``);
:mod:`~ckpt.engine.pipeline` re-exports the names it held before it was split.

Plugin authors use the names :mod:`ckpt.plugins` re-exports. The engine sits above the
plugin host (it runs the analyzers the host registers) and the numerics, and below the
analyzers and the CLI. Importing the package imports none of its modules (the runner
imports dask, xarray and zarr).
"""

__all__: list[str] = []
