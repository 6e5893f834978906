"""Figures of ``embedding-geometry``, and the 2-D embedding view of ``ckpt animate`` and the report's slider.

Clustering and Alignment plots the token embeddings E_a and their pair sums E_a + E_b coloured by
the class (a + b) mod N; Clustering Head plots the sequence embeddings ξ coloured by the target.
Tables wider than 2 columns are shown on their two leading principal components at the last
checkpoint (one projection for all steps, so that frames are comparable). Pair sums are drawn up to
:data:`~ckpt.analyzers.figures.tokens.PAIR_SUM_MAX_TOKENS` residues; a larger table (a language
model's vocabulary) is shown as its most frequent tokens (:mod:`ckpt.analyzers.figures.tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, new_figure, step_axis
from ckpt.analyzers.figures.tokens import (
    PAIR_SUM_MAX_TOKENS,
    FrequentTokensView,
    TableView,
    bounds,
    principal_plane,
)

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SNAPSHOTS = 4
"""Checkpoints shown in the ``embeddings`` figure: first, last and evenly between."""
CYCLIC = "twilight"
"""Colormap of residues and classes mod N: cyclic, so that N-1 and 0 look alike as they are."""


def cyclic_scatter(
    axes: Axes, points: np.ndarray, classes: np.ndarray, modulus: int, *, size: float, outline: float = 0.0
) -> None:
    """``points`` (``[n, 2]``) coloured by their ``classes`` 0..modulus-1 on :data:`CYCLIC`; ``outline``: edge width."""
    edges = {"edgecolors": "black", "linewidths": outline} if outline else {}
    axes.scatter(points[:, 0], points[:, 1], c=classes, cmap=CYCLIC, vmin=0, vmax=modulus, s=size, **edges)


class EmbeddingView(TableView):
    """The rows 0..N-1 of an embedding table across checkpoints, as 2-D points.

    Parameters
    ----------
    store, tensor
        As :class:`~ckpt.analyzers.figures.tokens.TableView`.
    modulus
        N: the rows shown, and the classes of the pair sums.
    """

    panels = 2
    """Axes one checkpoint is drawn on: the residues, their pair sums."""

    def __init__(self, store: Any, tensor: str, modulus: int) -> None:
        if modulus > PAIR_SUM_MAX_TOKENS:  # a programming error: embedding_view chooses the view
            msg = f"{modulus} residues have too many pair sums to draw (at most {PAIR_SUM_MAX_TOKENS})"
            raise ValueError(msg)
        super().__init__(store, tensor, slice(modulus))
        self.modulus = modulus
        self.title = f"{tensor}: residues 0..{modulus - 1} and their pair sums"

    def draw(self, axes: Sequence[Axes], points: np.ndarray, limits: tuple[Any, Any] | None) -> None:
        """Draw one checkpoint: residues (numbered) on ``axes[0]``, pair sums by class on ``axes[1]``."""
        embed_axes, sums_axes = axes
        n = self.modulus
        residues = np.arange(n)
        cyclic_scatter(embed_axes, points, residues, n, size=30, outline=0.3)
        if n <= 64:
            for a in residues:
                embed_axes.annotate(str(a), points[a], textcoords="offset points", xytext=(3, 3), fontsize=6)
        first, second = np.triu_indices(n)
        sums = points[first] + points[second]
        cyclic_scatter(sums_axes, sums, (first + second) % n, n, size=8)
        embed_axes.set_title(f"E_a, a = 0..{n - 1}", fontsize="medium")
        sums_axes.set_title("E_a + E_b, colour (a + b) mod N", fontsize="medium")
        for index, axes in enumerate((embed_axes, sums_axes)):
            axes.set_xlabel(self.axis_names[0])
            axes.set_ylabel(self.axis_names[1])
            if limits is None:
                axes.set_aspect("equal", adjustable="datalim")
            else:  # the same limits in every frame, so that motion on screen is motion of the points
                axes.set_xlim(limits[index][0])
                axes.set_ylim(limits[index][1])

    @staticmethod
    def limits(points: np.ndarray) -> tuple[Any, Any]:
        """Axis limits that hold every frame of ``points`` (``[step, residue, 2]``) and of its pair sums."""
        first, second = np.triu_indices(points.shape[1])
        return bounds(points), bounds(points[:, first] + points[:, second])


def embedding_view(store: Any, tensor: str, modulus: int) -> EmbeddingView | FrequentTokensView:
    """Rows ``0..modulus-1`` of ``tensor`` with their pair sums, or its most frequent tokens above the bound.

    Pair sums up to :data:`~ckpt.analyzers.figures.tokens.PAIR_SUM_MAX_TOKENS` residues (every
    modular task); above, a table is a vocabulary, shown as its most frequent tokens among ids
    below ``modulus``: never a number of points or bytes that grows with ``modulus``².
    """
    if modulus <= PAIR_SUM_MAX_TOKENS:
        return EmbeddingView(store, tensor, modulus)
    return FrequentTokensView(store, tensor, rows=modulus)


def default_view(store: Any) -> EmbeddingView | FrequentTokensView | None:
    """The view of the store's token embedding (``embedding-geometry``'s default table), or None.

    N is the run's ``p`` when its config records one (modular addition), else every row; see
    :func:`embedding_view` for the view of a large N.
    """
    from ckpt.analyzers.embedding_geometry import default_embedding

    name = default_embedding(store)
    if name is None:
        return None
    config = store.attrs.get("config") if isinstance(store.attrs.get("config"), dict) else {}
    rows = int(store.schema[name].shape[0])
    modulus = int(config.get("p", rows)) if 2 <= int(config.get("p", rows)) <= rows else rows
    return embedding_view(store, name, modulus)


def snapshot_steps(steps: Sequence[int], count: int) -> list[int]:
    """``count`` checkpoints evenly spread over ``steps``, first and last included."""
    picks = np.linspace(0, len(steps) - 1, min(count, len(steps))).round().astype(int)
    return [int(steps[i]) for i in sorted(set(picks.tolist()))]


def figures(result: xr.Dataset, store: Any, tensor: str, modulus: int) -> dict[str, Figure]:
    """``embeddings`` (the table and its pair sums at a few checkpoints, and ξ when stored) and ``geometry``.

    A table of more than :data:`~ckpt.analyzers.figures.tokens.PAIR_SUM_MAX_TOKENS` residues is
    drawn as its most frequent tokens instead (:func:`embedding_view`).
    """
    result = result.load()
    steps = [int(s) for s in result["step"].values]
    view = embedding_view(store, tensor, modulus)
    chosen = snapshot_steps(steps, SNAPSHOTS)
    points = view.points(chosen)
    limits = view.limits(points)
    sequences = "sequence_embedding" in result
    plane = sequence_plane(result["sequence_embedding"].values) if sequences else None
    rows = view.panels + sequences
    embeddings = new_figure(rows * len(chosen), columns=len(chosen), width=3.3, height=3.1)
    for column, step in enumerate(chosen):
        panels = [embeddings.axes[row * len(chosen) + column] for row in range(view.panels)]
        view.draw(panels, points[column], limits)
        panels[0].set_title(f"step {step}: " + panels[0].get_title(), fontsize="small")
        if sequences:
            _sequence_panel(embeddings.axes[view.panels * len(chosen) + column], result.sel(step=step), plane)
    embeddings.suptitle(view.title)
    geometry = new_figure(3, width=4.2)
    imperfection, circle, agreement = geometry.axes
    imperfection.plot(steps, result["grid_imperfection"].values, color=COLORS[0])
    imperfection.set_ylabel("grid imperfection")
    imperfection.set_title("0: an ideal grid", fontsize="medium")
    circle.plot(steps, result["circularity"].values, color=COLORS[1])
    circle.set_ylabel("circularity")
    circle.set_title("1: a circle", fontsize="medium")
    circle.set_ylim(0, 1.02)
    agreement.plot(steps, result["pair_sum_neighbor_agreement"].values, color=COLORS[2])
    agreement.set_ylabel("neighbour agreement")
    agreement.set_title("pair sums whose nearest one has their class", fontsize="medium")
    agreement.set_ylim(0, 1.02)
    for axes in geometry.axes:
        step_axis(axes, steps)
    geometry.suptitle("embedding geometry over training")
    return {"embeddings": embeddings, "geometry": geometry}


def sequence_plane(xi: np.ndarray) -> np.ndarray | None:
    """The top-2 principal directions (``[d, 2]``) of ξ at the last step (``[step, probe, d]``); None when d <= 2.

    One projection for every step, as for the token table, so that panels and frames are comparable.
    """
    last = np.asarray(xi[-1], dtype=np.float64)
    return principal_plane(last[np.isfinite(last).all(axis=1)])


def project_sequences(xi: np.ndarray, plane: np.ndarray | None) -> np.ndarray:
    """ξ (``[..., d]``) on ``plane`` (``[..., 2]``); as it is when ``plane`` is None (d <= 2)."""
    xi = np.asarray(xi, dtype=np.float64)
    return xi if plane is None else xi @ plane


def draw_sequences(axes: Axes, xi: np.ndarray, target: np.ndarray, title: str, plane: np.ndarray | None = None) -> None:
    """ξ of every probe, coloured by the target on the cyclic map; on ``plane`` when d > 2 (:func:`sequence_plane`)."""
    points = project_sequences(xi, plane)
    cyclic_scatter(axes, points, target, int(target.max()) + 1, size=6, outline=0.2)
    axes.set_title(title, fontsize="small")
    axes.set_xlabel("ξ 0" if plane is None else "ξ, PC 1")
    axes.set_ylabel("ξ 1" if plane is None else "ξ, PC 2")


def _sequence_panel(axes: Axes, at_step: xr.Dataset, plane: np.ndarray | None) -> None:
    """ξ at one step, titled with its cluster count against the ideal one."""
    clusters, ideal = int(at_step["sequence_clusters"].values), int(at_step["ideal_clusters"].values)
    title = f"sequence embeddings ξ: {clusters} clusters (ideal {ideal})"
    xi, target = np.asarray(at_step["sequence_embedding"].values), np.asarray(at_step["target"].values)
    draw_sequences(axes, xi, target, title, plane)


def runs_figure(stores: Sequence[str]) -> Figure:
    """Grid imperfection against final accuracy, one point per run (Clustering and Alignment's comparison).

    Each store needs a stored ``embedding-geometry`` result and an accuracy metric
    (``test_accuracy``, ``val_accuracy`` or ``accuracy``); runs coloured by weight decay when recorded.
    """
    import ckpt.store as ckptstore
    from ckpt.errors import AnalysisError

    points = []
    for where in stores:
        store = ckptstore.open(str(where))
        if "embedding-geometry" not in store.analyses:
            msg = f"{where} has no embedding-geometry result: run `ckpt analyze embedding-geometry {where}` first"
            raise AnalysisError(msg)
        metrics = store.metrics
        name = next((m for m in ("test_accuracy", "val_accuracy", "accuracy") if m in metrics), None)
        if name is None:
            msg = f"{where} records no accuracy metric (test_accuracy, val_accuracy or accuracy)"
            raise AnalysisError(msg)
        geometry = store.analysis("embedding-geometry")
        config = store.attrs.get("config") if isinstance(store.attrs.get("config"), dict) else {}
        points.append(
            (
                float(metrics[name].dropna("step").values[-1]),
                float(geometry["grid_imperfection"].values[-1]),
                config.get("weight_decay"),
            )
        )
    figure = new_figure(1, width=5.5, height=4.0)
    axes = figure.axes[0]
    decays = sorted({p[2] for p in points if p[2] is not None})
    for index, decay in enumerate(decays or [None]):
        chosen = [p for p in points if p[2] == decay]
        label = f"weight decay {decay:g}" if decay is not None else "runs"
        axes.scatter([p[0] for p in chosen], [p[1] for p in chosen], color=COLORS[index % len(COLORS)], label=label)
    axes.set_xlabel("final accuracy")
    axes.set_ylabel("final grid imperfection")
    axes.set_title(f"{len(points)} runs")
    axes.legend(fontsize="small")
    return figure


__all__ = [
    "CYCLIC",
    "SNAPSHOTS",
    "EmbeddingView",
    "cyclic_scatter",
    "default_view",
    "draw_sequences",
    "embedding_view",
    "figures",
    "project_sequences",
    "runs_figure",
    "sequence_plane",
    "snapshot_steps",
]
