"""Figures of ``grad-norms`` and ``loss-spikes`` (Clustering Head, Fig. 15-16)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, new_figure, positive_log, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

MAX_LAYERS = 10
"""Layers drawn in the per-layer panel (the largest norms at the last step)."""


def grad_norm_figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``norms``: the mean loss and the total gradient norm over steps; per-layer gradient (or update) norms."""
    result = result.load()
    steps = result["step"].values
    has_grad = bool(np.isfinite(result["total_grad_norm"].values).any())
    figure = new_figure(2, width=5.5)
    left, right = figure.axes
    left.plot(steps, result["loss"].values, color=COLORS[0], label="loss")
    left.set_ylabel("mean loss", color=COLORS[0])
    positive_log(left, result["loss"].values)
    twin = left.twinx()
    variable = "total_grad_norm" if has_grad else "total_update_norm"
    twin.plot(steps, result[variable].values, color=COLORS[1], label=variable.replace("_", " "))
    twin.set_ylabel(variable.replace("_", " "), color=COLORS[1])
    positive_log(twin, result[variable].values)
    left.set_title("loss and " + variable.replace("_", " "))
    layer_variable = "layer_grad_norm" if has_grad else "layer_update_norm"
    layers = result[layer_variable]
    last = np.nan_to_num(layers.isel(step=-1).values, nan=-np.inf)
    top = np.argsort(-last)[:MAX_LAYERS]
    for rank, index in enumerate(top):
        right.plot(
            steps, layers.values[:, index], color=COLORS[rank % len(COLORS)], label=str(layers["layer"].values[index])
        )
    positive_log(right, layers.values[:, top])
    right.set_ylabel(layer_variable.replace("_", " "))
    more = f" (the {len(top)} largest of {layers.sizes['layer']})" if layers.sizes["layer"] > len(top) else ""
    right.set_title("per layer" + more)
    right.legend(fontsize="x-small")
    for axes in (left, right):
        step_axis(axes, steps)
    return {"norms": figure}


def spike_figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``spikes``: each series with its rolling median and ±threshold·MAD band, spikes marked.

    The loss spikes are also drawn as vertical lines on the gradient-norm panel, so that
    co-occurrence (the Clustering Head finding) is read at a glance.
    """
    result = result.load()
    steps = result["step"].values
    threshold = float(result.ckpt.option("threshold", 5.0))
    has_grad = bool(np.isfinite(result["grad_norm"].values).any())
    series = ["loss", "grad_norm"] if has_grad else ["loss"]
    figure = new_figure(len(series), columns=1, width=10.0, height=2.8)
    loss_spikes = steps[np.asarray(result["loss_spike"].values, dtype=bool)]
    for axes, name, color in zip(figure.axes, series, COLORS, strict=False):
        values = result[name].values
        median, mad = result[f"{name}_median"].values, result[f"{name}_mad"].values
        axes.plot(steps, values, color=color, linewidth=1, label=name.replace("_", " "))
        axes.plot(steps, median, color="grey", linewidth=1, label="rolling median")
        axes.fill_between(
            steps,
            median - threshold * mad,
            median + threshold * mad,
            color="grey",
            alpha=0.15,
            linewidth=0,
            label=f"± {threshold:g} scaled MAD",
        )
        spikes = np.asarray(result[f"{name}_spike"].values, dtype=bool)
        axes.plot(steps[spikes], values[spikes], "v", color="black", label=f"{int(spikes.sum())} spikes")
        if name == "grad_norm":
            for at in loss_spikes:
                axes.axvline(at, color=COLORS[0], alpha=0.35, linewidth=1)
        positive_log(axes, values)
        axes.set_ylabel(name.replace("_", " "))
        axes.legend(fontsize="x-small", loc="upper right")
        step_axis(axes, steps)
    cooccurrence, chance = float(result["cooccurrence"].values), float(result["chance"].values)
    if not has_grad:
        title = "loss spikes (no model: no gradient norms)"
    elif not np.isfinite(cooccurrence):
        title = "no loss spikes, so no co-occurrence to measure"
    else:
        title = f"{cooccurrence:.2f} of the loss spikes co-occur with a gradient-norm spike (chance {chance:.2f})"
    figure.suptitle(title)
    return {"spikes": figure}


__all__ = ["MAX_LAYERS", "grad_norm_figures", "spike_figures"]
