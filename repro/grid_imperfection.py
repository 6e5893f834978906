"""Grid imperfection vs validation accuracy in the ``modular-addition`` sandbox (Clustering and Alignment).

The paper reports that grid imperfection (how far the 2-D token embeddings are
from an ideal reading-order lattice) correlates negatively with validation
accuracy. This checks it over many runs: one store per (weight decay, seed),
each trained by the sandbox's own ``ckpt.sandboxes.base.train`` (the task's preset,
one torch thread, checkpoints only at step 0 and the last step), then the real
``embedding-geometry`` analyzer over all stores through
``ckpt.analyze_runs``. For every run it takes ``grid_imperfection`` (and
``circularity``) at the final checkpoint and the final ``test_accuracy`` (the
80/20 split's validation pairs) from the store's training metrics, and prints

- per weight decay: mean grid imperfection, mean circularity, mean validation accuracy;
- over all runs: Pearson and Spearman correlation of grid imperfection with
  validation accuracy, with 95% percentile bootstrap intervals (runs resampled
  with replacement, ``numpy.random.default_rng(0)``, 10,000 resamples);
- within each weight decay (weight decay moves both quantities, so the pooled
  correlation can be a weight-decay effect): Spearman, n and its interval;
- circularity vs validation accuracy (Spearman) for context.

Nothing is tuned: the preset, weight decays and seeds are fixed up front.
Stores already present under ``--out`` with the same settings are reused
(delete the folder to retrain).

Run by hand (not in CI)::

    python repro/grid_imperfection.py --seeds 15 --weight-decays 0,0.3,0.6,1.0 --out /tmp/grid-runs
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from scipy import stats

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.sandboxes.base import train
from ckpt.sandboxes.modular_addition import ModularAddition

RESAMPLES = 10_000


def store_path(out: str, weight_decay: float, seed: int) -> str:
    return os.path.join(out, f"wd{weight_decay:g}_seed{seed}.zarr")


def train_runs(out: str, weight_decays: list[float], seeds: int, preset: str) -> list[str]:
    """One store per (weight decay, seed); existing stores with the same settings are reused."""
    torch.set_num_threads(1)
    task = ModularAddition()
    steps = int(task.presets[preset]["steps"])
    paths = []
    for wd in weight_decays:
        for seed in range(seeds):
            path = store_path(out, wd, seed)
            if os.path.exists(path):
                attrs = ckptstore.open(path).attrs
                same = (
                    attrs.get("preset") == preset
                    and attrs.get("seed") == seed
                    and float(attrs.get("config", {}).get("weight_decay", float("nan"))) == wd
                    and attrs.get("steps") == steps
                )
                if not same:
                    raise SystemExit(f"{path} exists with other settings; remove it or choose another --out")
            else:
                # every = the run length: checkpoints at step 0 and the last step only
                train(task, path, preset=preset, every=steps, seed=seed, device="cpu", weight_decay=wd)
            paths.append(path)
    return paths


def ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank, as in Spearman's rho)."""
    return stats.rankdata(values, axis=-1)


def correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis (NaN where either side is constant)."""
    x = x - x.mean(-1, keepdims=True)
    y = y - y.mean(-1, keepdims=True)
    norm = np.sqrt((x**2).sum(-1) * (y**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (x * y).sum(-1) / np.where(norm > 0, norm, 1.0), np.nan)


def bootstrap(x: np.ndarray, y: np.ndarray, kind: str, seed: int = 0) -> tuple[float, float, float, int]:
    """The correlation of ``x`` and ``y``, its 95% percentile bootstrap interval, and the degenerate resamples.

    Resamples (with replacement) whose ``x`` or ``y`` is constant have no
    correlation; they are dropped and counted.
    """
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(x), size=(RESAMPLES, len(x)))
    xs, ys = x[index], y[index]
    if kind == "spearman":
        estimate = float(correlation(ranks(x), ranks(y)))
        boot = correlation(ranks(xs), ranks(ys))
    else:
        estimate = float(correlation(x, y))
        boot = correlation(xs, ys)
    finite = boot[np.isfinite(boot)]
    if len(finite) == 0:
        return estimate, float("nan"), float("nan"), RESAMPLES
    low, high = np.percentile(finite, [2.5, 97.5])
    return estimate, float(low), float(high), RESAMPLES - len(finite)


def describe(label: str, x: np.ndarray, y: np.ndarray, kind: str) -> str:
    estimate, low, high, dropped = bootstrap(x, y, kind)
    if kind == "spearman":
        p = stats.spearmanr(x, y).pvalue if np.ptp(x) > 0 and np.ptp(y) > 0 else float("nan")
    else:
        p = stats.pearsonr(x, y).pvalue if np.ptp(x) > 0 and np.ptp(y) > 0 else float("nan")
    note = f"  ({dropped} constant resamples dropped)" if dropped else ""
    return f"  {label:<34} n={len(x):>3}  r={estimate:+.3f}  95% CI [{low:+.3f}, {high:+.3f}]  p={p:.2g}{note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=15, help="seeds per weight decay")
    parser.add_argument("--weight-decays", default="0,0.3,0.6,1.0", help="comma-separated AdamW weight decays")
    parser.add_argument("--out", default=None, help="folder of the stores (default: a new temporary folder)")
    parser.add_argument("--preset", default="default", choices=sorted(ModularAddition.presets))
    parser.add_argument("--scheduler", default="sync", choices=["sync", "processes"], help="analyzer scheduler")
    args = parser.parse_args()
    weight_decays = [float(w) for w in args.weight_decays.split(",")]
    out = args.out or tempfile.mkdtemp(prefix="grid-imperfection-")
    os.makedirs(out, exist_ok=True)

    began = time.perf_counter()
    paths = train_runs(out, weight_decays, args.seeds, args.preset)
    trained = time.perf_counter()
    workers = 1 if args.scheduler == "processes" else None
    geometry = ckpt.analyze_runs("embedding-geometry", paths, scheduler=args.scheduler, workers=workers)
    analyzed = time.perf_counter()

    final = geometry.isel(step=-1)  # every run has the same checkpoints (0 and the last step)
    last_step = int(final["step"])
    grid = final["grid_imperfection"].values.astype(np.float64)
    circ = final["circularity"].values.astype(np.float64)
    wd = np.asarray(geometry["weight_decay"].values, dtype=np.float64)
    val, train_acc = [], []
    for path in paths:
        metrics = ckptstore.open(path).metrics
        if int(metrics["step"][-1]) != last_step:
            raise SystemExit(f"{path}: last metrics step {int(metrics['step'][-1])} != last checkpoint {last_step}")
        val.append(float(metrics["test_accuracy"][-1]))
        train_acc.append(float(metrics["train_accuracy"][-1]))
    val, train_acc = np.array(val), np.array(train_acc)
    if not np.all(np.isfinite(grid)):
        raise SystemExit("grid imperfection is NaN for some run")

    steps = int(ModularAddition.presets[args.preset]["steps"])
    print(
        f"modular-addition, preset {args.preset} ({steps} full-batch AdamW steps), seeds 0..{args.seeds - 1}, "
        f"{len(paths)} runs; embedding-geometry at step {last_step}"
    )
    print(f"stores: {out}")
    header = ("weight decay", 12), ("runs", 4), ("grid imperf.", 12), ("circularity", 11), ("val acc", 7)
    print("  ".join(f"{name:>{width}}" for name, width in header) + f"  {'train acc':>9}")
    for w in weight_decays:
        sel = wd == w
        print(
            f"{w:>12.2f}  {int(sel.sum()):>4}  {grid[sel].mean():>12.3f}  {circ[sel].mean():>11.3f}"
            f"  {val[sel].mean():>7.3f}  {train_acc[sel].mean():>9.3f}"
        )
    print(f"\ngrid imperfection vs validation accuracy (bootstrap: {RESAMPLES} resamples, seed 0, percentile 95%)")
    print(describe("all runs, Pearson", grid, val, "pearson"))
    print(describe("all runs, Spearman", grid, val, "spearman"))
    for w in weight_decays:
        sel = wd == w
        print(describe(f"weight decay {w:g}, Spearman", grid[sel], val[sel], "spearman"))
    print("\ncircularity vs validation accuracy (context)")
    print(describe("all runs, Spearman", circ, val, "spearman"))
    for w in weight_decays:
        sel = wd == w
        print(describe(f"weight decay {w:g}, Spearman", circ[sel], val[sel], "spearman"))
    print(
        f"\n(training {trained - began:.0f} s, analysis {analyzed - trained:.0f} s, "
        f"total {time.perf_counter() - began:.0f} s; 1 process, scheduler {args.scheduler})"
    )


if __name__ == "__main__":
    main()
