"""Figures of ``attention`` (Clustering Head Fig. 8): attention maps at the first and last checkpoint side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt.analyzers.figures import new_figure

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

MAX_MAPS = 6
"""(layer, head) pairs drawn at most; the title says how many were left out."""
MAX_ROWS = 64
"""Examples drawn at most in a single-query map (one row each)."""


def attention_figures(result: xr.Dataset) -> dict[str, Figure]:
    """``maps``: per (layer, head), the attention at the first and at the last checkpoint, side by side.

    With one query per example (the sparse-modular-addition sandbox's learned query), each map is
    Fig. 8's: a row per example (the first 64), a column per key position. With several queries,
    the map is query x key averaged over the examples. Each pair's title gives the start-to-end
    correlation (``start_end_correlation`` at the last step).
    """
    steps = result["step"].values
    pairs = [(str(layer), int(head)) for layer in result["layer"].values for head in result["head"].values]
    shown = pairs[:MAX_MAPS]
    note = f" (first {MAX_MAPS} of {len(pairs)} layer/head pairs)" if len(pairs) > MAX_MAPS else ""
    ends = [int(steps[0]), int(steps[-1])]
    figure = new_figure(2 * len(shown), columns=2, width=4.4, height=3.4)
    single = result.sizes["query"] == 1
    image = None
    drawn = result["weights"].sel(step=ends)
    # one colour scale for every map, to the largest weight drawn: a fixed 0-1 scale hides near-uniform maps
    top = float(drawn.max()) if drawn.size else 1.0
    for row, (layer, head) in enumerate(shown):
        rho = float(result["start_end_correlation"].sel(step=ends[1], layer=layer, head=head))
        for column, step in enumerate(ends):
            axes = figure.axes[2 * row + column]
            weights = result["weights"].sel(step=step, layer=layer, head=head)
            if single:
                data = weights.isel(query=0).values[:MAX_ROWS]
                axes.set_ylabel("example")
            else:
                data = weights.mean("example").values
                axes.set_ylabel("query position")
            image = axes.imshow(data, aspect="auto", cmap="viridis", vmin=0, vmax=top, interpolation="nearest")
            axes.set_xlabel("key position")
            where = "start" if column == 0 else "end"
            label = f"{layer}, head {head}" if len(pairs) > 1 else "attention"
            axes.set_title(f"{label}: {where} (step {step}), ρ = {rho:.4f}", fontsize="small")
    if image is not None:
        figure.colorbar(image, ax=figure.axes, label="attention weight", shrink=0.8).ax.set_title(
            "weight", fontsize="x-small"
        )
    what = "per example" if single else "query x key, mean over examples"
    figure.suptitle(
        f"Attention at the start and end of training ({what})\nρ: start-to-end correlation (Clustering Head Fig. 8)"
        + note,
        fontsize="medium",
    )
    return {"maps": figure}


__all__ = ["MAX_MAPS", "MAX_ROWS", "attention_figures"]
