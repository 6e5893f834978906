"""Figures of ``clusters``: the paper's Fig. 4 for every kept basis vector (Hidden Breakthroughs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, new_figure, step_axis
from ckpt.numerics.basis_format import FOUND_AT

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_CLUSTERS = len(COLORS)
"""Clusters drawn per basis vector (the largest); one colour each."""
MAX_BASIS_FIGURES = 12
"""Basis vectors drawn (those with clusters, in order); the rest are listed in the overview."""
TRAJECTORY = {
    "polca": "projected loss L_b (eq. 10)",
    "lca": "cumulative LCA",
    "fisher": "projected Fisher information",
    "loss": "loss",
    "loss-change": "loss change",
}


def figures(result: xr.Dataset, store: Any) -> dict[str, Figure]:
    """``overview`` and one ``basis-B`` figure per basis vector with clusters.

    ``basis-B`` has the paper's Fig. 4 panels: each cluster's median trajectory with its
    quartile band, the dashed line at the step the vector was found and a dot at the cluster's
    breakthrough; the clusters' median exact loss (when the store holds a ``loss`` result over
    the same datapoints); and each cluster's make-up (label and place shares), or, for text, the
    context of its medoid with the target token in red.
    """
    result = result.load()
    on = result.ckpt.option("on", "polca")
    counts = np.asarray(result["clusters"].values)
    kept = np.asarray(result["basis_kept"].values)
    figures = {"overview": _overview(result, counts, kept, on)}
    exact = _exact_loss(result, store)
    for basis in [b for b in range(len(counts)) if counts[b] > 0][:MAX_BASIS_FIGURES]:
        figures[f"basis-{basis}"] = _basis_figure(result, basis, exact, on)
    return figures


def _overview(result: xr.Dataset, counts: np.ndarray, kept: np.ndarray, on: str) -> Figure:
    figure = new_figure(2, width=5.0)
    left, right = figure.axes
    basis = np.arange(len(counts))
    left.bar(basis, counts, color=[COLORS[0] if k else "lightgrey" for k in kept])
    left.set_xlabel("basis vector (grey: dropped by the filter)")
    left.set_ylabel("clusters")
    left.set_title(f"HDBSCAN clusters of the {on} trajectories")
    steps = result["step"].values
    right.plot(steps, result["mean_trajectory"].values, color="black", label="mean over datapoints")
    mean_break = float(result["mean_breakthrough_step"].values)
    if np.isfinite(mean_break):
        right.axvline(mean_break, color="black", linestyle=":", label="its breakthrough")
    found = result["breakthrough_step"].values[np.isfinite(result["breakthrough_step"].values)]
    hidden = result["hidden"].values[np.isfinite(result["breakthrough_step"].values)]
    for value, is_hidden in zip(found, hidden, strict=True):
        right.axvline(value, color=COLORS[1] if is_hidden else COLORS[0], alpha=0.4, linewidth=1)
    right.plot([], [], color=COLORS[0], label="cluster breakthroughs")
    right.plot([], [], color=COLORS[1], label="hidden (> τ from the mean's)")
    right.set_title("aggregate curve and the clusters' breakthroughs")
    right.set_ylabel(f"mean {TRAJECTORY.get(on, on)}")
    step_axis(right, steps)
    right.legend(fontsize="small")
    if counts.sum() == 0:
        left.text(0.5, 0.5, "no clusters were found", transform=left.transAxes, ha="center", color=COLORS[1])
    return figure


def _exact_loss(result: xr.Dataset, store: Any) -> xr.DataArray | None:
    """The stored per-datapoint loss, when it covers exactly the clustered datapoints."""
    if "loss" not in store.analyses:
        return None
    loss = store.analysis("loss")
    same = loss.sizes.get("datapoint") == result.sizes["datapoint"] and np.array_equal(
        loss["example"].values, result["example"].values
    )
    return loss["loss"] if same else None


def _basis_figure(result: xr.Dataset, basis: int, exact: xr.DataArray | None, on: str) -> Figure:
    sizes = np.asarray(result["size"].values[basis])
    count = int(result["clusters"].values[basis])
    shown = sorted(range(count), key=lambda c: -sizes[c])[:MAX_CLUSTERS]
    text = "medoid_context" in result
    figure = new_figure(3, width=4.4, height=3.2)
    curves, losses, makeup = figure.axes
    steps = result["step"].values
    found = int(result[FOUND_AT].values[basis]) if FOUND_AT in result.coords else None
    for rank, cluster in enumerate(shown):
        color = COLORS[rank]
        selection = {"basis": basis, "cluster": cluster}
        median = result["median"].isel(selection).values
        curves.plot(steps, median, color=color, label=f"cluster {cluster} ({sizes[cluster]})")
        curves.fill_between(
            steps,
            result["lower_quartile"].isel(selection).values,
            result["upper_quartile"].isel(selection).values,
            color=color,
            alpha=0.2,
            linewidth=0,
        )
        at = float(result["breakthrough_step"].values[basis, cluster])
        if np.isfinite(at):
            curves.plot([at], [np.interp(at, steps, median)], "o", color=color, markeredgecolor="black")
        if exact is not None:
            members = result["cluster_label"].values[basis] == cluster
            median_loss = np.median(exact.values[:, members], axis=1)
            losses.plot(exact["step"].values, median_loss, color=color, label=f"cluster {cluster}")
    if found is not None:  # trajectories projected on a basis (not the exact loss)
        curves.axvline(found, color="black", linestyle="--", linewidth=1, label=f"vector found ({found})")
        losses.axvline(found, color="black", linestyle="--", linewidth=1)
    curves.set_ylabel(TRAJECTORY.get(on, on))
    curves.set_title("median and quartiles per cluster (dot: breakthrough)", fontsize="medium")
    curves.legend(fontsize="x-small")
    losses.set_ylabel("exact loss (median per cluster)")
    losses.set_title("exact loss of the same clusters", fontsize="medium")
    if exact is None:
        losses.text(0.5, 0.5, "no stored loss over these datapoints", transform=losses.transAxes, ha="center")
    for axes in (curves, losses):
        step_axis(axes, steps)
    if text:
        _contexts(makeup, result, basis, shown)
    else:
        _composition(makeup, result, basis, shown)
    more = f"; the {len(shown)} largest of {count} shown" if count > len(shown) else ""
    what = f"basis vector {basis}: " if found is not None else ""
    figure.suptitle(f"{what}{count} clusters of {on} trajectories{more}")
    return figure


def _composition(axes: Axes, result: xr.Dataset, basis: int, shown: list[int]) -> None:
    """Stacked bars of each cluster's place shares, and its label homogeneity as a black tick."""
    positions = np.arange(len(shown))
    if "place_share" in result:
        shares = np.asarray(result["place_share"].values[basis])[shown]  # cluster, place
        bottom = np.zeros(len(shown))
        for index, place in enumerate(result["place"].values):
            axes.bar(
                positions,
                shares[:, index],
                bottom=bottom,
                color=COLORS[index % len(COLORS)],
                alpha=0.55,
                label=f"place {place}",
            )
            bottom += shares[:, index]
    label = result.ckpt.option("label")
    if label and "homogeneity" in result:
        homogeneity = np.asarray(result["homogeneity"].values[basis])[shown]
        value = np.asarray(result["label_value"].values[basis])[shown]
        axes.scatter(
            positions,
            homogeneity,
            marker="_",
            s=400,
            color="black",
            zorder=3,
            label=f"share with the {label} value written above",
        )
        for x, y, v in zip(positions, homogeneity, value, strict=True):
            axes.annotate(
                f"{label}={v}", (x, y), textcoords="offset points", xytext=(0, 4), ha="center", fontsize="x-small"
            )
    axes.set_xticks(positions, [str(c) for c in shown])
    axes.set_xlabel("cluster")
    axes.set_ylim(0, 1.12)
    axes.set_ylabel("share of the cluster")
    axes.set_title("make-up of each cluster", fontsize="medium")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    else:
        axes.text(0.5, 0.5, "no labels: pass --label", transform=axes.transAxes, ha="center")


def _contexts(axes: Axes, result: xr.Dataset, basis: int, shown: list[int]) -> None:
    """Each cluster's medoid context, the target token (in brackets) in red."""
    axes.set_axis_off()
    axes.set_title("medoid context of each cluster", fontsize="medium")
    for row, cluster in enumerate(shown):
        context = str(result["medoid_context"].values[basis, cluster, 0])
        cut = context.rfind("[")
        before, target = (context[:cut], context[cut:]) if cut >= 0 else (context, "")
        y = 1 - (row + 1) / (len(shown) + 1)
        head = axes.text(
            0,
            y,
            f"{cluster}: {before[-40:]}",
            transform=axes.transAxes,
            color=COLORS[row],
            fontsize="small",
            va="center",
        )
        axes.annotate(target, xy=(1, 0.5), xycoords=head, va="center", color="red", weight="bold", fontsize="small")


def compare(results: dict[str, xr.Dataset]) -> dict[str, Figure]:
    """``homogeneity``: the three highest label homogeneities of each result, grouped bars (Table 3's layout).

    Only results scored against a label (``--label``) take part; with fewer than two there is
    nothing to compare and no figure.
    """
    scored = {name: r for name, r in results.items() if "top_homogeneity" in r}
    if len(scored) < 2:
        return {}
    figure = new_figure(1, width=max(5.0, 1.6 * len(scored)), height=3.4)
    axes = figure.axes[0]
    width = 0.8 / 3
    for rank in range(3):
        values = [float(np.nan_to_num(r["top_homogeneity"].values[rank])) for r in scored.values()]
        positions = np.arange(len(scored)) + (rank - 1) * width
        axes.bar(positions, values, width=width, color=COLORS[rank], label=f"rank {rank + 1}")
        for x, value in zip(positions, values, strict=True):
            axes.annotate(
                f"{value:.2f}", (x, value), textcoords="offset points", xytext=(0, 2), ha="center", fontsize="x-small"
            )
    names = [f"{name}\n(on {r.ckpt.option('on', '?')})" for name, r in scored.items()]
    axes.set_xticks(np.arange(len(scored)), names, fontsize="small")
    labels = {str(r.ckpt.option("label")) for r in scored.values()}
    axes.set_ylabel(f"homogeneity ({', '.join(sorted(labels))})")
    axes.set_ylim(0, 1.1)
    axes.set_title("best clusters of each result (0: no cluster)")
    axes.legend(fontsize="small")
    return {"homogeneity": figure}


__all__ = ["MAX_BASIS_FIGURES", "MAX_CLUSTERS", "TRAJECTORY", "compare", "figures"]
