"""What :meth:`Analyzer.compute` builds its lazy result with: :class:`AnalysisContext`.

The context maps a task function over checkpoints, over pairs of consecutive
checkpoints and over blocks of datapoints. Each call becomes a ``dask.delayed``
task that ships only a :class:`TaskSpec` (paths and names); on the worker it
gets the process's cached :class:`Worker`, which loads what it needs there.
dask and xarray are imported when a graph is built, not when this module is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.engine.resume import Journal
from ckpt.engine.worker import TaskSpec, datapoint_index, worker_for
from ckpt.errors import AnalysisError

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

    from ckpt.store import Store

Output = tuple[tuple[str, ...], Any]
"""An output variable: (dims after ``step``, numpy dtype)."""


def _call(
    fn: Callable[..., dict[str, np.ndarray]],
    spec: TaskSpec,
    args: tuple,
    kwargs: dict,
    expected: Mapping[str, tuple[tuple[int, ...], Any]] | None = None,
    analyzer: str = "",
) -> dict:
    """Run a task function on this worker: what every Dask task of an analysis calls.

    With ``expected`` (``{variable: (shape, dtype)}``, what the analyzer declared),
    the returned arrays are checked against it: Dask would otherwise stack arrays
    of another shape into the result without a word.
    """
    returned = fn(worker_for(spec), *args, **kwargs)
    if expected is not None:
        return _checked(returned, expected, f"task function {fn.__module__}.{fn.__qualname__} of analyzer {analyzer!r}")
    return returned


def _checked(returned: Any, expected: Mapping[str, tuple[tuple[int, ...], Any]], who: str) -> dict:
    """``returned`` as a dict of arrays with the declared shapes and kinds, or an AnalysisError naming ``who``."""
    if not isinstance(returned, Mapping):
        msg = f"{who} returned {type(returned).__name__}; it must return a dict of arrays {sorted(expected)}"
        raise AnalysisError(msg)
    missing = sorted(set(expected) - set(returned))
    if missing:
        msg = f"{who} returned no variable {missing[0]!r}; it returned {sorted(returned)}"
        raise AnalysisError(msg)
    checked = {}
    for name, (shape, dtype) in expected.items():
        value = np.asarray(returned[name])
        if value.shape != tuple(shape):
            msg = f"{who} returned {name!r} shaped {value.shape}; the analyzer declared {tuple(shape)}"
            raise AnalysisError(msg)
        if not np.can_cast(value.dtype, np.dtype(dtype), casting="same_kind"):
            msg = f"{who} returned {name!r} of dtype {value.dtype}; the analyzer declared {np.dtype(dtype)}"
            raise AnalysisError(msg)
        checked[name] = value.astype(dtype, copy=False)
    return checked


class AnalysisContext:
    """What :meth:`Analyzer.compute` works with: the store, the steps to compute, graph helpers.

    Attributes
    ----------
    store
        The :class:`ckpt.store.Store` (read-only, committed state).
    steps
        Steps to compute: checkpoint steps for ``per="checkpoint"``, first steps of
        the pairs for ``per="pair"``, every step for ``per="run"``.
    device
        Torch device the workers compute on.
    """

    def __init__(
        self,
        store: Store,
        steps: Sequence[int],
        spec: TaskSpec,
        results: Mapping[str, xr.Dataset],
        analyzer: str = "",
        journal: Journal | None = None,
    ) -> None:
        self.analyzer = analyzer
        """Name of the analyzer computing (named in errors)."""
        self.store = store
        self.steps = [int(s) for s in steps]
        self.spec = spec
        self.device = spec.device
        self._results = dict(results)
        self.journal = journal
        """Where a ``per="run"`` analyzer commits its pieces as it finds them, so that a killed run
        resumes (:class:`ckpt.engine.resume.Journal`); None for other analyzers."""
        self.resumed: list[int] = []
        """Steps whose pieces the analyzer took from the journal (the engine reports them)."""
        self.from_journal: tuple[tuple[str, ...], list[Any]] | None = None
        """Variables the engine writes from the journal, and the keys of the pieces holding them
        (:meth:`write_from_journal`)."""

    def write_from_journal(self, names: Sequence[str], keys: Sequence[Any]) -> None:
        """Have the engine write variables ``names`` of the result from the journal, chunk by chunk.

        For a ``per="run"`` analyzer whose pieces, committed with :meth:`Journal.append` or
        :meth:`Journal.add` under ``keys``, hold those variables of the whole result (a basis: its
        vectors, piece after piece along ``basis``). The engine computes the result's other
        variables (which runs every piece), then copies these from the journal into the result
        one stored chunk at a time, each checked against its digest, instead of computing them:
        the result is never held in memory whole. The variables the analyzer returns for them
        must still compute the same values (the journal read back), for any caller outside the
        engine; the engine checks that the journal's have their dims, shape and dtype, and that
        the coordinates both hold agree. Without a journal (``ctx.journal`` is None) this does
        nothing.
        """
        if self.journal is not None:
            self.from_journal = (tuple(names), list(keys))

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

    def previous_step(self, step: int) -> int | None:
        """The checkpoint before ``step``, or None at the run's first checkpoint."""
        index = int(np.searchsorted(self.store.steps, step))
        return int(self.store.steps[index - 1]) if index > 0 else None

    @property
    def first_step(self) -> int:
        """The run's first checkpoint (e.g. the reference of a distance from initialisation)."""
        if not len(self.store.steps):
            raise AnalysisError(f"{self.store.path} has no checkpoints yet")
        return int(self.store.steps[0])

    def delayed(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """A ``dask.delayed`` call of ``fn(worker, *args, **kwargs)`` on a worker.

        For analyzers whose tasks depend on each other (a basis grown
        checkpoint by checkpoint): pass earlier delayed results as arguments;
        Dask computes them first and hands ``fn`` their values. ``fn`` is
        positional-only, so ``fn`` may itself take a keyword named ``fn``.
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

        for name, (dims, _) in outputs.items():
            unsized = [d for d in dims if d not in sizes and d != block_dim]  # blocks size their own dim
            if unsized:
                msg = (
                    f"analyzer {self.analyzer!r}: output {name!r} has dim {unsized[0]!r} of unknown length; "
                    f"pass sizes={{{unsized[0]!r}: LENGTH}} to map_checkpoints / map_pairs"
                )
                raise AnalysisError(msg)
        columns: dict[str, list[Any]] = {name: [] for name in outputs}
        for step in steps:
            parts: dict[str, list[Any]] = {name: [] for name in outputs}
            for args, kwargs, part_sizes in task_args(step):
                declared = {**sizes, **part_sizes}
                expected = {name: (tuple(declared[d] for d in dims), dtype) for name, (dims, dtype) in outputs.items()}
                task = dask.delayed(_call, pure=True)(fn, self.spec, args, kwargs, expected, self.analyzer)
                for name, (shape, dtype) in expected.items():
                    parts[name].append(da.from_delayed(task[name], shape=shape, dtype=dtype))
            for name, (dims, _) in outputs.items():
                pieces = parts[name]
                axis = dims.index(block_dim) if block_dim in dims else None
                columns[name].append(pieces[0] if axis is None else da.concatenate(pieces, axis=axis))
        return {name: da.stack(column) for name, column in columns.items()}

    def _dataset(
        self, arrays: dict[str, Any], outputs: Mapping[str, Output], coords: Mapping[str, Any], steps: Sequence[int]
    ) -> xr.Dataset:
        import xarray as xr

        variables = {name: (("step", *outputs[name][0]), array) for name, array in arrays.items()}
        return xr.Dataset(variables, coords={"step": ("step", [int(s) for s in steps]), **coords})

    def map_checkpoints(
        self,
        fn: Callable[..., dict[str, np.ndarray]],
        outputs: Mapping[str, Output],
        /,
        *,
        sizes: Mapping[str, int] | None = None,
        coords: Mapping[str, Any] | None = None,
        datapoint_blocks: Sequence[tuple[slice, int]] | None = None,
        steps: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> xr.Dataset:
        """Map ``fn(worker, step, **kwargs)`` over ``self.steps``; one Dask task per step.

        ``fn`` and ``outputs`` are positional-only, so a task function may take keywords of
        those names; ``sizes``, ``coords``, ``datapoint_blocks`` and ``steps`` are this
        method's own and never reach ``fn`` (a task function requiring one is refused,
        naming the analyzer).

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
        self._check_keywords(fn, kwargs, "map_checkpoints", ("sizes", "coords", "datapoint_blocks", "steps"))
        if datapoint_blocks is None:

            def task_args(step: int) -> list[tuple[tuple, dict, dict[str, int]]]:
                return [((step,), kwargs, {})]

        else:

            def task_args(step: int) -> list[tuple[tuple, dict, dict[str, int]]]:
                return [
                    ((step,), {**kwargs, "examples": block}, {"datapoint": count}) for block, count in datapoint_blocks
                ]

        steps = self.steps if steps is None else [int(s) for s in steps]
        arrays = self._stack(fn, outputs, sizes, task_args, None if datapoint_blocks is None else "datapoint", steps)
        return self._dataset(arrays, outputs, coords or {}, steps)

    def map_pairs(
        self,
        fn: Callable[..., dict[str, np.ndarray]],
        outputs: Mapping[str, Output],
        /,
        *,
        sizes: Mapping[str, int] | None = None,
        coords: Mapping[str, Any] | None = None,
        steps: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> xr.Dataset:
        """Map ``fn(worker, step, next_step, **kwargs)`` over consecutive checkpoint pairs.

        The result's ``step`` coordinate is the first step of each pair:
        ``self.steps``, or ``steps`` when given (a ``per="run"`` analyzer passes
        every checkpoint but the last). ``fn`` and ``outputs`` are positional-only;
        ``sizes``, ``coords`` and ``steps`` are this method's own and never reach ``fn``.
        """
        sizes = dict(sizes or {})
        self._check_keywords(fn, kwargs, "map_pairs", ("sizes", "coords", "steps"))
        steps = self.steps if steps is None else [int(s) for s in steps]

        def task_args(step: int) -> list[tuple[tuple, dict, dict[str, int]]]:
            return [((step, self.next_step(step)), kwargs, {})]

        arrays = self._stack(fn, outputs, sizes, task_args, None, steps)
        return self._dataset(arrays, outputs, coords or {}, steps)

    def _check_keywords(
        self, fn: Callable[..., Any], kwargs: Mapping[str, Any], method: str, own: Sequence[str]
    ) -> None:
        """Refuse, naming the analyzer, a task function whose required keywords are not all given.

        A keyword named like one of ``method``'s own arguments (``steps``) is taken by ``method``
        and never reaches the task: without this check it was a ``TypeError`` inside a Dask task.
        """
        import inspect

        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C function: nothing to check
            return
        given = set(kwargs) | {"examples"}  # datapoint blocks pass examples=
        for parameter in parameters:
            required = parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty
            if not required or parameter.name in given:
                continue
            task = f"task function {getattr(fn, '__qualname__', fn)} of analyzer {self.analyzer!r}"
            if parameter.name in own:
                msg = (
                    f"{task} takes keyword {parameter.name!r}, which {method} keeps as its own argument "
                    f"({', '.join(own)}): rename that keyword of the task function"
                )
            else:
                msg = f"{task} needs keyword {parameter.name!r}: pass {parameter.name}=... to {method}"
            raise AnalysisError(msg)

    def datapoint_blocks(self, split: str, objective: str, examples_per_block: int) -> list[tuple[slice, int]]:
        """Blocks of whole examples and how many datapoints each holds (for ``map_checkpoints``)."""
        example, _ = datapoint_index(self.store, split, objective)
        n = self.store.data(split).sizes["example"]
        counts = np.bincount(example, minlength=n)
        return [
            (slice(start, min(start + examples_per_block, n)), int(counts[start : start + examples_per_block].sum()))
            for start in range(0, n, examples_per_block)
        ]


__all__ = [
    "AnalysisContext",
    "Output",
]
