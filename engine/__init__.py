"""ckpt.engine: turns analyzers into computations over a store and commits their results.

:mod:`~ckpt.engine.pipeline` plans what each analyzer has to compute (stored results reused,
missing steps computed), schedules it on Dask, runs it and commits it (``run``, ``analyze``);
:mod:`~ckpt.engine.worker` is the per-process runtime a task computes in (the cached model and
data, devices, the computation slots); :mod:`~ckpt.engine.context` the
:class:`~ckpt.engine.context.AnalysisContext` an analyzer builds its graph from;
:mod:`~ckpt.engine.resume` the journal an interrupted run resumes from;
:mod:`~ckpt.engine.lineage` results drawn across runs initialised from one another; and
:mod:`~ckpt.engine.memory` the memory budget (``--max-memory``).

Plugin authors use the names :mod:`ckpt.plugins` re-exports. The engine sits above the
plugin host (it runs the analyzers the host registers) and the numerics, and below the
analyzers and the CLI. Importing the package imports none of its modules (the pipeline
imports dask, xarray and zarr).
"""

__all__: list[str] = []
