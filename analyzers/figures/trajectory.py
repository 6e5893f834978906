"""The report's trajectory figure: distances and turns between consecutive checkpoints, findings marked.

The numbers are :mod:`ckpt.store.trajectory`'s: :func:`read_trajectory` feeds its
:class:`~ckpt.store.trajectory.DistanceAccumulator` as :func:`~ckpt.store.trajectory.trajectory_distances`
does, except that a tensor that cannot be read is recorded as lost (its distances unknown, drawn as
a gap) instead of ending the pass, as ``ckpt verify --trajectory`` does: one damaged chunk must not
cost the whole section. :func:`findings` words each flagged step as ``ckpt verify --trajectory``'s
table does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, new_figure, step_axis

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ckpt.store.trajectory import Duplicates, Trajectory

DUPLICATE_COLOR = COLORS[3]
MISLABELED_COLOR = COLORS[1]
NAMED = 12
"""Flagged steps whose numbers are written on the figure; more would overlap."""


def read_trajectory(store: Any) -> tuple[Trajectory, list[str]]:
    """Distances along ``store``'s checkpoints, and the tensors that could not be read (``tensor 'x' at step 4``).

    Every floating-point tensor of every checkpoint is read once, one tensor at a time (at most
    two checkpoints held). The first problem's error text follows its name.
    """
    from ckpt.store.trajectory import trajectory_distances

    lost: list[str] = []

    def unreadable(step: int, name: str, error: Exception) -> None:
        lost.append(f"tensor {name!r} at step {step}" + ("" if lost else f" ({error})"))

    return trajectory_distances(store, on_unreadable=unreadable), lost


def findings(duplicates: Duplicates, trajectory: Trajectory | None = None) -> list[tuple[int, str]]:
    """(step, what was found there) for every duplicated or possibly mislabeled checkpoint, by step.

    Duplicates come from the commit record; mislabeled steps only with ``trajectory``.
    """
    found: dict[int, list[str]] = {}
    final = duplicates.final
    for group in duplicates.groups:
        for step in group:
            others = [s for s in group if s != step]
            listed = ", ".join(map(str, others[:3])) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            text = (
                f"identical to the final checkpoint (step {final})"
                if final in group and step != final
                else f"identical to step {listed}"
            )
            found.setdefault(step, []).append(text)
    for partial in duplicates.partial:
        found.setdefault(partial.step, []).append(partial.describe(final).removeprefix(f"step {partial.step}: "))
    if trajectory is not None:
        ratio = dict(zip(trajectory.steps.tolist(), trajectory.ratio, strict=True))
        for step in trajectory.mislabeled:
            found.setdefault(step, []).append(
                f"possibly mislabeled (> {trajectory.k:g}x): {ratio[step]:.1f} x farther from both of its "
                "neighbours than they are from each other"
            )
    return [(step, "; ".join(texts)) for step, texts in sorted(found.items())]


def dense_early(steps: list[int]) -> bool:
    """Whether a run spanning decades of steps saved many checkpoints early (Pythia: 0, 1, 2, 4, ..., 512, 1000, ...).

    :func:`~ckpt.analyzers.figures.log_spaced` wants gaps growing all along; Pythia's are
    doubling for ten checkpoints, then constant for 143. On a linear axis those first ten
    (where the weights move most) overlap at 0: a symlog axis is used when at least 5% of the
    checkpoints (and 3) lie in the first 1% of the steps, five times what even spacing puts there.
    """
    positive = [s for s in steps if s > 0]
    if len(positive) < 4 or max(positive) < 100 * min(positive):
        return False
    first, last = min(steps), max(steps)
    early = sum(1 for s in steps if s <= first + 0.01 * (last - first))
    return early >= 3 and early >= 0.05 * len(steps)


def _steps(axes: Axes, steps: list[int]) -> None:
    step_axis(axes, steps)
    if axes.get_xscale() == "linear" and dense_early(steps):
        axes.set_xscale("symlog", linthresh=min(s for s in steps if s > 0))
    low, high = min(steps), max(steps)
    if axes.get_xscale() == "symlog":  # limits of its own: autoscaling a symlog axis reaches negative steps
        axes.set_xlim(low if low <= 0 else low / 1.3, high * 1.3)
    else:
        pad = 0.02 * (high - low) or 1
        axes.set_xlim(low - pad, high + pad)


def _log_when_spread(axes: Axes, values: np.ndarray) -> None:
    """Log y when the positive values span over two decades; zeros are drawn on the axis's bottom edge."""
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size and positive.max() / positive.min() > 100:
        axes.set_yscale("log")


def _zeros(axes: Axes, steps: np.ndarray, values: np.ndarray, label: str) -> None:
    """Mark zero values on the bottom edge (a log axis cannot show them; a linear one hides them on the line)."""
    at = steps[values == 0]
    if at.size:
        axes.scatter(
            at,
            np.zeros(at.size),
            transform=axes.get_xaxis_transform(),
            marker="v",
            s=30,
            color="black",
            label=label,
            clip_on=False,
            zorder=3,
        )


def _mark(axes: Axes, steps: list[int], color: str, style: str, label: str) -> None:
    width = 1.0 if len(steps) <= NAMED else 0.6  # dozens of lines (a suite serving final weights) make a band
    for index, step in enumerate(steps):
        axes.axvline(step, color=color, linestyle=style, linewidth=width, zorder=1, label=None if index else label)


def _name_steps(axes: Axes, steps: list[int]) -> None:
    """The flagged steps' numbers above the top panel, when at most :data:`NAMED` (the table lists them all)."""
    if len(steps) > NAMED:
        return
    for step in steps:
        axes.annotate(
            str(step),
            (step, 1.0),
            xycoords=axes.get_xaxis_transform(),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="x-small",
            color="#444",
        )


def figure(trajectory: Trajectory, duplicates: Duplicates) -> Figure:
    """Three panels over steps: distance to the previous checkpoint, cosine of consecutive updates, neighbour ratio.

    Duplicated steps are dashed orange lines, possibly mislabeled ones solid red lines with
    their points circled, in every panel; the ratio panel draws the threshold ``k``.
    """
    steps = trajectory.steps.astype(np.int64)
    shown = [int(s) for s in steps]
    copies = duplicates.steps
    flagged = trajectory.mislabeled
    where = {s: i for i, s in enumerate(shown)}
    drawn = new_figure(3, columns=1, width=11.0, height=2.6)
    distance, cosine, ratio = drawn.axes
    panels = (
        (distance, trajectory.distance, "L2 distance to the previous checkpoint"),
        (cosine, trajectory.cosine, "cosine of the updates into\nand out of the checkpoint"),
        (ratio, trajectory.ratio, "nearest neighbour's distance /\ndistance between the neighbours"),
    )
    for axes, values, label in panels:
        axes.plot(steps, values, color=COLORS[0], marker="o", markersize=3, linewidth=1.2)
        _mark(axes, flagged, MISLABELED_COLOR, "-", "possibly mislabeled")
        _mark(axes, copies, DUPLICATE_COLOR, "--", "duplicates another step")  # over red: both show
        if flagged:
            at = [where[s] for s in flagged]
            axes.scatter(
                steps[at], values[at], s=80, facecolors="none", edgecolors=MISLABELED_COLOR, linewidths=1.5, zorder=3
            )
        axes.set_ylabel(label, fontsize="small")
        _steps(axes, shown)
        if axes is not ratio:
            axes.set_xlabel("")
    _log_when_spread(distance, trajectory.distance)
    _zeros(distance, steps, trajectory.distance, "0: identical to the previous checkpoint")
    _name_steps(distance, sorted(set(copies) | set(flagged)))
    cosine.set_ylim(-1.05, 1.05)
    cosine.axhline(0, color="grey", linewidth=0.8)
    _log_when_spread(ratio, trajectory.ratio)
    ratio.axhline(trajectory.k, color=MISLABELED_COLOR, linestyle=":", linewidth=1, label=f"k = {trajectory.k:g}")
    # one legend for the marks (the same in every panel), one for the threshold: none covers the others' data
    if distance.get_legend_handles_labels()[0]:
        distance.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0), title="table below")
    ratio.legend(handles=ratio.get_lines()[-1:], fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    drawn.suptitle(
        f"trajectory: {len(shown)} checkpoints, L2 distances over {len(trajectory.tensors)} floating-point tensors"
    )
    return drawn


__all__ = ["dense_early", "figure", "findings", "read_trajectory"]
