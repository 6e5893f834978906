"""Benchmark of the analysis engine: overhead against a plain Python loop, and scaling with workers.

Run from the repository root: ``python bench/engine.py`` (``--quick`` for a smoke run).

1. Overhead: the ``loss`` analyzer through the engine (graph building, Dask
   threads scheduler with one worker, saving the result into the store)
   on the single-threaded ``sync`` scheduler against a plain loop computing
   the same per-example losses (load tensors,
   ``load_state_dict``, forward, cross-entropy), on a 100-checkpoint store.
   Target: <= 1.2x.
2. Scaling: the same run on the threads scheduler, and on a distributed
   LocalCluster of 1 and 2 worker processes. torch is limited to one thread per
   worker so that the workers, not torch's intra-op pool, share the cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["OMP_NUM_THREADS"] = "1"  # workers inherit it (LocalCluster processes too)

import dask  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from distributed import LocalCluster  # noqa: E402

import ckpt.store as ckptstore  # noqa: E402
from ckpt.engine.pipeline import run  # noqa: E402
from tests.models import mlp  # noqa: E402

ckptstore.allow("tests.models")  # the bench's stores name the test package's model factory
CONFIG = {"d_in": 64, "hidden": 512, "classes": 10}


def make_store(path: Path, checkpoints: int, examples: int) -> None:
    torch.manual_seed(0)
    model = mlp(**CONFIG)
    inputs, targets = torch.randn(examples, CONFIG["d_in"]), torch.randint(0, CONFIG["classes"], (examples,))
    with ckptstore.create(path, model="tests.models:mlp", config=CONFIG, objective="cross-entropy") as w:
        w.add_data("eval", inputs=inputs, targets=targets)
        for step in range(checkpoints):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.01)
            w.write(step * 10, model)


def plain_loop(path: Path) -> np.ndarray:
    store = ckptstore.open(path)
    data = store.data("eval")
    inputs, targets = torch.from_numpy(data["inputs"].values), torch.from_numpy(data["targets"].values)
    model = mlp(**CONFIG).eval()
    rows = []
    for step in store.steps:
        model.load_state_dict(store.tensors(int(step), framework="torch"))
        with torch.no_grad():
            rows.append(torch.nn.functional.cross_entropy(model(inputs), targets, reduction="none").double().numpy())
    return np.stack(rows)


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 checkpoints, 1 repetition")
    args = parser.parse_args()
    if args.quick:
        args.checkpoints, args.repeat = 10, 1
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-engine-"))
    path = folder / "run.zarr"
    try:
        make_store(path, args.checkpoints, args.examples)
        params = sum(p.numel() for p in mlp(**CONFIG).parameters())
        print(f"store: {args.checkpoints} checkpoints of a {params:,}-parameter MLP, {args.examples} eval examples")
        loop_s, expected = timed(lambda: plain_loop(path), args.repeat)

        def engine(**kw: object) -> np.ndarray:
            return run("loss", path, force=True, **kw).dataset["loss"].values

        sync, values = timed(lambda: engine(scheduler="sync"), args.repeat)
        np.testing.assert_allclose(values, expected, rtol=1e-5)
        threads, values = timed(lambda: engine(scheduler="threads"), args.repeat)
        np.testing.assert_allclose(values, expected, rtol=1e-5)
        scaling = {}
        for n in (1, 2):  # clusters started outside the timing: we measure the engine, not dask's start-up
            # the environment the engine gives the clusters it starts itself (see compute_settings)
            environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {})}
            environ.pop("MALLOC_TRIM_THRESHOLD_", None)
            with (
                dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
                LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
            ):
                engine(address=cluster.scheduler_address)  # warm the workers' caches, as a long session would
                scaling[n], values = timed(lambda c=cluster: engine(address=c.scheduler_address), args.repeat)
                np.testing.assert_allclose(values, expected, rtol=1e-5)

        print(f"\n{'measure':<48} {'seconds':>9} {'ratio':>8}  target")
        print(f"{'plain Python loop (one thread)':<48} {loop_s:9.3f}")
        print(f"{'engine, sync scheduler (one thread, saves result)':<48} {sync:9.3f} {sync / loop_s:7.2f}x  <= 1.2x")
        print(f"{'engine, threads scheduler (2 threads)':<48} {threads:9.3f} {sync / threads:7.2f}x  speedup vs sync")
        print(f"{'engine, LocalCluster, 1 worker process':<48} {scaling[1]:9.3f}")
        label = "engine, LocalCluster, 2 worker processes"
        print(f"{label:<48} {scaling[2]:9.3f} {scaling[1] / scaling[2]:7.2f}x  speedup 1->2")
        print(f"\nmedians of {args.repeat}; every engine result was checked equal (1e-5) to the plain loop's.")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
