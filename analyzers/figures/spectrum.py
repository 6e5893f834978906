"""Figures of ``spectrum``: the Hessian's smoothed spectral density per checkpoint, and its trace over steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ckpt.analyzers.figures import COLORS, limited, log_spaced, new_figure, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

GRID_POINTS = 800
"""Eigenvalues at which a smoothed density is drawn."""
WIDTH_OF_RANGE = 0.01
"""The Gaussian's standard deviation as a share of the range of Ritz values drawn (all checkpoints')."""
FLOOR = 1e-6
"""Densities below this share of the highest drawn are not drawn (the log axis would reach for rounding)."""


def smoothed_density(values: np.ndarray, weights: np.ndarray, grid: np.ndarray, width: float) -> np.ndarray:
    """Σ w N(λ; θ, width²) on ``grid``: quadrature nodes blurred into a density (Ghorbani et al. 2019, §2.2)."""
    finite = np.isfinite(values) & (weights > 0)
    theta, w = values[finite], weights[finite]
    blocks = [
        (w[None, :] * np.exp(-0.5 * ((grid[start : start + 200, None] - theta[None, :]) / width) ** 2)).sum(axis=1)
        for start in range(0, len(grid), 200)
    ]  # by rows of the grid: never grid × nodes at once for many nodes
    return np.concatenate(blocks) / (width * np.sqrt(2 * np.pi)) if blocks else np.zeros_like(grid)


def spectrum_figures(result: xr.Dataset) -> dict[str, Figure]:
    """``density`` (log density over eigenvalue, one line per checkpoint, coloured by step) and ``trace``."""
    result = result.load()
    return {"density": density_figure(result), "trace": trace_figure(result)}


def density_figure(result: xr.Dataset) -> Figure:
    """The SLQ density of each checkpoint, smoothed by a Gaussian of 1% of the eigenvalue range, on a log axis."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    steps = result["step"].values
    values = result["ritz_values"].values.reshape(len(steps), -1)
    weights = result["ritz_weights"].values.reshape(len(steps), -1)
    figure = new_figure(1, width=7.0, height=4.0)
    axes = figure.axes[0]
    finite = values[np.isfinite(values) & (weights > 0)]
    if not finite.size:
        missing = "no Ritz values: the density needs --slq-runs 1 or more"
        axes.text(0.5, 0.5, missing, transform=axes.transAxes, ha="center")
        return figure
    low, high = float(finite.min()), float(finite.max())
    width = WIDTH_OF_RANGE * max(high - low, abs(high), 1e-12)
    grid = np.linspace(low - 4 * width, high + 4 * width, GRID_POINTS)
    colors = colormaps["viridis"]
    norm = Normalize(float(steps.min()), float(steps.max()) if len(steps) > 1 else float(steps.min()) + 1)
    curves = [smoothed_density(values[i], weights[i], grid, width) for i in range(len(steps))]
    peak = max(float(c.max()) for c in curves)
    for step, curve in zip(steps, curves, strict=True):
        shown = np.where(curve >= FLOOR * peak, curve, np.nan)
        axes.plot(grid, shown, color=colors(norm(step)), linewidth=1.2)
    axes.set_yscale("log")
    axes.set_ylim(FLOOR * peak, 2 * peak)
    axes.axvline(0, color="grey", linewidth=0.6, linestyle=":")
    axes.set_xlabel("Hessian eigenvalue λ")
    axes.set_ylabel("density (smoothed)")
    runs, nodes = result.sizes["slq_run"], result.sizes["node"]
    axes.set_title(
        f"Hessian spectral density (SLQ, {runs} runs × {nodes} nodes, Gaussian σ = {width:.3g})", fontsize="medium"
    )
    bar = figure.colorbar(ScalarMappable(norm, colors), ax=axes)
    bar.set_label("training step")
    return figure


def trace_figure(result: xr.Dataset) -> Figure:
    """tr(H) and each module block's tr(H_mm) over steps, each with a ±1 standard error band."""
    steps = result["step"].values
    figure = new_figure(2, columns=2, width=4.6, height=3.6)
    whole, parts = figure.axes
    trace, stderr = result["trace"].values, result["trace_stderr"].values
    whole.plot(steps, trace, color="black", marker=".", linewidth=1.8, label="tr(H)")
    band = np.nan_to_num(stderr)
    whole.fill_between(steps, trace - band, trace + band, color="black", alpha=0.2, linewidth=0, label="±1 s.e.")
    whole.set_ylabel("Hessian trace")
    whole.set_title(f"Whole model ({result['trace'].attrs.get('method', '')})", fontsize="medium")
    whole.legend(fontsize="x-small", loc="best")
    modules, note = limited([str(m) for m in result["module"].values], "modules")
    for index, module in enumerate(modules):
        color = COLORS[index % len(COLORS)]
        value = result["block_trace"].sel(module=module).values
        band = np.nan_to_num(result["block_trace_stderr"].sel(module=module).values)
        parts.plot(steps, value, color=color, marker=".", label=module)
        parts.fill_between(steps, value - band, value + band, color=color, alpha=0.2, linewidth=0)
    parts.axhline(0, color="grey", linewidth=0.6, linestyle=":")
    parts.set_ylabel("trace of the module's block")
    parts.set_title("Module blocks tr(H_mm), ±1 s.e." + note, fontsize="medium")
    parts.legend(fontsize="x-small", loc="best")
    for axes in (whole, parts):
        step_axis(axes, steps)
        if len(steps) and log_spaced([int(s) for s in steps]):  # autoscale's margin would reach below step 0
            axes.set_xlim(left=float(steps.min()))
    return figure


__all__ = ["density_figure", "smoothed_density", "spectrum_figures", "trace_figure"]
