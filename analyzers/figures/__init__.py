"""Figures of stored results: what ``Analyzer.plot``, ``ckpt plot``, ``ckpt report`` and ``ckpt animate`` draw.

One module per family of analyzers (``loss``, ``basis``, ``clusters`` ...), each with a
function ``figures(result, store)`` returning ``{name: matplotlib.figure.Figure}``. This package
is imported only when something is drawn, so matplotlib stays out of the import path of every
command that does not plot (``tests/test_packaging.py`` checks ``ckpt analyze``'s).

Figures are built with :class:`matplotlib.figure.Figure` directly, never ``pyplot``: no global
figure registry to leak memory across the hundreds of frames of an animation, and no GUI backend
chosen behind the user's back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANEL_WIDTH = 4.2
"""Inches per panel (a 3-panel row is 12.6 in: 1,000 pixels at the report's 80 dpi)."""
PANEL_HEIGHT = 3.0
MAX_PANELS = 12
"""At most this many panels (basis vectors, modules) in one figure; the rest are named in its title."""
COLORS = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]
"""matplotlib's tab10, with red second so that a two-group plot reads blue against red."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def displayable(text: str) -> str:
    r"""``text`` with every character that is no Unicode text replaced by U+FFFD, the replacement character.

    Python keeps the bytes of a file name that is not UTF-8 as lone surrogates (``run-\xff.zarr`` is
    ``"run-\udcff.zarr"``), and a store's JSON may hold them too (``"\udcff"``): neither a font
    nor a UTF-8 page can show one, so they are replaced, as a terminal shows undecodable bytes.
    """
    return _SURROGATE.sub("\ufffd", text)


def readable_texts(figure: Figure) -> Figure:
    """``figure`` with every text it holds made :func:`displayable` (matplotlib refuses to draw the others).

    Called where a figure is drawn (:func:`save`, :func:`png_bytes`, an animation's frames), so
    that no figure module has to clean each name it reads from a store.
    """
    from matplotlib.text import Text

    for text in figure.findobj(Text):
        shown = text.get_text()
        if isinstance(shown, str) and _SURROGATE.search(shown):
            text.set_text(displayable(shown))
    return figure


def new_figure(panels: int, columns: int = 3, *, width: float = PANEL_WIDTH, height: float = PANEL_HEIGHT) -> Figure:
    """A constrained-layout Figure with ``panels`` axes in rows of ``columns`` (``figure.axes`` lists them)."""
    from matplotlib.figure import Figure

    columns = max(1, min(columns, panels))
    rows = -(-panels // columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    for index in range(panels):
        figure.add_subplot(rows, columns, index + 1)
    return figure


def log_spaced(steps: Sequence[int]) -> bool:
    """Whether checkpoints are log-spaced (gaps growing geometrically), as in runs saved on a log schedule."""
    positive = np.asarray([s for s in steps if s > 0], dtype=np.float64)
    if positive.size < 4:
        return False
    ratios = positive[1:] / positive[:-1]
    gaps = np.diff(positive)
    return bool(gaps[-1] > 4 * gaps[0] and np.median(ratios) > 1.05)


def step_axis(axes: Axes, steps: Sequence[int], label: str = "training step") -> None:
    """Label ``axes``' x axis with training steps; symlog when the run was saved on a log schedule."""
    steps = [int(s) for s in steps]
    if log_spaced(steps):
        first = min((s for s in steps if s > 0), default=1)
        axes.set_xscale("symlog", linthresh=first)
    axes.set_xlabel(label)


def quartile_band(axes: Axes, steps: Any, values: np.ndarray, color: str, label: str) -> None:
    """Median line and 25-75% band of ``values`` (rows: steps, columns: datapoints); NaNs ignored."""
    finite = np.isfinite(values).any(axis=1)
    if not finite.any():
        return
    low, median, high = np.nanpercentile(values[finite], [25, 50, 75], axis=1)
    steps = np.asarray(steps)[finite]
    axes.plot(steps, median, color=color, label=label, linewidth=1.5)
    axes.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)


def positive_log(axes: Axes, values: np.ndarray, axis: str = "y") -> None:
    """Log scale on ``axis`` when every finite value is positive and they span over two decades."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size and finite.min() > 0 and finite.max() / finite.min() > 100:
        (axes.set_yscale if axis == "y" else axes.set_xscale)("log")


def limited(items: Sequence[Any], what: str) -> tuple[list[Any], str]:
    """The first :data:`MAX_PANELS` of ``items`` and a note naming how many were left out ('' when none)."""
    items = list(items)
    if len(items) <= MAX_PANELS:
        return items, ""
    return items[:MAX_PANELS], f" (first {MAX_PANELS} of {len(items)} {what})"


def hide_unused(figure: Figure, used: int) -> None:
    """Remove the axes after the first ``used`` (a grid of panels with a short last row)."""
    for axes in figure.axes[used:]:
        figure.delaxes(axes)


def save(figure: Figure, path: str, dpi: int = 100) -> None:
    """Write ``figure`` to ``path``; the format follows the extension (png, svg, pdf ...)."""
    readable_texts(figure).savefig(path, dpi=dpi)


def png_bytes(figure: Figure, dpi: int = 80) -> bytes:
    """``figure`` as PNG bytes (what the HTML report embeds)."""
    import io

    buffer = io.BytesIO()
    readable_texts(figure).savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


__all__ = [
    "COLORS",
    "MAX_PANELS",
    "PANEL_HEIGHT",
    "PANEL_WIDTH",
    "displayable",
    "hide_unused",
    "limited",
    "log_spaced",
    "new_figure",
    "png_bytes",
    "positive_log",
    "quartile_band",
    "readable_texts",
    "save",
    "step_axis",
]
