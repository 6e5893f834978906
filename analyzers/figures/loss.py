"""Figures of ``loss``: per-datapoint loss curves summarised by the split's labels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, new_figure, positive_log, quartile_band, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

MAX_GROUPS = 8
"""A label groups datapoints in a figure when it has 2..MAX_GROUPS values (place, carry, a class)."""


def datapoint_labels(store: Any, split: str, result: xr.Dataset) -> dict[str, np.ndarray]:
    """The split's stored labels, one value per datapoint of ``result``, for labels with few values.

    A label of dims ``(example, position)`` is read at each datapoint's (example, position); one
    of dims ``(example,)`` at its example. Labels with one value, or more than
    :data:`MAX_GROUPS`, do not group anything and are left out.
    """
    if split not in store.splits or "example" not in result.coords:
        return {}
    data = store.data(split)
    example = np.asarray(result["example"].values)
    position = np.asarray(result["position"].values) if "position" in result.coords else None
    found = {}
    for name in data.attrs.get("labels", []):
        values = np.asarray(data[name].values)
        if values.ndim == 2 and position is not None and (position >= 0).all():
            per_datapoint = values[example, position]
        elif values.ndim == 1:
            per_datapoint = values[example]
        else:
            continue
        if 2 <= len(np.unique(per_datapoint)) <= MAX_GROUPS:
            found[name] = per_datapoint
    return found


def figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``curves``: median and quartiles of the per-datapoint loss over steps, overall and per label group.

    With two grouping labels (addition: ``place`` and ``carry``) there is a panel per value of the
    one with more values and a line per value of the other; with one, a line per value.
    """
    split = result.ckpt.option("split", "eval")
    steps = result["step"].values
    loss = np.asarray(result["loss"].values, dtype=np.float64)  # step, datapoint
    labels = datapoint_labels(store, split, result)
    ordered = sorted(labels, key=lambda name: (-len(np.unique(labels[name])), name))[:2]
    panel_label = ordered[0] if len(ordered) == 2 else None
    line_label = ordered[-1] if ordered else None
    panel_values = list(np.unique(labels[panel_label])) if panel_label else []
    figure = new_figure(1 + len(panel_values))
    overall = figure.axes[0]
    quartile_band(overall, steps, loss, COLORS[0], "median, 25-75%")
    overall.plot(steps, np.asarray(result["mean_loss"].values), color="black", linewidth=1, label="mean")
    overall.set_title(f"all {loss.shape[1]} datapoints ({split})")
    if line_label and not panel_label:
        overall.cla()
        _lines(overall, steps, loss, labels[line_label], line_label)
        overall.set_title(f"{loss.shape[1]} datapoints ({split}) by {line_label}")
    for axes, value in zip(figure.axes[1:], panel_values, strict=True):
        members = labels[panel_label] == value
        _lines(axes, steps, loss[:, members], labels[line_label][members], line_label)
        axes.set_title(f"{panel_label} = {value} ({int(members.sum())} datapoints)")
    for axes in figure.axes:
        step_axis(axes, steps)
        axes.set_ylabel("loss")
        positive_log(axes, loss)
        axes.legend(fontsize="small")
    figure.suptitle("per-datapoint loss: median and quartiles")
    return {"curves": figure}


def _lines(axes: Any, steps: Any, loss: np.ndarray, groups: np.ndarray, name: str) -> None:
    for index, value in enumerate(np.unique(groups)):
        members = groups == value
        quartile_band(axes, steps, loss[:, members], COLORS[index % len(COLORS)], f"{name} = {value}")


__all__ = ["MAX_GROUPS", "datapoint_labels", "figures"]
