"""``ckpt train`` and ``ckpt demo``: training the sandboxes, and the embedded default."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from cli.analyze import _click_option, registry

TRAIN_OPTIONS = ("preset", "steps", "epochs", "every", "log_spaced", "seed", "device", "resume", "progress")


def _make_train_command(name: str, task: Any) -> click.Command:
    def callback(store: str, **values: Any) -> None:
        from sandboxes.base import train

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
        click.Option(["--progress/--no-progress"], default=True, show_default=True, help="Show a progress bar."),
    ]
    for key, option in task.option_spec().items():
        params.append(_click_option(key, option))
    return click.Command(name, callback=callback, params=params, help=task.description, short_help=task.description)


class TrainGroup(click.Group):
    """One subcommand per registered task."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # noqa: D102
        return sorted(registry().tasks)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:  # noqa: D102
        from sandboxes.base import Task

        tasks = registry().tasks
        if cmd_name not in tasks:
            msg = f"unknown task {cmd_name!r}; registered tasks: {', '.join(sorted(tasks)) or 'none'}"
            raise click.UsageError(msg, ctx)
        task = tasks[cmd_name]
        if not isinstance(task, Task):
            provider = registry().provider("tasks", cmd_name)
            msg = f"task {cmd_name!r} registered by {provider} is not a sandboxes.base.Task and cannot be trained"
            raise click.UsageError(msg, ctx)
        return _make_train_command(cmd_name, task)


@click.group("train", cls=TrainGroup)
def train_command() -> None:
    """Train a sandbox task and record the run: ckpt train TASK STORE [OPTIONS].

    Writes checkpoints, training metrics (train/test loss and accuracy), the
    evaluation data with its labels, and the model spec, through the public
    ckptstore writer.
    """


PLACES = ("1000s", "100s", "10s", "1s")


def _place_table(store: Any, result: Any) -> list[str]:
    import numpy as np

    data = store.data("eval")
    example, position = result["example"].values, result["position"].values
    place = data["place"].values[example, position]
    carry = data["carry"].values[example, position]
    losses = result["loss"].values
    steps = result["step"].values
    picks = sorted(set(np.linspace(0, len(steps) - 1, 8).round().astype(int).tolist()))
    header = f"  {'step':>7}  " + "  ".join(f"{p:>7}" for p in PLACES) + f"  {'carry':>7}  {'no carry':>8}"
    rows = [header]
    for i in picks:
        cells = [losses[i][place == k].mean() for k in range(4)]
        # the 1s digit never receives a carry: compare carry / no carry on the other places
        receives = place < 3
        with_carry = losses[i][receives & (carry == 1)].mean()
        without = losses[i][receives & (carry == 0)].mean()
        row = f"  {int(steps[i]):>7}  " + "  ".join(f"{c:7.3f}" for c in cells)
        rows.append(row + f"  {with_carry:7.3f}  {without:8.3f}")
    return rows


@click.command("demo")
@click.argument("directory", metavar="[DIR]", default="ckpt-demo", required=False)
@click.option("--preset", default="default", show_default=True, help="Preset of the addition task (paper: GPU).")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda", help="Torch device.")
def demo(directory: str, preset: str, device: str) -> None:
    """The embedded default: train 3-digit addition, analyze it, print what happened.

    Trains the `addition` sandbox into DIR/addition.zarr (reused if it is
    already there), computes the exact loss of every answer token at every
    checkpoint, and prints per-place loss curves. Offline; about 3-5 minutes
    on a 2-core CPU.
    """
    import ckptstore
    from plugins.engine import run
    from sandboxes.base import train

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "addition.zarr"
    started = time.perf_counter()
    if path.exists():
        click.echo(f"using the run already in {path} (delete it to train again)")
    else:
        click.echo(f"training the addition task ({preset} preset) into {path} ...")
        train(registry().tasks["addition"], str(path), preset=preset, device=device, progress=True)
    trained = time.perf_counter()
    click.echo("computing the exact loss of every answer token at every checkpoint ...")
    report = run("loss", str(path), registry=registry(), progress=True, device="cpu")
    store = ckptstore.open(path)
    final = store.metrics.isel(step=-1)
    click.echo("")
    click.echo(
        f"{len(store.steps)} checkpoints (steps {int(store.steps[0])}..{int(store.steps[-1])}); "
        f"final answer-token accuracy: train {float(final['train_accuracy']):.1%}, "
        f"test {float(final['test_accuracy']):.1%}"
    )
    click.echo("mean loss of the answer digits by place, and (1000s-10s) by whether a carry comes into that place:")
    for line in _place_table(store, report.dataset.load()):
        click.echo(line)
    click.echo("")
    click.echo(
        f"trained in {trained - started:.0f} s, analyzed in {time.perf_counter() - trained:.0f} s. "
        f"Next: ckpt info {path}; ckpt show {path} loss"
    )
