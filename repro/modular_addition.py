"""Weight decay and generalization in the ``modular-addition`` sandbox (Clustering and Alignment).

The check: with AdamW weight decay 1.0 clearly more seeds reach validation
accuracy >= 0.9 than without weight decay. Each (weight decay, seed) run is the
sandbox's own training loop (same seeding order as ``ckpt.sandboxes.base.train``:
global seed, data, model, optimizer; full batch), minus the checkpoint writes.

``--vectorize`` trains all the seeds of a weight decay in one process instead:
the task's own model, evaluated with ``torch.func.vmap`` over the stacked
parameters of the seeds (each with its own split and initialisation). AdamW
acts element by element (decoupled weight decay included), so one AdamW over
the stacked parameters is the seeds' independent AdamWs; only the
floating-point summation order differs. Use it for the long ``paper`` preset.

Run by hand (not in CI)::

    python repro/modular_addition.py --seeds 20 --workers 1
    python repro/modular_addition.py --seeds 20 --preset paper --vectorize
"""

from __future__ import annotations

import argparse
import math
import time
from multiprocessing import Pool

import torch

from ckpt.sandboxes.modular_addition import ModularAddition


def run_one(job: tuple[float, int, int, float | None, str, dict]) -> tuple[float, int, dict[str, float]]:
    weight_decay, seed, steps, lr, preset, options = job
    torch.set_num_threads(1)  # one run per core: processes, not threads, give the parallelism
    task = ModularAddition()
    config = task.config(preset, {"weight_decay": weight_decay, "lr": lr, **options})
    torch.manual_seed(seed)
    data = task.make_data(config, seed)
    model = task.build_model(config)
    optimizer, scheduler = task.make_optimizer(model, config)
    model.train()
    for _ in range(steps):
        loss = task.per_datapoint_loss(model(data.train_inputs), data.train_targets, None).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    model.eval()
    return weight_decay, seed, {**task.evaluate(model, data), **structure(model)}


def structure(model: torch.nn.Module) -> dict[str, float]:
    """The final embeddings' circularity and grid imperfection (the ``embedding-geometry`` metrics)."""
    from ckpt.analyzers.embedding_geometry import circularity, grid_imperfection

    table = model.embed.weight.detach().double().numpy()
    return {"circularity": circularity(table)[0], "grid_imperfection": grid_imperfection(table)[0]}


def run_vectorized(
    weight_decay: float,
    seeds: int,
    steps: int,
    lr: float | None,
    preset: str,
    options: dict,
    first_seed: int = 0,
    decay: str = "all",
    embedding_scale: float = 1.0,
) -> list:
    """All ``seeds`` of one weight decay at once (see the module docstring); same results as :func:`run_one`.

    Two deviations from the task, for the search of what generalization needs:
    ``decay`` applies the weight decay to ``"all"`` parameters (the task),
    the ``"embeddings"`` only or the ``"mlp"`` only; ``embedding_scale``
    multiplies the initial embeddings (torch's N(0, 1)).
    """
    from vectorized import stack_seeds

    task = ModularAddition()
    config = task.config(preset, {"weight_decay": weight_decay, "lr": lr, **options})
    stacked = stack_seeds(task, config, range(first_seed, first_seed + seeds))
    if stacked.scheduler is not None:
        raise NotImplementedError("--vectorize does not replay a learning-rate schedule")
    models, datas, params, buffers = stacked.models, stacked.datas, stacked.params, stacked.buffers
    forward, optimizer = stacked.forward, stacked.optimizer
    with torch.no_grad():
        params["embed.weight"].mul_(embedding_scale)
    if decay != "all":
        embeddings = [value for name, value in params.items() if name == "embed.weight"]
        others = [value for name, value in params.items() if name != "embed.weight"]
        decayed = {"embeddings": (embeddings, others), "mlp": (others, embeddings)}[decay]
        optimizer = torch.optim.AdamW(
            [{"params": decayed[0]}, {"params": decayed[1], "weight_decay": 0.0}],
            lr=optimizer.defaults["lr"],
            weight_decay=weight_decay,
        )
    inputs = torch.stack([d.train_inputs for d in datas])  # every seed has as many training pairs
    targets = torch.stack([d.train_targets for d in datas])
    for _ in range(steps):
        logits = forward(params, buffers, inputs)
        loss = sum(task.per_datapoint_loss(logits[i], targets[i], None).mean() for i in range(seeds))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # seed i's parameters only see seed i's loss
        optimizer.step()
    results = []
    for i, (model, data) in enumerate(zip(models, datas, strict=True)):
        with torch.no_grad():
            model.load_state_dict({name: value[i] for name, value in params.items()})
        model.eval()
        results.append((weight_decay, first_seed + i, {**task.evaluate(model, data), **structure(model)}))
    return results


CIRCLE = 0.99
"""Circularity (share of one Fourier frequency) from which a final embedding counts as a circle."""


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sound at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean (validation accuracies are bounded, not normal)."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per weight decay")
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are FIRST .. FIRST+SEEDS-1")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the preset's)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the preset's)")
    parser.add_argument("--hidden", type=int, default=None, help="width of the ReLU layer (default: the preset's)")
    parser.add_argument("--train-fraction", type=float, default=None, help="share of training pairs (default 0.8)")
    parser.add_argument(
        "--decay", default="all", choices=("all", "embeddings", "mlp"), help="parameters weight-decayed (--vectorize)"
    )
    parser.add_argument("--embedding-scale", type=float, default=1.0, help="initial embeddings x this (--vectorize)")
    parser.add_argument("--preset", default="default", choices=sorted(ModularAddition.presets))
    parser.add_argument("--weight-decays", type=float, nargs="+", default=[0.0, 0.3, 0.6, 1.0])
    parser.add_argument("--threshold", type=float, default=0.9, help="validation accuracy that counts as generalized")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes")
    parser.add_argument("--vectorize", action="store_true", help="train each weight decay's seeds in one process")
    args = parser.parse_args()

    if not args.vectorize and (args.decay != "all" or args.embedding_scale != 1.0):
        parser.error("--decay and --embedding-scale need --vectorize")
    steps = args.steps if args.steps is not None else int(ModularAddition.presets[args.preset]["steps"])
    lr = args.lr if args.lr is not None else float(ModularAddition.presets[args.preset]["lr"])
    options = {"hidden": args.hidden, "train_fraction": args.train_fraction}
    options = {key: value for key, value in options.items() if value is not None}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(wd, seed, steps, lr, args.preset, options) for wd in args.weight_decays for seed in seeds]
    start = time.perf_counter()
    if args.vectorize:
        results = [
            r
            for wd in args.weight_decays
            for r in run_vectorized(
                wd, args.seeds, steps, lr, args.preset, options, args.first_seed, args.decay, args.embedding_scale
            )
        ]
    else:
        with Pool(args.workers) as pool:
            results = pool.map(run_one, jobs, chunksize=1)
    elapsed = time.perf_counter() - start

    variant = {"decay": args.decay, "embedding_scale": args.embedding_scale}
    variant = {k: v for k, v in variant.items() if v != {"decay": "all", "embedding_scale": 1.0}[k]}
    described = ", ".join(f"{key} {value}" for key, value in {**options, **variant}.items())
    print(
        f"modular-addition: preset {args.preset}, lr {lr}, {steps} full-batch steps"
        f"{', ' + described if described else ''}, seeds {seeds.start}..{seeds.stop - 1}"
    )
    print(
        f"{'weight decay':>12}  {'val acc >= ' + str(args.threshold):>16}  {'95% CI':>13}  {'mean val acc':>12}  "
        f"{'95% CI':>13}  {'mean train acc':>14}"
    )
    for wd in args.weight_decays:
        runs = [m for w, _, m in results if w == wd]
        val = [m["test_accuracy"] for m in runs]
        train = [m["train_accuracy"] for m in runs]
        hits = sum(v >= args.threshold for v in val)
        low, high = wilson_interval(hits, len(runs))
        mean_low, mean_high = mean_interval(val)
        print(
            f"{wd:>12.2f}  {f'{hits}/{len(runs)}':>16}  {f'[{low:.2f}, {high:.2f}]':>13}  "
            f"{sum(val) / len(val):>12.3f}  {f'[{mean_low:.3f}, {mean_high:.3f}]':>13}  "
            f"{sum(train) / len(train):>14.3f}"
        )
        print(f"{'':>12}  per-seed val acc: {' '.join(f'{v:.2f}' for v in val)}")
        circles = sum(m["circularity"] >= CIRCLE for m in runs)
        low, high = wilson_interval(circles, len(runs))
        grids = sorted(m["grid_imperfection"] for m in runs)
        print(
            f"{'':>12}  circles (circularity >= {CIRCLE}): {circles}/{len(runs)} [{low:.2f}, {high:.2f}]; "
            f"grid imperfection median {grids[len(grids) // 2]:.3f}"
        )
    where = "1 process, vectorized" if args.vectorize else f"{args.workers} processes"
    print(f"({len(jobs)} runs in {elapsed:.0f} s on {where})", flush=True)


if __name__ == "__main__":
    main()
