"""Clustering Head training dynamics on ``sparse-modular-addition``: loss spikes and ε-sparsity.

Two findings of "Clustering Head" about the d=2 transformer trained with
minibatch Adam on sparse modular addition (p=2, L=12, k=5, the ``paper``
preset: 2,048 train / 2,048 test sequences, lr 3e-3, batch 32, 1,000 epochs):

1. loss spikes co-occur with gradient-norm spikes;
2. runs that succeed have *lower* ε-sparsity (denser activations) than runs
   that fail, for ε from about 1e-3 to 10.

The script trains ``--num-seeds`` seeds (0 .. N-1) into one checkpoint store
each under ``--out``, a checkpoint (with the training metrics ``train_loss``,
``train_accuracy``, ``test_loss``, ``test_accuracy``, and ``lr``) every epoch. By default
all seeds train at once (``repro/vectorized.py``: the sandbox's model under
``torch.func.vmap`` over the stacked parameters, one Adam over them, which is
each seed's own Adam); at every epoch each seed's parameters are unstacked and
written through the ckpt.store writer, with the model spec, data splits and
attributes that :func:`ckpt.sandboxes.base.train` records, so the stores are the
ones ``ckpt train sparse-modular-addition --preset paper`` writes, up to the
floating-point summation order of the batched ops: identical over the first 5
epochs (checked), but over 64,000 steps a run that passes through loss spikes
can drift onto another trajectory, so which seeds succeed can differ from
``train()`` and from a vectorized run of another set of seeds. ``--no-vectorize`` trains
each seed with :func:`ckpt.sandboxes.base.train` in a pool of ``--jobs`` processes
instead. Complete stores already under ``--out`` are reused; incomplete ones
are trained again.

Then the project's analyzers run over all stores (``ckpt.analyze_runs``):

- ``loss-spikes`` (which runs ``grad-norms`` first): the loss series is the
  stored ``train_loss`` metric (full training loss after every epoch), the
  gradient series ``grad-norms``' ``total_grad_norm`` at the same
  checkpoints, by default the mean norm of minibatch gradients of the
  training batch size (``--grad-batch-size 32``; 0 for the full-batch
  gradient). Spikes: the analyzer's trailing median + MAD rule (window 20,
  threshold 5). Printed per run and pooled: loss spikes, gradient-norm spikes,
  the fraction of loss spikes within ±``--tolerance`` training steps of a
  gradient-norm spike, and its chance level, both analytic (the analyzer's
  ``chance``: the fraction of checkpoints near a gradient-norm spike) and by
  circularly shifting every run's gradient-norm spike train by a random offset
  (``--shifts`` times; the pooled p-value is the share of shifts whose pooled
  fraction reaches the observed one), at tolerances 0, ``--tolerance`` and
  twice that. The analyzer flags every checkpoint that lies above its trailing
  median, so a spike that decays over several epochs is a run of flags; the
  pooled figures are printed for the flagged checkpoints and again for the
  onsets alone (the first checkpoint of each run of flags, in both series).
  "Far above chance" means p < 0.01 and at least 3x the shifted mean.
- ``sparsity`` on the GELU outputs of the MLP (``--modules mlp.fc2 --capture
  input``: the model calls ``torch.nn.functional.gelu``, so the GELU has no
  module of its own) over the ``eval`` split (train + test), ε from 1e-3 to 10
  (9 values, half a decade apart). Runs are split into successful (final test
  accuracy > 0.9) and failed; per ε the script prints each group's mean
  ε-sparsity at the final checkpoint and averaged over the last 10% of the
  checkpoints, the difference (successful - failed) with a 95% percentile
  bootstrap interval (runs resampled within each group, 10,000 resamples,
  ``numpy.random.default_rng(0)``) and the two-sided Mann-Whitney U p-value.

``repro/spike_causes.py`` runs on the same stores (``--out``): the paper's causes of
loss spikes (§4.3) at the spike onsets, and the attention start-to-end correlation
(Fig. 8) across seeds; ``--spike-causes`` runs it after this script's report.

Nothing is tuned to the outcome: seeds, thresholds and the ε grid are fixed up
front. Run by hand (not in CI). On the shared 2-core CPU, one process, 24 seeds
x 1,000 epochs took 67 minutes: 15 to train (vectorized, writing 24,024
checkpoints), 46 for ``grad-norms`` with minibatch norms (about 0.11 s per
checkpoint; ``--grad-batch-size 0`` is about 3x cheaper) and 6 for
``sparsity``. A rerun reuses the stores and the stored analyses (about 1 minute)::

    python repro/sparse_dynamics.py
    python repro/sparse_dynamics.py --num-seeds 20 --out /tmp/sparse-dynamics
    python repro/sparse_dynamics.py --grad-batch-size 0 --tolerance 0
    python repro/sparse_dynamics.py --no-vectorize --jobs 2
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
from scipy import stats

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.analyzers.grad_norms import chance_cooccurrence, near
from ckpt.sandboxes.base import create_task_store, learning_rate
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition

PRESET = "paper"
SUCCESS = 0.9
"""A run succeeds when its final test accuracy exceeds this."""
EPSILONS = {"eps_min": 1e-3, "eps_max": 10.0, "eps_count": 9}
"""The ε grid of ``sparsity``: 1e-3 to 10, half a decade apart."""
SPARSITY_OPTIONS = {"modules": "mlp.fc2", "capture": "input", "split": "eval", **EPSILONS}
"""The GELU outputs (the input of ``mlp.fc2``) over train + test."""
RESAMPLES = 10_000
LAST_FRACTION = 0.1
"""The "late training" window of the sparsity table: the last 10% of the checkpoints."""


# -- training ------------------------------------------------------------------------------------


def store_path(out: str, seed: int) -> str:
    """Where seed ``seed``'s store lives."""
    return os.path.join(out, f"seed{seed:03d}.zarr")


def run_settings(task: SparseModularAddition, epochs: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task config and the store attributes :func:`ckpt.sandboxes.base.train` records for this run."""
    config = task.config(PRESET, {})
    steps = epochs * math.ceil(int(config["train_size"]) / int(config["batch_size"]))  # as steps_per_epoch
    return config, {"task": task.name, "preset": PRESET, "seed": seed, "steps": steps, "config": config}


def is_complete(path: str, steps: int) -> bool:
    """Whether ``path`` holds a finished run of ``steps`` steps (checkpoint and metrics at every epoch)."""
    if not os.path.exists(path):
        return False
    try:
        store = ckptstore.open(path)
    except ckptstore.CkptError:
        return False
    recorded = store.attrs.get("steps")
    if recorded is not None and recorded != steps:
        raise SystemExit(f"{path} holds a run of {recorded} steps, not {steps}; remove it or choose another --out")
    metrics = store.metrics
    return (
        len(store.steps) > 0
        and int(store.steps[-1]) == steps
        and "test_accuracy" in metrics
        and int(metrics["step"].values[-1]) == steps
    )


def create_store(task: SparseModularAddition, path: str, attrs: dict[str, Any], data: Any) -> ckptstore.Writer:
    """A new store (replacing an incomplete one) with the model spec, objective and splits of ``train``."""
    return create_task_store(task, path, attrs["config"], data, attrs=attrs, overwrite=True)


def stacked_metrics(
    task: SparseModularAddition, stacked: Any, inputs: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]
) -> list[dict[str, float]]:
    """``task.evaluate``'s metrics (train/test loss and accuracy) of every stacked seed."""
    rows: list[dict[str, float]] = [{} for _ in stacked.datas]
    with torch.no_grad():
        for part in ("train", "test"):
            logits = stacked.forward(stacked.params, stacked.buffers, inputs[part])
            for i, row in enumerate(rows):
                row[f"{part}_loss"] = float(task.per_datapoint_loss(logits[i], targets[part][i], None).mean())
                row[f"{part}_accuracy"] = float((logits[i].argmax(-1) == targets[part][i]).float().mean())
    lr = learning_rate(stacked.optimizer)  # one Adam over every seed: the same rate for all
    return [row | {"lr": lr} for row in rows]


def write_all(writers: list[ckptstore.Writer], stacked: Any, step: int, metrics: list[dict[str, float]]) -> None:
    """Write seed i's unstacked parameters and metrics at ``step`` into ``writers[i]``."""
    for i, writer in enumerate(writers):
        tensors = {name: value[i].detach() for name, value in stacked.params.items()}
        tensors |= {name: value[i] for name, value in stacked.buffers.items()}
        writer.write(step, tensors, metrics=metrics[i])


def train_epoch(
    task: SparseModularAddition,
    config: dict[str, Any],
    stacked: Any,
    seeds: Sequence[int],
    epoch: int,
    after_step: Callable[[int], None] | None = None,
) -> int:
    """One epoch of every stacked seed (its minibatches, one Adam step each); returns the steps taken.

    ``after_step(t)`` runs after the epoch's t-th step (1-based), e.g. to record the state there.
    """
    batches = zip(*(task.batches(d, config, epoch, s) for d, s in zip(stacked.datas, seeds, strict=True)), strict=True)
    taken = 0
    for batch in batches:
        logits = stacked.forward(stacked.params, stacked.buffers, torch.stack([b[0] for b in batch]))
        losses = [task.per_datapoint_loss(logits[i], b[1], None).mean() for i, b in enumerate(batch)]
        stacked.optimizer.zero_grad(set_to_none=True)
        torch.stack(losses).sum().backward()  # seed i's parameters only see seed i's loss
        stacked.optimizer.step()
        taken += 1
        if after_step is not None:
            after_step(taken)
    return taken


def train_vectorized(out: str, seeds: Sequence[int], epochs: int) -> None:
    """Train ``seeds`` at once (``repro/vectorized.py``) and write a checkpoint per seed every epoch."""
    from vectorized import stack_seeds

    task = SparseModularAddition()
    config, _ = run_settings(task, epochs, 0)
    stacked = stack_seeds(task, config, seeds)  # seeding order of train(): manual_seed, data, model
    inputs = {part: torch.stack([getattr(d, f"{part}_inputs") for d in stacked.datas]) for part in ("train", "test")}
    targets = {part: torch.stack([getattr(d, f"{part}_targets") for d in stacked.datas]) for part in ("train", "test")}
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        writers = [
            stack.enter_context(create_store(task, store_path(out, s), run_settings(task, epochs, s)[1], d))
            for s, d in zip(seeds, stacked.datas, strict=True)
        ]
        step = 0
        write_all(writers, stacked, step, stacked_metrics(task, stacked, inputs, targets))
        for epoch in range(epochs):
            step += train_epoch(task, config, stacked, seeds, epoch)
            write_all(writers, stacked, step, stacked_metrics(task, stacked, inputs, targets))
            if (epoch + 1) % 50 == 0 or epoch + 1 == epochs:
                print(f"  epoch {epoch + 1}/{epochs}  ({time.perf_counter() - began:.0f} s)", flush=True)


def train_one(out: str, seed: int, epochs: int) -> int:
    """Train one seed with the sandbox's own loop (a worker of the ``--no-vectorize`` pool)."""
    torch.set_num_threads(1)
    from ckpt.sandboxes.base import train

    path = store_path(out, seed)
    if os.path.exists(path):  # an incomplete run: start again
        shutil.rmtree(path)
    train(SparseModularAddition(), path, preset=PRESET, epochs=epochs, seed=seed, device="cpu")
    return seed


def train_runs(out: str, seeds: Sequence[int], epochs: int, vectorize: bool, jobs: int) -> list[str]:
    """One complete store per seed under ``out``; only the missing or incomplete ones are trained."""
    steps = run_settings(SparseModularAddition(), epochs, 0)[1]["steps"]
    missing = [s for s in seeds if not is_complete(store_path(out, s), steps)]
    print(f"stores: {out}  ({len(seeds) - len(missing)} reused, {len(missing)} to train)", flush=True)
    if missing and vectorize:
        train_vectorized(out, missing, epochs)
    elif missing:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            for seed in pool.map(train_one, [out] * len(missing), missing, [epochs] * len(missing)):
                print(f"  seed {seed} trained", flush=True)
    return [store_path(out, s) for s in seeds]


# -- loss spikes vs gradient-norm spikes ----------------------------------------------------------------


def pooled_cooccurrence(steps: np.ndarray, loss_spikes: np.ndarray, grad_spikes: np.ndarray, tolerance: int) -> float:
    """Fraction of all runs' loss spikes within ±``tolerance`` steps of a gradient-norm spike of the same run."""
    hits = [near(steps[loss], steps[grad], tolerance) for loss, grad in zip(loss_spikes, grad_spikes, strict=True)]
    flat = np.concatenate(hits) if hits else np.zeros(0, bool)
    return float(flat.mean()) if flat.size else float("nan")


def shifted_null(
    steps: np.ndarray, loss_spikes: np.ndarray, grad_spikes: np.ndarray, tolerance: int, shifts: int, seed: int = 0
) -> np.ndarray:
    """Pooled co-occurrence with each run's gradient-norm spike train rolled by a random offset, ``shifts`` times."""
    rng = np.random.default_rng(seed)
    count = grad_spikes.shape[1]
    null = np.empty(shifts)
    for k in range(shifts):
        rolled = np.stack([np.roll(g, int(rng.integers(1, count))) for g in grad_spikes])
        null[k] = pooled_cooccurrence(steps, loss_spikes, rolled, tolerance)
    return null


def pooled_chance(steps: np.ndarray, loss_spikes: np.ndarray, grad_spikes: np.ndarray, tolerance: int) -> float:
    """The analyzer's analytic chance level per run, weighted by the run's number of loss spikes."""
    counts = loss_spikes.sum(1)
    chances = np.array([chance_cooccurrence(steps, steps[grad], tolerance) for grad in grad_spikes])
    return float((chances * counts).sum() / counts.sum())


def onsets(flags: np.ndarray) -> np.ndarray:
    """The first checkpoint of every run of consecutive flagged checkpoints (flags ``[run, step]``)."""
    before = np.zeros_like(flags)
    before[:, 1:] = flags[:, :-1]
    return flags & ~before


def cooccurrence_table(steps: np.ndarray, loss: np.ndarray, grad: np.ndarray, tolerance: int, shifts: int) -> str:
    """Print pooled co-occurrence against chance at tolerances 0, ``tolerance``, 2 x ``tolerance``; the verdict."""
    columns = ("tolerance", 9), ("co-occur", 8), ("analytic chance", 15), ("shifted mean", 12), ("shifted 95%", 11)
    print("  ".join(f"{name:>{width}}" for name, width in columns) + f"  {'p':>7}  {'ratio':>6}")
    verdicts = {}
    for tol in sorted({0, tolerance, 2 * tolerance}):
        observed = pooled_cooccurrence(steps, loss, grad, tol)
        null = shifted_null(steps, loss, grad, tol, shifts)
        p = (1 + int((null >= observed).sum())) / (1 + shifts)
        ratio = observed / null.mean() if null.mean() > 0 else float("inf")
        print(
            f"{'+-' + str(tol):>9}  {observed:>8.3f}  {pooled_chance(steps, loss, grad, tol):>15.3f}"
            f"  {null.mean():>12.3f}  {np.percentile(null, 95):>11.3f}  {p:>7.2g}  {ratio:>5.1f}x"
        )
        verdict = "far above" if p < 0.01 and ratio >= 3 else "above" if p < 0.05 else "not above"
        verdicts[tol] = f"{verdict} chance ({ratio:.1f}x the shifted mean, p = {p:.2g})"
    return verdicts[tolerance]


def report_spikes(spikes: Any, accuracy: np.ndarray, tolerance: int, shifts: int) -> None:
    """Per-run and pooled spike counts, co-occurrence and chance (analytic and circular shifts).

    The analyzer flags every checkpoint above its trailing baseline, so one
    spike that decays over several epochs gives a run of flags; the pooled
    figures are also given for the onsets alone (one per run of flags, in both
    series), which counts spike events rather than flagged checkpoints.
    """
    steps = spikes["step"].values
    loss = spikes["loss_spike"].values.astype(bool)
    grad = spikes["grad_norm_spike"].values.astype(bool)
    head = ("seed", 4), ("test acc", 8), ("loss spikes", 11), ("(onsets)", 8), ("grad spikes", 11), ("(onsets)", 8)
    print("\n" + "  ".join(f"{name:>{width}}" for name, width in head) + f"  {'co-occur':>8}  {'chance':>7}")
    loss_on, grad_on = onsets(loss), onsets(grad)
    for i, seed in enumerate(spikes["seed"].values):
        co, chance = float(spikes["cooccurrence"][i]), float(spikes["chance"][i])
        print(
            f"{int(seed):>4}  {accuracy[i]:>8.3f}  {int(loss[i].sum()):>11}  {int(loss_on[i].sum()):>8}"
            f"  {int(grad[i].sum()):>11}  {int(grad_on[i].sum()):>8}  {co:>8.3f}  {chance:>7.3f}"
        )
    print(f"(co-occur, chance: the analyzer's, per flagged checkpoint, at +-{tolerance} steps)")
    for label, loss_flags, grad_flags in (("flagged checkpoints", loss, grad), ("spike onsets", loss_on, grad_on)):
        print(
            f"\npooled over {len(loss)} runs, {label}: {int(loss_flags.sum())} loss spikes,"
            f" {int(grad_flags.sum())} gradient-norm spikes ({len(steps)} checkpoints per run;"
            f" chance by {shifts} circular shifts of each run's grad-spike train)"
        )
        if not loss_flags.sum():
            print("  no loss spikes: no co-occurrence to measure")
            continue
        verdict = cooccurrence_table(steps, loss_flags, grad_flags, tolerance, shifts)
        print(f"  -> {label}, at +-{tolerance} steps: co-occurrence is {verdict}")


# -- sparsity: successful vs failed runs ----------------------------------------------------------------


def bootstrap_difference(a: np.ndarray, b: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``mean(a) - mean(b)`` (each group resampled on its own)."""
    rng = np.random.default_rng(seed)
    boot_a = a[rng.integers(0, len(a), size=(RESAMPLES, len(a)))].mean(1)
    boot_b = b[rng.integers(0, len(b), size=(RESAMPLES, len(b)))].mean(1)
    low, high = np.percentile(boot_a - boot_b, [2.5, 97.5])
    return float(low), float(high)


def sparsity_table(label: str, values: np.ndarray, epsilons: np.ndarray, success: np.ndarray) -> None:
    """Mean ε-sparsity of successful and failed runs per ε, their difference, CI and Mann-Whitney p."""
    good, bad = values[success], values[~success]
    print(f"\n{label}")
    columns = ("epsilon", 8), ("successful", 10), ("failed", 8), ("diff (s-f)", 10), ("95% bootstrap CI", 20)
    print("  ".join(f"{name:>{width}}" for name, width in columns) + f"  {'MWU p':>8}")
    for k, eps in enumerate(epsilons):
        a, b = good[:, k], bad[:, k]
        low, high = bootstrap_difference(a, b)
        tied = np.ptp(np.concatenate([a, b])) == 0
        p = float("nan") if tied else float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
        print(
            f"{eps:>8.3g}  {a.mean():>10.4f}  {b.mean():>8.4f}  {a.mean() - b.mean():>+10.4f}"
            f"  [{low:>+8.4f}, {high:>+8.4f}]  {p:>8.2g}"
        )


def report_sparsity(sparsity: Any, accuracy: np.ndarray) -> None:
    """The successful-vs-failed tables at the final checkpoint and over the last 10% of training."""
    success = accuracy > SUCCESS
    print(
        f"\n{int(success.sum())}/{len(success)} runs successful (final test accuracy > {SUCCESS}):"
        f" seeds {[int(s) for s in sparsity['seed'].values[success]]}"
    )
    if success.all() or not success.any():
        print("  one group is empty: no successful-vs-failed comparison")
        return
    values = sparsity["sparsity"].sel(module="mlp.fc2")  # [run, step, epsilon]
    epsilons = values["epsilon"].values
    count = values.sizes["step"]
    last = max(1, round(LAST_FRACTION * count))
    final = values.isel(step=-1).transpose("run", "epsilon").values
    late = values.isel(step=slice(count - last, None)).mean("step").transpose("run", "epsilon").values
    step = int(values["step"].values[-1])
    what = "fraction of GELU outputs (input of mlp.fc2) with |a| < epsilon, eval split (train + test)"
    sparsity_table(f"epsilon-sparsity at the final checkpoint (step {step}); {what}", final, epsilons, success)
    sparsity_table(f"epsilon-sparsity averaged over the last {last} checkpoints", late, epsilons, success)


# -- main -------------------------------------------------------------------------------------------


def final_accuracy(paths: Sequence[str]) -> np.ndarray:
    """Final ``test_accuracy`` of every run, from the stored training metrics."""
    return np.array([float(ckpt.open(p).metrics["test_accuracy"].values[-1]) for p in paths])


def main() -> None:
    """Parse the options, train (or reuse) the stores, run the analyzers and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seeds", type=int, default=24, help="train seeds 0 .. N-1 (default 24)")
    parser.add_argument("--epochs", type=int, default=1000, help="epochs per run (paper: 1000)")
    parser.add_argument("--out", default="./repro-out/sparse-dynamics", help="folder of the stores")
    parser.add_argument("--no-vectorize", dest="vectorize", action="store_false", help="train each seed with train()")
    parser.add_argument("--jobs", type=int, default=1, help="processes for --no-vectorize (one core each)")
    parser.add_argument("--grad-batch-size", type=int, default=32, help="grad-norms --batch-size (0: full batch)")
    parser.add_argument("--tolerance", type=int, default=64, help="co-occurrence window in steps (64 = 1 epoch)")
    parser.add_argument("--shifts", type=int, default=10_000, help="circular shifts for the chance level")
    parser.add_argument("--scheduler", default="sync", choices=["sync", "threads", "processes"])
    parser.add_argument("--workers", type=int, default=None, help="analyzer workers (threads/processes)")
    parser.add_argument("--spike-causes", action="store_true", help="then run repro/spike_causes.py on the stores")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    seeds = list(range(args.num_seeds))

    print(
        f"sparse-modular-addition, preset {PRESET} (p=2, L=12, k=5, d=2, Adam 3e-3, batch 32), "
        f"{args.epochs} epochs, seeds 0..{args.num_seeds - 1}, a checkpoint every epoch",
        flush=True,
    )
    began = time.perf_counter()
    paths = train_runs(args.out, seeds, args.epochs, args.vectorize, args.jobs)
    trained = time.perf_counter()
    print(f"training: {trained - began:.0f} s", flush=True)
    accuracy = final_accuracy(paths)
    engine = {"scheduler": args.scheduler, "workers": args.workers}
    batch = args.grad_batch_size or None
    options = {"metric": "train_loss", "batch_size": batch, "tolerance": args.tolerance}
    spikes = ckpt.analyze_runs("loss-spikes", paths, **options, **engine)
    spikes = spikes.load()
    spiked = time.perf_counter()
    print(f"grad-norms + loss-spikes: {spiked - trained:.0f} s", flush=True)
    sparsity = ckpt.analyze_runs("sparsity", paths, **SPARSITY_OPTIONS, **engine).load()
    analyzed = time.perf_counter()
    print(f"sparsity: {analyzed - spiked:.0f} s", flush=True)

    how = "full-batch gradient" if batch is None else f"mean norm of minibatch gradients, batch {batch}"
    print(
        f"\n== loss spikes vs gradient-norm spikes (loss: the train_loss metric; grad-norms {how};"
        f" window 20, threshold 5, tolerance +-{args.tolerance} steps)"
    )
    report_spikes(spikes, accuracy, args.tolerance, args.shifts)
    print("\n== epsilon-sparsity, successful vs failed runs")
    report_sparsity(sparsity, accuracy)
    print(
        f"\n(training {trained - began:.0f} s, grad-norms + loss-spikes {spiked - trained:.0f} s, "
        f"sparsity {analyzed - spiked:.0f} s, total {analyzed - began:.0f} s)"
    )
    if args.spike_causes:
        from spike_causes import main as spike_causes

        print("\n== spike causes and attention start vs end (repro/spike_causes.py)", flush=True)
        spike_causes(["--num-seeds", str(args.num_seeds), "--epochs", str(args.epochs), "--out", args.out])


if __name__ == "__main__":
    main()
