"""Figures of ``essential-dynamics``, in the style of Hoogland et al. (2024) and devinterp's plots.

- ``path``: the smoothed path of the checkpoints in each pair of the leading components (PC1-PC2,
  PC1-PC3, PC2-PC3 as small multiples), coloured by step with a colourbar, the unsmoothed scores
  as grey dots behind it, turning points marked and labelled by step;
- ``components``: each component's score over steps, stage boundaries (turning points) as
  vertical lines, the turning angle against its threshold, and, when the store holds an ``llc``
  result, λ̂ over steps with its plateaus (:func:`ckpt.analyzers.essential_dynamics.llc_boundaries`);
- ``variance``: the explained variance ratio of each component, and their running total.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, log_spaced, new_figure, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TURN_COLOR = COLORS[1]
LLC_COLOR = COLORS[4]
LABELLED = 12
"""Turning points whose steps are written on the path; more would overlap."""


def figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``path``, ``components`` and ``variance`` of a stored result."""
    data = {
        "steps": np.asarray(result["step"].values, dtype=np.int64),
        "raw": np.asarray(result["projection"].values, dtype=np.float64),
        "path": np.asarray(result["smoothed"].values, dtype=np.float64),
        "ratio": np.asarray(result["explained_variance_ratio"].values, dtype=np.float64),
        "turning": np.asarray(result["turning_point"].values, dtype=bool),
        "angle": np.asarray(result["turning_angle"].values, dtype=np.float64),
        "extremum": np.asarray(result["extremum"].values, dtype=bool),
    }
    probe = result["projection"].attrs
    what = f"{probe.get('outputs', 'outputs')} of {probe.get('probe_examples', '?')} examples"
    sigma = float(result["smoothed"].attrs.get("smoothing_sigma", np.nan))
    threshold = float(result.ckpt.option("turn_angle", 45.0))
    return {
        "path": path_figure(data, f"essential dynamics: {what}, σ = {sigma:.3g} checkpoints"),
        "components": components_figure(data, threshold, llc_curve(store)),
        "variance": variance_figure(data["ratio"], what),
    }


def llc_curve(store: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, λ̂) of the store's ``llc`` result, when it holds one with finite values; else None."""
    try:
        if store is None or "llc" not in store.analyses:
            return None
        stored = store.analysis("llc")
        values = np.asarray(stored["llc"].values, dtype=np.float64)
        steps = np.asarray(stored["step"].values, dtype=np.int64)
    except (KeyError, ValueError, OSError):  # another analyzer's layout, or unreadable: drawn without it
        return None
    if values.ndim != 1 or len(values) != len(steps) or not np.isfinite(values).any():
        return None
    return steps, values


def _pc_label(ratio: np.ndarray, index: int) -> str:
    return f"PC{index + 1} ({ratio[index]:.1%})"


def _colour_norm(steps: np.ndarray) -> Any:
    from matplotlib.colors import Normalize, SymLogNorm

    low, high = float(steps.min()), float(max(steps.max(), steps.min() + 1))
    if log_spaced(list(steps)):
        first = float(min((s for s in steps if s > 0), default=1))
        return SymLogNorm(linthresh=first, vmin=low, vmax=high)
    return Normalize(vmin=low, vmax=high)


def path_figure(data: dict[str, np.ndarray], title: str) -> Figure:
    """The smoothed path in each pair of the first three components, coloured by step."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.collections import LineCollection

    steps, raw, path, ratio = data["steps"], data["raw"], data["path"], data["ratio"]
    count = min(3, path.shape[1])
    pairs = list(itertools.combinations(range(count), 2)) or [(0, -1)]
    figure = new_figure(len(pairs), width=4.4 if len(pairs) > 1 else 6.0, height=4.0)  # one panel: room for the title
    norm = _colour_norm(steps)
    cmap = "viridis"
    for axes, (i, j) in zip(figure.axes, pairs, strict=True):
        if j < 0:  # one component: its score over steps stands for the path
            x, y, xr_, yr_ = steps.astype(np.float64), path[:, 0], steps.astype(np.float64), raw[:, 0]
            axes.set_xlabel("training step")
            axes.set_ylabel(_pc_label(ratio, 0))
        else:
            x, y, xr_, yr_ = path[:, i], path[:, j], raw[:, i], raw[:, j]
            axes.set_xlabel(_pc_label(ratio, i))
            axes.set_ylabel(_pc_label(ratio, j))
        axes.scatter(xr_, yr_, s=8, color="0.75", zorder=1, linewidths=0)
        points = np.column_stack([x, y])
        segments = np.stack([points[:-1], points[1:]], axis=1)
        lines = LineCollection(segments, cmap=cmap, norm=norm, linewidths=2.2, zorder=2)
        lines.set_array((steps[:-1] + steps[1:]) / 2)
        axes.add_collection(lines)
        axes.scatter(x[:1], y[:1], marker="o", s=36, color="black", zorder=4, label=f"step {steps[0]}")
        axes.scatter(x[-1:], y[-1:], marker="s", s=36, color="black", zorder=4, label=f"step {steps[-1]}")
        _mark_turns(axes, x, y, steps, data["turning"])
        axes.autoscale_view()
        axes.margins(0.08)
        axes.grid(alpha=0.3)
    handles, labels = figure.axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8, frameon=False)
    bar = figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=figure.axes, shrink=0.9, pad=0.02)
    bar.set_label("training step")
    figure.suptitle(title, fontsize=10)
    return figure


def _mark_turns(axes: Axes, x: np.ndarray, y: np.ndarray, steps: np.ndarray, turning: np.ndarray) -> None:
    """Red triangles at the turning points; the first :data:`LABELLED` labelled by step."""
    marked = np.flatnonzero(turning)
    if not marked.size:
        return
    axes.scatter(
        x[marked], y[marked], marker="^", s=60, color=TURN_COLOR, edgecolor="white", zorder=5, label="turning point"
    )
    # turning points drawn within a few percent of the panel of each other share one label
    points = np.column_stack([x, y])
    span = np.ptp(points, axis=0)
    span[span <= 0] = 1.0
    groups: list[list[int]] = []
    for index in marked[:LABELLED]:
        near = [g for g in groups if np.all(np.abs(points[index] - points[g[0]]) < 0.05 * span)]
        if near:
            near[0].append(index)
        else:
            groups.append([index])
    for group in groups:
        text = ", ".join(str(int(steps[i])) for i in group)
        axes.annotate(
            text, points[group[0]], xytext=(5, 5), textcoords="offset points", fontsize=8, color=TURN_COLOR, zorder=6
        )


def _boundaries(axes: Axes, steps: np.ndarray, turning: np.ndarray, label: str | None = None) -> None:
    """Dashed vertical lines at the turning points; the first one named ``label`` in a legend."""
    for index, step in enumerate(steps[turning]):
        axes.axvline(step, color=TURN_COLOR, linestyle="--", linewidth=1, alpha=0.8, label=None if index else label)


def components_figure(
    data: dict[str, np.ndarray], threshold: float, llc: tuple[np.ndarray, np.ndarray] | None
) -> Figure:
    """Each component over steps with stage boundaries; the turning angle; λ̂ and its plateaus when stored."""
    from ckpt.analyzers.essential_dynamics import llc_boundaries

    steps, raw, path, ratio, turning = data["steps"], data["raw"], data["path"], data["ratio"], data["turning"]
    count = path.shape[1]
    panels = count + 1 + (llc is not None)
    figure = new_figure(panels, columns=2 if panels == 4 else min(3, panels))
    for index in range(count):
        axes = figure.axes[index]
        axes.plot(steps, raw[:, index], color="0.7", linewidth=1, label="score")
        axes.plot(steps, path[:, index], color=COLORS[0], linewidth=1.8, label="smoothed")
        where = data["extremum"][:, index]
        axes.scatter(steps[where], path[where, index], s=14, color=COLORS[3], zorder=3, label="extremum")
        _boundaries(axes, steps, turning)
        axes.set_ylabel(_pc_label(ratio, index))
        axes.set_title(f"PC{index + 1}", fontsize=10)
        step_axis(axes, steps)
        axes.grid(alpha=0.3)
        if index == 0:
            axes.legend(fontsize=7, frameon=False)
    axes = figure.axes[count]
    axes.plot(steps, data["angle"], color=COLORS[2], linewidth=1.5)
    axes.axhline(threshold, color="0.4", linestyle=":", linewidth=1, label=f"threshold {threshold:g}°")
    if turning.any():
        angles = data["angle"][turning]
        axes.scatter(steps[turning], angles, marker="^", color=TURN_COLOR, zorder=3, label="turning point")
    _boundaries(axes, steps, turning)
    axes.set_ylim(0, 180)
    axes.set_ylabel("turning angle (degrees)")
    axes.set_title("turning angle (gaps: path at rest)", fontsize=10)
    axes.legend(fontsize=7, frameon=False)
    step_axis(axes, steps)
    axes.grid(alpha=0.3)
    if llc is not None:
        llc_steps, values = llc
        axes = figure.axes[count + 1]
        axes.plot(llc_steps, values, color=LLC_COLOR, linewidth=1.8, marker=".", markersize=4)
        plateau, boundary = llc_boundaries(llc_steps, values)
        for index, step in enumerate(llc_steps[boundary]):
            label = "LLC boundary" if index == 0 else None
            axes.axvline(step, color=LLC_COLOR, linestyle="--", linewidth=1.2, label=label)
        axes.scatter(llc_steps[plateau], values[plateau], s=10, color="0.4", zorder=3, label="plateau")
        _boundaries(axes, steps, turning, "turning point")
        axes.set_ylabel("LLC λ̂")
        axes.set_title("LLC (stored llc result) and its plateaus", fontsize=10)
        axes.legend(fontsize=7, frameon=False)
        step_axis(axes, llc_steps)
        axes.grid(alpha=0.3)
    figure.suptitle("principal components over training; dashed: turning points (stage boundaries)", fontsize=10)
    return figure


def variance_figure(ratio: np.ndarray, what: str) -> Figure:
    """Explained variance ratio per component (bars) and cumulative (line)."""
    figure = new_figure(1, width=max(3.5, 0.6 * len(ratio) + 2.5))
    axes = figure.axes[0]
    labels = [f"PC{i + 1}" for i in range(len(ratio))]
    bars = axes.bar(labels, ratio, color=COLORS[0])
    for bar, value in zip(bars, ratio, strict=True):  # inside a tall bar, clear of the cumulative line
        inside = value > 0.15
        axes.annotate(
            f"{value:.1%}",
            (bar.get_x() + bar.get_width() / 2, value / 2 if inside else value),
            xytext=(0, 0 if inside else 2),
            textcoords="offset points",
            ha="center",
            va="center" if inside else "bottom",
            fontsize=8,
            color="white" if inside else "black",
        )
    axes.plot(labels, np.cumsum(ratio), color=COLORS[1], marker="o", markersize=4, label="cumulative")
    axes.set_ylim(0, 1.08)
    axes.set_ylabel("explained variance ratio")
    axes.set_title(f"variance explained ({what})", fontsize=10)
    axes.legend(fontsize=7, frameon=False, loc="center right")
    axes.grid(alpha=0.3, axis="y")
    return figure


__all__ = ["components_figure", "figures", "llc_curve", "path_figure", "variance_figure"]
