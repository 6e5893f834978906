"""``ckpt watch STORE [NAME ...]``: several analyzers followed in one process, each checkpoint read once."""

from __future__ import annotations

from typing import Any

import click

from ckpt.cli.analyze import (
    ckpt_warnings_as_lines,
    computed_lines,
    duration_options,
    engine_options,
    quiet_distributed,
    registry,
)

HELP = """Follow a run as it trains with several analyzers, reading each new checkpoint once for all.

Computes what is there, then each checkpoint as it is committed, for every analyzer NAME, until the
writer closes the store, --until-idle passes or Ctrl-C (committed work is kept); one line per step
computed on stderr. Each new checkpoint is read from STORE once and its tensors handed to every
analyzer (with the threads or sync scheduler; worker processes read their own); each result is the
one `ckpt analyze NAME STORE` computes.

Without NAME: every registered analyzer that grows by one row per checkpoint and requires no other
result (no basis): loss, grad-norms, sparsity ... (see `ckpt plugins`); those whose first run
refuses the store (a model without attention for attention) are left out, saying why. A named
analyzer requiring a result over the whole run (a basis: polca, fisher, clusters) is refused while
STORE holds none; follow it with `ckpt analyze NAME STORE --follow`. Each analyzer runs with the
options of its stored result, or its defaults.
"""


def _callback(store: str, names: tuple[str, ...], **values: Any) -> None:
    from ckpt.engine.waiting import DEFAULT_EVERY
    from ckpt.engine.watch import watch
    from ckpt.store import allow

    allow(*values.pop("trust_factory"))
    until_idle, rerun_every = values.pop("until_idle"), values.pop("rerun_every")
    if values["address"] is not None:
        quiet_distributed()
    loaded = registry()

    def show(report: Any) -> None:
        computed_lines(report, loaded, report.name)

    with ckpt_warnings_as_lines():
        watched = watch(
            store,
            names,
            until_idle=until_idle,
            rerun_every=rerun_every if rerun_every is not None else DEFAULT_EVERY,
            on_report=show,
            registry=loaded,
            **values,
        )
    for name, why in watched.left_out.items():
        click.echo(f"{name}: not watched: {' '.join(why.split())}", err=True)
    for name, followed in watched.reports.items():
        click.echo(f"{name}: computed {len(followed.computed_steps)} step(s)")
    why = "the run is finished" if watched.stopped == "finished" else f"idle for {until_idle}"
    count = len(watched.reports)
    reads = f"read {watched.reads} checkpoint(s) once for {count} analyzer(s)"
    if not watched.reads:  # all reused, or worker processes that read the store themselves
        reads = f"no checkpoint read in this process for {count} analyzer(s)"
    click.echo(f"watched {store} until {why}; {reads}")
    shown = ", ".join(f"analyses/{name}" for name in watched.reports)
    click.echo(f"results: {shown} in {store} (ckpt show {store} NAME)")


watch_command = click.Command(
    "watch",
    callback=_callback,
    params=[
        click.Argument(["store"], metavar="STORE"),
        click.Argument(["names"], metavar="[NAME]...", nargs=-1),
        *duration_options(),
        *engine_options(leave_out=("save_as",)),
    ],
    help=HELP,
    short_help="Follow a run with several analyzers, reading each new checkpoint once.",
)


__all__ = ["watch_command"]
