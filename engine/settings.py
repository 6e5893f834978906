"""The engine settings: one typed record, from which the command line, the signatures and the docs are made.

:class:`EngineSettings` names every keyword argument that :func:`ckpt.analyze` gives the
engine rather than the analyzer. Each field carries its default, its help text and how it
appears on the command line in its metadata (:func:`setting`); from the fields are derived

- ``ckpt.plugins.analyzer.ENGINE_SETTINGS``, the names no analyzer option may take;
- the options of every ``ckpt analyze NAME`` command (``ckpt.cli.analyze``);
- the signature and the Parameters section of :func:`ckpt.analyze` and
  :func:`ckpt.analyze_runs` (:func:`with_engine_settings`);

so that a new setting is declared once. :meth:`EngineSettings.resolve` checks the values
(one :class:`~ckpt.errors.AnalysisError` naming the setting) before anything runs.

This module imports neither dask nor torch: the command line builds its options from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ckpt.errors import AnalysisError

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.plugins.manager import Registry

SCHEDULERS = ("threads", "processes", "sync")
"""The local Dask schedulers ``scheduler`` may name."""

ADDRESS_PATTERN = r"(tcp|tls|inproc|ucx|ws|wss)://[^\s/]+/?|[^\s:/]+:\d+"
"""What ``address`` must look like: a ``distributed`` scheduler's address, checked before connecting."""

FOLLOW_OPTIONS = ("follow", "until_idle", "rerun_every")
"""Options ``ckpt analyze`` adds beyond the settings (:mod:`ckpt.engine.follow`): no analyzer option may take them."""


def setting(
    default: Any,
    help: str,  # noqa: A002 - the word click and argparse use
    *,
    kind: str,
    doc: str | None = None,
    cli: bool = True,
    flags: tuple[str, ...] = (),
    metavar: str | None = None,
    choices: tuple[str, ...] = (),
    minimum: int | None = None,
    negatable: bool = True,
    cli_default: Any = dataclasses.MISSING,
) -> Any:
    """A field of :class:`EngineSettings`: its default, and in its metadata how it is shown and documented.

    Parameters
    ----------
    default
        The default in Python.
    help
        One or two sentences: the ``--help`` text, and the Parameters entry unless ``doc`` is given.
    kind
        The type as the docs show it (``"str"``, ``"int or None"``).
    doc
        The Parameters entry, where Python callers need other words than the command line.
    cli
        Whether ``ckpt analyze`` has an option for it (objects such as a registry have none).
    flags
        The option's flags and parameter name (default: ``--name`` with dashes).
    metavar, choices, minimum
        How the command line shows and checks the value.
    negatable
        For a bool: ``--name/--no-name`` (True) or the flag ``--name`` alone.
    cli_default
        The command line's default where it differs from Python's (a progress bar in a terminal).
    """
    metadata = {
        "help": help,
        "doc": doc or help,
        "kind": kind,
        "cli": cli,
        "flags": flags,
        "metavar": metavar,
        "choices": choices,
        "minimum": minimum,
        "negatable": negatable,
        "cli_default": default if cli_default is dataclasses.MISSING else cli_default,
    }
    if isinstance(default, dict | list):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class EngineSettings:
    """How the engine runs one request: where it computes, how much memory it may take, what it keeps.

    Build one with keyword arguments (each is also a keyword of :func:`ckpt.analyze` and an
    option of ``ckpt analyze``), then :meth:`resolve` it; dependencies run with the same settings.
    """

    scheduler: str = setting(
        "threads",
        "Local Dask scheduler.",
        kind="str",
        doc='Local Dask scheduler: ``"threads"``, ``"processes"`` or ``"sync"``.',
        choices=SCHEDULERS,
    )
    address: str | None = setting(
        None,
        "Run on a running distributed scheduler.",
        kind="str or None",
        doc="Address of a running ``distributed`` scheduler (``tcp://HOST:PORT``) to run on.",
        metavar="TCP://HOST:PORT",
    )
    workers: int | None = setting(
        None,
        "Start a LocalCluster of N worker processes (or N local ones).",
        kind="int or None",
        doc="Start a ``LocalCluster`` of that many processes (threads or processes of ``scheduler`` otherwise).",
        minimum=1,
    )
    device: str = setting(
        "cpu",
        "Torch device of the workers.",
        kind="str",
        doc='Torch device of the workers: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"``.',
        metavar="cpu|cuda|auto",
    )
    force: bool = setting(False, "Recompute even when a stored result matches.", kind="bool", negatable=False)
    progress: bool = setting(False, "Show a progress bar.", kind="bool", cli_default=True)
    block_steps: int | None = setting(
        None,
        "Steps computed and committed together (default: blocks grown until one takes about 2 s, and one "
        "step more than are computed at once); an interrupted or killed run resumes after the last "
        "committed block.",
        kind="int or None",
        minimum=1,
    )
    max_memory: str | int | None = setting(
        None,
        "Memory the run may use on this machine, shared by its parallel tasks (e.g. 12GiB); analyzers size "
        "their blocks to it and say which knob to turn when even the smallest cannot fit. Default: 50% of "
        "the RAM available at the start (80% of free GPU memory with --device cuda).",
        kind="str, int or None",
        doc='Bytes, or a size such as ``"12GiB"``, the run may use on this machine, shared by its parallel '
        "tasks; analyzers size their blocks to it (default: a share of what is free, see "
        ":mod:`ckpt.engine.memory`).",
        metavar="SIZE",
    )
    storage_options: dict[str, Any] | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        None,
        "fsspec options of a remote store.",
        kind="dict or None",
        doc="fsspec options of a remote store (``s3://`` ...), passed to every open of it.",
        cli=False,
    )
    registry: Registry | None = setting(  # noqa: RUF009 - setting() makes a dataclasses.field
        None,
        "The plugin registry.",
        kind="Registry or None",
        doc="The plugin registry the analyzer and its dependencies are found in (default: the installed "
        "plugins', :func:`ckpt.plugins.manager.registry`).",
        cli=False,
    )
    save_as: str | None = setting(
        None,
        "Keep the result as analyses/NAME instead of analyses/ANALYZER, beside other results of the same "
        "analyzer (e.g. clusters on loss, fisher and polca).",
        kind="str or None",
        doc="Keep the result under ``analyses/<save_as>`` instead of ``analyses/<name>`` (e.g. several "
        "``clusters`` results side by side); reused by provenance like any other.",
        flags=("--as", "save_as"),
        metavar="NAME",
    )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names, in the order of the fields."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def split(cls, kwargs: Mapping[str, Any]) -> tuple[EngineSettings, dict[str, Any]]:
        """The engine settings among ``kwargs``, and the rest (the analyzer's options)."""
        names = set(cls.names())
        settings = cls(**{k: v for k, v in kwargs.items() if k in names})
        return settings, {k: v for k, v in kwargs.items() if k not in names}

    def resolve(self) -> EngineSettings:
        """These settings checked, with the device resolved and the memory budget in bytes.

        The one place the settings are validated, before anything runs, so that a wrong value is
        one line, not a traceback from inside a Dask task. Resolving resolved settings changes nothing.

        Raises
        ------
        AnalysisError
            A value that is not one the setting takes, naming the setting and what to pass.
        """
        from ckpt.engine.memory import default_budget, parse_size
        from ckpt.engine.worker import resolve_device

        if self.scheduler not in SCHEDULERS:
            msg = f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"
            raise AnalysisError(msg)
        if self.address is not None and not (
            isinstance(self.address, str) and re.fullmatch(ADDRESS_PATTERN, self.address)
        ):
            msg = f"--address must be a dask scheduler address such as tcp://HOST:PORT, got {self.address!r}"
            raise AnalysisError(msg)
        for name in ("workers", "block_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                msg = f"--{name.replace('_', '-')} must be a whole number of at least 1, got {value!r}"
                raise AnalysisError(msg)
        device = resolve_device(self.device)
        if self.max_memory is not None:
            budget: int | None = parse_size(self.max_memory)
        elif self.address is None:  # measured once, when the run starts, not in each worker after its model loaded
            budget = default_budget(device)
        else:  # each machine of a remote cluster resolves its own
            budget = None
        return dataclasses.replace(self, device=device, max_memory=budget)

    @property
    def budget(self) -> int | None:
        """The resolved memory budget in bytes (None: each remote machine resolves its own)."""
        return None if self.max_memory is None else int(self.max_memory)


ENGINE_FIELDS = dataclasses.fields(EngineSettings)
"""The fields of :class:`EngineSettings`, in order; their metadata is what :func:`setting` records."""


def engine_parameters() -> list[inspect.Parameter]:
    """The engine settings as keyword-only parameters, with their defaults and types."""
    parameters = []
    for f in ENGINE_FIELDS:
        default = f.default if f.default is not dataclasses.MISSING else None
        parameters.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.type))
    return parameters


def engine_parameters_doc(indent: str = "    ") -> str:
    """The numpydoc Parameters entries of the engine settings (``name : kind, default ...`` and its text)."""
    import textwrap

    entries = []
    for f in ENGINE_FIELDS:
        default = f.default if f.default is not dataclasses.MISSING else None
        text = textwrap.fill(f.metadata["doc"], 96, initial_indent=indent * 2, subsequent_indent=indent * 2)
        entries.append(f"{indent}{f.name} : {f.metadata['kind']}, default {default!r}\n{text}")
    return "\n".join(entries)


Function = TypeVar("Function", bound=Callable[..., Any])


def with_engine_settings(function: Function) -> Function:
    """Give ``function`` (``name, store, **kwargs``) the engine settings in its signature and docstring.

    The settings become keyword-only parameters before ``**options`` (what :func:`inspect.signature`,
    ``help()`` and a notebook's completion show), and ``{engine_settings}`` in the docstring becomes
    their numpydoc entries.
    """
    signature = inspect.signature(function)
    before = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD, annotation=Any)
    function.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*before, *engine_parameters(), options]
    )
    if function.__doc__:
        function.__doc__ = function.__doc__.replace("{engine_settings}", engine_parameters_doc().lstrip())
    return function


__all__ = [
    "ADDRESS_PATTERN",
    "ENGINE_FIELDS",
    "SCHEDULERS",
    "EngineSettings",
    "engine_parameters",
    "engine_parameters_doc",
    "setting",
    "with_engine_settings",
]
