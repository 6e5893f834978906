"""Developmental stages of one sandbox run from its LLC curve (Hoogland et al., "The Developmental Landscape
of In-Context Learning").

The check: train the ``modular-addition`` default run (N = 17, AdamW with weight decay 1,
full batch; seconds on a CPU), then through the ordinary engine ``loss``, ``llc`` (SGLD
chains per checkpoint), and, when installed, ``essential-dynamics`` and ``spectrum``
(Hutchinson trace only). It prints the LLC curve over steps with its spread over chains and
the chains' diagnostics (R-hat, ESS, diverged, flattened), and the candidate stages.

Stages, as in Hoogland et al. §3: boundaries are the critical points of the (smoothed) LLC
curve, where λ̂ turns from rising to falling or back (their "type A" stages raise the LLC,
"type B" lower it), kept only when the turn is larger than twice the curve's standard error
there (:func:`llc_stages`); a stretch where λ̂ moves less than that is a plateau. The
essential-dynamics stages (turning points of the developmental path) are printed beside them
when that analyzer is available.

Run by hand (not in CI)::

    python repro/development.py                       # the default run, 4 chains x 200 draws
    python repro/development.py --steps 4000 --every 100 --draws 300 --keep
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
import warnings
from pathlib import Path

import numpy as np

import ckpt
from ckpt.errors import CkptError, LLCWarning

ROOT = Path(__file__).resolve().parents[1]


def llc_stages(steps: np.ndarray, llc: np.ndarray, stderr: np.ndarray, sigma: float = 1.0) -> list[dict]:
    """Stages of an LLC curve: stretches between its significant critical points.

    Parameters
    ----------
    steps
        The checkpoints' steps, increasing.
    llc
        λ̂ at each step.
    stderr
        Its standard error at each step (spread over chains / √chains).
    sigma
        Gaussian smoothing of the curve, in checkpoints (0: none), before its turns are found.

    Returns
    -------
    list of dict
        One per stage, in order: ``start`` and ``end`` (steps), ``kind`` ("rising", "falling" or
        "plateau"), ``change`` (λ̂ at the end − at the start).
    """
    from scipy.ndimage import gaussian_filter1d

    curve = gaussian_filter1d(llc.astype(np.float64), sigma, mode="nearest") if sigma > 0 else llc.astype(float)
    noise = 2 * np.nan_to_num(stderr.astype(np.float64), nan=0.0)
    # the extrema: ends of the run, and where the smoothed slope changes sign
    slope = np.sign(np.diff(curve))
    turns = [0, *[i + 1 for i in range(len(slope) - 1) if slope[i] * slope[i + 1] < 0], len(curve) - 1]
    # merge turns whose rise or fall is within the noise: a wiggle is not a stage boundary
    kept = [turns[0]]
    for i in turns[1:]:
        if abs(curve[i] - curve[kept[-1]]) <= max(noise[i], noise[kept[-1]]) and i != turns[-1]:
            continue
        if len(kept) >= 2 and np.sign(curve[i] - curve[kept[-1]]) == np.sign(curve[kept[-1]] - curve[kept[-2]]):
            kept[-1] = i  # the same direction goes on: the previous turn was not one
        else:
            kept.append(i)
    # each rise or fall loses its flat ends (3 or more checkpoints within the noise of its extremum) to plateaus
    pieces: list[tuple[int, int, str]] = []
    for a, b in itertools.pairwise(kept):
        up = curve[b] > curve[a]
        near_start = [k for k in range(a, b + 1) if abs(curve[k] - curve[a]) <= noise[a]]
        near_end = [k for k in range(a, b + 1) if abs(curve[k] - curve[b]) <= noise[b]]
        start = max(k for k in near_start if all(abs(curve[x] - curve[a]) <= noise[a] for x in range(a, k + 1)))
        end = min(k for k in near_end if all(abs(curve[x] - curve[b]) <= noise[b] for x in range(k, b + 1)))
        if start >= end:  # the whole stretch is within the noise
            pieces.append((a, b, "plateau"))
            continue
        if start - a >= 2:
            pieces.append((a, start, "plateau"))
        else:
            start = a
        if b - end < 2:
            end = b
        pieces.append((start, end, "rising" if up else "falling"))
        if end < b:
            pieces.append((end, b, "plateau"))
    merged: list[list] = []
    for a, b, kind in pieces:
        if merged and merged[-1][2] == kind:
            merged[-1][1] = b
        else:
            merged.append([a, b, kind])
    return [
        {"start": int(steps[a]), "end": int(steps[b]), "kind": kind, "change": float(curve[b] - curve[a])}
        for a, b, kind in merged
    ]


def optional(name: str, store: str, **options: object) -> object:
    """``ckpt.analyze(name, ...)`` when the analyzer is installed and succeeds, else None (said why)."""
    try:
        began = time.perf_counter()
        result = ckpt.analyze(name, store, **options).load()
        print(f"{name}: {time.perf_counter() - began:.0f} s", flush=True)
        return result
    except (CkptError, KeyError) as error:
        print(f"{name}: skipped ({str(error).splitlines()[0]})")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=ROOT / "bench" / "out" / "development" / "modular-addition.zarr")
    parser.add_argument("--steps", type=int, default=2000, help="training steps")
    parser.add_argument("--every", type=int, default=100, help="a checkpoint every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--epsilon", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=100.0)
    parser.add_argument("--keep", action="store_true", help="reuse the trained run and its results")
    args = parser.parse_args()

    from ckpt.sandboxes.base import train
    from ckpt.sandboxes.modular_addition import ModularAddition

    store = str(args.store)
    if not (args.keep and args.store.exists()):
        args.store.parent.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        train(ModularAddition(), store, steps=args.steps, every=args.every, seed=args.seed, log_spaced=True)
        print(f"trained modular-addition ({args.steps} steps) in {time.perf_counter() - began:.0f} s")
    force = not args.keep
    loss = ckpt.analyze("loss", store, force=force, split="train").load()
    began = time.perf_counter()
    options = {"chains": args.chains, "draws": args.draws, "epsilon": args.epsilon, "gamma": args.gamma}
    with warnings.catch_warnings(record=True) as caught:  # the table below shows every diagnostic
        warnings.simplefilter("always", LLCWarning)
        llc = ckpt.analyze("llc", store, force=force, **options).load()
    print(f"llc: {sum(issubclass(w.category, LLCWarning) for w in caught)} checkpoints warned (see r-hat, ess)")
    print(f"llc: {time.perf_counter() - began:.0f} s ({len(llc['step'])} checkpoints)", flush=True)
    dynamics = optional("essential-dynamics", store, force=force)
    spectrum = optional("spectrum", store, force=force, method="hutchinson", probes=10, slq_runs=0)

    steps = llc["step"].values
    chains = int(llc.sizes["chain"])
    stderr = llc["llc_std"].values / math.sqrt(chains)
    per_step_loss = loss["mean_loss"].sel(step=steps).values
    header = f"{'step':>6} {'train loss':>10} {'λ̂':>8} {'± std':>7} {'r-hat':>6} {'ess':>7} {'div':>4} {'flat':>5}"
    header += f" {'trace':>9}" if spectrum is not None else ""
    header += " stage" if dynamics is not None else ""
    print(f"\nLLC curve, {chains} chains x {llc.sizes['draw']} draws (options: {llc['llc'].attrs.get('options')})")
    print(header)
    for i, step in enumerate(steps):
        row = f"{step:>6} {per_step_loss[i]:>10.4f} {llc['llc'].values[i]:>8.3f} {llc['llc_std'].values[i]:>7.3f}"
        row += f" {llc['rhat'].values[i]:>6.3f} {llc['ess'].values[i]:>7.1f}"
        row += f" {int(llc['diverged'].values[i].sum()):>4} {bool(llc['flat'].values[i])!s:>5}"
        if spectrum is not None:
            row += f" {float(spectrum['trace'].sel(step=step)):>9.3g}"
        if dynamics is not None:
            row += f" {int(dynamics['stage'].sel(step=step))}"
        print(row)
    print("\ncandidate stages from the LLC curve (critical points beyond 2 SE, Hoogland et al. §3):")
    for stage in llc_stages(steps, llc["llc"].values, stderr):
        print(f"  steps {stage['start']:>5} - {stage['end']:>5}: {stage['kind']:<8} Δλ̂ = {stage['change']:+.3f}")
    if dynamics is not None:
        turning = steps[np.asarray(dynamics["turning_point"].sel(step=steps).values, bool)]
        print(f"essential-dynamics turning points: {turning.tolist()}")


if __name__ == "__main__":
    main()
