"""Figures of ``sparsity``: ε-curves (Clustering Head, Fig. 17)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, hide_unused, limited, new_figure, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

CURVES = 6
"""Checkpoints drawn per panel (evenly spaced, first and last included)."""


def figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``epsilon``: the fraction of values below ε against ε, per module; ``nonpositive`` over steps.

    One panel per module with a curve per chosen checkpoint (darker = later). A result with a
    ``run`` dimension (``ckpt.analyze_runs``) overlays the runs at their last step instead.
    """
    from matplotlib import colormaps

    result = result.load()
    modules, note = limited(list(result["module"].values), "modules")
    epsilon = result["epsilon"].values
    steps = result["step"].values
    figure = new_figure(len(modules), columns=3, width=4.0, height=3.0)
    runs = "run" in result.dims
    picks = sorted(set(np.linspace(0, len(steps) - 1, min(CURVES, len(steps))).round().astype(int).tolist()))
    shades = colormaps["viridis"](np.linspace(0.0, 0.9, len(picks)))
    for axes, module in zip(figure.axes, modules, strict=False):
        curves = result["sparsity"].sel(module=module)
        if runs:
            for index, run in enumerate(result["run"].values):
                per_run = curves.sel(run=run).dropna("step", how="all")
                axes.plot(
                    epsilon,
                    per_run.isel(step=-1).values,
                    color=COLORS[index % len(COLORS)],
                    label=f"{_run_name(result, index)} (step {int(per_run['step'].values[-1])})",
                )
        else:
            for shade, index in zip(shades, picks, strict=True):
                axes.plot(epsilon, curves.isel(step=index).values, color=shade, label=f"step {int(steps[index])}")
        axes.set_xscale("log")
        axes.set_ylim(-0.02, 1.02)
        axes.set_xlabel("ε")
        axes.set_ylabel("fraction with |a| < ε")
        axes.set_title(str(module), fontsize="medium")
    hide_unused(figure, len(modules))
    figure.axes[0].legend(fontsize="x-small")
    figure.suptitle("ε-sparsity of the captured activations" + note)
    nonpositive = new_figure(1, width=5.5)
    axes = nonpositive.axes[0]
    for index, module in enumerate(modules):
        values = result["nonpositive"].sel(module=module)
        values = values.mean("run") if runs else values
        axes.plot(steps, values.values, color=COLORS[index % len(COLORS)], label=str(module))
    axes.set_ylabel("fraction of inputs ≤ 0" + (" (mean over runs)" if runs else ""))
    axes.set_title("non-positive pre-activations")
    step_axis(axes, steps)
    axes.legend(fontsize="x-small")
    return {"epsilon": figure, "nonpositive": nonpositive}


def _run_name(result: xr.Dataset, index: int) -> str:
    """A short name of run ``index``: its weight decay or seed when recorded, else its path."""
    for key in ("weight_decay", "seed"):
        if key in result.coords and result[key].dims == ("run",):
            return f"{key} {result[key].values[index]}"
    return str(result["run"].values[index]).rsplit("/", 1)[-1]


__all__ = ["CURVES", "figures"]
