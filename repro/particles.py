"""Particles vs trained embeddings: circles and grids of the ``particles`` sandbox next to ``modular-addition``.

"Clustering and Alignment" (§6) shows that particles moved by its clustering
and alignment forces settle into the structures of the trained embeddings:
circles, grids and imperfect grids. This script runs the ``particles`` sandbox
(our forces, derived from the paper's description: see its module docstring)
with each force alone and both, trains ``modular-addition`` at weight decay 0,
1 and 2, writes every run to a store, runs ``embedding-geometry`` on each store
through the engine exactly as on any run, and prints, side by side, the final
circularity and grid imperfection over the seeds (median and quartiles, and how
many runs end as a circle: circularity >= 0.99), with N(0, 1) random points as
the baseline.

Run by hand (not in CI; about 10 minutes on 2 cores for 20 seeds)::

    python repro/particles.py [--seeds 20] [--out particles-repro]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import ckpt.plugins  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001 - rows reach a log as soon as they are known

CIRCLE = 0.99
"""Circularity from which a final embedding counts as a circle."""

SETTINGS = {
    "particles: clustering only": ("particles", {"alignment": 0.0, "every": 100}),
    "particles: alignment only": ("particles", {"clustering": 0.0, "every": 100}),
    "particles: both forces": ("particles", {"every": 100}),
    "modular-addition, wd 0": ("modular-addition", {"weight_decay": 0.0, "every": 500}),
    "modular-addition, wd 1": ("modular-addition", {"weight_decay": 1.0, "every": 500}),
    "modular-addition, wd 2": ("modular-addition", {"weight_decay": 2.0, "every": 500}),
}


def final_geometry(store: str) -> tuple[float, float]:
    """Circularity and grid imperfection at the last checkpoint, from the engine's ``embedding-geometry``."""
    result = ckpt.analyze("embedding-geometry", store, scheduler="sync").load()
    last = result.isel(step=-1)
    return float(last["circularity"]), float(last["grid_imperfection"])


def summary(label: str, values: np.ndarray) -> str:
    circ, grid = values[:, 0], values[:, 1]
    q = np.quantile
    return (
        f"{label:<30} circularity {q(circ, 0.5):.2f} [{q(circ, 0.25):.2f}, {q(circ, 0.75):.2f}]  "
        f"circles {int((circ >= CIRCLE).sum()):>2}/{len(circ)}  "
        f"grid imperfection {q(grid, 0.5):.3f} [{q(grid, 0.25):.3f}, {q(grid, 0.75):.3f}]"
    )


def main() -> None:
    from ckpt.analyzers.embedding_geometry import circularity, grid_imperfection
    from ckpt.sandboxes.base import train
    from ckpt.sandboxes.modular_addition import ModularAddition
    from ckpt.sandboxes.particles import Particles

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--out", default="particles-repro", help="folder of the runs' stores (replaced)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    began = time.perf_counter()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tasks = {"particles": Particles(), "modular-addition": ModularAddition()}
    rng = np.random.default_rng(0)
    random = np.array([(circularity(p)[0], grid_imperfection(p)[0]) for p in rng.normal(size=(args.seeds, 17, 2))])
    print(f"final structures over seeds 0..{args.seeds - 1}: median [quartiles]")
    print(summary("random N(0, 1) points", random))
    for label, (task, options) in SETTINGS.items():
        values = []
        for seed in range(args.seeds):
            store = str(out / f"{label.replace(' ', '_').replace(':', '').replace(',', '')}-{seed}.zarr")
            train(tasks[task], store, seed=seed, **options)
            values.append(final_geometry(store))
        print(summary(label, np.array(values)))
    print(f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
