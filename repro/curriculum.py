"""Clustering Head §4.2 (Fig. 9-11): transfer of circuits by curriculum, p = 2 -> p = 3.

Protocol (Clustering Head §4.2; the sandbox's ``paper`` preset, §2: L = 12, k = 5, d = 2,
2,048 train / 2,048 test sequences, Adam lr 3e-3, batch 32):

- **curriculum arm**: train sparse modular addition at p = 2 for ``--epochs`` (paper: 1,000)
  epochs, then switch the data to p = 3 for ``--epochs`` more. At the switch the model gains a
  token-embedding row for x = 2, set exactly as ``ckpt train --p 3 --init-from P2.zarr`` sets it:
  the child is seeded and built as a fresh p = 3 run of the same seed (``torch.manual_seed(seed)``,
  its p = 3 data, its model), then every tensor is the parent's, the embedding grown by the task's
  own :meth:`~ckpt.sandboxes.sparse_modular_addition.SparseModularAddition.grow` (the parent's
  rows, then the fresh row). The optimizer starts fresh, as ``--init-from`` does.
- **scratch arm**: p = 3 from a fresh initialisation for ``--epochs`` epochs: Fig. 9's
  "pretraining only" bars, which §4.2 trains for the same 1,000 epochs ("training for 1000 epochs
  does not result in any learning for p > 4"). The scratch run of seed s is the child of seed s
  before the parent's weights are copied in: same p = 3 data, batch order and x = 2 row, so the
  two arms are paired by seed.
- **compute-matched scratch arm** (``--scratch-epochs 2000``): the scratch runs go on to as many
  epochs as the curriculum trained in all, with the same Adam and the batch orders of the epochs
  after the first 1,000, exactly as one ``ckpt train --epochs 2000`` run. It separates what the p = 2
  phase gives from what 1,000 more epochs give (the paper compares 1,000 against 1,000 + 1,000).
- ``--child-p 4`` (to 10) runs Fig. 9's other bars: the same p = 2 parent, then p = 4. Several
  sizes (``--child-p 3 4 5 6 7 8 9 10``) share one p = 2 phase: each size's report is written when
  it is done, and ``curriculum-sweep.json/.png`` (Fig. 9: mean and maximum per p, both arms) after
  each size, so a stopped sweep keeps what it finished.

Accuracy: the final test accuracy (the 2,048 held-out sequences) after the last epoch. Fig. 9
shows its mean over runs (left) and its maximum over runs (right); a maximum over seeds has no
useful bootstrap, so the script reports the count of seeds at 100% with a Clopper-Pearson 95%
interval of that share. The mean has a 95% percentile bootstrap interval over seeds.

§4.2 also states: "the only models that achieved 100% test accuracy were those that captured both
the token and permutation invariances after the first 1000 epochs", i.e. whose p = 2 run made
C(k+p-1, k) = 6 sequence-embedding clusters. The clusters are counted as the ``embedding-geometry``
analyzer counts them, with its functions and default options (probe sequences: every prefix with
4 seeded suffixes; ξ: the output of ``attn``; single-linkage clusters at 0.05 x the RMS spread),
on each p = 2 run's final weights; the 2x2 table (ideal clusters x reached 100% at p = 3) gets
Fisher's exact test.

All seeds train at once (``repro/vectorized.py``: the sandbox's model under ``torch.func.vmap``
over the stacked parameters, one Adam that is each seed's own); each seed follows its
``ckpt train`` trajectory up to the floating-point summation order. Run by hand, not in CI::

    nice -n 19 python repro/curriculum.py --seeds 48 --epochs 1000 --out repro-out/curriculum
    nice -n 19 python repro/curriculum.py --seeds 24 --child-p 3 4 5 6 7 8 9 10 --out repro-out/curriculum-sweep
    nice -n 19 python repro/curriculum.py --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy import stats

from ckpt.analyzers.embedding_geometry import EmbeddingGeometry, cluster_count, ideal_cluster_count, probe_sequences
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition

PRESET = "paper"
PARENT_P, CHILD_P = 2, 3
RESAMPLES = 10_000
"""Bootstrap resamples (``numpy.random.default_rng(0)``)."""
QUICK = {"seeds": 4, "epochs": 3}
"""``--quick``: a smoke run of the whole pipeline (seconds), not a result."""


# -- training ------------------------------------------------------------------------------------


def paper_config(task: SparseModularAddition, p: int) -> dict[str, Any]:
    """The ``paper`` preset at field size ``p``."""
    return task.config(PRESET, {"p": p})


def epoch_orders(task: SparseModularAddition, config: dict[str, Any], data: Any, seed: int, epoch: int) -> list:
    """The row indices of every minibatch of one epoch, as :meth:`Task.batches` draws them.

    ``task.batches`` is run on a copy of the data whose inputs are the row numbers, so the
    shuffle is the task's own (seeded by seed and epoch), not a re-implementation of it.
    """
    rows = torch.arange(len(data.train_inputs))
    index = dataclasses.replace(data, train_inputs=rows, train_targets=rows, train_mask=None)
    return [batch[0] for batch in task.batches(index, config, epoch, seed)]


def train_stacked(
    task: SparseModularAddition,
    config: dict[str, Any],
    stacked: Any,
    seeds: Sequence[int],
    epochs: int,
    label: str,
    log: Callable[[str], None],
    start: int = 0,
) -> None:
    """Train every seed of ``stacked`` for ``epochs`` epochs, in place (minibatch Adam, the task's loss).

    ``start``: the epochs it was trained before (the batch orders go on from there, as one longer run's).
    """
    count = len(seeds)
    train_x = torch.stack([d.train_inputs for d in stacked.datas])
    train_y = torch.stack([d.train_targets for d in stacked.datas])
    which = torch.arange(count)[:, None]
    began = time.perf_counter()
    for epoch in range(start, start + epochs):
        orders = [epoch_orders(task, config, d, s, epoch) for d, s in zip(stacked.datas, seeds, strict=True)]
        for batch in zip(*orders, strict=True):
            rows = torch.stack(batch)  # [seed, batch]
            logits = stacked.forward(stacked.params, stacked.buffers, train_x[which, rows])
            losses = task.per_datapoint_loss(logits.flatten(0, 1), train_y[which, rows].flatten(), None)
            stacked.optimizer.zero_grad(set_to_none=True)
            # per seed the mean over its batch, as train() does; summed, seed i's parameters see only its own loss
            losses.view(count, -1).mean(1).sum().backward()
            stacked.optimizer.step()
        if (epoch + 1) % 100 == 0 or epoch + 1 == start + epochs:
            log(f"  {label}: epoch {epoch + 1}/{start + epochs}  ({time.perf_counter() - began:.0f} s)")


def test_accuracy(stacked: Any) -> np.ndarray:
    """Final test accuracy of every seed, ``[seed]``."""
    test_x = torch.stack([d.test_inputs for d in stacked.datas])
    test_y = torch.stack([d.test_targets for d in stacked.datas])
    with torch.no_grad():
        hits = stacked.forward(stacked.params, stacked.buffers, test_x).argmax(-1) == test_y
    return hits.double().mean(-1).numpy()


def seed_state(stacked: Any, i: int) -> dict[str, torch.Tensor]:
    """Seed ``i``'s tensors, unstacked (detached copies)."""
    state = {name: value[i].detach().clone() for name, value in stacked.params.items()}
    return state | {name: value[i].clone() for name, value in stacked.buffers.items()}


def grow_into(task: SparseModularAddition, parent: Any, child: Any) -> list[str]:
    """Set every child seed's parameters to its parent's, grown by ``task.grow`` where shapes differ.

    The child's stacked parameters hold its fresh initialisation (seeded as a ``train()`` run of
    the same seed); this is :func:`ckpt.sandboxes.init_from.initial_state` for in-memory parents.

    Returns
    -------
    list[str]
        The names of the grown tensors.

    Raises
    ------
    ValueError
        When a tensor differs in shape and the task does not grow it.
    """
    grown: set[str] = set()
    with torch.no_grad():
        for name, fresh in child.params.items():
            for i in range(len(fresh)):
                old = parent.params[name][i].detach()
                if old.shape == fresh[i].shape:
                    fresh[i].copy_(old)
                    continue
                extended = task.grow(name, old, fresh[i].clone())
                if extended is None or extended.shape != fresh[i].shape:
                    raise ValueError(f"{name}: parent {tuple(old.shape)}, child {tuple(fresh[i].shape)}, not grown")
                fresh[i].copy_(extended)
                grown.add(name)
    return sorted(grown)


# -- sequence clusters, as embedding-geometry counts them --------------------------------------------------


def sequence_clusters(stacked: Any, config: dict[str, Any]) -> tuple[np.ndarray, int]:
    """Clusters of ξ per seed (``embedding-geometry``'s ``sequence_clusters``) and the ideal count.

    The analyzer's own functions and default options: its probe set, ξ as the output of its
    default ``module`` captured by a forward hook, and its single-linkage count.
    """
    p, k, length = int(config["p"]), int(config["k"]), int(config["length"])
    options = {name: getattr(EmbeddingGeometry, name).default for name in ("suffixes", "seed", "module")}
    tolerance = EmbeddingGeometry.cluster_tolerance.default
    tokens = torch.as_tensor(probe_sequences(p, k, length, options["suffixes"], options["seed"])["tokens"])
    counts = []
    for i, model in enumerate(stacked.models):
        model.load_state_dict(seed_state(stacked, i))
        model.eval()
        captured: list[torch.Tensor] = []
        hook = captured.append
        handle = model.get_submodule(options["module"]).register_forward_hook(lambda _m, _i, out, keep=hook: keep(out))
        try:
            with torch.no_grad():
                model(tokens)
        finally:
            handle.remove()
        xi = captured[-1].reshape(len(tokens), -1).double().numpy()
        counts.append(cluster_count(xi, tolerance))
    return np.array(counts, dtype=np.int64), ideal_cluster_count(p, k)


# -- statistics --------------------------------------------------------------------------------------


def bootstrap_mean(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over seeds."""
    rng = np.random.default_rng(seed)
    boot = values[rng.integers(0, len(values), size=(RESAMPLES, len(values)))].mean(1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(low), float(high)


def summary(accuracy: np.ndarray) -> dict[str, Any]:
    """Mean (bootstrap CI), maximum, and seeds at 100% (Clopper-Pearson CI of the share)."""
    perfect = int((accuracy == 1.0).sum())
    share = stats.binomtest(perfect, len(accuracy)).proportion_ci(0.95, method="exact")
    return {
        "mean": float(accuracy.mean()),
        "mean_ci95": bootstrap_mean(accuracy),
        "std": float(accuracy.std(ddof=1)) if len(accuracy) > 1 else float("nan"),
        "max": float(accuracy.max()),
        "perfect": perfect,
        "perfect_share_ci95": (float(share.low), float(share.high)),
        "seeds": len(accuracy),
    }


def contingency(ideal: np.ndarray, perfect: np.ndarray) -> dict[str, Any]:
    """The 2x2 table ideal clusters (rows: yes, no) x 100% after the switch (columns: yes, no), Fisher's p."""
    table = [
        [int((ideal & perfect).sum()), int((ideal & ~perfect).sum())],
        [int((~ideal & perfect).sum()), int((~ideal & ~perfect).sum())],
    ]
    result = stats.fisher_exact(table, alternative="two-sided")
    odds = float(result.statistic)
    return {"table": table, "fisher_p": float(result.pvalue), "odds_ratio": odds if np.isfinite(odds) else None}


# -- report ------------------------------------------------------------------------------------------


def paired_difference(curriculum: np.ndarray, scratch: np.ndarray) -> dict[str, Any]:
    """Curriculum minus scratch, paired by seed: mean, bootstrap interval, counts and Wilcoxon's p."""
    difference = curriculum - scratch
    nonzero = difference[difference != 0]
    return {
        "mean": float(difference.mean()),
        "ci95": bootstrap_mean(difference),
        "better": int((difference > 0).sum()),
        "worse": int((difference < 0).sum()),
        "tied": int((difference == 0).sum()),
        "wilcoxon_p": float(stats.wilcoxon(nonzero).pvalue) if len(nonzero) else float("nan"),
    }


def print_tables(figures: dict[str, Any]) -> None:
    """The arms' accuracy table and the 2x2 cluster table."""
    arms = figures["arms"]
    print(f"\nfinal test accuracy over {figures['seeds'][0]}..{figures['seeds'][-1]} ({len(figures['seeds'])} seeds)")
    print(f"{'arm':<32}  {'mean':>6}  {'95% bootstrap CI':>17}  {'std':>5}  {'max':>6}  {'100%':>6}  {'share CI':>14}")
    for label, s in arms.items():
        low, high = s["mean_ci95"]
        plow, phigh = s["perfect_share_ci95"]
        print(
            f"{label:<32}  {s['mean']:>6.3f}  [{low:>6.3f}, {high:>6.3f}]  {s['std']:>5.3f}  {s['max']:>6.3f}"
            f"  {s['perfect']:>2}/{s['seeds']:<3}  [{plow:.2f}, {phigh:.2f}]"
        )
    compared = [("scratch", figures["paired_difference"])]
    if "paired_difference_matched" in figures:
        compared.append((f"scratch at {figures['scratch_epochs']} epochs", figures["paired_difference_matched"]))
    for against, diff in compared:
        print(
            f"curriculum - {against} (paired by seed): {diff['mean']:+.3f}"
            f" [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]; curriculum better in {diff['better']},"
            f" worse in {diff['worse']}, tied in {diff['tied']} seeds; Wilcoxon p = {diff['wilcoxon_p']:.2g}"
        )
    c = figures["clusters"]
    (a, b), (cc, d) = c["table"]
    print(
        f"\nsequence clusters of the p = 2 run at the switch (ideal C(k+p-1,k) = {c['ideal']}): counts {c['histogram']}"
    )
    print(f"{'':<26}  {'100% at p=' + str(figures['protocol']['child_p']):>11}  {'not 100%':>8}")
    print(f"{'ideal clusters':<26}  {a:>11}  {b:>8}")
    print(f"{'not ideal':<26}  {cc:>11}  {d:>8}")
    print(f"Fisher's exact test (two-sided): p = {c['fisher_p']:.3g}")


def plot(figures: dict[str, Any], path: str) -> None:
    """Bars with intervals as Fig. 9: mean accuracy (bootstrap CI), seeds at 100% (Clopper-Pearson CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = figures["arms"]
    child = figures["protocol"]["child_p"]
    labels = list(arms)
    colors = ["#999999", "#4477aa", "#228833", "#ee6677"] if len(labels) == 4 else ["#999999", "#4477aa", "#ee6677"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = np.arange(len(labels))
    means = np.array([arms[k]["mean"] for k in labels])
    cis = np.array([arms[k]["mean_ci95"] for k in labels])
    axes[0].bar(x, means, color=colors, yerr=[means - cis[:, 0], cis[:, 1] - means], capsize=6)
    rng = np.random.default_rng(0)
    for i, k in enumerate(labels):
        values = np.array(figures["accuracy"][k])
        axes[0].scatter(i + rng.uniform(-0.25, 0.25, len(values)), values, s=6, color="black", alpha=0.5, zorder=3)
    axes[0].set_title("mean final test accuracy\n(95% bootstrap CI over seeds; dots: seeds)", fontsize=9)
    shares = np.array([arms[k]["perfect"] / arms[k]["seeds"] for k in labels])
    pcis = np.array([arms[k]["perfect_share_ci95"] for k in labels])
    axes[1].bar(x, shares, color=colors, yerr=[shares - pcis[:, 0], pcis[:, 1] - shares], capsize=6)
    for i, k in enumerate(labels):
        note = f"{arms[k]['perfect']}/{arms[k]['seeds']}\nmax {arms[k]['max']:.3f}"
        axes[1].text(i, pcis[i, 1] + 0.02, note, ha="center", fontsize=8)
    axes[1].set_title("share of seeds at 100% test accuracy\n(Clopper-Pearson 95% CI; max over seeds)", fontsize=9)
    for ax in axes[:2]:
        ax.set_xticks(
            x, [k.replace(" (", "\n(").replace(" from", "\nfrom").replace(", ", ",\n") for k in labels], fontsize=8
        )
        ax.set_ylim(0, 1.1)
    c = figures["clusters"]
    ideal = np.array(figures["clusters_per_seed"]) == c["ideal"]
    final = np.array(figures["accuracy"][labels[-1]])  # the curriculum arm, always last
    for i, group in enumerate((ideal, ~ideal)):
        values = final[group]
        if len(values):
            axes[2].scatter(i + rng.uniform(-0.2, 0.2, len(values)), values, s=10, color=colors[-1], alpha=0.7)
            axes[2].errorbar(i + 0.3, values.mean(), fmt="o", color="black")
        axes[2].text(i, 1.04, f"n={len(values)}, 100%: {int((values == 1.0).sum())}", ha="center", fontsize=8)
    axes[2].set_xticks([0, 1], [f"{c['ideal']} clusters (ideal)", "other"])
    axes[2].set_xlim(-0.6, 1.6)
    axes[2].set_ylim(0, 1.1)
    axes[2].set_title(
        f"curriculum: final p={child} accuracy by the p=2 run's\nsequence clusters (Fisher p = {c['fisher_p']:.2g})",
        fontsize=9,
    )
    fig.suptitle(
        f"Clustering Head §4.2 / Fig. 9: p=2 -> p={child} curriculum vs p={child} from scratch,"
        f" {figures['epochs']} epochs per phase, {len(figures['seeds'])} seeds"
        + (f"; scratch also to {figures['scratch_epochs']}" if len(labels) == 4 else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Parent:
    """The p = 2 runs of every seed after phase 1, shared by every child field size."""

    stacked: Any
    config: dict[str, Any]
    accuracy: np.ndarray
    clusters: np.ndarray
    ideal: int
    seconds: float


def train_parent(task: SparseModularAddition, seeds: Sequence[int], epochs: int, log: Callable[[str], None]) -> Parent:
    """Phase 1: every seed at p = 2 for ``epochs`` epochs, its test accuracy and sequence clusters."""
    from vectorized import stack_seeds

    began = time.perf_counter()
    config = paper_config(task, PARENT_P)
    parent = stack_seeds(task, config, seeds)  # seeding order of train(): manual_seed, data, model
    train_stacked(task, config, parent, seeds, epochs, f"p={PARENT_P}", log)
    clusters, ideal = sequence_clusters(parent, config)
    return Parent(parent, config, test_accuracy(parent), clusters, ideal, time.perf_counter() - began)


def run(
    seeds: Sequence[int],
    epochs: int,
    child_p: int = CHILD_P,
    log: Callable[[str], None] = print,
    scratch_epochs: int | None = None,
    parent: Parent | None = None,
) -> dict[str, Any]:
    """Train both arms and compute every figure of the report (a JSON-serialisable dict).

    Parameters
    ----------
    seeds
        The seeds; seed s of every arm is seeded as ``ckpt train --seed s``.
    epochs
        Epochs of each phase (the paper: 1,000).
    child_p
        Field size after the switch (the paper: 3, and 4-10 in Fig. 9, always from a p = 2 parent).
    log
        Where the progress lines go.
    scratch_epochs
        Train the scratch arm on to this many epochs too (more than ``epochs``; the compute-matched
        control is ``2 * epochs``), reported as a fourth arm beside its accuracy at ``epochs``.
    parent
        Phase 1 of these seeds and epochs, already trained (:func:`train_parent`; a sweep over
        ``child_p`` shares it); trained here when None. It is not changed.
    """
    from vectorized import stack_seeds

    task = SparseModularAddition()
    seeds = list(seeds)
    parent = parent if parent is not None else train_parent(task, seeds, epochs, log)
    child_config = paper_config(task, child_p)
    began = time.perf_counter()

    # the child as `ckpt train --p 3 --seed S --init-from P2.zarr`: a fresh p=3 run of the seed, then the parent's
    child = stack_seeds(task, child_config, seeds)
    scratch_state = {name: value.detach().clone() for name, value in child.params.items()}
    grown = grow_into(task, parent.stacked, child)
    switch = {name: value.detach().clone() for name, value in child.params.items()}
    train_stacked(task, child_config, child, seeds, epochs, f"p={PARENT_P}->{child_p}", log)
    curriculum_accuracy = test_accuracy(child)

    scratch = stack_seeds(task, child_config, seeds)  # the same fresh initialisation the child started from
    for name, value in scratch.params.items():
        if not torch.equal(value, scratch_state[name]):
            raise RuntimeError(f"scratch arm's {name} is not the child's fresh initialisation")
    train_stacked(task, child_config, scratch, seeds, epochs, f"p={child_p} scratch", log)
    scratch_accuracy = test_accuracy(scratch)
    matched_accuracy = None
    if scratch_epochs is not None and scratch_epochs > epochs:
        more = scratch_epochs - epochs
        train_stacked(task, child_config, scratch, seeds, more, f"p={child_p} scratch", log, start=epochs)
        matched_accuracy = test_accuracy(scratch)

    perfect = curriculum_accuracy == 1.0
    is_ideal = parent.clusters == parent.ideal
    accuracies = {f"p={PARENT_P} (phase 1 only)": parent.accuracy, f"p={child_p} from scratch": scratch_accuracy}
    if matched_accuracy is not None:
        accuracies[f"p={child_p} from scratch, {scratch_epochs} epochs"] = matched_accuracy
    accuracies[f"p={PARENT_P}->{child_p} curriculum"] = curriculum_accuracy
    histogram = {int(v): int(n) for v, n in zip(*np.unique(parent.clusters, return_counts=True), strict=True)}
    return {
        "paper": "Clustering Head §4.2, Fig. 9-11",
        "protocol": {
            "preset": PRESET,
            "parent_p": PARENT_P,
            "child_p": child_p,
            **{key: parent.config[key] for key in ("length", "k", "dim", "hidden", "lr", "batch_size")},
            "train_size": parent.config["train_size"],
            "test_size": parent.config["test_size"],
            "accuracy": "final test accuracy (held-out test sequences) after the last epoch",
            "grown": grown,
            "optimizer_at_switch": "fresh Adam (as --init-from)",
        },
        "seeds": seeds,
        "epochs": epochs,
        "accuracy": {k: v.tolist() for k, v in accuracies.items()},
        "arms": {k: summary(v) for k, v in accuracies.items()},
        "scratch_epochs": scratch_epochs if matched_accuracy is not None else epochs,
        "paired_difference": paired_difference(curriculum_accuracy, scratch_accuracy),
        **(
            {"paired_difference_matched": paired_difference(curriculum_accuracy, matched_accuracy)}
            if matched_accuracy is not None
            else {}
        ),
        "clusters_per_seed": parent.clusters.tolist(),
        "clusters": {"ideal": parent.ideal, "histogram": histogram, **contingency(is_ideal, perfect)},
        "switch_check": {
            "old_rows_equal_parent": bool(
                all(
                    torch.equal(switch["embed.weight"][i, :PARENT_P], parent.stacked.params["embed.weight"][i].detach())
                    for i in range(len(seeds))
                )
            )
        },
        "wall_seconds": parent.seconds + time.perf_counter() - began,
        "machine": f"{platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)",
    }


def sweep_figures(parent: Parent, results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Fig. 9's bars for every child field size done so far: both arms' summaries and their paired difference."""
    first = next(iter(results.values()))
    sizes = {}
    for child_p, figures in results.items():
        arms = list(figures["arms"])
        sizes[str(child_p)] = {
            "scratch": figures["arms"][f"p={child_p} from scratch"],
            "curriculum": figures["arms"][arms[-1]],
            "paired_difference": figures["paired_difference"],
            "clusters_fisher_p": figures["clusters"]["fisher_p"],
            "clusters_table": figures["clusters"]["table"],
        }
    return {
        "paper": "Clustering Head §4.2, Fig. 9 (p = 2 parent; pretraining only vs finetuned from p = 2)",
        "seeds": first["seeds"],
        "epochs": first["epochs"],
        "parent": summary(parent.accuracy),
        "sizes": sizes,
        "wall_seconds": parent.seconds + sum(f["wall_seconds"] - parent.seconds for f in results.values()),
        "machine": first["machine"],
    }


def plot_sweep(sweep: dict[str, Any], path: str) -> None:
    """Fig. 9 side by side: mean (bootstrap CI) and maximum final accuracy per field size, both arms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(sweep["sizes"], key=int)
    x = np.arange(len(sizes))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for offset, arm, color, label in (
        (-0.2, "scratch", "#4477aa", "pretraining only (p from scratch)"),
        (0.2, "curriculum", "#ee6677", f"finetuned from p = {PARENT_P}"),
    ):
        rows = [sweep["sizes"][p][arm] for p in sizes]
        means = np.array([r["mean"] for r in rows])
        cis = np.array([r["mean_ci95"] for r in rows])
        axes[0].bar(
            x + offset, means, 0.4, color=color, label=label, yerr=[means - cis[:, 0], cis[:, 1] - means], capsize=4
        )
        maxima = np.array([r["max"] for r in rows])
        axes[1].bar(x + offset, maxima, 0.4, color=color, label=label)
        for i, r in enumerate(rows):
            axes[1].text(x[i] + offset, maxima[i] + 0.01, f"{r['perfect']}", ha="center", fontsize=7)
    for p in sizes:  # chance: a uniform guess of the sum mod p
        axes[0].hlines(1 / int(p), sizes.index(p) - 0.45, sizes.index(p) + 0.45, color="black", lw=0.8, ls=":")
    axes[0].set_title("mean final test accuracy (95% bootstrap CI over seeds; dotted: chance 1/p)", fontsize=9)
    axes[1].set_title("maximum final test accuracy over seeds (numbers: seeds at 100%)", fontsize=9)
    for ax in axes:
        ax.set_xticks(x, [f"p = {p}" for p in sizes])
        ax.set_ylim(0, 1.25)  # room above the bars for the legend
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.suptitle(
        f"Clustering Head Fig. 9: p = {PARENT_P} -> p curriculum vs p from scratch, {sweep['epochs']} epochs per phase,"
        f" {len(sweep['seeds'])} seeds per bar (p = {PARENT_P} alone: mean {sweep['parent']['mean']:.3f})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_sweep(sweep: dict[str, Any]) -> None:
    """One line per child field size: both arms' mean and maximum and the paired difference."""
    print(f"\nFig. 9 over {len(sweep['seeds'])} seeds, {sweep['epochs']} epochs per phase")
    print(
        f"{'p':>3}  {'scratch mean [CI]':>24}  {'max':>5}  {'100%':>4}  {'curriculum mean [CI]':>24}  {'max':>5}"
        f"  {'100%':>4}  {'difference [CI]':>26}  {'Wilcoxon p':>10}"
    )
    for p in sorted(sweep["sizes"], key=int):
        s, c, d = (sweep["sizes"][p][key] for key in ("scratch", "curriculum", "paired_difference"))
        print(
            f"{p:>3}  {s['mean']:.3f} [{s['mean_ci95'][0]:.3f}, {s['mean_ci95'][1]:.3f}]  {s['max']:>5.3f}"
            f"  {s['perfect']:>4}  {c['mean']:.3f} [{c['mean_ci95'][0]:.3f}, {c['mean_ci95'][1]:.3f}]"
            f"  {c['max']:>5.3f}  {c['perfect']:>4}  {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            f"  {d['wilcoxon_p']:>10.2g}"
        )


def write_report(figures: dict[str, Any], out: str, stem: str) -> tuple[str, str]:
    """``<stem>.json`` and ``<stem>.png`` in ``out``; returns their paths."""
    json_path, png_path = os.path.join(out, f"{stem}.json"), os.path.join(out, f"{stem}.png")
    with open(json_path, "w") as f:
        json.dump(figures, f, indent=1)
    plot(figures, png_path)
    return json_path, png_path


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the options, run both arms, print the tables, write the JSON and the PNG.

    With several ``--child-p`` (Fig. 9's sweep) the p = 2 phase is trained once and shared; each
    size writes ``curriculum-p<P>.json/.png`` when done, and ``curriculum-sweep.json/.png`` is
    rewritten after each, so a stopped sweep keeps the sizes it finished. Returns the last size's
    figures, or the sweep's when there are several.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="train seeds 0 .. N-1 (default 48)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per phase (default: the paper's 1000)")
    parser.add_argument("--out", default="./repro-out/curriculum", help="folder of curriculum.json and .png")
    parser.add_argument(
        "--child-p",
        type=int,
        nargs="+",
        default=[CHILD_P],
        help="p after the switch (paper: 3; Fig. 9: 3 4 5 6 7 8 9 10, one shared p = 2 phase)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 seeds, 3 epochs")
    parser.add_argument(
        "--scratch-epochs",
        type=int,
        default=None,
        help="train the scratch arm on to this many epochs too (compute-matched control: 2 x --epochs)",
    )
    args = parser.parse_args(argv)
    if any(p <= PARENT_P for p in args.child_p):
        parser.error(f"--child-p must be above the parent's p = {PARENT_P}")
    defaults = QUICK if args.quick else {"seeds": 48, "epochs": 1000}  # --seeds/--epochs override --quick's
    seeds = args.seeds if args.seeds is not None else defaults["seeds"]
    epochs = args.epochs if args.epochs is not None else defaults["epochs"]
    os.makedirs(args.out, exist_ok=True)
    children = ", ".join(str(p) for p in args.child_p)
    print(
        f"curriculum p={PARENT_P} -> p={children} vs the same p from scratch: preset {PRESET}"
        f" (L=12, k=5, d=2, Adam 3e-3, batch 32), {epochs} epochs per phase, seeds 0..{seeds - 1}",
        flush=True,
    )
    log = lambda line: print(line, flush=True)  # noqa: E731
    parent = train_parent(SparseModularAddition(), range(seeds), epochs, log)
    results: dict[int, dict[str, Any]] = {}
    for child_p in args.child_p:
        figures = run(range(seeds), epochs, child_p, log=log, scratch_epochs=args.scratch_epochs, parent=parent)
        results[child_p] = figures
        print_tables(figures)
        stem = "curriculum" if len(args.child_p) == 1 else f"curriculum-p{child_p}"
        json_path, png_path = write_report(figures, args.out, stem)
        print(f"\nwrote {json_path} and {png_path}  ({figures['wall_seconds']:.0f} s wall)", flush=True)
        if len(args.child_p) > 1:
            sweep = sweep_figures(parent, results)
            print_sweep(sweep)
            sweep_json, sweep_png = (
                os.path.join(args.out, "curriculum-sweep.json"),
                os.path.join(args.out, "curriculum-sweep.png"),
            )
            with open(sweep_json, "w") as f:
                json.dump(sweep, f, indent=1)
            plot_sweep(sweep, sweep_png)
            print(f"wrote {sweep_json} and {sweep_png}", flush=True)
    return sweep if len(args.child_p) > 1 else figures


if __name__ == "__main__":
    main()
