"""Figures of ``boundary-distance`` (Clustering Head §4.3, Fig. 13-14): distances over steps, ξ and the boundaries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import new_figure, step_axis
from ckpt.analyzers.figures.spike_causes import quantile_bands

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GRID = 200
"""Points per side of the grid the d = 2 boundaries are contoured on (40,000 read-out evaluations)."""
MAX_CLASSES = 20
"""Boundaries are drawn per class; above this many classes the picture only shows ξ."""


def _bands(axes: Axes, steps: np.ndarray, quantiles: xr.DataArray, color: str, what: str) -> None:
    quantile_bands(axes, steps, quantiles, color)
    values = quantiles.values
    if np.isfinite(values).any() and np.nanmin(values) > 0:
        axes.set_yscale("log")
    step_axis(axes, steps)
    axes.set_ylabel(what)


def grid_margins(store: Any, step: int, readout: str, split: str, box: tuple[float, ...]) -> tuple[Any, np.ndarray]:
    """Per class c, g_c = logit_c − max_{j≠c} logit_j on a GRID x GRID grid of the ξ plane at ``step``.

    The read-out is evaluated as the analyzer does: the model on the split's first
    example with the read-out module's input replaced by each grid point.

    Returns
    -------
    tuple
        ``((x, y) mesh, margins [classes, GRID, GRID])``; g_c = 0 is the boundary of class c's region.
    """
    import torch

    from ckpt.analyzers.boundary_distance import readout_logits

    model = store.model.build().double().eval()
    params = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in store.tensors(step).items()}
    module = dict(model.named_modules())[readout]
    example = torch.from_numpy(np.asarray(store.data(split)["inputs"][:1].values))
    x, y = np.meshgrid(np.linspace(box[0], box[1], GRID), np.linspace(box[2], box[3], GRID))
    points = torch.from_numpy(np.stack([x.ravel(), y.ravel()], -1))[None]
    with torch.no_grad():
        logits = readout_logits(model, params, module, example)(points)[0].numpy()
    margins = []
    for c in range(logits.shape[-1]):
        others = np.delete(logits, c, axis=-1).max(-1)
        margins.append((logits[:, c] - others).reshape(GRID, GRID))
    return (x, y), np.array(margins)


def _plane(axes: Axes, figure: Figure, result: xr.Dataset, store: Any, j: int, box: tuple, options: dict) -> Any:
    from matplotlib.colors import LogNorm

    step = int(result["step"].values[j])
    xi = result["xi"].isel(step=j).values
    distance = result["distance"].isel(step=j).values
    classes = int(result["predicted"].max()) + 1
    (x, y), margins = grid_margins(store, step, options["readout"], options["split"], box)
    if margins.shape[0] <= MAX_CLASSES:
        regions = margins.argmax(0)
        axes.contourf(x, y, regions, levels=np.arange(-0.5, margins.shape[0]), cmap="Pastel1", alpha=0.5)
        for c in range(margins.shape[0]):
            if margins[c].min() < 0 < margins[c].max():
                axes.contour(x, y, margins[c], levels=[0.0], colors="black", linewidths=1.0)
    finite = np.isfinite(distance) & (distance > 0)
    norm = LogNorm(*options["range"]) if options["range"] else None
    axes.scatter(xi[~finite, 0], xi[~finite, 1], s=14, facecolors="none", edgecolors="grey", linewidths=0.6)
    points = axes.scatter(xi[finite, 0], xi[finite, 1], c=distance[finite], s=14, cmap="viridis_r", norm=norm)
    axes.set_xlim(box[0], box[1])
    axes.set_ylim(box[2], box[3])
    axes.set_aspect("equal")
    axes.set_xlabel("ξ₁")
    axes.set_ylabel("ξ₂")
    axes.set_title(f"step {step}: ξ by distance, boundaries in black ({classes} classes seen)", fontsize="small")
    return points


def boundary_figures(result: xr.Dataset, store: Any, *, readout: str | None, split: str) -> dict[str, Figure]:
    """``distances``: quantile bands of the distance and of ‖∂ζ/∂ξ‖₂ over steps; at d = 2, ``boundaries``.

    ``boundaries`` shows, at the first and last checkpoints, each ξ coloured by its
    distance (log scale, shared by both panels; hollow grey where none was found), the
    predicted-class regions of the read-out shaded and their boundaries (g_c = 0) in
    black, on a grid around the ξ of both checkpoints.
    """
    from ckpt.analyzers.boundary_distance import declared_readout

    result = result.load()
    steps = result["step"].values
    figure = new_figure(2, columns=2, width=5.0, height=3.6)
    _bands(figure.axes[0], steps, result["distance_quantile"], "#1f77b4", "distance of ξ to the boundary")
    figure.axes[0].legend(fontsize="x-small")
    _bands(figure.axes[1], steps, result["jacobian_quantile"], "#2ca02c", "‖∂ζ/∂ξ‖₂ (read-out Jacobian)")
    missing = float((result["status"] != 0).mean())
    note = f" — no boundary found for {missing:.1%}" if missing else ""
    figure.suptitle("Sequence embeddings near the read-out's decision boundaries (Clustering Head §4.3)" + note)
    figures = {"distances": figure}
    if result.sizes["component"] != 2 or not len(steps):
        return figures
    readout = readout or declared_readout(store.model.build())
    ends = sorted({0, len(steps) - 1})
    xi = result["xi"].isel(step=ends).values.reshape(-1, 2)
    low, high = np.nanmin(xi, 0), np.nanmax(xi, 0)
    pad = 0.25 * float(np.max(high - low)) + 1e-3
    box = (low[0] - pad, high[0] + pad, low[1] - pad, high[1] + pad)
    distance = result["distance"].isel(step=ends).values
    positive = distance[np.isfinite(distance) & (distance > 0)]
    options = {
        "readout": readout,
        "split": split,
        "range": (float(positive.min()), float(positive.max())) if positive.size else None,
    }
    plane = new_figure(len(ends), columns=2, width=5.0, height=4.6)
    points = None
    for axes, j in zip(plane.axes, ends, strict=True):
        points = _plane(axes, plane, result, store, j, box, options)
    if points is not None and positive.size:
        bar = plane.colorbar(points, ax=plane.axes, label="distance to the nearest boundary", shrink=0.8)
        bar.ax.set_title("log scale", fontsize="x-small")
    plane.suptitle("Sequence embeddings ξ and the read-out's decision boundaries (Clustering Head Fig. 13)")
    figures["boundaries"] = plane
    return figures


__all__ = ["GRID", "MAX_CLASSES", "boundary_figures", "grid_margins"]
