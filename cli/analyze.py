"""``ckpt analyze``, ``ckpt plugins`` and ``ckpt show``: running and reading analyzers.

``ckpt analyze`` is a group with one subcommand per registered analyzer, whose
options are generated from the analyzer's declared :class:`ckpt.plugins.Option` s.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from typing import Any

import click

_warned = False


def registry() -> Any:
    """The process's plugin registry (:func:`ckpt.plugins.manager.registry`); a broken plugin: one ``Warning:`` line."""
    global _warned
    from ckpt.plugins.manager import registry as shared_registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # printed below as one line each, once
        loaded = shared_registry()
    if not _warned:
        _warned = True
        for problem in loaded.problems:
            click.echo(f"Warning: {problem}", err=True)
    return loaded


_TYPES = {int: click.INT, float: click.FLOAT, str: click.STRING}


@contextlib.contextmanager
def ckpt_warnings_as_lines() -> Any:
    """Print each ckpt warning raised inside as one ``Warning:`` line on stderr, when raised and once."""
    from ckpt.errors import CkptWarning

    shown: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", CkptWarning)
        python_shows = warnings.showwarning

        def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if not issubclass(category, CkptWarning):
                python_shows(message, category, *args, **kwargs)
                return
            line = " ".join(str(message).split())
            if line not in shown:
                shown.add(line)
                click.echo(f"Warning: {line}", err=True)

        warnings.showwarning = show
        yield


def click_option(name: str, option: Any) -> click.Option:
    """The click option of an analyzer or task :class:`~ckpt.plugins.Option` (bounds and choices checked by click)."""
    flag = "--" + name.replace("_", "-")
    if option.type is bool:
        return click.Option(
            [f"{flag}/--no-{name.replace('_', '-')}"], default=bool(option.default), help=option.help, show_default=True
        )
    kind = click.Choice([str(c) for c in option.choices]) if option.choices else _TYPES.get(option.type, click.STRING)
    bounded = option.minimum is not None or option.maximum is not None
    if bounded and option.type in (int, float) and not option.choices:
        ranged = click.IntRange if option.type is int else click.FloatRange
        kind = ranged(min=option.minimum, max=option.maximum)
    short = [f"-{name}"] if len(name) == 1 else []  # -k as in the papers' notation
    return click.Option([*short, flag, name], type=kind, default=option.default, help=option.help, show_default=True)


def _engine_option(setting: Any) -> click.Option:
    """The click option of one engine setting (a field of :class:`ckpt.engine.settings.EngineSettings`)."""
    meta = setting.metadata
    flag = "--" + setting.name.replace("_", "-")
    declared = list(meta["flags"]) or [flag]
    shown: dict[str, Any] = {"help": meta["help"], "metavar": meta["metavar"]}
    default = meta["cli_default"]
    if meta["kind"] == "bool":
        if not meta["negatable"]:
            return click.Option(declared, is_flag=True, default=bool(default), help=meta["help"])
        declared = [f"{flag}/--no-{setting.name.replace('_', '-')}"]
        return click.Option(declared, default=bool(default), show_default=True, help=meta["help"])
    kind: click.ParamType = click.STRING
    if meta["choices"]:
        kind = click.Choice(list(meta["choices"]))
    elif meta["minimum"] is not None:
        kind = click.IntRange(min=meta["minimum"])
    return click.Option(declared, type=kind, default=default, show_default=default is not None, **shown)


def engine_options(leave_out: tuple[str, ...] = ()) -> list[click.Option]:
    """The engine settings' options but ``leave_out``, made from their one declaration, then ``--trust-factory``."""
    from ckpt.engine.settings import ENGINE_FIELDS

    chosen = [setting for setting in ENGINE_FIELDS if setting.metadata["cli"] and setting.name not in leave_out]
    return [
        *(_engine_option(setting) for setting in chosen),
        click.Option(
            ["--trust-factory"],
            multiple=True,
            metavar="PATTERN",
            help="Run the store's model factory although no installed package registers it as one: a "
            "module:function, a module or '*' (repeatable; also the setting CKPT_TRUSTED_FACTORIES).",
        ),
    ]


def expand_stores(patterns: tuple[str, ...]) -> list[str]:
    """Paths of the stores: each argument a path, or a quoted glob pattern (``'runs/wd*.zarr'``)."""
    import glob
    import os

    stores: list[str] = []
    for pattern in patterns:
        if os.path.exists(pattern) or not glob.has_magic(pattern):
            stores.append(pattern)
            continue
        matches = sorted(glob.glob(pattern))
        if not matches:
            msg = f"no store matches {pattern!r}"
            raise click.UsageError(msg)
        stores.extend(matches)
    return list(dict.fromkeys(stores))


def _make_command(name: str, analyzer: Any) -> click.Command:
    def callback(stores: tuple[str, ...], **values: Any) -> None:
        from ckpt.engine.runner import run
        from ckpt.engine.settings import FOLLOW_OPTIONS, EngineSettings  # no analyzer option takes these names
        from ckpt.store import allow

        allow(*values.pop("trust_factory"))
        following = {key: values.pop(key) for key in FOLLOW_OPTIONS}
        engine = {k: values.pop(k) for k in EngineSettings.names() if k in values}
        options = {k: v for k, v in values.items() if v is not None}
        if engine["address"] is not None:
            quiet_distributed()
        paths = expand_stores(stores)
        if following["follow"]:
            _follow(name, paths, following, engine, options)
            return
        if following["until_idle"] is not None or following["rerun_every"] is not None:
            flag = "--until-idle" if following["until_idle"] is not None else "--rerun-every"
            msg = f"{flag} is an option of --follow: add --follow to follow the run as it trains"
            raise click.UsageError(msg)
        for store in paths:
            with ckpt_warnings_as_lines():
                report = run(name, store, registry=registry(), **engine, **options)
            prefix = f"{store}: " if len(paths) > 1 else ""
            for dependency in report.dependencies:
                click.echo(prefix + _report_line(dependency))
            click.echo(prefix + _report_line(report))
            click.echo(f"{prefix}result: analyses/{report.name} in {store} (ckpt show {store} {report.name})")
        if len(paths) > 1:
            click.echo(
                f"{len(paths)} runs; in Python: ckpt.analyze_runs({name!r}, [...]) gives one Dataset with a run dim"
            )

    params: list[click.Parameter] = [click.Argument(["stores"], metavar="STORE...", nargs=-1, required=True)]
    params += [click_option(key, option) for key, option in analyzer.option_spec().items()]
    params += engine_options()
    params += _follow_options()
    requires = f"\n\nRequires: {', '.join(analyzer.requires)}." if analyzer.requires else ""
    return click.Command(
        name,
        callback=callback,
        params=params,
        help=f"{analyzer.description}{requires}",
        short_help=analyzer.description,
    )


def _follow_options() -> list[click.Option]:
    """``--follow`` and its two durations (options of the command, not engine settings of one run)."""
    return [
        click.Option(
            ["--follow"],
            is_flag=True,
            help="Keep computing as checkpoints are committed, until the writer closes the store, --until-idle "
            "passes or Ctrl-C (one line per step computed on stderr).",
        ),
        *duration_options(follow=True),
    ]


def duration_options(*, follow: bool = False) -> list[click.Option]:
    """``--until-idle`` and ``--rerun-every``: how a follower stops and reruns (``follow``: options of --follow)."""
    from ckpt.engine.waiting import DEFAULT_EVERY

    stop, recompute = ("With --follow: stop", "With --follow: recompute") if follow else ("Stop", "Recompute")
    return [
        click.Option(
            ["--until-idle"],
            metavar="DURATION",
            help=f"{stop} after this long without a new checkpoint (e.g. 30s, 10m, 1h).",
        ),
        click.Option(
            ["--rerun-every"],
            metavar="DURATION",
            help=f"{recompute} a per-run analyzer (clusters, loss-spikes ...) at most once per DURATION while "
            "checkpoints arrive, and once more at the end; hessian-basis (and polca with it) when a basis "
            f"checkpoint of its schedule is committed instead [default: {DEFAULT_EVERY:g}s].",
        ),
    ]


def quiet_distributed() -> None:
    """Silence the ``distributed`` client's loggers: a lost scheduler is the engine's one ``Error:`` line."""
    import logging

    import distributed  # noqa: F401 - importing it sets its loggers' levels from dask's config

    # a lost scheduler makes the client log on stderr ("Failed to reconnect", "Batched Comm
    # Closed" ...) before the engine's own Error: line, which says what happened
    for logger in ["distributed", *logging.root.manager.loggerDict]:
        if logger.startswith("distributed"):
            logging.getLogger(logger).setLevel(logging.CRITICAL)


def computed_lines(report: Any, loaded: Any, analyzer: str) -> None:
    """One line on stderr per step a run of ``analyzer`` (and its dependencies) computed; per-run: one line."""
    from ckpt.plugins import PER_RUN

    def per(name: str) -> str:
        return str(getattr(loaded.analyzers.get(name), "per", ""))

    done = [(sub, per(sub.name)) for sub in report.dependencies] + [(report, per(analyzer))]
    for ran, kind in done:
        steps = ran.computed_steps
        if steps and kind == PER_RUN:
            click.echo(f"{ran.name}: recomputed over {len(steps)} checkpoint(s) ({steps[0]} .. {steps[-1]})", err=True)
        elif steps:
            for step in steps:
                click.echo(f"{ran.name}: step {step} computed", err=True)


def _follow(name: str, paths: list[str], following: dict[str, Any], engine: dict[str, Any], options: Any) -> None:
    """``--follow``: one store, followed until it is finished or idle; a line on stderr per step computed."""
    from ckpt.engine.follow import follow
    from ckpt.engine.waiting import DEFAULT_EVERY

    if len(paths) != 1:
        msg = f"--follow follows one store, got {len(paths)}: start one follower per store"
        raise click.UsageError(msg)
    loaded = registry()
    store = paths[0]

    def show(report: Any) -> None:
        computed_lines(report, loaded, name)

    every = following["rerun_every"] if following["rerun_every"] is not None else DEFAULT_EVERY
    with ckpt_warnings_as_lines():
        followed = follow(
            name,
            store,
            until_idle=following["until_idle"],
            rerun_every=every,
            on_report=show,
            registry=loaded,
            **engine,
            **options,
        )
    why = "the run is finished" if followed.stopped == "finished" else f"idle for {following['until_idle']}"
    click.echo(f"{followed.name}: followed {store} until {why}; computed {len(followed.computed_steps)} step(s)")
    click.echo(f"result: analyses/{followed.name} in {store} (ckpt show {store} {followed.name})")


def _report_line(report: Any) -> str:
    computed, reused = report.computed_steps, report.reused_steps
    line = f"{report.name}: computed {len(computed)} step(s), reused {len(reused)} stored"
    if report.resumed:
        line += f"; resumed {len(report.resumed)} step(s) of an interrupted run"
    return line


class AnalyzeGroup(click.Group):
    """One subcommand per registered analyzer."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: D102
        return sorted(registry().analyzers)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: D102
        analyzers = registry().analyzers
        if cmd_name not in analyzers:
            known = ", ".join(sorted(analyzers)) or "none"
            msg = f"unknown analyzer {cmd_name!r}; registered analyzers: {known} (see `ckpt plugins`)"
            from ckpt.cli.main import EXIT_USAGE

            error = click.ClickException(msg)  # the same words as ckpt.analyze's, with the usage exit status
            error.exit_code = EXIT_USAGE
            raise error
        return _make_command(cmd_name, analyzers[cmd_name])


@click.group("analyze", cls=AnalyzeGroup)
def analyze() -> None:
    """Run an analyzer over a store: ckpt analyze NAME STORE... [OPTIONS].

    Results are saved in STORE under analyses/NAME (or the name given with
    --as); a rerun reuses them and computes only new checkpoints. Several stores (or a quoted glob such as
    'runs/*.zarr') are analyzed one after the other, each keeping its result.
    """


@click.command("plugins")
def plugins_command() -> None:
    """List the analyzers, objectives, importers and tasks, with the package providing each."""
    reg = registry()
    kinds = ("analyzers", "objectives", "importers", "tasks")
    rows = {kind: [(name, reg.provider(kind, name)) for name in sorted(getattr(reg, kind))] for kind in kinds}
    # columns as wide as their longest entry (a long package name pushed the descriptions out of line)
    names = max((len(name) for entries in rows.values() for name, _ in entries), default=0)
    providers = max((len(f"{p.package} {p.version}") for entries in rows.values() for _, p in entries), default=0)
    for kind in kinds:
        click.echo(f"{kind}:")
        if not rows[kind]:
            click.echo("  (none)")
        for name, provider in rows[kind]:
            description = getattr(getattr(reg, kind)[name], "description", "") or ""
            source = f"{provider.package} {provider.version}"
            click.echo(f"  {name:<{names}}  {source:<{providers}}  {description}")


@click.command("show")
@click.argument("store", metavar="STORE")
@click.argument("name", metavar="NAME")
def show(store: str, name: str) -> None:
    """Summarize a stored analysis result: provenance and the analyzer's own summary."""
    import ckpt.store as ckptstore
    from ckpt.errors import AnalysisError, CkptError
    from ckpt.plugins import Analyzer
    from ckpt.store.results import load_result

    result = ckptstore.open(store).analysis(name)
    record = result.ckpt
    analyzers = registry().analyzers
    record.validate(name, store, analyzers)  # a store is data: checked before anything reads it
    steps = record.steps
    analyzer_name = record.analyzer or name
    cls = analyzers.get(analyzer_name)
    summarizer = Analyzer()  # generic: shape and range of every variable
    if cls is not None:
        # the analyzer as it was run, so that its summary may read its options
        with contextlib.suppress(CkptError):  # options of another version: keep the generic summary
            summarizer = cls(**record.options)
    try:
        summary = summarizer.summarize(load_result(result))
    except CkptError:
        raise
    except Exception as exc:  # a summary reads what its analyzer writes: a result holding other data fails it
        kept_as = "" if name == analyzer_name else f" --as {name}"
        msg = (
            f"the {analyzer_name} summary of analysis {name!r} failed ({type(exc).__name__}: {exc}): the result "
            f"does not hold what {analyzer_name} writes (edited by hand?); recompute it "
            f"(ckpt analyze {analyzer_name} {store}{kept_as} --force) or remove it (ckpt rm {store} {name})"
        )
        raise AnalysisError(msg) from None
    click.echo(f"{name} in {store}")
    click.echo(f"  analyzer     {analyzer_name} v{record.version or '?'}")
    click.echo(f"  options      {json.dumps(record.options)}")
    span = f"{len(steps)} ({steps[0]} .. {steps[-1]})" if steps else "-"
    click.echo(f"  steps        {span}")
    click.echo(f"  computed     {record.created or '?'} by {record.computed_by or 'ckpt ?'}")
    click.echo(summary)


@click.command("rm")
@click.argument("store", metavar="STORE")
@click.argument("name", metavar="NAME")
def rm_command(store: str, name: str) -> None:
    """Delete the stored result NAME (analyses/NAME) from STORE.

    The result leaves the commit record first (readers stop seeing it), then its
    files go. Refused while another process computes it. Also the way to clear a
    result whose files were deleted by hand.
    """
    from ckpt.store.results import delete_analysis

    delete_analysis(store, name)
    click.echo(f"removed analyses/{name} from {store}")


__all__ = [
    "AnalyzeGroup",
    "analyze",
    "ckpt_warnings_as_lines",
    "click_option",
    "computed_lines",
    "duration_options",
    "engine_options",
    "expand_stores",
    "plugins_command",
    "quiet_distributed",
    "registry",
    "rm_command",
    "show",
]
