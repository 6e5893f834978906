"""Figures of the analyzers of loss-spike causes (Clustering Head §4.3): ``curvature``, ``normalization``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, hide_unused, limited, new_figure, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


SERIES = [color for color in COLORS if color != "#d62728"]
"""Colours of modules: red is the learning-rate line's."""


def curvature_figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``sharpness``: top Hessian eigenvalue of each module's block and of the model over steps, with 2/η.

    The 2/η line (gradient descent's stability threshold) is drawn where η is known; the
    y axis is logarithmic when every eigenvalue drawn is positive.
    """
    result = result.load()
    steps = result["step"].values
    modules, note = limited([str(m) for m in result["module"].values], "modules")
    figure = new_figure(1, width=6.5, height=3.8)
    axes = figure.axes[0]
    whole = result["model_eigenvalue"].values
    axes.plot(steps, whole, color="black", linewidth=2, marker=".", label="whole model")
    drawn = [whole]
    for index, module in enumerate(modules):
        values = result["eigenvalue"].sel(module=module).values
        drawn.append(values)
        axes.plot(steps, values, color=SERIES[index % len(SERIES)], marker=".", label=f"{module}")
    rates = result["learning_rate"].values
    if np.isfinite(rates).any():
        axes.plot(steps, 2 / rates, color="red", linestyle="--", linewidth=1.2, label="2/η (GD stability)")
        drawn.append(2 / rates)
    else:
        axes.text(
            0.01,
            0.01,
            "no learning rate known: pass --lr to draw 2/η",
            transform=axes.transAxes,
            fontsize="x-small",
            color="red",
        )
    values = np.concatenate([np.ravel(v) for v in drawn])
    if np.isfinite(values).any() and np.nanmin(values) > 0:
        axes.set_yscale("log")
    step_axis(axes, steps)
    axes.set_ylabel("top Hessian eigenvalue λ_max")
    axes.legend(fontsize="x-small", loc="best")
    axes.set_title("Top Hessian eigenvalue per module block and of the whole model" + note, fontsize="medium")
    return {"sharpness": figure}


QUANTILE_BANDS = ((0.05, 0.95), (0.25, 0.75))
"""Quantile bands shaded around the median, widest first."""


def quantile_bands(axes: Axes, steps: np.ndarray, quantiles: xr.DataArray, color: str) -> None:
    """Median, the 25-75% and 5-95% bands and the minimum (dotted) of ``quantiles`` (dims step, quantile)."""
    for alpha, (low, high) in zip((0.15, 0.3), QUANTILE_BANDS, strict=True):
        axes.fill_between(
            steps,
            quantiles.sel(quantile=low).values,
            quantiles.sel(quantile=high).values,
            color=color,
            alpha=alpha,
            linewidth=0,
            label=f"{low:.0%}–{high:.0%}",
        )
    axes.plot(steps, quantiles.sel(quantile=0.5).values, color=color, linewidth=1.5, label="median")
    axes.plot(steps, quantiles.sel(quantile=0.0).values, color=color, linestyle=":", linewidth=1.2, label="minimum")


def normalization_figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``norms``: ‖x‖ at each normalisation layer's input over steps, against η; ``below-lr``: the share below η.

    ``norms`` has a panel per layer with the median, the 25-75% and 5-95% bands and the
    minimum; ``below-lr`` a line per layer.
    """
    result = result.load()
    steps = result["step"].values
    modules, note = limited([str(m) for m in result["module"].values], "modules")
    rates = result["learning_rate"].values
    figure = new_figure(len(modules), columns=3, width=4.2, height=3.2)
    for index, (axes, module) in enumerate(zip(figure.axes, modules, strict=False)):
        quantile_bands(axes, steps, result["norm_quantile"].sel(module=module), SERIES[index % len(SERIES)])
        axes.plot(steps, rates, color="red", linestyle="--", linewidth=1.2, label="η (learning rate)")
        positive = result["norm_quantile"].sel(module=module).values
        if np.isfinite(positive).any() and np.nanmin(positive) > 0:
            axes.set_yscale("log")
        step_axis(axes, steps)
        axes.set_ylabel("‖x‖ at the layer's input")
        axes.set_title(module, fontsize="medium")
    hide_unused(figure, len(modules))
    figure.axes[0].legend(fontsize="x-small")
    figure.suptitle("Norms reaching the normalisation layers (a step is safe while η < ‖x‖)" + note)
    below = new_figure(1, width=6.0, height=3.5)
    axes = below.axes[0]
    for index, module in enumerate(modules):
        axes.plot(
            steps,
            result["below_lr"].sel(module=module).values,
            color=SERIES[index % len(SERIES)],
            marker=".",
            label=module,
        )
    step_axis(axes, steps)
    axes.set_ylim(-0.02, 1.02)
    axes.set_ylabel("share of vectors with ‖x‖ < η")
    axes.legend(fontsize="x-small")
    below.suptitle("Inputs within one learning rate of the origin (Clustering Head §4.3)" + note)
    return {"norms": figure, "below-lr": below}


__all__ = ["QUANTILE_BANDS", "SERIES", "curvature_figures", "normalization_figures", "quantile_bands"]
