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
import time
from multiprocessing import Pool

import torch

from ckpt.sandboxes.modular_addition import ModularAddition


def run_one(job: tuple[float, int, int, float | None, str]) -> tuple[float, int, dict[str, float]]:
    weight_decay, seed, steps, lr, preset = job
    torch.set_num_threads(1)  # one run per core: processes, not threads, give the parallelism
    task = ModularAddition()
    config = task.config(preset, {"weight_decay": weight_decay, "lr": lr})
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
    return weight_decay, seed, task.evaluate(model, data)


def run_vectorized(weight_decay: float, seeds: int, steps: int, lr: float | None, preset: str) -> list:
    """All ``seeds`` of one weight decay at once (see the module docstring); same results as :func:`run_one`."""
    from vectorized import stack_seeds

    task = ModularAddition()
    config = task.config(preset, {"weight_decay": weight_decay, "lr": lr})
    stacked = stack_seeds(task, config, range(seeds))
    if stacked.scheduler is not None:
        raise NotImplementedError("--vectorize does not replay a learning-rate schedule")
    models, datas, params, buffers = stacked.models, stacked.datas, stacked.params, stacked.buffers
    forward, optimizer = stacked.forward, stacked.optimizer
    inputs = torch.stack([d.train_inputs for d in datas])  # every seed has 122 training pairs
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
        results.append((weight_decay, i, task.evaluate(model, data)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per weight decay")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the preset's)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the preset's)")
    parser.add_argument("--preset", default="default", choices=sorted(ModularAddition.presets))
    parser.add_argument("--weight-decays", type=float, nargs="+", default=[0.0, 0.3, 0.6, 1.0])
    parser.add_argument("--threshold", type=float, default=0.9, help="validation accuracy that counts as generalized")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes")
    parser.add_argument("--vectorize", action="store_true", help="train each weight decay's seeds in one process")
    args = parser.parse_args()

    steps = args.steps if args.steps is not None else int(ModularAddition.presets[args.preset]["steps"])
    lr = args.lr if args.lr is not None else float(ModularAddition.presets[args.preset]["lr"])
    jobs = [(wd, seed, steps, lr, args.preset) for wd in args.weight_decays for seed in range(args.seeds)]
    start = time.perf_counter()
    if args.vectorize:
        results = [r for wd in args.weight_decays for r in run_vectorized(wd, args.seeds, steps, lr, args.preset)]
    else:
        with Pool(args.workers) as pool:
            results = pool.map(run_one, jobs, chunksize=1)
    elapsed = time.perf_counter() - start

    print(f"modular-addition: preset {args.preset}, lr {lr}, {steps} full-batch steps, seeds 0..{args.seeds - 1}")
    print(
        f"{'weight decay':>12}  {'val acc >= ' + str(args.threshold):>16}  {'mean val acc':>12}  {'mean train acc':>14}"
    )
    for wd in args.weight_decays:
        runs = [m for w, _, m in results if w == wd]
        val = [m["test_accuracy"] for m in runs]
        train = [m["train_accuracy"] for m in runs]
        hits = sum(v >= args.threshold for v in val)
        print(
            f"{wd:>12.2f}  {f'{hits}/{len(runs)}':>16}  {sum(val) / len(val):>12.3f}  {sum(train) / len(train):>14.3f}"
        )
        print(f"{'':>12}  per-seed val acc: {' '.join(f'{v:.2f}' for v in val)}")
    where = "1 process, vectorized" if args.vectorize else f"{args.workers} processes"
    print(f"({len(jobs)} runs in {elapsed:.0f} s on {where})")


if __name__ == "__main__":
    main()
