"""Frames of 2-D dynamics across checkpoints: ``ckpt animate`` and the report's step slider.

A frame shows one checkpoint: the token embeddings and their pair sums by class (for a
vocabulary over :data:`~ckpt.analyzers.figures.tokens.PAIR_SUM_MAX_TOKENS` tokens, its most
frequent tokens instead: :mod:`ckpt.analyzers.figures.tokens`), the sequence embeddings ξ when
an ``embedding-geometry`` result holds them (sparse modular addition), and the
run's loss curve with a marker at the frame's step. Every frame uses the same axis limits, so
that motion on screen is motion of the embeddings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, positive_log, readable_texts, step_axis
from ckpt.analyzers.figures.geometry import (
    CYCLIC,
    EmbeddingView,
    default_view,
    draw_sequences,
    project_sequences,
    sequence_plane,
)
from ckpt.analyzers.figures.tokens import FrequentTokensView
from ckpt.errors import AnalysisError

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

REGION_GRID = 120
"""Points per side of the grid the output regions are evaluated on."""
LOSS_METRICS = ("train_loss", "loss", "test_loss", "val_loss")
"""Metrics drawn as the loss curve, the first one the store records."""


class Frames:
    """Draws the frames of one store.

    Parameters
    ----------
    store
        The opened store.
    view
        The embedding table to show (default: the store's token embedding).

    Raises
    ------
    AnalysisError
        When the store has no 2-D-viewable embedding table.
    """

    def __init__(self, store: Any, view: EmbeddingView | FrequentTokensView | None = None) -> None:
        view = view or default_view(store)
        if view is None:
            msg = f"{store.path} has no token embedding (*embed.weight or an nn.Embedding) to animate"
            raise AnalysisError(msg)
        self.store, self.view = store, view
        self.loss = self._loss_curve(store)
        self.sequences = None
        if "embedding-geometry" in store.analyses:
            geometry = store.analysis("embedding-geometry")
            if "sequence_embedding" in geometry:
                self.sequences = geometry[["sequence_embedding", "target"]].load()
        self.xi_limits: tuple[tuple[float, float], tuple[float, float]] | None = None
        self.xi_plane = None
        if self.sequences is not None:  # one view for every frame, from ξ at every step
            self.xi_plane = sequence_plane(self.sequences["sequence_embedding"].values)
            every = project_sequences(self.sequences["sequence_embedding"].values, self.xi_plane)
            x, y = every[..., 0], every[..., 1]
            self.xi_limits = (float(np.nanmin(x)), float(np.nanmax(x))), (float(np.nanmin(y)), float(np.nanmax(y)))
        # the output regions are the classes of the ξ plane itself: only where ξ is 2-D (d = 2);
        # a point of a projection of d > 2 stands for a whole subspace of outputs
        flat = self.sequences is not None and self.xi_plane is None
        self.model = self._decoder(store) if flat else None

    @staticmethod
    def _decoder(store: Any) -> Any:
        """The store's model when it maps a sequence embedding to logits (``output_logits``), else None."""
        if store.model is None:
            return None
        try:
            model = store.model.build()
        except Exception:  # an untrusted or broken factory: the frames simply show no regions
            return None
        return model if callable(getattr(model, "output_logits", None)) else None

    def regions(self, step: int, xlim: tuple[float, float], ylim: tuple[float, float]) -> np.ndarray:
        """The class the model outputs at each point of a ``REGION_GRID``² grid of the ξ plane at ``step``."""
        import torch

        self.model.load_state_dict(self.store.tensors(step, framework="torch"))
        xs, ys = np.linspace(*xlim, REGION_GRID), np.linspace(*ylim, REGION_GRID)
        grid = np.stack(np.meshgrid(xs, ys), axis=-1).reshape(-1, 2)
        dtype = next(self.model.parameters()).dtype
        with torch.no_grad():
            logits = self.model.output_logits(torch.as_tensor(grid, dtype=dtype))
        return logits.argmax(-1).numpy().reshape(REGION_GRID, REGION_GRID)

    @staticmethod
    def _loss_curve(store: Any) -> tuple[str, np.ndarray, np.ndarray] | None:
        metrics = store.metrics
        for name in LOSS_METRICS:
            if name in metrics:
                series = metrics[name].dropna("step")
                return name.replace("_", " "), series["step"].values, series.values
        if "loss" in store.analyses:
            mean = store.analysis("loss")["mean_loss"].load()
            return "mean loss (loss analyzer)", mean["step"].values, mean.values
        return None

    def steps(self, limit: int | None = None) -> list[int]:
        """The checkpoints to draw: all, or ``limit`` evenly spread (first and last included)."""
        steps = [int(s) for s in self.store.steps]
        if limit is None or len(steps) <= limit:
            return steps
        picks = np.linspace(0, len(steps) - 1, limit).round().astype(int)
        return [steps[i] for i in sorted(set(picks.tolist()))]

    def figure(self) -> Figure:
        """An empty figure sized for one frame."""
        from matplotlib.figure import Figure

        panels = self._panels()
        return Figure(figsize=(3.6 * panels, 3.6), layout="constrained")

    def frames(self, figure: Figure, steps: Sequence[int]) -> Iterator[int]:
        """Draw each of ``steps`` into ``figure`` in turn (cleared first), yielding the step drawn."""
        points = self.view.points(steps)
        limits = self.view.limits(points)
        for index, step in enumerate(steps):
            figure.clear()
            self._draw(figure, step, points[index], limits)
            yield int(step)

    def _panels(self) -> int:
        """Axes of one frame: the view's, ξ's when stored, the loss curve's when recorded."""
        return self.view.panels + (self.sequences is not None) + (self.loss is not None)

    def _draw(self, figure: Figure, step: int, points: np.ndarray, limits: Any) -> None:
        panels = self._panels()
        axes = [figure.add_subplot(1, panels, i + 1) for i in range(panels)]
        used = self.view.panels
        self.view.draw(axes[:used], points, limits)
        figure.suptitle(f"{Path(self.store.path).name}: step {step}")
        if self.sequences is not None:
            ax = axes[used]
            used += 1
            target = self.sequences["target"].values
            xlim, ylim = self.xi_limits
            title = "sequence embeddings ξ by target"
            if self.model is not None:
                ax.imshow(
                    self.regions(step, xlim, ylim),
                    origin="lower",
                    extent=(*xlim, *ylim),
                    aspect="auto",
                    cmap=CYCLIC,
                    vmin=0,
                    vmax=int(target.max()) + 1,
                    alpha=0.35,
                    interpolation="nearest",
                )
                title += "; shading: the class output there"
            if step in self.sequences["step"].values:
                xi = self.sequences["sequence_embedding"].sel(step=step).values
                draw_sequences(ax, xi, target, title, self.xi_plane)
            else:  # said, not left blank without a word
                ax.set_title(title + f" (not computed at step {step})", fontsize="small")
                ax.set_xlabel("ξ 0")
                ax.set_ylabel("ξ 1")
            ax.set_xlim(xlim)
            ax.set_ylim(ylim)
        if self.loss is not None:
            ax = axes[used]
            name, steps, values = self.loss
            ax.plot(steps, values, color=COLORS[0])
            ax.axvline(step, color=COLORS[1])
            at = np.interp(step, steps, values)
            ax.plot([step], [at], "o", color=COLORS[1])
            positive_log(ax, values)
            step_axis(ax, steps)
            ax.set_ylabel(name)
            ax.set_title(f"{name}: {at:.4g}", fontsize="medium")


def animate(store: Any, out: str, *, fps: int = 20, limit: int | None = 200, dpi: int = 80) -> int:
    """Write the frames of ``store`` to ``out`` (``.gif`` with Pillow, ``.mp4`` with ffmpeg); return the count.

    Raises
    ------
    AnalysisError
        For another extension, an MP4 without ffmpeg on the PATH, or a store without embeddings.
    """
    from matplotlib import animation

    suffix = Path(out).suffix.lower()
    if suffix == ".gif":
        writer: Any = animation.PillowWriter(fps=fps)
    elif suffix == ".mp4":
        if not animation.FFMpegWriter.isAvailable():
            msg = f"writing {out} needs ffmpeg on the PATH (e.g. apt-get install ffmpeg); or write a .gif"
            raise AnalysisError(msg)
        writer = animation.FFMpegWriter(fps=fps)
    else:
        msg = f"cannot write an animation to {out!r}: use a .gif or .mp4 file name"
        raise AnalysisError(msg)
    frames = Frames(store)
    figure = frames.figure()
    count = 0
    with writer.saving(figure, out, dpi):
        for _ in frames.frames(figure, frames.steps(limit)):
            readable_texts(figure)  # the store's name is in every frame's title
            writer.grab_frame()
            count += 1
    return count


__all__ = ["LOSS_METRICS", "REGION_GRID", "Frames", "animate"]
