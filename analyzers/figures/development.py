"""The report's development page: loss, LLC, Hessian trace and essential dynamics on one step axis.

Hoogland et al. (2024) read a run's developmental stages off these curves together: the local
learning coefficient λ̂ (``llc``) plateaus or turns where the essential-dynamics path
(``essential-dynamics``) turns, while the loss may show nothing. This module gathers what the
store holds of each (:func:`gather`, data only, no HTML) and draws it as one column of panels
sharing the step axis, the essential-dynamics stage boundaries as vertical lines across all of
them (:func:`figure`). docs/development.md tells how to read it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, positive_log, step_axis

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

SOURCES = ("loss", "llc", "spectrum", "essential-dynamics")
"""The analyzers the page draws, in the order of its panels."""
WHAT = {
    "loss": "loss",
    "llc": "local learning coefficient λ̂ ± its spread over chains",
    "spectrum": "Hessian trace tr(H) ± its standard error",
    "essential-dynamics": "essential-dynamics path (PC1, PC2) and its stage boundaries",
}
"""What each analyzer's panel shows, in the page's words."""
PANEL_WIDTH = 12.6
"""Inches: at the report's 80 dpi the figure is 1,008 pixels wide, as wide as a row of three panels."""
PANEL_HEIGHT = 2.1
BOUNDARY_COLOR = COLORS[1]
LABELLED = 12
"""Stage boundaries whose steps are written above the top panel; more would overlap."""
STEP_OF_LINE = re.compile(r"step (-?\d+):")
"""The step a line of ``chain_warnings`` names (each begins with it)."""


@dataclass
class Curve:
    """One line of a panel, with an optional ±spread band."""

    steps: np.ndarray
    values: np.ndarray
    label: str
    spread: np.ndarray | None = None


@dataclass
class Source:
    """What the page drew from one of :data:`SOURCES`, or that it is missing."""

    analyzer: str
    result: str | None = None
    """The stored result's name (None: the store holds none; the loss may then come from a metric)."""
    metrics: list[str] = field(default_factory=list)
    """The training metrics drawn instead of a ``loss`` result."""
    stale: bool = False
    """The store's data or model changed after the result was computed."""
    steps: int = 0
    """Checkpoints the result covers."""
    notes: list[str] = field(default_factory=list)
    """What is wrong with the drawn values (non-finite steps), in the page's words."""


@dataclass
class Development:
    """Everything the development page shows, as data."""

    panels: dict[str, list[Curve]]
    """Drawn curves by source analyzer, in the order of :data:`SOURCES` (only those the store holds)."""
    boundaries: np.ndarray
    """Steps of the essential-dynamics turning points (where a new stage begins)."""
    sources: list[Source]
    """One per :data:`SOURCES`."""
    problems: list[str]
    """Results that could not be read (also printed by ``ckpt report``)."""


def _pick(readable: Mapping[str, xr.Dataset], analyzer: str) -> str | None:
    """The name of the result of ``analyzer`` to draw: the one under its own name, else the first under ``--as``."""
    names = [name for name, result in readable.items() if (result.ckpt.analyzer or name) == analyzer]
    return analyzer if analyzer in names else (names[0] if names else None)


def _float(result: xr.Dataset, name: str) -> np.ndarray:
    return np.asarray(result[name].values, dtype=np.float64)


def _stale_label(label: str, source: Source) -> str:
    return f"{label} (stale)" if source.stale else label


def _listed(steps: np.ndarray) -> str:
    return ", ".join(str(s) for s in steps[:8]) + (f" and {steps.size - 8} more" if steps.size > 8 else "")


def _chain_notes(result: xr.Dataset, steps: np.ndarray, source: Source) -> None:
    """A note when the chains' diagnostics make λ̂ doubtful at some steps (docs/llc.md, "What the diagnostics say")."""
    try:
        from ckpt.numerics.chain_diagnostics import chain_warnings
    except ImportError:  # a ckpt without the diagnostics: diverged chains alone
        lines = [f"step {s}: a chain diverged" for s in steps[np.asarray(result["diverged"].values, bool).any(1)]]
    else:
        lines = chain_warnings(result)
    if lines:
        flagged = np.asarray(sorted({int(m.group(1)) for m in map(STEP_OF_LINE.match, lines) if m}), dtype=np.int64)
        source.notes.append(
            f"the chains' diagnostics flag {flagged.size} of {steps.size} steps ({_listed(flagged)}); first: "
            f"{lines[0]} (the {source.result} section lists every warning)"
        )


def _curves(analyzer: str, result: xr.Dataset, source: Source) -> tuple[list[Curve], np.ndarray]:
    """The curves of one stored result, and its stage boundaries (essential dynamics only)."""
    steps = np.asarray(result["step"].values, dtype=np.int64)
    boundaries = np.zeros(0, dtype=np.int64)
    if analyzer == "loss":
        split = result.ckpt.option("split", "eval")
        curves = [Curve(steps, _float(result, "mean_loss"), _stale_label(f"mean loss ({split})", source))]
    elif analyzer == "llc":
        label = _stale_label("λ̂ ± std over chains", source)
        curves = [Curve(steps, _float(result, "llc"), label, _float(result, "llc_std"))]
    elif analyzer == "spectrum":
        label = _stale_label(f"tr(H) ± 1 s.e. ({result['trace'].attrs.get('method', '?')})", source)
        curves = [Curve(steps, _float(result, "trace"), label, _float(result, "trace_stderr"))]
    else:
        projection = _float(result, "projection")
        ratio = _float(result, "explained_variance_ratio")
        curves = [
            Curve(steps, projection[:, k], _stale_label(f"PC{k + 1} ({ratio[k]:.1%} of the variance)", source))
            for k in range(min(2, projection.shape[1]))
        ]
        boundaries = steps[np.asarray(result["turning_point"].values, dtype=bool)]
    if analyzer == "llc":
        _chain_notes(result, steps, source)
    for curve in curves:
        bad = curve.steps[~np.isfinite(curve.values)]
        if bad.size:
            source.notes.append(f"{curve.label}: not finite at {bad.size} step(s) ({_listed(bad)}), not drawn there")
    return curves, boundaries


METRICS_DRAWN = 4
"""Loss metrics drawn when the store holds no ``loss`` result (train and test loss, and a few more)."""


def _metric_losses(store: Any) -> list[str]:
    """The training metrics drawn when the store holds no ``loss`` result: those named ``*loss*``."""
    return [str(n) for n in store.metrics.data_vars if "loss" in str(n).lower()][:METRICS_DRAWN]


def gather(store: Any, readable: Mapping[str, xr.Dataset], stale: Callable[[xr.Dataset], bool]) -> Development:
    """What the development page shows of ``store``.

    Parameters
    ----------
    store
        The open store.
    readable
        Its stored results whose provenance was validated, by name (the report's).
    stale
        Whether a stored result was computed on data or a model the store no longer holds.
    """
    from ckpt.errors import CkptError

    panels: dict[str, list[Curve]] = {}
    boundaries = np.zeros(0, dtype=np.int64)
    sources, problems = [], []
    for analyzer in SOURCES:
        name = _pick(readable, analyzer)
        source = Source(analyzer, name)
        sources.append(source)
        if name is None:
            source.metrics = _metric_losses(store) if analyzer == "loss" else []
            curves = []
            for metric in source.metrics:
                series = store.metrics[metric].dropna("step")
                steps = np.asarray(series["step"].values, dtype=np.int64)
                curves.append(Curve(steps, np.asarray(series.values, dtype=np.float64), f"{metric} (training metric)"))
                source.steps = max(source.steps, len(steps))
            if curves:
                panels[analyzer] = curves
            continue
        result = readable[name]
        try:
            source.stale = stale(result)
            curves, found = _curves(analyzer, result, source)
        except (CkptError, KeyError, ValueError, IndexError) as exc:  # damaged or another layout: named, not drawn
            problems.append(f"development: {name} not drawn ({type(exc).__name__}: {exc})")
            source.notes.append(f"not drawn: {type(exc).__name__}: {exc}")
            continue
        source.steps = len(curves[0].steps) if curves else 0
        panels[analyzer] = curves
        boundaries = found if analyzer == "essential-dynamics" else boundaries
    return Development(panels, boundaries, sources, problems)


YLABELS = {"loss": "loss", "llc": "LLC λ̂", "spectrum": "Hessian trace", "essential-dynamics": "ED projection"}


def figure(development: Development) -> Figure | None:
    """The panels of ``development`` one under the other on a shared step axis; None when there is nothing to draw."""
    from matplotlib.figure import Figure

    keys = list(development.panels)
    if not keys:
        return None
    drawn = Figure(figsize=(PANEL_WIDTH, 0.6 + PANEL_HEIGHT * len(keys)), layout="constrained")
    axes_list = np.atleast_1d(drawn.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]).tolist()
    steps: list[int] = []
    for axes, key in zip(axes_list, keys, strict=True):
        for index, curve in enumerate(development.panels[key]):
            color = "black" if len(development.panels[key]) == 1 else COLORS[index % len(COLORS)]
            axes.plot(curve.steps, curve.values, color=color, marker=".", linewidth=1.5, label=curve.label)
            if curve.spread is not None:
                band = np.nan_to_num(curve.spread)
                low, high = curve.values - band, curve.values + band
                axes.fill_between(curve.steps, low, high, color=color, alpha=0.2, linewidth=0)
            steps += [int(s) for s in curve.steps]
        if key == "loss":
            positive_log(axes, np.concatenate([c.values for c in development.panels[key]]))
        if key == "essential-dynamics":
            axes.axhline(0, color="grey", linewidth=0.6, linestyle=":")
        axes.set_ylabel(YLABELS[key])
    for place, axes in enumerate(axes_list):
        for index, step in enumerate(development.boundaries):
            label = "stage boundary (essential dynamics)" if index == 0 and place == 0 else None
            axes.axvline(step, color=BOUNDARY_COLOR, linestyle="--", linewidth=1.0, label=label)
        axes.legend(fontsize="small", loc="best", framealpha=0.8)
    top = axes_list[0]
    if 0 < len(development.boundaries) <= LABELLED:
        for step in development.boundaries:
            top.annotate(
                f"{step}", (step, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 2), textcoords="offset points",
                ha="center", va="bottom", fontsize="x-small", color=BOUNDARY_COLOR,
            )  # fmt: skip
    shown = sorted(set(steps))
    step_axis(axes_list[-1], shown)
    if len(shown) > 1:  # symlog's autoscale margin would reach into negative steps
        axes_list[-1].set_xlim(shown[0], shown[-1])
    drawn.suptitle("development over training, on one step axis", fontsize="medium")
    return drawn


__all__ = ["SOURCES", "WHAT", "Curve", "Development", "Source", "figure", "gather"]
