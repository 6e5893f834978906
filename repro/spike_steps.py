"""Clustering Head §4.3 at step resolution: the spike causes in the last step before each loss-spike onset.

``repro/spike_causes.py`` compares the checkpoint one epoch (64 steps) before each
loss-spike onset with a quiet control checkpoint of the same seed; at that
resolution none of the paper's three causes is more present before a spike. A
cause that arises inside those 64 steps would be missed. This script looks inside:

- training: seeds 0 .. N-1 of the ``paper`` preset, vectorised with the epoch loop
  of ``repro/sparse_dynamics.py`` (:func:`sparse_dynamics.train_epoch`), in memory,
  keeping the parameters and the Adam state at every epoch. The full training loss
  after every epoch is computed exactly as ``sparse_dynamics`` records ``train_loss``.
- onsets and controls: exactly ``spike_causes``' (same rule, window 20, threshold 5,
  radius 50, gap 3, ``default_rng(1000 + seed)``), so the pairs are the same ones.
- replay: the epoch that ends at each onset, and the epoch after each control
  checkpoint, are trained again from their kept state, with the full training loss
  after every step. The replayed epoch must end on the kept state bit for bit (else
  the script stops: a replay that drifts would measure another run).
- the onset step t*: the first step of the onset epoch whose full training loss the
  ``loss-spikes`` rule flags against the same 20 checkpoints before it (so the
  epoch's last step, the onset checkpoint itself, is always flagged).
- measures, as ``spike_causes`` computes them (``normalization``, ``boundary-distance``,
  ``curvature``, on a store holding only the measured states, ``<out>/steps/seedNNN.zarr``)
  at two points of every pair: **step** resolution, the state after step t* − 1 of
  the onset epoch (the last one before the loss rises) against the state after the
  same step of the control's epoch; and **epoch** resolution, the two checkpoints
  themselves (step 0), which repeats ``spike_causes``' comparison on the same run.
- statistics: ``spike_causes``' (paired differences, seed bootstrap, sign-flip
  null, verdicts).

Writes ``spike-steps.json``, ``spike-steps.png`` (the paired differences at step
resolution) and ``spike-steps-onsets.png`` (the onset steps; the step losses aligned at
t*) under ``--out``. Run by
hand (not in CI)::

    python repro/spike_steps.py --out repro-out/spike-steps       # 24 seeds x 1,000 epochs
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import ckpt.store as ckptstore
from ckpt.analyzers.grad_norms import detect_spikes
from ckpt.sandboxes.base import learning_rate
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition

WINDOW = 20
"""``loss-spikes``' trailing window, as ``spike_causes`` and ``sparse_dynamics`` use it."""
RISEN_LIMIT = 1.1
"""The pairs "barely risen" at t* − 1: loss there at most this times its baseline (:func:`stratified_statistics`)."""


@dataclass
class Training:
    """The stacked run, the full training loss ``[seed, checkpoint]`` and the state at every checkpoint."""

    stacked: Any
    config: dict[str, Any]
    seeds: list[int]
    loss: np.ndarray
    lr: np.ndarray
    states: list[dict[str, Any]]
    steps_per_epoch: int


def train_losses(task: SparseModularAddition, stacked: Any, inputs: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """Every seed's full training loss, computed as ``sparse_dynamics.stacked_metrics`` records ``train_loss``."""
    with torch.no_grad():
        logits = stacked.forward(stacked.params, stacked.buffers, inputs)
        return np.array(
            [float(task.per_datapoint_loss(logits[i], targets[i], None).mean()) for i in range(len(logits))]
        )


def keep_state(stacked: Any) -> dict[str, Any]:
    """A copy of the stacked parameters and the optimizer's state."""
    params = {name: value.detach().clone() for name, value in stacked.params.items()}
    return {"params": params, "optimizer": copy.deepcopy(stacked.optimizer.state_dict())}


def restore_state(stacked: Any, state: dict[str, Any]) -> None:
    """Put a kept state back (parameters in place, so the optimizer keeps pointing at them)."""
    with torch.no_grad():
        for name, value in stacked.params.items():
            value.copy_(state["params"][name])
    stacked.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))


def train(seeds: Sequence[int], epochs: int, log: Any) -> Training:
    """Train every seed for ``epochs`` epochs, keeping the state and the training loss at every epoch."""
    from sparse_dynamics import run_settings, train_epoch
    from vectorized import stack_seeds

    task = SparseModularAddition()
    config, _ = run_settings(task, epochs, 0)
    seeds = list(seeds)
    stacked = stack_seeds(task, config, seeds)
    inputs = torch.stack([d.train_inputs for d in stacked.datas])
    targets = torch.stack([d.train_targets for d in stacked.datas])
    losses, lrs, states = [train_losses(task, stacked, inputs, targets)], [learning_rate(stacked.optimizer)], []
    states.append(keep_state(stacked))
    began = time.perf_counter()
    per_epoch = 0
    for epoch in range(epochs):
        per_epoch = train_epoch(task, config, stacked, seeds, epoch)
        losses.append(train_losses(task, stacked, inputs, targets))
        lrs.append(learning_rate(stacked.optimizer))
        states.append(keep_state(stacked))
        if (epoch + 1) % 100 == 0 or epoch + 1 == epochs:
            log(f"  epoch {epoch + 1}/{epochs}  ({time.perf_counter() - began:.0f} s)")
    return Training(stacked, config, seeds, np.stack(losses, axis=1), np.array(lrs), states, per_epoch)


@dataclass
class Replay:
    """One replayed epoch: every seed's training loss ``[seed, step 0..S]`` and the parameters after each step."""

    loss: np.ndarray
    flat: torch.Tensor
    """``[step 0..S, P]``: the stacked parameters, flattened in the order of ``layout``."""
    layout: list[tuple[str, torch.Size]]

    def params(self, step: int) -> dict[str, torch.Tensor]:
        """The stacked parameters after step ``step`` (0: the checkpoint the epoch starts from), as views."""
        out, start = {}, 0
        for name, shape in self.layout:
            out[name] = self.flat[step, start : start + shape.numel()].view(shape)
            start += shape.numel()
        return out


def replay(run: Training, epoch: int) -> Replay:
    """Epoch ``epoch`` again from its kept state, recording the training loss and the parameters at every step.

    Why one preallocated ``[S + 1, P]`` tensor for the parameters: a few small tensors cloned per
    step, kept between the evaluations' large temporary ones, held the allocator's heap: 11 MB a
    replay for 2 steps kept, and the 24-seed run was killed for memory at 19 GB.

    Raises
    ------
    RuntimeError
        When the replayed epoch does not end on the kept state of the next checkpoint, bit for bit.
    """
    from sparse_dynamics import train_epoch

    task = SparseModularAddition()
    stacked = run.stacked
    inputs = torch.stack([d.train_inputs for d in stacked.datas])
    targets = torch.stack([d.train_targets for d in stacked.datas])
    restore_state(stacked, run.states[epoch])
    layout = [(name, value.shape) for name, value in stacked.params.items()]
    flat = torch.empty(run.steps_per_epoch + 1, sum(shape.numel() for _, shape in layout))
    losses = [train_losses(task, stacked, inputs, targets)]

    def record(step: int) -> None:
        if step > 0:
            losses.append(train_losses(task, stacked, inputs, targets))
        torch.cat([value.detach().reshape(-1) for value in stacked.params.values()], out=flat[step])

    record(0)
    taken = train_epoch(task, run.config, stacked, run.seeds, epoch, after_step=record)
    expected = run.states[epoch + 1]["params"]
    drifted = [name for name, value in stacked.params.items() if not torch.equal(value, expected[name])]
    if drifted:
        raise RuntimeError(f"the replay of epoch {epoch} does not end on the kept state: {', '.join(drifted)} differ")
    if taken != run.steps_per_epoch or not np.array_equal(losses[-1], run.loss[:, epoch + 1]):
        raise RuntimeError(f"the replay of epoch {epoch} ends on another training loss than the checkpoint's")
    return Replay(np.stack(losses, axis=1), flat, layout)


def onset_step(epoch_loss: np.ndarray, onset: int, step_loss: np.ndarray, threshold: float) -> int:
    """The first step t >= 1 of the onset epoch that ``loss-spikes``' rule flags against the checkpoints before it.

    ``epoch_loss``: the seed's loss at every checkpoint; ``step_loss``: its loss after every
    step of the epoch that ends at checkpoint ``onset`` (index 0: the checkpoint before).
    """
    before = epoch_loss[max(0, onset - WINDOW) : onset]
    for t in range(1, len(step_loss)):
        if detect_spikes(np.append(before, step_loss[t]), window=WINDOW, threshold=threshold)[-1]:
            return t
    raise RuntimeError(f"no step of the epoch ending at checkpoint {onset} is flagged, though the checkpoint is")


def step_store(
    run: Training, seed_index: int, dest: str, points: dict[int, tuple[dict, float, float]], boundary: int
) -> str:
    """A store of one seed's measured states: ``points`` maps a global step to (parameters, lr, training loss)."""
    from sparse_dynamics import run_settings

    task = SparseModularAddition()
    seed = run.seeds[seed_index]
    data = run.stacked.datas[seed_index]
    _, attrs = run_settings(task, run.loss.shape[1] - 1, seed)
    with ckptstore.create(
        dest,
        model=task.factory,
        config=task.model_config(run.config),
        objective=task.objective,
        framework="torch",
        attrs={**attrs, "replayed_steps": "states after single steps, replayed from the kept epoch state"},
        overwrite=True,
    ) as writer:
        inputs, targets = data.train_inputs.numpy(), data.train_targets.numpy()
        writer.add_data("train", inputs=inputs, targets=targets)
        writer.add_data("boundary", inputs=inputs[:boundary], targets=targets[:boundary])
        buffers = {name: value[seed_index] for name, value in run.stacked.buffers.items()}
        for step in sorted(points):
            params, lr, loss = points[step]
            tensors = {name: value[seed_index] for name, value in params.items()} | buffers
            writer.write(step, tensors, metrics={"lr": lr, "train_loss": loss})
    return dest


def spike_steps(run: Training, out: str, *, radius: int, gap: int, boundary_examples: int, threshold: float) -> dict:
    """Onsets, pairs, onset steps, measures and statistics at step and at epoch resolution."""
    from spike_causes import MEASURES, loss_onsets, measure_store, pair_checkpoints

    per_epoch = run.steps_per_epoch
    pairs_of: dict[int, list[tuple[int, int]]] = {}
    onset_counts = []
    for i, seed in enumerate(run.seeds):
        flags, onsets = loss_onsets(run.loss[i], threshold)
        onset_counts.append(len(onsets))
        pairs_of[i] = pair_checkpoints(flags, onsets, np.random.default_rng(1000 + seed), radius, gap)
    replays = {}
    for epoch in sorted({c for pairs in pairs_of.values() for pair in pairs for c in pair}):
        replays[epoch] = replay(run, epoch)  # the epoch after checkpoint `epoch`: pre-onset to onset, control to next
    rows: dict[str, list] = {"seed": [], "pre_checkpoint": [], "control_checkpoint": [], "onset_step": []}
    rows |= {"step_losses": [], "window_median": []}
    values = {res: {name: {"pre": [], "control": []} for name in MEASURES} for res in ("step", "epoch")}
    os.makedirs(os.path.join(out, "steps"), exist_ok=True)
    for i, pairs in pairs_of.items():
        if not pairs:
            continue
        seed = run.seeds[i]
        points: dict[int, tuple[dict, float, float]] = {}
        located = []
        for pre, control in pairs:
            pre_losses = replays[pre].loss[i]
            t = onset_step(run.loss[i], pre + 1, pre_losses, threshold)
            located.append((pre, control, t))
            for checkpoint, offset in ((pre, t - 1), (control, t - 1), (pre, 0), (control, 0)):
                done = replays[checkpoint]
                points[checkpoint * per_epoch + offset] = (
                    done.params(offset),
                    float(run.lr[checkpoint]),
                    float(done.loss[i][offset]),
                )
            rows["seed"].append(seed)
            rows["pre_checkpoint"].append(pre)
            rows["control_checkpoint"].append(control)
            rows["onset_step"].append(t)
            rows["step_losses"].append(pre_losses.tolist())
            rows["window_median"].append(float(np.median(run.loss[i][max(0, pre + 1 - WINDOW) : pre + 1])))
        store = step_store(run, i, os.path.join(out, "steps", f"seed{seed:03d}.zarr"), points, boundary_examples)
        measured, at = measure_store(store)
        for pre, control, t in located:
            for resolution, offset in (("step", t - 1), ("epoch", 0)):
                for name in MEASURES:
                    values[resolution][name]["pre"].append(float(measured[name][at[pre * per_epoch + offset]]))
                    values[resolution][name]["control"].append(float(measured[name][at[control * per_epoch + offset]]))
        print(f"  seed {seed}: {onset_counts[i]} onsets, {len(pairs)} pairs, onset steps {[t for *_, t in located]}")
    results = {"steps_per_epoch": per_epoch, "onsets": onset_counts, "pairs": rows, "values": values}
    return results | {"statistics": all_statistics(results)}


def all_statistics(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``spike_causes``' paired statistics of every measure at both resolutions, and the barely-risen pairs'."""
    from spike_causes import MEASURES, paired_statistics

    groups = np.array(results["pairs"]["seed"])
    statistics: dict[str, dict[str, Any]] = {"step": {}, "epoch": {}}
    for resolution in statistics:
        for name, (_, sign) in MEASURES.items():
            if len(groups):
                pre = np.array(results["values"][resolution][name]["pre"])
                control = np.array(results["values"][resolution][name]["control"])
                stat = paired_statistics(pre - control, groups, sign)
                statistics[resolution][name] = stat | {
                    "pre_mean": float(pre.mean()),
                    "control_mean": float(control.mean()),
                }
    statistics["step, barely risen"] = stratified_statistics(results)
    return statistics


def barely_risen(results: dict[str, Any]) -> np.ndarray:
    """Per pair: the training loss after step t* − 1 over the median of the 20 checkpoints before the onset."""
    rows = results["pairs"]
    return np.array(
        [
            losses[t - 1] / median
            for losses, t, median in zip(rows["step_losses"], rows["onset_step"], rows["window_median"], strict=True)
        ]
    )


def stratified_statistics(results: dict[str, Any], limit: float = RISEN_LIMIT) -> dict[str, dict[str, Any]]:
    """The step-resolution statistics over the pairs whose loss at t* − 1 is at most ``limit`` x its baseline.

    At t* − 1 the loss has often begun to rise (it crosses the rule's threshold one step later),
    so a measure that differs there may be part of the spike rather than before it. Among pairs
    where it has risen by at most 10%, it is still nearly the state before the spike. Added after
    the first run showed the curvature difference (so: a check of that result, not a test fixed
    in advance).
    """
    from spike_causes import MEASURES, paired_statistics

    keep = barely_risen(results) <= limit
    groups = np.array(results["pairs"]["seed"])[keep]
    out = {}
    for name, (_, sign) in MEASURES.items():
        if keep.any():
            pre = np.array(results["values"]["step"][name]["pre"])[keep]
            control = np.array(results["values"]["step"][name]["control"])[keep]
            out[name] = paired_statistics(pre - control, groups, sign)
    return out


def print_report(results: dict[str, Any]) -> None:
    """The onset steps and, per measure, both resolutions' paired differences."""
    t = np.array(results["pairs"]["onset_step"])
    per_epoch = results["steps_per_epoch"]
    print(f"\n{len(t)} pairs, {sum(results['onsets'])} onsets over {len(results['onsets'])} seeds")
    if len(t):
        q = np.percentile(t, [10, 25, 50, 75, 90])
        print(
            f"onset step t* within its epoch (1..{per_epoch}): quantiles 10/25/50/75/90% = {q.tolist()};"
            f" t* = 1 in {int((t == 1).sum())}, t* = {per_epoch} in {int((t == per_epoch).sum())}"
        )
    risen = barely_risen(results)
    if len(t):
        q = np.percentile(risen, [10, 50, 90])
        print(f"loss after step t*-1 / its baseline (median of the 20 checkpoints before): 10/50/90% = {q.round(3)}")
    labels = {
        "step": "step t*-1 of the onset epoch",
        "step, barely risen": f"step t*-1, the {int((risen <= RISEN_LIMIT).sum())} pairs whose loss there is at most"
        f" {RISEN_LIMIT}x its baseline",
        "epoch": "checkpoint before the onset",
    }
    for resolution, label in labels.items():
        print(f"\npre-onset − control at the {label}:")
        print(f"{'measure':<30}  {'mean [95% CI]':>30}  {'chance 95%':>22}  {'p':>6}  verdict")
        for name, s in results["statistics"][resolution].items():
            low, high = s["ci95"]
            nlow, nhigh = s["null95"]
            print(
                f"{name:<30}  {s['mean_diff']:+.3f} [{low:+.3f}, {high:+.3f}]{'':>8}  [{nlow:+.3f}, {nhigh:+.3f}]"
                f"  {s['p']:>6.3f}  {s['verdict']}"
            )


def figure(results: dict[str, Any]) -> Any:
    """Onset steps; step losses aligned at t*; the step-resolution paired differences (``spike_causes``' panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from spike_causes_figures import causes_figure

    per_epoch = results["steps_per_epoch"]
    steps_resolved = {
        "values": results["values"]["step"],
        "statistics": results["statistics"]["step"],
        "pairs": {"seed": results["pairs"]["seed"]},
        "onsets": results["onsets"],
    }
    fig = causes_figure(steps_resolved)
    fig.suptitle(
        "Loss-spike causes at step resolution (Clustering Head §4.3): the last step before each onset step"
        f" minus the same step of a matched control epoch ({len(results['pairs']['seed'])} pairs)",
        fontsize=9,
    )
    side, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    t = np.array(results["pairs"]["onset_step"])
    axes[0].hist(t, bins=np.arange(0.5, per_epoch + 1.5, 2), color="0.5")
    axes[0].set_xlabel(f"onset step t* within the epoch (1..{per_epoch})", fontsize=8)
    axes[0].set_ylabel("onsets", fontsize=8)
    axes[0].set_title("where in its epoch the loss first rises past the rule", fontsize=9)
    offsets = np.arange(-16, 9)
    aligned = np.full((len(t), len(offsets)), np.nan)
    for k, (losses, median, onset) in enumerate(
        zip(results["pairs"]["step_losses"], results["pairs"]["window_median"], t, strict=True)
    ):
        for j, o in enumerate(offsets):
            if 0 <= onset + o < len(losses):
                aligned[k, j] = losses[onset + o] / median
    if len(t):
        axes[1].plot(offsets, np.nanmedian(aligned, axis=0), color="C3", label="median over onsets")
        axes[1].fill_between(
            offsets, *np.nanpercentile(aligned, [25, 75], axis=0), color="C3", alpha=0.25, label="25-75%"
        )
    axes[1].axvline(0, color="k", lw=0.8)
    axes[1].axhline(1, color="0.5", lw=0.8, ls=":")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("steps from the onset step t*", fontsize=8)
    axes[1].set_ylabel("training loss / median of the 20 checkpoints before", fontsize=7)
    axes[1].set_title("the full training loss step by step around t*", fontsize=9)
    axes[1].legend(fontsize=7)
    side.tight_layout()
    return fig, side


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train, locate the onset steps, measure, print and write the JSON and the figures; returns the results."""
    from spike_causes import add_run_options, pairing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_options(parser, "./repro-out/spike-steps", "folder of the results and the step stores")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="recompute the statistics, the report and the figures from --out's spike-steps.json (no training)",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        return report(args.out)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    began = time.perf_counter()
    run = train(range(args.num_seeds), args.epochs, lambda line: print(line, flush=True))
    trained = time.perf_counter()
    results = spike_steps(run, args.out, **pairing(args))
    results["times"] = {"train_s": trained - began, "replay_and_measures_s": time.perf_counter() - trained}
    results["settings"] = vars(args)
    write_report(results, args.out)
    return results | {"run": run}


def write_report(results: dict[str, Any], out: str) -> None:
    """Print the report; write ``spike-steps.json`` and the two figures into ``out``."""
    print_report(results)
    times = results["times"]
    print(f"\n(training {times['train_s']:.0f} s, replays and measures {times['replay_and_measures_s']:.0f} s)")
    causes, onsets = figure(results)
    causes.savefig(os.path.join(out, "spike-steps.png"), dpi=110)
    onsets.savefig(os.path.join(out, "spike-steps-onsets.png"), dpi=110)
    with open(os.path.join(out, "spike-steps.json"), "w") as f:
        json.dump(results, f, indent=1)


def report(out: str) -> dict[str, Any]:
    """``--report-only``: the statistics recomputed from the values in ``out``'s ``spike-steps.json``."""
    with open(os.path.join(out, "spike-steps.json")) as f:
        results = json.load(f)
    results["statistics"] = all_statistics(results)
    write_report(results, out)
    return results


if __name__ == "__main__":
    main()
