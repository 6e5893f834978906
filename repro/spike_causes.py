"""Clustering Head §4.3 and Fig. 8 across seeds: spike causes at loss-spike onsets; attention start vs end.

Runs on the stores of ``repro/sparse_dynamics.py`` (seeds 0 .. N-1 of the
``sparse-modular-addition`` ``paper`` preset, a checkpoint every epoch; trained
here, vectorized, when missing) and tests two claims of the paper.

**1. Causes of loss spikes (§4.3, Fig. 12-14).** The paper names three
conditions before a spike: inputs of the normalisation x/‖x‖ close to the
origin, ‖x‖ below the step size η; sequence embeddings ξ close to the MLP's
decision boundaries, where the response ζ(ξ) is steep; high curvature (the
edge of stability, 2/η). All fixed up front:

- onsets: the ``train_loss`` metric (full training loss after every epoch) is
  flagged by ``loss-spikes``' rule (:func:`ckpt.analyzers.grad_norms.detect_spikes`,
  trailing window 20, threshold 5: the analyzer's and ``sparse_dynamics``'
  settings; no gradient norms are needed for the loss series alone); an onset is
  the first checkpoint of each run of flags. The checkpoint *before* each onset
  (one epoch, 64 steps, earlier) is where a cause must already be present.
- controls: for each pre-onset checkpoint, one checkpoint of the same seed drawn
  uniformly (``default_rng(1000 + seed)``) within ±``--radius`` (50) checkpoints,
  such that no flagged checkpoint lies within ``--gap`` (3) checkpoints of it or
  of its successor, and not drawn twice. Matching on seed and training phase
  keeps "late runs have small losses" from passing for a cause.
- measures at both, computed by the analyzers on a thinned copy of each run
  holding only those checkpoints (``<out>/causes/seedNNN.zarr``, with the ``lr``
  metric, so ``normalization`` and ``curvature`` read η from the store):
  ``normalization`` on the train split (log10 of min ‖x‖ / η and the share with
  ‖x‖ < η, per normalisation layer: ``norm`` on token + position embeddings,
  ``mlp.norm`` on ξ); ``boundary-distance`` on the first ``--boundary-examples``
  (256) training sequences (log10 of the 5% quantile of the distance to the
  nearest decision boundary, NaN, i.e. none within the radius of 10, counted as
  10; log10 of the 95% quantile of ‖∂ζ/∂ξ‖); ``curvature`` on its default 1,250
  training examples (log10 of λ_max η / 2: 0 is the 2/η line).
- statistics: per measure the mean paired difference (pre-onset − control), a 95%
  bootstrap interval resampling seeds (all of a seed's pairs together, 10,000
  resamples, ``default_rng(0)``), and the chance baseline of swapping the two
  labels within each pair at random (10,000 sign flips, ``default_rng(1)``): the
  null 95% range and the two-sided p-value. "Reproduces" needs the interval to
  exclude 0 on the side the paper predicts and p < 0.05; the same on the other
  side is "opposite"; otherwise "not resolved".

**2. Attention at start and end (§4.1, Fig. 8).** The ``attention`` analyzer at
the first and last checkpoint of every seed (thinned copies under
``<out>/ends/``), on ``--probes`` (256) sequences shared by all seeds (drawn from
``default_rng(0)``, so seeds are comparable on the same inputs). Per seed r_i,
the Pearson correlation of the start and end weights (the analyzer's
``start_end_correlation``); the baseline, seed i's start against seed j's end
(j ≠ i), averaged over j; means with 95% bootstrap intervals over seeds and the
paired difference. The final maps being "variations of the initial one" needs
r_i above the baseline.

Writes ``spike-causes.json`` and the figures ``spike-causes.png`` and
``attention-start-end.png`` under ``--out``. Run by hand (not in CI)::

    python repro/spike_causes.py                      # 24 seeds x 1,000 epochs
    python repro/spike_causes.py --num-seeds 8 --out /tmp/sparse-dynamics
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.analyzers.grad_norms import detect_spikes

WINDOW, THRESHOLD = 20, 5.0
"""``loss-spikes``' defaults, as ``sparse_dynamics`` uses them."""
RESAMPLES = 10_000
FLIPS = 10_000
BOUNDARY_RADIUS = 10.0
"""``boundary-distance``'s default search radius; a NaN distance (none found) counts as this."""
MEASURES: dict[str, tuple[str, int]] = {
    "log10 min|x|/lr (norm)": ("norm lower", -1),
    "share |x|<lr (norm)": ("norm more below lr", +1),
    "log10 min|x|/lr (mlp.norm)": ("mlp.norm lower", -1),
    "share |x|<lr (mlp.norm)": ("mlp.norm more below lr", +1),
    "log10 q05 boundary distance": ("closer to a boundary", -1),
    "log10 q95 |dzeta/dxi|": ("steeper MLP response", +1),
    "log10 lambda_max lr/2": ("sharper (nearer 2/lr)", +1),
}
"""Each measure: what the paper predicts before a spike, and the sign of pre-onset − control it predicts."""
CONDITIONS = {
    "min|x| < lr at norm": "share |x|<lr (norm)",
    "min|x| < lr at mlp.norm": "share |x|<lr (mlp.norm)",
    "lambda_max > 2/lr": "log10 lambda_max lr/2",
}
"""The paper's conditions for a spike, each met where its measure is above 0."""


# -- onsets and controls ---------------------------------------------------------------------------------


def loss_onsets(loss: np.ndarray, threshold: float = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """(flags, onset indices) of a loss series under ``loss-spikes``' rule (window 20)."""
    flags = detect_spikes(loss, window=WINDOW, threshold=threshold)
    before = np.concatenate([[False], flags[:-1]])
    return flags, np.flatnonzero(flags & ~before)


def pair_checkpoints(flags: np.ndarray, onsets: np.ndarray, rng: np.random.Generator, radius: int, gap: int) -> list:
    """(pre-onset index, control index) pairs; an onset without an eligible control is left out.

    A control c lies within ``radius`` of the pre-onset checkpoint, has a successor,
    no flag within ``gap`` checkpoints of c or c + 1, and is used once.
    """
    count = len(flags)
    flagged = np.flatnonzero(flags)
    quiet = np.array([not len(flagged) or np.abs(flagged - c).min() > gap for c in range(count)])
    eligible = quiet & np.concatenate([quiet[1:], [False]])
    used: set[int] = set()
    pairs = []
    for onset in onsets:
        pre = int(onset) - 1
        if pre < 0:
            continue
        low, high = max(0, pre - radius), min(count - 1, pre + radius)
        candidates = [c for c in range(low, high + 1) if eligible[c] and c not in used]
        if candidates:
            control = int(rng.choice(candidates))
            used.add(control)
            pairs.append((pre, control))
    return pairs


# -- thinned stores --------------------------------------------------------------------------------------


def thin_copy(source: str, dest: str, steps: Sequence[int], splits: dict[str, dict[str, Any]]) -> str:
    """A store holding ``source``'s checkpoints (and ``lr``, ``train_loss``) at ``steps`` and ``splits``.

    Reused when it already holds exactly those checkpoints (same steps and digests as
    ``source``'s), and with it the analyses stored in it.
    """
    steps = sorted({int(s) for s in steps})
    store = ckptstore.open(source)
    if os.path.exists(dest):
        try:
            thin = ckptstore.open(dest)
            same = [int(s) for s in thin.steps] == steps
            if same and all(thin.checkpoint_digest(s) == store.checkpoint_digest(s) for s in steps):
                return dest
        except ckptstore.CkptError:
            pass
    metrics = store.metrics.sel(step=steps)
    with ckptstore.create(
        dest,
        model=store.model.factory,
        config=store.model.config,
        objective=store.objective,
        framework="torch",
        attrs={**store.attrs, "thinned_from": source},
        overwrite=True,
    ) as writer:
        for split, arrays in splits.items():
            writer.add_data(split, **arrays)
        for step in steps:
            row = {name: float(metrics[name].sel(step=step)) for name in ("lr", "train_loss") if name in metrics}
            writer.write(step, store.tensors(step), metrics=row)
    return dest


def split_arrays(store: Any, split: str, count: int | None = None) -> dict[str, Any]:
    """``inputs`` and ``targets`` of ``split`` (its first ``count`` examples)."""
    data = store.data(split)
    end = count if count is not None else data.sizes["example"]
    return {"inputs": data["inputs"].values[:end], "targets": data["targets"].values[:end]}


def probe_split(config: dict[str, Any], count: int) -> dict[str, Any]:
    """``count`` sequences shared by every seed (``default_rng(0)``), with their sparse-sum targets."""
    p, length, k = int(config["p"]), int(config["length"]), int(config["k"])
    inputs = np.random.default_rng(0).integers(0, p, size=(count, length))
    return {"inputs": inputs, "targets": inputs[:, :k].sum(1) % p}


# -- measures and statistics -----------------------------------------------------------------------------


def cause_measures(norms: Any, boundary: Any, curvature: Any) -> dict[str, np.ndarray]:
    """Every measure of :data:`MEASURES` at the thinned store's checkpoints (arrays on its steps)."""
    eta = norms["learning_rate"].values
    values = {}
    for module in ("norm", "mlp.norm"):
        smallest = norms["norm_quantile"].sel(module=module, quantile=0.0).values
        values[f"log10 min|x|/lr ({module})"] = np.log10(smallest / eta)
        values[f"share |x|<lr ({module})"] = norms["below_lr"].sel(module=module).values
    distance = np.where(np.isnan(boundary["distance"].values), BOUNDARY_RADIUS, boundary["distance"].values)
    values["log10 q05 boundary distance"] = np.log10(np.quantile(distance, 0.05, axis=1))
    values["log10 q95 |dzeta/dxi|"] = np.log10(np.nanquantile(boundary["jacobian_norm"].values, 0.95, axis=1))
    values["log10 lambda_max lr/2"] = np.log10(curvature["model_eigenvalue"].values * eta / 2)
    return values


def measure_store(path: str) -> tuple[dict[str, np.ndarray], dict[int, int]]:
    """:func:`cause_measures` of every checkpoint of the store at ``path``, and each step's index in them.

    The three analyzers run on its ``train`` split (``normalization``, ``curvature``) and its
    ``boundary`` split (``boundary-distance``), with the synchronous scheduler.
    """
    engine = {"scheduler": "sync"}
    norms = ckpt.analyze("normalization", path, split="train", **engine).load()
    boundary = ckpt.analyze("boundary-distance", path, split="boundary", **engine).load()
    curvature = ckpt.analyze("curvature", path, split="train", **engine).load()
    return cause_measures(norms, boundary, curvature), {int(s): i for i, s in enumerate(norms["step"].values)}


def paired_statistics(diffs: np.ndarray, groups: np.ndarray, sign: int) -> dict[str, Any]:
    """Mean paired difference, seed-bootstrap 95% interval, sign-flip null and the verdict."""
    seeds = np.unique(groups)
    by_seed = [diffs[groups == s] for s in seeds]
    rng = np.random.default_rng(0)
    boot = np.empty(RESAMPLES)
    for b in range(RESAMPLES):
        boot[b] = np.concatenate([by_seed[i] for i in rng.integers(0, len(seeds), len(seeds))]).mean()
    flips = np.random.default_rng(1).choice([-1.0, 1.0], size=(FLIPS, len(diffs)))
    null = (flips * diffs).mean(1)
    mean = float(diffs.mean())
    low, high = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
    p = float((1 + np.sum(np.abs(null) >= abs(mean))) / (1 + FLIPS))
    near, far = sorted((sign * low, sign * high))
    verdict = "reproduces" if near > 0 and p < 0.05 else "opposite" if far < 0 and p < 0.05 else "not resolved"
    return {
        "pairs": len(diffs),
        "mean_diff": mean,
        "ci95": [low, high],
        "null95": [float(v) for v in np.percentile(null, [2.5, 97.5])],
        "p": p,
        "verdict": verdict,
    }


def bootstrap_mean(values: np.ndarray, seed: int = 0) -> list[float]:
    """95% percentile bootstrap interval of the mean of ``values``."""
    rng = np.random.default_rng(seed)
    boot = values[rng.integers(0, len(values), size=(RESAMPLES, len(values)))].mean(1)
    return [float(v) for v in np.percentile(boot, [2.5, 97.5])]


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation over the entries that are not zero in both (as ``attention`` computes it)."""
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    keep = (a != 0) | (b != 0)
    return float(np.corrcoef(a[keep], b[keep])[0, 1])


def attention_statistics(starts: list[np.ndarray], ends: list[np.ndarray], stored: np.ndarray) -> dict[str, Any]:
    """Own-seed start-end correlation against seed i's start with seed j's end (j ≠ i)."""
    n = len(starts)
    matrix = np.array([[correlation(starts[i], ends[j]) for j in range(n)] for i in range(n)])
    own = np.diag(matrix).copy()
    others = ~np.eye(n, dtype=bool)
    cross = np.array([matrix[i, others[i]].mean() for i in range(n)]) if n > 1 else np.full(n, np.nan)
    ends_cross = np.array([[correlation(ends[i], ends[j]) for j in range(n) if j != i] for i in range(n)])
    result = {
        "seeds": n,
        "own": own.tolist(),
        "own_mean": float(own.mean()),
        "own_ci95": bootstrap_mean(own),
        "analyzer_start_end_correlation": stored.tolist(),
        "cross": cross.tolist(),
    }
    if n > 1:
        result |= {
            "cross_mean": float(cross.mean()),
            "cross_ci95": bootstrap_mean(cross),
            "diff_mean": float((own - cross).mean()),
            "diff_ci95": bootstrap_mean(own - cross),
            "end_end_mean": float(ends_cross.mean()),
        }
    return result


# -- the pipeline ----------------------------------------------------------------------------------------


def spike_causes(
    paths: Sequence[str], out: str, *, radius: int, gap: int, boundary_examples: int, threshold: float
) -> dict[str, Any]:
    """Pairs, measures and statistics of claim 1 over the runs at ``paths``."""
    os.makedirs(os.path.join(out, "causes"), exist_ok=True)
    rows: dict[str, list] = {"seed": [], "pre_step": [], "control_step": []}
    values: dict[str, dict[str, list]] = {name: {"pre": [], "control": []} for name in MEASURES}
    onset_counts = []
    for path in paths:
        store = ckptstore.open(path)
        seed = int(store.attrs["seed"])
        loss = store.metrics["train_loss"].sel(step=store.steps).values.astype(np.float64)
        flags, onsets = loss_onsets(loss, threshold)
        onset_counts.append(len(onsets))
        pairs = pair_checkpoints(flags, onsets, np.random.default_rng(1000 + seed), radius, gap)
        if not pairs:
            continue
        steps = store.steps
        wanted = [int(steps[i]) for pair in pairs for i in pair]
        splits = {"train": split_arrays(store, "train"), "boundary": split_arrays(store, "train", boundary_examples)}
        thin = thin_copy(path, os.path.join(out, "causes", f"seed{seed:03d}.zarr"), wanted, splits)
        measured, at = measure_store(thin)
        for pre, control in pairs:
            rows["seed"].append(seed)
            rows["pre_step"].append(int(steps[pre]))
            rows["control_step"].append(int(steps[control]))
            for name in MEASURES:
                values[name]["pre"].append(float(measured[name][at[int(steps[pre])]]))
                values[name]["control"].append(float(measured[name][at[int(steps[control])]]))
        print(f"  seed {seed}: {len(onsets)} onsets, {len(pairs)} pairs", flush=True)
    groups = np.array(rows["seed"])
    stats = {}
    for name, (_, sign) in MEASURES.items():
        if len(groups):
            pre, control = np.array(values[name]["pre"]), np.array(values[name]["control"])
            stats[name] = paired_statistics(pre - control, groups, sign)
            stats[name] |= {"pre_mean": float(pre.mean()), "control_mean": float(control.mean())}
    conditions = {  # the paper's conditions themselves: how many checkpoints meet them
        f"{kind} meets {name}": int(np.sum(np.array(values[measure][kind]) > 0))
        for name, measure in CONDITIONS.items()
        for kind in ("pre", "control")
    }
    return {"onsets": onset_counts, "pairs": rows, "values": values, "statistics": stats, "conditions": conditions}


def attention_start_end(paths: Sequence[str], out: str, probes: int) -> dict[str, Any]:
    """Claim 2 over the runs at ``paths``: attention on shared probes at the first and last checkpoint."""
    os.makedirs(os.path.join(out, "ends"), exist_ok=True)
    starts, ends, stored = [], [], []
    for path in paths:
        store = ckptstore.open(path)
        seed = int(store.attrs["seed"])
        splits = {"probe": probe_split(store.attrs["config"], probes)}
        ends_of = [int(store.steps[0]), int(store.steps[-1])]
        thin = thin_copy(path, os.path.join(out, "ends", f"seed{seed:03d}.zarr"), ends_of, splits)
        result = ckpt.analyze("attention", thin, split="probe", scheduler="sync").load()
        weights = result["weights"].values
        starts.append(weights[0])
        ends.append(weights[-1])
        stored.append(float(result["start_end_correlation"].isel(step=-1).mean()))
    return attention_statistics(starts, ends, np.array(stored)) | {"starts": starts[:1], "ends": ends[:1]}


def print_report(causes: dict[str, Any], attention: dict[str, Any]) -> None:
    """The two tables."""
    counts = causes["onsets"]
    print(f"\n== loss-spike onsets: {sum(counts)} over {len(counts)} runs (per run {counts})")
    print(f"   {len(causes['pairs']['seed'])} pre-onset / control pairs")
    head = f"{'measure':<30} {'prediction':<24} {'pairs':>5} {'pre-ctrl':>9} {'95% CI (seeds)':>20}"
    print(head + f" {'null 95%':>20} {'p':>7}  verdict")
    for name, stat in causes["statistics"].items():
        low, high = stat["ci95"]
        nlow, nhigh = stat["null95"]
        print(
            f"{name:<30} {MEASURES[name][0]:<24} {stat['pairs']:>5} {stat['mean_diff']:>+9.3f}"
            f" [{low:>+8.3f}, {high:>+8.3f}] [{nlow:>+8.3f}, {nhigh:>+8.3f}] {stat['p']:>7.2g}  {stat['verdict']}"
        )
    pairs = len(causes["pairs"]["seed"])
    print(f"{'':<30} {'mean at pre-onset':>17} {'mean at control':>15}")
    for name, stat in causes["statistics"].items():
        print(f"{name:<30} {stat['pre_mean']:>17.4g} {stat['control_mean']:>15.4g}")
    for name in CONDITIONS:
        met = causes["conditions"]
        print(
            f"   {name}: {met['pre meets ' + name]}/{pairs} pre-onset, {met['control meets ' + name]}/{pairs} control"
        )
    print(f"\n== attention start vs end over {attention['seeds']} seeds (shared probes)")
    low, high = attention["own_ci95"]
    print(f"   own seed, start-end correlation: mean {attention['own_mean']:.3f}  95% CI [{low:.3f}, {high:.3f}]")
    if attention["seeds"] > 1:
        low, high = attention["cross_ci95"]
        print(f"   seed i start vs seed j end (j != i): mean {attention['cross_mean']:.3f}  [{low:.3f}, {high:.3f}]")
        low, high = attention["diff_ci95"]
        print(f"   own - cross: {attention['diff_mean']:+.3f}  95% CI [{low:+.3f}, {high:+.3f}]")
        print(f"   (end vs end across seeds: mean {attention['end_end_mean']:.3f})")


def add_run_options(parser: argparse.ArgumentParser, out: str, out_help: str) -> None:
    """The runs, the onset rule and the pairing: the options shared with ``spike_steps``."""
    parser.add_argument("--num-seeds", type=int, default=24, help="seeds 0 .. N-1 (default 24)")
    parser.add_argument("--epochs", type=int, default=1000, help="epochs per run (paper: 1000)")
    parser.add_argument("--out", default=out, help=out_help)
    parser.add_argument("--radius", type=int, default=50, help="controls within this many checkpoints")
    parser.add_argument("--gap", type=int, default=3, help="controls this far from any flagged checkpoint")
    parser.add_argument("--boundary-examples", type=int, default=256, help="training sequences for boundaries")
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help="loss-spike threshold (paper runs: 5)")


def pairing(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`spike_causes` (and ``spike_steps``) from the parsed options."""
    return {name: getattr(args, name) for name in ("radius", "gap", "boundary_examples", "threshold")}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train or reuse the runs, measure, print, write the JSON and the figures; returns the results."""
    from sparse_dynamics import train_runs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_options(parser, "./repro-out/sparse-dynamics", "folder of the stores (shared)")
    parser.add_argument("--probes", type=int, default=256, help="shared probe sequences for attention")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    began = time.perf_counter()
    paths = train_runs(args.out, list(range(args.num_seeds)), args.epochs, True, 1)
    trained = time.perf_counter()
    causes = spike_causes(paths, args.out, **pairing(args))
    measured = time.perf_counter()
    attention = attention_start_end(paths, args.out, args.probes)
    done = time.perf_counter()
    print_report(causes, attention)
    times = {"train_s": trained - began, "causes_s": measured - trained, "attention_s": done - measured}
    print(
        f"\n(training {times['train_s']:.0f} s, causes {times['causes_s']:.0f} s,"
        f" attention {times['attention_s']:.0f} s)"
    )
    from spike_causes_figures import attention_figure, causes_figure

    causes_figure(causes).savefig(os.path.join(args.out, "spike-causes.png"), dpi=110)
    attention_figure(attention).savefig(os.path.join(args.out, "attention-start-end.png"), dpi=110)
    results = {
        "settings": vars(args),
        "times": times,
        "causes": causes,
        "attention": {k: v for k, v in attention.items() if k not in ("starts", "ends")},
    }
    with open(os.path.join(args.out, "spike-causes.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results | {"attention_maps": attention}


if __name__ == "__main__":
    main()
