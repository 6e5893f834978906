"""A measured search for a demo configuration where Table 3's ordering holds over seeds.

Issue: the paper's Table 3 finding (carry homogeneity POLCA > Fisher > exact
loss) must hold on at least 4 of 5 seeds, unrestricted and under the 10s/100s
restriction, for ``ckpt demo`` to claim it. Training is fixed (the ``addition``
default preset, 2,000 steps, a checkpoint every 40) unless a configuration
says otherwise (its ``train`` options: the learning rate, the checkpoint interval, the width);
the search varies what the analysis chooses: how many Hessian basis vectors
(``--every``, ``--k``: the paper has 50 over its run, the demo 6), the
Hessian's sample size, and HDBSCAN's ``min_cluster_size``. Training pins the CPU kernels as ``ckpt demo``
does. Each seed is trained once (or reused from
``--dir``); the exact-loss clusters depend only on HDBSCAN's settings.

For every configuration it prints the best carry homogeneity of each method per
seed (all clusters / restricted) and on how many seeds the ordering holds, the
same table as ``ckpt demo --seeds``. Run by hand (not in CI; about 15 minutes
per configuration for 5 seeds on 2 cores, after 5 minutes of training)::

    python repro/demo_search.py [--seeds 0-4] [--dir demo-search]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

print = functools.partial(print, flush=True)  # noqa: A001 - rows reach a log as soon as they are known

CONFIGS = {
    "demo (every 400, 640 samples: 6 vectors)": {"basis": {"every": 400, "samples": 640}},
    # the next two reuse the stored basis, POLCA and Fisher of the first (same options): clustering only
    "demo, min_cluster_size 100": {"basis": {"every": 400, "samples": 640}, "clusters": {"min_cluster_size": 100}},
    "demo, min_cluster_size 250": {"basis": {"every": 400, "samples": 640}, "clusters": {"min_cluster_size": 250}},
    "every 200 (11 vectors)": {"basis": {"every": 200, "samples": 640}},
    "every 400, k 3 (18 vectors)": {"basis": {"every": 400, "samples": 640, "k": 3}},
    "every 100 (21 vectors)": {"basis": {"every": 100, "samples": 640}},
    # training-side: the paper trains far more slowly (lr 1e-5 on 9.5M parameters, 10,000 steps);
    # a lower step size spreads the learning of each place and carry over more checkpoints
    "lr 1e-3, every 400 (6 vectors)": {"train": {"lr": 1e-3}, "basis": {"every": 400, "samples": 640}},
    "lr 1e-3, every 400, k 3 (18 vectors)": {"train": {"lr": 1e-3}, "basis": {"every": 400, "samples": 640, "k": 3}},
    # the paper keeps a checkpoint every 20 steps (the demo: 40): POLCA's first-order steps are shorter
    "checkpoint every 20, every 400 (6 vectors)": {"train": {"every": 20}, "basis": {"every": 400, "samples": 640}},
    # model size: the paper's model is 9.5M parameters (d_model 512); twice the demo's width, 4x its weights
    "d_model 128, every 400 (6 vectors)": {
        "train": {"d_model": 128, "d_mlp": 512},
        "basis": {"every": 400, "samples": 640},
    },
    # the two changes that moved the restricted reading, together (not yet run: ~90 minutes for 5 seeds)
    "d_model 128, every 400, k 3 (18 vectors)": {
        "train": {"d_model": 128, "d_mlp": 512},
        "basis": {"every": 400, "samples": 640, "k": 3},
    },
}


def cluster(store: str, on: str, options: dict) -> object:
    """``clusters --on ON --label carry``, loaded at once (the next one replaces it in the store)."""
    from ckpt.engine.pipeline import run

    return run("clusters", store, on=on, label="carry", **options).dataset.load()


def main() -> None:
    from ckpt.sandboxes.reproducible import pin_cpu_kernels

    pin_cpu_kernels()  # as ckpt demo does: the same weights on any x86-64 CPU
    from ckpt.cli.demo import _seed_range, seed_spread
    from ckpt.engine.pipeline import run
    from ckpt.sandboxes.addition import Addition
    from ckpt.sandboxes.base import train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--dir", default="demo-search", help="folder of the seeds' runs (reused when present)")
    parser.add_argument("--configs", nargs="*", default=None, help="names of CONFIGS to run (default: all)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    seeds = _seed_range(args.seeds)
    began = time.perf_counter()

    def trained(options: dict) -> dict[int, str]:
        """Each seed's run with these training options (the default preset's otherwise), trained once."""
        folder = Path(args.dir, *(f"{key}-{value}" for key, value in sorted(options.items())))
        stores = {}
        for seed in seeds:
            path = folder / f"seed-{seed}" / "addition.zarr"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                started = time.perf_counter()
                train(Addition(), str(path), seed=seed, **options)
                print(f"trained seed {seed} {options or ''} ({time.perf_counter() - started:.0f} s)")
            stores[seed] = str(path)
        return stores

    for name in args.configs or list(CONFIGS):
        config = CONFIGS[name]
        stores = trained(config.get("train", {}))
        basis, clustering = config["basis"], config.get("clusters", {})
        started = time.perf_counter()
        tables = {}
        for seed, store in stores.items():
            run("hessian-basis", store, **basis)
            run("polca", store, second_order="none", **basis)
            run("fisher", store, **basis)
            tables[seed] = {
                "exact loss": cluster(store, "loss", clustering),
                "Fisher": cluster(store, "fisher", clustering),
                "POLCA (first order)": cluster(store, "polca", clustering),
            }
        print(f"\n== {name}: {config} ({time.perf_counter() - started:.0f} s)")
        for line in seed_spread(tables):
            print(line)
    print(f"\n{time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
