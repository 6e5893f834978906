"""The figures of ``repro/spike_causes.py``: measures at pre-onset vs control checkpoints; attention start vs end."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure


def causes_figure(causes: dict[str, Any]) -> Figure:
    """One panel per measure: the paired differences (pre-onset − control), their mean, its CI and the null range."""
    names = list(causes["values"])
    columns = 4
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.1 * columns, 2.9 * rows), squeeze=False)
    for ax in axes.ravel()[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.ravel(), names, strict=False):
        diffs = np.subtract(causes["values"][name]["pre"], causes["values"][name]["control"])
        stat = causes["statistics"].get(name)
        if diffs.size:
            ax.hist(diffs, bins=30, color="0.7")
        ax.axvline(0, color="k", lw=0.8)
        if stat is not None:
            ax.axvspan(*stat["null95"], color="0.3", alpha=0.15, label="chance (sign flips) 95%")
            ax.axvspan(*stat["ci95"], color="C3", alpha=0.35, label="mean, 95% CI (seeds)")
            ax.axvline(stat["mean_diff"], color="C3", lw=1.5)
            low, high = stat["ci95"]
            ax.set_xlabel(
                f"pre-onset − control: {stat['mean_diff']:+.3g} [{low:+.3g}, {high:+.3g}]\n"
                f"p = {stat['p']:.2g}: {stat['verdict']}",
                fontsize=7,
            )
        ax.set_title(f"{name}\npaper: {causes_prediction(name)}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(fontsize=6, loc="upper left")
    axes[0, 0].set_ylabel("pairs", fontsize=8)
    pairs, runs = len(causes["pairs"]["seed"]), len(causes["onsets"])
    fig.suptitle(
        f"Loss-spike causes (Clustering Head §4.3): checkpoint before each onset minus a matched control"
        f" ({pairs} pairs, {runs} seeds)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def causes_prediction(name: str) -> str:
    """The paper's prediction for measure ``name`` (see ``spike_causes.MEASURES``)."""
    from spike_causes import MEASURES

    text, sign = MEASURES[name]
    return f"{text} ({'>' if sign > 0 else '<'} 0)"


def attention_figure(attention: dict[str, Any], shown: int = 24) -> Figure:
    """Seed 0's attention on the first probes at start and end (Fig. 8), and r per seed against the baseline."""
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 1, 1.4]})
    start, end = attention["starts"][0], attention["ends"][0]  # [layer, head, example, query, key]
    for ax, weights, title in ((axes[0], start, "start"), (axes[1], end, "end")):
        image = ax.imshow(weights[0, 0, :shown, 0, :], aspect="auto", cmap="viridis", vmin=0)
        ax.set_title(f"seed 0, {title} of training", fontsize=9)
        ax.set_xlabel("position t (key)", fontsize=8)
        ax.set_ylabel("probe sequence", fontsize=8)
        ax.set_xticks(range(0, weights.shape[-1], 2))
        fig.colorbar(image, ax=ax, fraction=0.046)
    own = np.array(attention["own"])
    seeds = np.arange(len(own))
    axes[2].scatter(seeds, own, color="C0", s=14, label="own seed: start vs end")
    if attention["seeds"] > 1:
        axes[2].scatter(seeds, attention["cross"], color="C1", s=14, marker="x", label="seed i start vs seed j end")
        low, high = attention["cross_ci95"]
        axes[2].axhspan(low, high, color="C1", alpha=0.15)
    low, high = attention["own_ci95"]
    axes[2].axhspan(low, high, color="C0", alpha=0.15)
    axes[2].set_xlabel("seed", fontsize=8)
    axes[2].xaxis.get_major_locator().set_params(integer=True)
    axes[2].set_ylabel("Pearson r of attention weights", fontsize=8)
    axes[2].legend(fontsize=7)
    axes[2].set_title("per seed (bands: 95% CI of the means)", fontsize=9)
    fig.suptitle(f"Attention at the start and end of training (Fig. 8), {attention['seeds']} seeds", fontsize=9)
    fig.tight_layout()
    return fig
