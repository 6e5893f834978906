"""Figures of the bases and of what is projected on them (hessian-basis, random-basis, polca, fisher, lca)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, hide_unused, limited, new_figure, positive_log, quartile_band, step_axis
from ckpt.numerics.basis_format import FOUND_AT

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


def basis_figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``eigenvalues``: each vector's eigenvalue (of P H P) and residual against the step it was found at.

    A basis without eigenvalues (``random-basis``) gets one panel: how many vectors each checkpoint added.
    """
    found = np.asarray(result[FOUND_AT].values)
    steps = [int(s) for s in store.steps]
    if "eigenvalue" not in result:
        figure = new_figure(1)
        axes = figure.axes[0]
        at, counts = np.unique(found, return_counts=True)
        axes.bar(at, counts, width=max(1.0, (max(steps) - min(steps)) / 80), color=COLORS[0])
        step_axis(axes, steps, "checkpoint the vector belongs to")
        axes.set_ylabel("vectors")
        axes.set_title(f"{len(found)} basis vectors")
        return {"vectors": figure}
    eigenvalue = np.asarray(result["eigenvalue"].values, dtype=np.float64)
    residual = np.asarray(result["residual"].values, dtype=np.float64)
    figure = new_figure(2)
    left, right = figure.axes
    left.scatter(found, eigenvalue, color=COLORS[0], zorder=3)
    for index, (x, y) in enumerate(zip(found, eigenvalue, strict=True)):
        left.annotate(str(index), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    left.set_ylabel("eigenvalue of P H P")
    left.set_title("eigenvalue of each basis vector (its index beside it)")
    positive_log(left, eigenvalue)
    right.scatter(found, residual, color=COLORS[1], zorder=3)
    right.set_ylabel("residual ‖P H P v − λ v‖")
    right.set_title("residual of each eigenpair")
    positive_log(right, residual)
    for axes in figure.axes:
        step_axis(axes, steps, "step the vector was found at")
    return {"eigenvalues": figure}


def projected_figures(
    result: xr.Dataset, store: Any, variable: str, title: str, *, per_pair: str | None = None
) -> dict[str, Figure]:
    """``trajectories``: median and quartiles over datapoints of ``variable`` per basis vector.

    One panel per basis vector (or parameter, for ``lca``), with a dashed line at the step it
    was found (the paper's Fig. 4 draws the same line). A per-pair result is drawn as eq. 10
    reads it, at every checkpoint from L(θ_0) = 0 (:func:`ckpt.analyzers.trajectories.from_origin`):
    ``per_pair="running"`` for a stored running sum (``projected_loss``), ``"sum"`` for
    per-transition allocations summed here (``lca``).
    """
    from ckpt.analyzers.trajectories import from_origin

    values = result[variable]
    (vectors,) = [d for d in values.dims if d not in ("step", "datapoint")]
    steps = result["step"].values
    if per_pair is not None:  # rows at each pair's first step hold L(θ_(i+1)): redraw them from θ_0
        steps = np.asarray(store.steps)[: len(steps) + 1]
    shown, note = limited(range(values.sizes[vectors]), f"{vectors} entries")
    figure = new_figure(len(shown), columns=4, width=3.4, height=2.6)
    found = result[FOUND_AT].values if FOUND_AT in result.coords else None
    for axes, index in zip(figure.axes, shown, strict=False):
        trajectory = np.asarray(values.isel({vectors: index}).transpose("step", "datapoint").values, dtype=np.float64)
        if per_pair is not None:
            trajectory = from_origin(trajectory, cumulative=per_pair == "sum")
        quartile_band(axes, steps, trajectory, COLORS[0], "median, 25-75%")
        axes.plot(steps, np.nanmean(trajectory, axis=1), color="black", linewidth=1, label="mean")
        axes.axhline(0, color="grey", linewidth=0.5)
        heading = f"{vectors} {index}"
        if found is not None:
            axes.axvline(found[index], color=COLORS[1], linestyle="--", linewidth=1, label="found at")
            heading += f" (found at {int(found[index])})"
        axes.set_title(heading, fontsize="medium")
        axes.set_ylabel(variable.replace("_", " "))
        step_axis(axes, steps)
    hide_unused(figure, len(shown))
    figure.axes[0].legend(fontsize="small")
    figure.suptitle(title + note)
    return {"trajectories": figure}


def polca_figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``trajectories``: projected loss (eq. 10) per basis vector; ``explained``: the loss change and what is not."""
    figures = projected_figures(
        result, store, "projected_loss", "projected loss L_b (eq. 10) per basis vector", per_pair="running"
    )
    steps = result["step"].values
    change = np.abs(np.asarray(result["loss_change"].values, dtype=np.float64))
    unexplained = np.abs(np.asarray(result["unexplained"].values, dtype=np.float64))
    figure = new_figure(1, width=7.0)
    axes = figure.axes[0]
    axes.plot(steps, np.nanmean(change, axis=1), color=COLORS[0], label="mean |loss change|")
    axes.plot(steps, np.nanmean(unexplained, axis=1), color=COLORS[1], label="mean |unexplained|")
    step_axis(axes, steps, "first step of the pair")
    positive_log(axes, np.concatenate([np.nanmean(change, axis=1), np.nanmean(unexplained, axis=1)]))
    axes.set_ylabel("per datapoint")
    axes.set_title("loss change per pair of checkpoints, and what the basis leaves unexplained", fontsize="medium")
    axes.legend(fontsize="small")
    figures["explained"] = figure
    return figures


__all__ = ["basis_figures", "polca_figures", "projected_figures"]
