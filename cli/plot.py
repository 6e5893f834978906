"""``ckpt plot``, ``ckpt report`` and ``ckpt animate``: figures of stored results.

matplotlib is imported inside the commands, never at registration, so that ``ckpt --help`` and
commands that do not plot do not load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ckpt.cli.analyze import expand_stores, registry


def _check_writable(out: str) -> None:
    folder = Path(out).resolve().parent
    if not folder.is_dir():
        msg = f"cannot write {out}: folder {folder} does not exist; create it or choose another --out"
        raise click.UsageError(msg)


def _figure_formats() -> set[str]:
    from matplotlib.figure import Figure

    return set(Figure().canvas.get_supported_filetypes())


@click.command("plot")
@click.argument("stores", metavar="STORE...", nargs=-1, required=True)
@click.argument("name", metavar="NAME")
@click.option(
    "--out",
    metavar="FILE",
    help="Figure file; the format follows its extension (png, svg, pdf ...). Several figures are "
    "written as FILE's name plus -KEY. Default: NAME.png in the current folder.",
)
@click.option("--dpi", type=click.IntRange(min=10, max=1200), default=100, show_default=True, help="Raster resolution.")
@click.option(
    "--with-parent",
    is_flag=True,
    help="Draw STORE after the runs it was initialised from (ckpt train --init-from) as one trajectory: "
    "its step s is the parent's step + s. Each run needs a stored NAME computed alike, on the same data.",
)
def plot_command(stores: tuple[str, ...], name: str, out: str | None, dpi: int, with_parent: bool) -> None:
    """Write the figures of the stored result NAME of STORE.

    NAME is a stored result (ckpt info STORE lists them), drawn by the analyzer that
    computed it. With several stores, NAME must be embedding-geometry: one figure of the final
    grid imperfection against final accuracy, a point per run.
    """
    import ckpt.store as ckptstore
    from ckpt.analyzers.figures import save
    from ckpt.store.results import threads_unless_configured

    out = out or f"{name}.png"
    suffix = Path(out).suffix.lower().lstrip(".")
    formats = _figure_formats()
    if suffix not in formats:
        msg = f"cannot write a figure to {out!r}: use one of the extensions {', '.join(sorted(formats))}"
        raise click.UsageError(msg)
    _check_writable(out)
    paths = expand_stores(stores)
    if with_parent and len(paths) > 1:
        raise click.UsageError("--with-parent draws one store (and its parents): give one STORE")
    if len(paths) > 1:
        if name != "embedding-geometry":
            msg = f"several stores are compared for embedding-geometry only, not {name!r}: plot one store at a time"
            raise click.UsageError(msg)
        from ckpt.analyzers.figures.geometry import runs_figure

        with threads_unless_configured():
            save(runs_figure(paths), out, dpi)
        click.echo(f"wrote {out} ({len(paths)} runs)")
        return
    with threads_unless_configured():
        _plot_one(ckptstore.open(paths[0]), name, out, dpi, with_parent)


def _plot_one(store: Any, name: str, out: str, dpi: int, with_parent: bool) -> None:
    """The figures of the stored result ``name`` of one store, written beside ``out``."""
    from ckpt.analyzers.figures import save
    from ckpt.errors import CkptError, StepNotFoundError

    if with_parent:
        from ckpt.engine.lineage import join_lineage, stored_result

        result = join_lineage(store, name, stored_result(name))
    else:
        result = store.analysis(name)
    record = result.ckpt
    analyzers = registry().analyzers
    record.validate(name, store.path, analyzers)  # a store is data: checked before anything reads it
    analyzer_name = record.analyzer or name
    cls = analyzers.get(analyzer_name)
    if cls is None:
        msg = f"{name} was computed by analyzer {analyzer_name!r}, which is not installed here: install its plugin"
        raise CkptError(msg)
    try:
        figures = cls(**record.options).plot(result, store)
    except StepNotFoundError:
        if not with_parent:
            raise
        # figures that read the run's checkpoints cannot draw steps that live in a parent store
        msg = f"{analyzer_name}'s figures read STORE's checkpoints, so --with-parent cannot draw them: plot each run"
        raise CkptError(msg) from None
    if not figures:
        click.echo(f"analyzer {analyzer_name!r} draws no figures")
        return
    target = Path(out)
    for key, figure in figures.items():
        path = target if len(figures) == 1 else target.with_name(f"{target.stem}-{key}{target.suffix}")
        save(figure, str(path), dpi)
        click.echo(f"wrote {path}")


@click.command("report")
@click.argument("store", metavar="STORE")
@click.option(
    "--out", metavar="FILE", help="HTML file to write. Default: report.html beside STORE (a remote STORE: here)."
)
@click.option(
    "--no-trajectory",
    is_flag=True,
    help="Skip the distances between consecutive checkpoints (they read every checkpoint once); "
    "duplicated checkpoints are still named, from the commit record.",
)
def report_command(store: str, out: str | None, no_trajectory: bool) -> None:
    """Write one self-contained HTML report of STORE (it opens offline, with no server).

    The report holds the run's metadata and metrics, every stored result's summary, figures and
    provenance (stale results are marked), a step slider over the 2-D embeddings (above 256
    tokens, the most frequent ones: see ckpt animate), and the trajectory: the L2 distance
    between consecutive checkpoints and the cosine of consecutive updates, with duplicated and
    possibly mislabeled checkpoints marked and listed (as ckpt verify --trajectory names them).
    """
    from ckpt.analyzers.figures.report import write_report
    from ckpt.store.results import threads_unless_configured

    remote = "://" in store and not store.startswith("file://")
    out = out or ("report.html" if remote else str(Path(store).resolve().parent / "report.html"))
    _check_writable(out)
    with threads_unless_configured():
        problems = write_report(store, out, registry(), trajectory=not no_trajectory)
    for problem in problems:
        click.echo(f"Warning: {problem}", err=True)
    click.echo(f"wrote {out}")


@click.command("animate")
@click.argument("store", metavar="STORE")
@click.option("--out", metavar="FILE", help="A .gif (Pillow) or .mp4 (needs ffmpeg). Default: STORE's name + .gif.")
@click.option("--fps", type=click.IntRange(min=1, max=60), default=20, show_default=True, help="Frames per second.")
@click.option(
    "--frames",
    "limit",
    type=click.IntRange(min=2),
    default=200,
    show_default=True,
    help="At most this many checkpoints, evenly spread (first and last included).",
)
@click.option("--dpi", type=click.IntRange(min=10, max=600), default=80, show_default=True, help="Resolution.")
def animate_command(store: str, out: str | None, fps: int, limit: int, dpi: int) -> None:
    """Animate the 2-D token embeddings of STORE (and their pair sums) across checkpoints.

    Above 256 tokens (a language model's vocabulary), the 1,000 tokens most frequent in the
    store's eval data, on their two principal components, instead of pair sums. Beside them: the
    sequence embeddings when an embedding-geometry result holds them (sparse modular addition),
    and the loss curve with a marker at each frame's step.
    """
    import ckpt.store as ckptstore
    from ckpt.analyzers.figures.animation import animate
    from ckpt.store.results import threads_unless_configured

    out = out or str(Path(store).with_suffix(".gif").name)
    _check_writable(out)
    with threads_unless_configured():
        count = animate(ckptstore.open(store), out, fps=fps, limit=limit, dpi=dpi)
    click.echo(f"wrote {out} ({count} frames at {fps} fps)")


__all__ = ["animate_command", "plot_command", "report_command"]
