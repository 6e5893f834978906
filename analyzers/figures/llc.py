"""Figures of ``llc``: λ̂ over steps with its spread over chains, and the chains' loss traces.

Checkpoints whose chains have a problem (:func:`ckpt.numerics.chain_diagnostics.chain_warnings`:
diverged, not flat, λ̂ < 0, R-hat or ESS) are marked on the λ̂ figure and named in its legend, and
their traces are among those drawn, so that a number the diagnostics doubt is never shown plain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.figures import COLORS, log_spaced, new_figure, step_axis
from ckpt.numerics.chain_diagnostics import chain_warnings

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TRACE_PANELS = 4
"""At most this many checkpoints' traces: the first, the last, and the first flagged ones between."""
NAMED_WARNINGS = 6
"""Flagged checkpoints named one by one in the λ̂ legend; the rest are counted."""
NAMED_CHAINS = 8
"""Chains named in a traces panel's legend."""
WARNING_COLOR = COLORS[1]


def llc_figures(result: xr.Dataset, store: Any = None) -> dict[str, Figure]:
    """``llc`` (λ̂ ± its spread over chains, per-chain points, flagged steps) and ``traces``.

    Parameters
    ----------
    result : xr.Dataset
        An ``llc`` result (dims step, chain, draw).
    store : Any
        The store (unused: everything drawn is in the result).

    Returns
    -------
    dict[str, Figure]
        The two figures by name.
    """
    result = result.load()
    problems = problems_by_step(result)
    return {"llc": estimate_figure(result, problems), "traces": traces_figure(result, problems)}


def problems_by_step(result: xr.Dataset) -> dict[int, list[str]]:
    """Each flagged step's problems in short (the head of each :func:`chain_warnings` line)."""
    found: dict[int, list[str]] = {}
    for line in chain_warnings(result):
        head, _, rest = line.partition(": ")
        found.setdefault(int(head.removeprefix("step ")), []).append(rest.split(": ")[0])
    return found


def estimate_figure(result: xr.Dataset, problems: dict[int, list[str]]) -> Figure:
    """λ̂ over steps, a ±1 std band over chains, every chain's λ̂ as a dot, and flagged steps marked."""
    steps = result["step"].values
    llc, std = result["llc"].values, result["llc_std"].values
    per_chain = result["llc_chain"].values
    figure = new_figure(1, width=8.0, height=4.2)
    axes = figure.axes[0]
    chains = per_chain.shape[1]
    xs = np.repeat(steps[:, None], chains, axis=1)
    axes.scatter(xs, per_chain, s=9, color="grey", alpha=0.5, linewidth=0, label=f"per chain ({chains})", zorder=2)
    band = np.isfinite(llc) & np.isfinite(std)
    if band.sum() > 1:
        axes.fill_between(
            steps, llc - std, llc + std, where=band, color=COLORS[0], alpha=0.2, linewidth=0, label="±1 std over chains"
        )
    elif band.any():
        axes.errorbar(steps[band], llc[band], yerr=std[band], fmt="none", ecolor=COLORS[0], capsize=4)
    axes.plot(steps, llc, color=COLORS[0], marker=".", linewidth=1.6, label="λ̂ (mean over chains)", zorder=3)
    mark_flagged(axes, steps, llc, per_chain, problems)
    axes.axhline(0, color="grey", linewidth=0.6, linestyle=":")
    if not np.isfinite(llc).any() and not np.isfinite(per_chain).any():
        axes.text(0.5, 0.5, "no finite λ̂", transform=axes.transAxes, ha="center", color=WARNING_COLOR)
    nbeta = result["llc"].attrs.get("nbeta")
    axes.set_ylabel("local learning coefficient λ̂")
    axes.set_title(
        "Local learning coefficient" + (f" (nβ = {float(nbeta):.4g})" if nbeta not in (None, "") else ""),
        fontsize="medium",
    )
    axes.legend(fontsize="x-small", loc="best")
    if len(steps):  # the marks on the axis' floor are outside autoscaling: every step stays in view
        low, high = float(steps.min()), float(steps.max())
        if log_spaced([int(s) for s in steps]):  # a linear pad reaches far below 0 on the symlog axis
            axes.set_xlim(low, high * 1.1)
        else:
            pad = 0.03 * (high - low) or 1.0
            axes.set_xlim(low - pad, high + pad)
    step_axis(axes, steps)
    if len(steps) == 1:
        axes.set_xticks(steps)
    return figure


def mark_flagged(
    axes: Axes, steps: np.ndarray, llc: np.ndarray, per_chain: np.ndarray, problems: dict[int, list[str]]
) -> None:
    """A red ring at each flagged step (at λ̂, else at its chains' mean, else on the floor), named in the legend."""
    from matplotlib.transforms import blended_transform_factory

    bottom = blended_transform_factory(axes.transData, axes.transAxes)
    index = {int(s): i for i, s in enumerate(steps)}
    for k, (step, what) in enumerate(sorted(problems.items())):
        i = index[step]
        finite = per_chain[i][np.isfinite(per_chain[i])]
        label = f"step {step}: {'; '.join(what)}" if k < NAMED_WARNINGS else None
        if k == NAMED_WARNINGS:
            label = f"and {len(problems) - NAMED_WARNINGS} more flagged steps"
        ring = {"s": 70, "facecolors": "none", "edgecolors": WARNING_COLOR, "linewidths": 1.4, "zorder": 4}
        if np.isfinite(llc[i]):
            axes.scatter([step], [llc[i]], label=label, **ring)
        elif finite.size:
            axes.scatter([step], [finite.mean()], marker="s", label=label, **ring)
        else:  # no finite λ̂ at all: a cross on the axis' floor
            axes.scatter([step], [0.03], transform=bottom, marker="x", color=WARNING_COLOR, label=label, zorder=4)


def chosen_steps(steps: np.ndarray, problems: dict[int, list[str]]) -> list[int]:
    """The indices of the checkpoints whose traces are drawn: first, last, then flagged ones, in step order."""
    picks = [0, len(steps) - 1]
    flagged = [i for i, s in enumerate(steps) if int(s) in problems and i not in picks]
    room = TRACE_PANELS - len(set(picks))
    return sorted(set(picks) | set(flagged[: max(room, 0)]))


def traces_figure(result: xr.Dataset, problems: dict[int, list[str]]) -> Figure:
    """Every chain's minibatch loss over its draws at up to :data:`TRACE_PANELS` checkpoints, with init_loss."""
    steps = result["step"].values
    picks = chosen_steps(steps, problems) if len(steps) else []
    figure = new_figure(max(len(picks), 1), columns=2, width=4.8, height=3.2)
    if not picks:
        figure.axes[0].text(0.5, 0.5, "no checkpoints", transform=figure.axes[0].transAxes, ha="center")
        return figure
    burn_in = result["llc"].attrs.get("burn_in")
    for panel, (axes, i) in enumerate(zip(figure.axes, picks, strict=True)):
        step = int(steps[i])
        trace_panel(axes, result.isel(step=i), legend=panel == 0)
        flagged = problems.get(step)
        title = f"step {step}" + (f": {'; '.join(flagged)}" if flagged else "")
        axes.set_title(title, fontsize="small", color=WARNING_COLOR if flagged else "black", wrap=True)
        axes.set_xlabel("draw" + (f" (after {burn_in} burn-in steps)" if burn_in not in (None, "") else ""))
        axes.set_ylabel("minibatch loss")
    return figure


def trace_panel(axes: Axes, one: xr.Dataset, *, legend: bool) -> None:
    """One checkpoint's chains; diverged ones dashed, the y range set by the others and init_loss."""
    trace = one["loss_trace"].values
    diverged = np.asarray(one["diverged"].values, bool)
    init = float(one["init_loss"].values)
    draws = np.arange(trace.shape[1])
    for c in range(trace.shape[0]):
        name = f"chain {c}" + (" (diverged)" if diverged[c] else "")
        label = name if legend and (c < NAMED_CHAINS or diverged[c]) else None
        style = "--" if diverged[c] else "-"
        color = COLORS[c % len(COLORS)]
        axes.plot(draws, trace[c], linestyle=style, color=color, linewidth=0.8, alpha=0.85, label=label)
    if np.isfinite(init):
        axes.axhline(init, color="black", linewidth=1.2, linestyle=":", label="init loss L(w*)" if legend else None)
    kept = trace[~diverged]
    kept = kept[np.isfinite(kept)]
    if kept.size:  # a blown-up chain must not flatten the others into a line
        low, high = float(kept.min()), float(kept.max())
        if np.isfinite(init):
            low, high = min(low, init), max(high, init)
        pad = 0.08 * (high - low) or 0.05 * max(abs(high), 1e-12)
        axes.set_ylim(low - pad, high + pad)
    elif not np.isfinite(trace).any():
        axes.text(0.5, 0.5, "no finite draw", transform=axes.transAxes, ha="center", color=WARNING_COLOR)
    if legend:
        axes.legend(fontsize="x-small", loc="best", ncol=2)


__all__ = ["chosen_steps", "estimate_figure", "llc_figures", "problems_by_step", "traces_figure"]
