"""Clustering Head check: with p=2, some seeds of sparse modular addition reach 100% test accuracy.

Trains the ``sparse-modular-addition`` sandbox for several seeds and prints,
per seed, the final train/test accuracy and the first epoch at which test
accuracy reached 100% (if it ever did).

The loop mirrors :func:`sandboxes.base.train` step for step (same seeding
order: ``torch.manual_seed(seed)``, then the data, then the model; same batch
order; same optimizer), so a seed here follows the same trajectory as
``train(task, path, preset="paper", seed=seed)``; it only skips writing a
checkpoint every epoch, which would double the run time on a small CPU.

Usage::

    python repro/sparse_modular_addition.py --seeds 0 1 2 3 --epochs 1000 --jobs 2
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import torch


def run_seed(seed: int, epochs: int, p: int) -> dict[str, Any]:
    """Train one seed; return its accuracy trajectory summary."""
    torch.set_num_threads(1)  # one process per core: torch's own threads would oversubscribe
    from sandboxes.sparse_modular_addition import SparseModularAddition

    task = SparseModularAddition()
    config = task.config("paper", {"p": p})
    torch.manual_seed(seed)
    data = task.make_data(config, seed)
    model = task.build_model(config)
    optimizer, _ = task.make_optimizer(model, config)
    first_perfect = None
    test_acc = train_acc = 0.0
    start = time.time()
    for epoch in range(epochs):
        model.train()
        for inputs, targets, mask in task.batches(data, config, epoch, seed):
            loss = task.per_datapoint_loss(model(inputs), targets, mask).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            test_acc = float((model(data.test_inputs).argmax(-1) == data.test_targets).float().mean())
        if test_acc == 1.0 and first_perfect is None:
            first_perfect = epoch + 1  # epochs completed
    with torch.no_grad():
        train_acc = float((model(data.train_inputs).argmax(-1) == data.train_targets).float().mean())
    return {
        "seed": seed,
        "train_acc": train_acc,
        "test_acc": test_acc,
        "first_perfect": first_perfect,
        "seconds": time.time() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--epochs", type=int, default=1000, help="paper: 1000")
    parser.add_argument("--p", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2, help="seeds trained in parallel (one core each)")
    args = parser.parse_args()

    print(f"sparse modular addition: p={args.p}, L=12, k=5, d=2, {args.epochs} epochs, seeds {args.seeds}")
    results = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_seed, s, args.epochs, args.p) for s in args.seeds]
        for future in as_completed(futures):
            r = future.result()
            results.append(r)
            first = "never" if r["first_perfect"] is None else f"epoch {r['first_perfect']}"
            print(
                f"seed {r['seed']:>3}: final train acc {r['train_acc']:.4f}  test acc {r['test_acc']:.4f}  "
                f"first 100% test: {first}  ({r['seconds']:.0f} s)",
                flush=True,
            )
    perfect = sum(r["first_perfect"] is not None for r in results)
    final = sum(r["test_acc"] == 1.0 for r in results)
    print(f"{perfect}/{len(results)} seeds reached 100% test accuracy at some epoch; {final} end at 100%")


if __name__ == "__main__":
    main()
