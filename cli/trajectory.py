"""Printing the trajectory checks of :mod:`ckpt.store.trajectory` for ``import``, ``info`` and ``verify``."""

from __future__ import annotations

import math
from typing import Any

import click


def warn_duplicates(store: Any, where: str | None = None) -> Any:
    """Print one ``Warning:`` line naming the duplicated checkpoints of open ``store``; return the finding.

    From the commit record alone: no tensor is read.
    """
    from ckpt.store.trajectory import duplicate_steps

    found = duplicate_steps(store)
    message = found.message(where or store.path)
    if message is not None:
        click.echo(f"Warning: {message}", err=True)
    return found


def warn_mislabeled(trajectory: Any, where: str) -> None:
    """Print one ``Warning:`` line naming the possibly mislabeled checkpoints, if any."""
    message = trajectory.message(where)
    if message is not None:
        click.echo(f"Warning: {message}", err=True)


def trajectory_table(trajectory: Any, duplicates: Any) -> list[str]:
    """The lines ``ckpt verify --trajectory`` prints: one row per step, then what was flagged."""

    def cell(value: float, width: int, spec: str) -> str:
        return format(value, f"{width}{spec}") if math.isfinite(value) else "-".rjust(width)

    named = {}
    for group in duplicates.groups:
        final = duplicates.final in group
        for step in group:
            others = [str(s) for s in group if s != step]
            listed = ", ".join(others) if len(others) <= 3 else f"{', '.join(others[:3])} and {len(others) - 3} more"
            last = final and step != duplicates.final
            named[step] = "identical to the final checkpoint" if last else f"identical to step {listed}"
    for pair in duplicates.partial:
        shared = f"{len(pair.tensors)} of {pair.changing} tensors identical to step"
        named.setdefault(pair.step, f"{shared} {pair.source}")
        named.setdefault(pair.source, f"{shared} {pair.step}")
    flagged = set(trajectory.mislabeled)
    ratio = trajectory.ratio
    lines = [
        f"trajectory: {len(trajectory.steps)} checkpoints, L2 distances over {len(trajectory.tensors)} "
        "floating-point tensors",
        f"  {'step':>10}  {'distance':>10}  {'cosine':>7}  {'ratio':>6}  flags",
    ]
    for i, step in enumerate(trajectory.steps.tolist()):
        flags = [named[step]] if step in named else []
        if step in flagged:
            flags.append(f"possibly mislabeled (> {trajectory.k:g}x)")
        row = (
            f"  {step:>10}  {cell(trajectory.distance[i], 10, '.4g')}  {cell(trajectory.cosine[i], 7, '.3f')}  "
            f"{cell(ratio[i], 6, '.2f')}  {'; '.join(flags)}"
        )
        lines.append(row.rstrip())
    lines.append(
        "  distance: to the previous checkpoint; cosine: between the updates into and out of the checkpoint; "
        f"ratio: min(distance to either neighbour) / distance between the neighbours (> {trajectory.k:g}, "
        "the neighbours' <= 1: possibly mislabeled)"
    )
    return lines


__all__ = ["trajectory_table", "warn_duplicates", "warn_mislabeled"]
