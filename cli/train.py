"""``ckpt train``: training the sandboxes (task plugins) into a store."""

from __future__ import annotations

import time
from typing import Any

import click

from ckpt.cli.analyze import click_option, registry

TRAIN_OPTIONS = (
    "preset",
    "steps",
    "epochs",
    "every",
    "log_spaced",
    "seed",
    "device",
    "resume",
    "init_from",
    "progress",
)


def _make_train_command(name: str, task: Any) -> click.Command:
    def callback(store: str, **values: Any) -> None:
        from ckpt.sandboxes.base import train

        settings = {k: values.pop(k) for k in TRAIN_OPTIONS}
        started = time.perf_counter()
        result = train(task, store, **settings, **values)
        metrics = result.metrics.isel(step=-1)
        summary = ", ".join(f"{k} {float(metrics[k]):.4g}" for k in metrics.data_vars)
        click.echo(
            f"trained {name} ({settings['preset']}) in {time.perf_counter() - started:.0f} s: "
            f"{len(result.steps)} checkpoints in {store}; at step {int(result.steps[-1])}: {summary}"
        )

    presets = list(task.presets)
    params: list[click.Parameter] = [
        click.Argument(["store"], metavar="STORE"),
        click.Option(
            ["--preset"],
            type=click.Choice(presets),
            default="default",
            show_default=True,
            help="Named settings of the task.",
        ),
        click.Option(["--steps"], type=click.IntRange(min=1), help="Optimizer steps (default: the preset's)."),
        click.Option(["--epochs"], type=click.IntRange(min=1), help="Epochs instead of steps."),
        click.Option(["--every"], type=click.IntRange(min=1), help="Checkpoint every N steps (default: the preset's)."),
        click.Option(["--log-spaced"], is_flag=True, help="Add dense, log-spaced checkpoints early in the run."),
        click.Option(["--seed"], type=int, default=0, show_default=True, help="Seed of data, initialisation, order."),
        click.Option(["--device"], default="cpu", show_default=True, metavar="auto|cpu|cuda", help="Torch device."),
        click.Option(["--resume"], is_flag=True, help="Continue STORE from its last checkpoint."),
        click.Option(
            ["--init-from"],
            metavar="PARENT.zarr[@STEP]",
            help="Start from another run's checkpoint (its last by default) instead of a fresh initialisation: "
            "tensors copied by name, grown where the task allows; the optimizer starts fresh and the steps "
            "at 0. The parent is recorded in STORE (ckpt info shows it).",
        ),
        click.Option(["--progress/--no-progress"], default=True, show_default=True, help="Show a progress bar."),
    ]
    for key, option in task.option_spec().items():
        params.append(click_option(key, option))
    return click.Command(name, callback=callback, params=params, help=task.description, short_help=task.description)


class TrainGroup(click.Group):
    """One subcommand per registered task."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: D102
        return sorted(registry().tasks)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: D102
        from ckpt.errors import PluginError
        from ckpt.plugins.tasks import resolve_task

        tasks = registry().tasks
        if cmd_name not in tasks:
            msg = f"unknown task {cmd_name!r}; registered tasks: {', '.join(sorted(tasks)) or 'none'}"
            raise click.UsageError(msg, ctx)
        try:
            task = resolve_task(tasks[cmd_name])
        except PluginError as exc:
            provider = registry().provider("tasks", cmd_name)
            raise click.UsageError(f"{exc} (registered by {provider})", ctx) from None
        return _make_train_command(cmd_name, task)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the tasks by their registered descriptions, without importing them (torch)."""
        tasks = registry().tasks
        rows = [(name, getattr(tasks[name], "description", "") or "") for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group("train", cls=TrainGroup)
def train_command() -> None:
    """Train a sandbox task and record the run: ckpt train TASK STORE [OPTIONS].

    Writes checkpoints, training metrics (train/test loss and accuracy, and lr:
    the learning rate in force), the evaluation data with its labels, and the
    model spec, through the public ckpt.store writer.
    """


__all__ = ["TRAIN_OPTIONS", "TrainGroup", "train_command"]
