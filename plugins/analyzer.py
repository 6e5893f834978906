"""The analyzer API for plugin authors: :class:`Analyzer`, :class:`Option` and the graph helpers.

An analyzer declares a name, a version, typed options and the analyzers it
requires, and implements :meth:`Analyzer.compute`, which returns a *lazy*
``xarray.Dataset``. It builds that Dataset with the helpers of
:class:`AnalysisContext`, which map a function over checkpoints, over pairs of
consecutive checkpoints, and over blocks of datapoints; the function runs on
a Dask worker and gets a :class:`plugins.runtime.Worker` that loads what it
needs from the store there (model and data cached per worker).

A complete analyzer::

    import numpy as np
    from plugins import Analyzer, Option, Worker

    def weight_norms(worker: Worker, step: int) -> dict[str, np.ndarray]:
        tensors = worker.tensors(step)
        return {"norm": np.array([np.linalg.norm(t.astype(np.float64)) for t in tensors.values()])}

    class WeightNorm(Analyzer):
        name = "weight-norm"
        version = "1"
        description = "L2 norm of every tensor at every checkpoint."

        def compute(self, ctx):
            names = ctx.store.tensor_names
            return ctx.map_checkpoints(weight_norms, {"norm": (("tensor",), np.float64)},
                                       coords={"tensor": names}, sizes={"tensor": len(names)})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from ckptstore.errors import CkptError

PER_CHECKPOINT = "checkpoint"
PER_PAIR = "pair"
PER_RUN = "run"


class AnalysisError(CkptError):
    """An analyzer was misused (unknown analyzer or option, bad value) or failed."""


@dataclass
class Option:
    """A typed analyzer option; becomes ``--name`` on the command line.

    Parameters
    ----------
    type
        ``int``, ``float``, ``str`` or ``bool`` (a flag).
    default
        Value when not given.
    help
        One line for ``ckpt analyze NAME --help``.
    choices
        Allowed values, if restricted.
    """

    type: type
    default: Any
    help: str
    choices: Sequence[Any] | None = None
    name: str = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return self
        return instance.options[self.name]

    def convert(self, value: Any, analyzer: str) -> Any:
        """Check and convert ``value``; raise AnalysisError naming the option otherwise."""
        try:
            if self.type is bool and isinstance(value, str):
                converted = {"true": True, "false": False, "1": True, "0": False}[value.lower()]
            else:
                converted = self.type(value)
                if self.type is int and isinstance(value, float) and value != int(value):
                    raise ValueError
        except (TypeError, ValueError, KeyError):
            msg = f"option {self.name!r} of analyzer {analyzer!r} must be {self.type.__name__}, got {value!r}"
            raise AnalysisError(msg) from None
        if self.choices is not None and converted not in self.choices:
            msg = f"option {self.name!r} of analyzer {analyzer!r} must be one of {list(self.choices)}, got {value!r}"
            raise AnalysisError(msg)
        return converted


def declared_options(cls: type) -> dict[str, Option]:
    """The :class:`Option` class attributes of ``cls`` and its bases, by name, base classes first."""
    spec: dict[str, Option] = {}
    for klass in reversed(cls.__mro__):
        spec.update({k: v for k, v in vars(klass).items() if isinstance(v, Option)})
    return spec


class Analyzer:
    """Base class of every analyzer (built-in or plugin).

    Subclasses set the class attributes below, declare options as
    :class:`Option` class attributes, and implement :meth:`compute`.
    """

    name: ClassVar[str]
    """What users type: ``ckpt analyze NAME``."""
    version: ClassVar[str] = "1"
    """Bump when results change: stored results of another version are recomputed."""
    description: ClassVar[str] = ""
    """One line for ``ckpt analyze --help``."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Analyzers whose results this one reads (computed first by the engine)."""
    running_sums: ClassVar[dict[str, str]] = {}
    """``{total: variable}``: the engine adds ``total``, the running sum of ``variable`` over
    ``step``, continued across the blocks it commits and across incremental runs."""
    per: ClassVar[str] = PER_CHECKPOINT
    """How results grow with the run: ``"checkpoint"`` (one row per step), ``"pair"``
    (one row per consecutive pair, at its first step) or ``"run"`` (recomputed whole)."""

    def __init__(self, **options: Any) -> None:
        spec = self.option_spec()
        unknown = sorted(set(options) - set(spec))
        if unknown:
            known = ", ".join(spec) or "none"
            msg = f"analyzer {self.name!r} has no option {unknown[0]!r}; its options are: {known}"
            raise AnalysisError(msg)
        self.options: dict[str, Any] = {}
        for key, option in spec.items():
            value = options.get(key, option.default)
            self.options[key] = value if value is None else option.convert(value, self.name)

    @classmethod
    def option_spec(cls) -> dict[str, Option]:
        """The declared options, by name, in declaration order (base classes first)."""
        return declared_options(cls)

    def dependency_options(self) -> dict[str, dict[str, Any]]:
        """Options to run each required analyzer with (default: their defaults)."""
        return {}

    def preflight(self, store: Any) -> None:
        """Check the options against ``store`` before anything, dependencies included, is computed.

        Raise :class:`AnalysisError` for a user mistake that would otherwise surface
        only after the required analyzers had run and written their results (a
        missing label, a model that is not installed). Default: nothing to check.
        """

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """Return the result for ``ctx.steps`` as a lazy (dask-backed) Dataset."""
        raise NotImplementedError

    def summarize(self, result: xr.Dataset) -> str:
        """A readable summary for ``ckpt show`` (default: each variable's shape and range)."""
        lines = []
        for name, variable in result.data_vars.items():
            values = np.asarray(variable.values, dtype=np.float64)
            finite = values[np.isfinite(values)]
            stats = f"min {finite.min():.4g}  mean {finite.mean():.4g}  max {finite.max():.4g}" if finite.size else ""
            dims = ", ".join(f"{d}={n}" for d, n in zip(variable.dims, variable.shape, strict=True))
            lines.append(f"  {name:<16} ({dims})  {stats}")
        return "\n".join(lines)

    def provenance(self) -> dict[str, Any]:
        """What identifies a result of this analyzer: name, version and options (JSON)."""
        return {"analyzer": self.name, "version": str(self.version), "options": json.loads(json.dumps(self.options))}


def validate_analyzer(cls: Any) -> None:
    """Raise TypeError unless ``cls`` is a well-formed Analyzer subclass (used at registration)."""
    if not (isinstance(cls, type) and issubclass(cls, Analyzer)):
        msg = f"{cls!r} is not a subclass of plugins.Analyzer"
        raise TypeError(msg)
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        msg = f"analyzer class {cls.__qualname__} has no name"
        raise TypeError(msg)
    if cls.per not in (PER_CHECKPOINT, PER_PAIR, PER_RUN):
        msg = f"analyzer {cls.name!r}: per must be 'checkpoint', 'pair' or 'run', got {cls.per!r}"
        raise TypeError(msg)


@dataclass(frozen=True)
class TaskSpec:
    """What a worker needs to set itself up: paths and names, never tensors (cheap to ship)."""

    store: str
    device: str = "cpu"
    storage_options: Mapping[str, Any] | None = None


Output = tuple[tuple[str, ...], Any]
"""An output variable: (dims after ``step``, numpy dtype)."""


def _call(fn: Callable[..., dict[str, np.ndarray]], spec: TaskSpec, args: tuple, kwargs: dict) -> dict:
    from plugins.runtime import worker_for

    return fn(worker_for(spec), *args, **kwargs)


class AnalysisContext:
    """What :meth:`Analyzer.compute` works with: the store, the steps to compute, graph helpers.

    Attributes
    ----------
    store
        The :class:`ckptstore.Store` (read-only, committed state).
    steps
        Steps to compute: checkpoint steps for ``per="checkpoint"``, first steps of
        the pairs for ``per="pair"``, every step for ``per="run"``.
    device
        Torch device the workers compute on.
    """

    def __init__(self, store: Any, steps: Sequence[int], spec: TaskSpec, results: Mapping[str, xr.Dataset]) -> None:
        self.store = store
        self.steps = [int(s) for s in steps]
        self.spec = spec
        self.device = spec.device
        self._results = dict(results)

    def result(self, name: str) -> xr.Dataset:
        """The stored result of a required analyzer (lazy)."""
        try:
            return self._results[name]
        except KeyError:
            msg = f"analyzer result {name!r} is not available; declare it in `requires`"
            raise AnalysisError(msg) from None

    def next_step(self, step: int) -> int:
        """The checkpoint after ``step`` (for pair analyzers)."""
        steps = self.store.steps
        index = int(np.searchsorted(steps, step))
        return int(steps[index + 1])

    def delayed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A ``dask.delayed`` call of ``fn(worker, *args, **kwargs)`` on a worker.

        For analyzers whose tasks depend on each other (a basis grown
        checkpoint by checkpoint): pass earlier delayed results as arguments;
        Dask computes them first and hands ``fn`` their values.
        """
        import dask

        return dask.delayed(_call, pure=True)(fn, self.spec, args, kwargs)

    def _stack(
        self,
        fn: Callable[..., dict[str, np.ndarray]],
        outputs: Mapping[str, Output],
        sizes: Mapping[str, int],
        task_args: Callable[[int], list[tuple[tuple, dict, dict[str, int]]]],
        block_dim: str | None,
        steps: Sequence[int],
    ) -> dict[str, Any]:
        import dask
        import dask.array as da

        columns: dict[str, list[Any]] = {name: [] for name in outputs}
        for step in steps:
            parts: dict[str, list[Any]] = {name: [] for name in outputs}
            for args, kwargs, part_sizes in task_args(step):
                task = dask.delayed(_call, pure=True)(fn, self.spec, args, kwargs)
                for name, (dims, dtype) in outputs.items():
                    shape = tuple({**sizes, **part_sizes}[d] for d in dims)
                    parts[name].append(da.from_delayed(task[name], shape=shape, dtype=dtype))
            for name, (dims, _) in outputs.items():
                pieces = parts[name]
                axis = dims.index(block_dim) if block_dim in dims else None
                columns[name].append(pieces[0] if axis is None else da.concatenate(pieces, axis=axis))
        return {name: da.stack(column) for name, column in columns.items()}

    def _dataset(
        self, arrays: dict[str, Any], outputs: Mapping[str, Output], coords: Mapping[str, Any], steps: Sequence[int]
    ) -> xr.Dataset:
        variables = {name: (("step", *outputs[name][0]), array) for name, array in arrays.items()}
        return xr.Dataset(variables, coords={"step": ("step", [int(s) for s in steps]), **coords})

    def map_checkpoints(
        self,
        fn: Callable[..., dict[str, np.ndarray]],
        outputs: Mapping[str, Output],
        *,
        sizes: Mapping[str, int] | None = None,
        coords: Mapping[str, Any] | None = None,
        datapoint_blocks: Sequence[tuple[slice, int]] | None = None,
        steps: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> xr.Dataset:
        """Map ``fn(worker, step, **kwargs)`` over ``self.steps``; one Dask task per step.

        Parameters
        ----------
        fn
            A module-level function returning ``{variable: array}``; array shapes
            follow ``outputs`` (without the step axis).
        outputs
            ``{variable: (dims, dtype)}``.
        sizes
            Length of every dim in ``outputs``.
        coords
            Coordinates of the result besides ``step``.
        datapoint_blocks
            ``[(examples slice, datapoints in it), ...]``: split each step into one
            task per block of examples; ``fn`` is then called with ``examples=slice``
            and its outputs are concatenated along ``"datapoint"``.
        steps
            Checkpoint steps to map over instead of ``self.steps`` (a pair analyzer
            computing per-checkpoint quantities once, for both pairs that share them).
        **kwargs
            Passed to ``fn`` (picklable values).
        """
        sizes = dict(sizes or {})
        if datapoint_blocks is None:

            def task_args(step: int) -> list[tuple[tuple, dict, dict[str, int]]]:
                return [((step,), kwargs, {})]

        else:

            def task_args(step: int) -> list[tuple[tuple, dict, dict[str, int]]]:
                return [
                    ((step,), {**kwargs, "examples": block}, {"datapoint": count}) for block, count in datapoint_blocks
                ]

        steps = self.steps if steps is None else [int(s) for s in steps]
        arrays = self._stack(fn, outputs, sizes, task_args, "datapoint", steps)
        return self._dataset(arrays, outputs, coords or {}, steps)

    def map_pairs(
        self,
        fn: Callable[..., dict[str, np.ndarray]],
        outputs: Mapping[str, Output],
        *,
        sizes: Mapping[str, int] | None = None,
        coords: Mapping[str, Any] | None = None,
        steps: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> xr.Dataset:
        """Map ``fn(worker, step, next_step, **kwargs)`` over consecutive checkpoint pairs.

        The result's ``step`` coordinate is the first step of each pair:
        ``self.steps``, or ``steps`` when given (a ``per="run"`` analyzer passes
        every checkpoint but the last).
        """
        sizes = dict(sizes or {})
        steps = self.steps if steps is None else [int(s) for s in steps]

        def task_args(step: int) -> list[tuple[tuple, dict, dict[str, int]]]:
            return [((step, self.next_step(step)), kwargs, {})]

        arrays = self._stack(fn, outputs, sizes, task_args, None, steps)
        return self._dataset(arrays, outputs, coords or {}, steps)

    def datapoint_blocks(self, split: str, objective: str, examples_per_block: int) -> list[tuple[slice, int]]:
        """Blocks of whole examples and how many datapoints each holds (for ``map_checkpoints``)."""
        from plugins.runtime import datapoint_index

        example, _ = datapoint_index(self.store, split, objective)
        n = self.store.data(split).sizes["example"]
        counts = np.bincount(example, minlength=n)
        return [
            (slice(start, min(start + examples_per_block, n)), int(counts[start : start + examples_per_block].sum()))
            for start in range(0, n, examples_per_block)
        ]
