"""The analyzer API for plugin authors: :class:`Analyzer` and :class:`Option`.

An analyzer declares a name, a version, typed options and the analyzers it
requires, and implements :meth:`Analyzer.compute`, which returns a *lazy*
``xarray.Dataset``. It builds that Dataset with the helpers of
:class:`ckpt.plugins.AnalysisContext`, which map a function over checkpoints, over
pairs of consecutive checkpoints, and over blocks of datapoints; the function runs
on a Dask worker and gets a :class:`ckpt.plugins.Worker` that loads what it needs
from the store there (model and data cached per worker).

This module imports neither xarray nor torch, so that registering analyzers
(``ckpt --help``, ``ckpt analyze NAME --help``) stays cheap.

A complete analyzer::

    import numpy as np
    from ckpt.plugins import Analyzer, Option, Worker

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

import builtins
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ckpt.errors import AnalysisError, PluginError

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

    from ckpt.engine.context import AnalysisContext
    from ckpt.store import Store

PER_CHECKPOINT = "checkpoint"
"""``Analyzer.per``: one result row per checkpoint."""
PER_PAIR = "pair"
"""``Analyzer.per``: one result row per pair of consecutive checkpoints, at its first step."""
PER_RUN = "run"
"""``Analyzer.per``: the whole result is recomputed when the run grows."""

ENGINE_SETTINGS: tuple[str, ...]
"""Keyword arguments that :func:`ckpt.analyze` gives the engine; no analyzer option may take these names.

The fields of :class:`ckpt.engine.settings.EngineSettings`, in order (read on first use)."""


def _engine_settings() -> tuple[str, ...]:
    """The names of the engine settings (:class:`ckpt.engine.settings.EngineSettings`' fields).

    Keyword arguments that :func:`ckpt.analyze` gives the engine; no analyzer option may take
    these names. Read from the engine's one declaration of them, which imports neither dask nor torch.
    """
    from ckpt.engine.settings import EngineSettings  # the host names the engine's settings only when asked

    return EngineSettings.names()


def __getattr__(name: str) -> Any:
    # ENGINE_SETTINGS is derived from the engine's settings, which sit a layer above the host:
    # read when first asked for (PEP 562), so that importing the host never imports the engine
    if name == "ENGINE_SETTINGS":
        value = _engine_settings()
        globals()[name] = value
        return value
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


OPTION_TYPES = (int, float, str, bool)
"""The types an :class:`Option` may have: each maps to one command-line value (lists are a ``str``)."""


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
    minimum, maximum
        Bounds (inclusive) of an ``int`` or ``float`` option; checked for every value
        given, on the command line and in Python. A ``float`` option's value is also
        finite: NaN passes every comparison, and infinity sizes nothing.
    """

    type: type
    default: Any
    help: str
    choices: Sequence[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    name: str = ""

    def __set_name__(self, owner: builtins.type, name: str) -> None:  # builtins: `type` is a field here
        self.name = name

    def __get__(self, instance: Any, owner: builtins.type) -> Any:
        if instance is None:
            return self
        return instance.options[self.name]

    def convert(self, value: Any, owner: str) -> Any:
        """Check and convert ``value``; raise AnalysisError naming the option and ``owner`` otherwise.

        ``owner`` says whose option it is, e.g. ``"analyzer 'loss'"``.
        """
        try:
            if self.type is bool and isinstance(value, str):
                converted = {"true": True, "false": False, "1": True, "0": False}[value.lower()]
            else:
                converted = self.type(value)
                if self.type is int and isinstance(value, float) and value != int(value):
                    raise ValueError
        except (TypeError, ValueError, KeyError, OverflowError):
            msg = f"option {self.name!r} of {owner} must be {self.type.__name__}, got {value!r}"
            raise AnalysisError(msg) from None
        if self.type is float and not math.isfinite(converted):
            msg = f"option {self.name!r} of {owner} must be a finite number, got {value!r}"
            raise AnalysisError(msg)
        if self.choices is not None and converted not in self.choices:
            msg = f"option {self.name!r} of {owner} must be one of {list(self.choices)}, got {value!r}"
            raise AnalysisError(msg)
        if self.minimum is not None and converted < self.minimum:
            msg = f"option {self.name!r} of {owner} must be at least {self.minimum:g}, got {value!r}"
            raise AnalysisError(msg)
        if self.maximum is not None and converted > self.maximum:
            msg = f"option {self.name!r} of {owner} must be at most {self.maximum:g}, got {value!r}"
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
    min_checkpoints: ClassVar[int] = 1
    """Checkpoints a store must hold before the analyzer computes anything (a pair analyzer needs at
    least 2 whatever this says): ``--follow`` and ``ckpt watch`` wait for them before its first run."""
    keeps_freed_memory: ClassVar[bool] = False
    """On the CPU, whether the memory this run's tasks free stays in the process's heap for their
    next allocations until the run ends (:func:`ckpt.runtime.freed_memory_kept_for_reuse`), instead
    of going back to the system after each task. For runs whose tasks allocate the same large blocks
    again and again (hessian-basis: each basis checkpoint's graphs and Lanczos vectors), where fresh
    pages cost a page fault each; it raises the peak of runs whose blocks vary in size."""

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
            self.options[key] = value if value is None else option.convert(value, f"analyzer {self.name!r}")

    @classmethod
    def option_spec(cls) -> dict[str, Option]:
        """The declared options, by name, in declaration order (base classes first)."""
        return declared_options(cls)

    def dependency_options(self) -> dict[str, dict[str, Any]]:
        """Options to run each required analyzer with (default: their defaults)."""
        return {}

    def data_splits(self, store: Store) -> Sequence[str] | None:
        """The data splits this result is computed from: only their content decides whether it is reused.

        ``None`` (the default): every split, so any change of the store's data recomputes it. A
        weights-only analyzer returns ``()``: adding or replacing a split leaves its results
        alone. An analyzer reading ``--split`` returns ``(self.split,)``. What required analyzers
        read is covered by their own provenance.
        """
        return None

    def preflight(self, store: Store) -> None:
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

    def plot(self, result: xr.Dataset, store: Store) -> dict[str, Figure]:
        """Figures of a stored result of this analyzer, by short name (default: none).

        ``ckpt plot``, ``ckpt report`` and notebooks call it with the result as stored
        (``store.analysis(name)``) and the opened store, to read what the figures need beside
        the result (data labels, checkpoints, other stored results). Return
        :class:`matplotlib.figure.Figure` objects built without ``pyplot`` and import matplotlib
        inside this method, so that commands that do not plot never load it. The name of each
        figure becomes part of its file name (``NAME-KEY.png``): short, lowercase, dashes.

        Parameters
        ----------
        result
            The stored result (lazy; load what is drawn).
        store
            The opened :class:`ckpt.store.Store` the result belongs to.

        Returns
        -------
        dict
            ``{name: Figure}``; empty when the analyzer draws nothing.
        """
        return {}

    def plot_together(self, results: dict[str, xr.Dataset], store: Store) -> dict[str, Figure]:
        """Figures comparing several stored results of this analyzer (kept apart with ``--as``); default: none.

        ``ckpt report`` calls it when a store holds more than one result of the analyzer, with
        ``{result name: result}``; e.g. ``clusters`` on the exact loss, on Fisher and on POLCA
        side by side, the comparison of Hidden Breakthroughs' Table 3. Same conventions as
        :meth:`plot`.
        """
        return {}

    def provenance(self) -> dict[str, Any]:
        """What identifies a result of this analyzer: name, version and options (JSON)."""
        return {"analyzer": self.name, "version": str(self.version), "options": json.loads(json.dumps(self.options))}


def validate_analyzer(cls: Any) -> None:
    """Raise :class:`PluginError` unless ``cls`` is a well-formed Analyzer subclass (used at registration)."""
    if not (isinstance(cls, type) and issubclass(cls, Analyzer)):
        msg = f"{cls!r} is not a subclass of ckpt.plugins.Analyzer"
        raise PluginError(msg)
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        msg = f"analyzer class {cls.__qualname__} has no name"
        raise PluginError(msg)
    if not isinstance(cls.version, str) or not cls.version:
        msg = (
            f'analyzer {cls.name!r}: version must be a non-empty str such as "1", got {cls.version!r} '
            "(a stored result's version is compared as text)"
        )
        raise PluginError(msg)
    if cls.per not in (PER_CHECKPOINT, PER_PAIR, PER_RUN):
        msg = f"analyzer {cls.name!r}: per must be 'checkpoint', 'pair' or 'run', got {cls.per!r}"
        raise PluginError(msg)
    if not isinstance(cls.min_checkpoints, int) or isinstance(cls.min_checkpoints, bool) or cls.min_checkpoints < 1:
        msg = f"analyzer {cls.name!r}: min_checkpoints must be an int of at least 1, got {cls.min_checkpoints!r}"
        raise PluginError(msg)
    from ckpt.engine.settings import FOLLOW_OPTIONS  # the command's own options, beside the settings

    reserved = (*_engine_settings(), *FOLLOW_OPTIONS)
    shadowing = [name for name in cls.option_spec() if name in reserved]
    if shadowing:
        msg = (
            f"analyzer {cls.name!r} declares option {shadowing[0]!r}, which is an engine setting or an option "
            f"of ckpt analyze ({', '.join(reserved)}); rename the option"
        )
        raise PluginError(msg)
    for option in cls.option_spec().values():
        validate_option(option, f"analyzer {cls.name!r}")


def validate_option(option: Option, owner: str) -> None:
    """Raise :class:`PluginError` unless ``option`` has a supported type, a valid default and valid choices."""
    where = f"option {option.name!r} of {owner}"
    if not option.name.isidentifier() or option.name.startswith("_"):
        msg = f"{where}: an option name must be a Python identifier not starting with '_'"
        raise PluginError(msg)
    if option.type not in OPTION_TYPES:
        kind = getattr(option.type, "__name__", repr(option.type))
        msg = (
            f"{where} has type {kind}; an option is int, float, str or bool "
            "(take several values as one comma-separated str)"
        )
        raise PluginError(msg)
    for value in [*([] if option.default is None else [option.default]), *(option.choices or ())]:
        try:
            converted = option.type(value)
        except (TypeError, ValueError):
            msg = f"{where}: {value!r} is not a {option.type.__name__}"
            raise PluginError(msg) from None
        if option.type is not bool and type(value) is bool:
            msg = f"{where}: {value!r} is a bool, not a {option.type.__name__}"
            raise PluginError(msg)
        if converted != value and not (option.type is float and isinstance(value, int)):
            msg = f"{where}: {value!r} is not a {option.type.__name__}"
            raise PluginError(msg)
    if (option.minimum is not None or option.maximum is not None) and option.type not in (int, float):
        msg = f"{where}: bounds are for int and float options"
        raise PluginError(msg)
    low = -float("inf") if option.minimum is None else option.minimum
    high = float("inf") if option.maximum is None else option.maximum
    if option.default is not None and option.type in (int, float) and not low <= option.default <= high:
        msg = f"{where}: the default {option.default!r} is outside its bounds [{low:g}, {high:g}]"
        raise PluginError(msg)
    if option.choices is not None and option.default is not None and option.default not in option.choices:
        msg = f"{where}: the default {option.default!r} is not one of its choices {list(option.choices)}"
        raise PluginError(msg)


__all__ = [
    "ENGINE_SETTINGS",
    "OPTION_TYPES",
    "PER_CHECKPOINT",
    "PER_PAIR",
    "PER_RUN",
    "Analyzer",
    "Option",
    "declared_options",
    "validate_analyzer",
    "validate_option",
]
