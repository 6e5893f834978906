"""Reproduce the shape of Table 3 of "Hidden Breakthroughs in Language Model Training" on the addition sandbox.

Trains the ``addition`` default preset (or reuses ``--store``), grows a Hessian basis
every ``--every`` steps, and clusters the answer tokens by their trajectories with
``clusters --label carry`` on: the exact loss, the projected Fisher information,
POLCA (the paper's second order), first-order POLCA, and the baselines of Table 3
and App. E: per-datapoint LCA on the 50 largest-magnitude parameters, first-order
POLCA on a random orthonormal basis of the same size, and on a Hessian basis grown
over the basis checkpoints in a shuffled order. Prints the top three carry
homogeneities of each, without and with the paper's restriction to clusters
whose carry tokens are >= 85% in the 10s or 100s place, next to the paper's
figures (exact loss 0.514, Fisher 0.664, POLCA 0.973 / 0.946 / 0.903, LCA 0.792,
random basis 0.902, shuffled-checkpoint basis 0.856), and App. F's comparison of
first- and second-order projected-loss trajectories (cosine similarity and L2
distance per token and kept basis vector).

Every analysis is the real ``ckpt`` analyzer through the engine; results that
would overwrite each other (one ``polca`` and one ``clusters`` per store) are
read right after they are computed. Run by hand (not in CI; about 110 minutes on
a 2-core CPU shared with other work, most of it LCA's 50 directions x 3 gradients
per checkpoint pair)::

    python repro/hidden_breakthroughs.py [--store PATH] [--every 400] [--workers 2]
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

import numpy as np  # noqa: E402

import ckpt.plugins  # noqa: E402

print = functools.partial(print, flush=True)  # noqa: A001 - rows reach a log as soon as they are known

PAPER = {
    "exact loss": "0.514",
    "Fisher": "0.664",
    "POLCA": "0.973 0.946 0.903",
    "LCA, 50 parameters": "0.792",
    "random basis, first order": "0.902",
    "shuffled basis, first order": "0.856",
}


def first_vs_second_order(polca) -> str:
    """App. F: first-order vs full (first + second order) projected-loss trajectories, eq. 10.

    Per token and basis vector, both trajectories start at 0 (L_b(x, θ_0) = 0) and sum the
    terms over the checkpoints; their cosine similarity and L2 distance (relative to the
    full trajectory's norm) over steps, summarised over tokens and basis vectors.
    """
    first = polca["first_order"].cumsum("step").transpose("datapoint", "basis", "step").values
    full = polca["polca"].cumsum("step").transpose("datapoint", "basis", "step").values
    norms = np.linalg.norm(first, axis=-1) * np.linalg.norm(full, axis=-1)
    keep = norms > 0
    cosine = (first * full).sum(-1)[keep] / norms[keep]
    relative = np.linalg.norm(first - full, axis=-1)[keep] / np.linalg.norm(full, axis=-1)[keep]
    q = np.quantile
    return (
        f"cosine similarity median {q(cosine, 0.5):.3f} (quartiles {q(cosine, 0.25):.3f}, {q(cosine, 0.75):.3f}); "
        f"L2 distance / ||full|| median {q(relative, 0.5):.3f} (quartiles {q(relative, 0.25):.3f}, "
        f"{q(relative, 0.75):.3f}); {keep.sum()} token x basis trajectories"
    )


def top3(store: str, on: str, engine: dict, label: str = "") -> tuple[np.ndarray, np.ndarray, str]:
    """Top-3 carry homogeneities, unrestricted and place-restricted, and where the best cluster sits.

    Printed as soon as they are known (flushed), so that a run stopped early keeps its rows.
    """
    found = []
    for restrict in (False, True):
        result = ckpt.analyze(
            "clusters", store, on=on, label="carry", place_restrict=restrict, force=True, **engine
        ).load()
        found.append(np.round(result["top_homogeneity"].values, 3))
    sizes = result["size"].values
    print(f"{label or on}: top-3 carry homogeneity {found[0].tolist()} / restricted {found[1].tolist()}", flush=True)
    return (
        found[0],
        found[1],
        f"clusters per basis vector: {result['clusters'].values.tolist()}, sizes {sizes[sizes > 0].tolist()}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default="hidden-breakthroughs/addition.zarr")
    parser.add_argument("--every", type=int, default=400, help="basis checkpoint spacing (steps)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    store = args.store
    began = time.perf_counter()
    if not Path(store).exists():
        from ckpt.sandboxes import addition
        from ckpt.sandboxes.base import train

        train(addition.Addition(), store, preset="default", progress=False)
    engine = {"scheduler": "processes", "workers": args.workers}
    basis = {"every": args.every}
    rows = []
    rows.append(("exact loss", *top3(store, "loss", engine, "exact loss")))
    ckpt.analyze("fisher", store, **basis, **engine)
    rows.append(("Fisher", *top3(store, "fisher", engine, "Fisher")))
    order_note = ""
    for label, options in (
        ("POLCA", {"second_order": "paper"}),
        ("POLCA, first order", {"second_order": "none"}),
        ("random basis, first order", {"second_order": "none", "basis": "random-basis"}),
    ):
        polca = ckpt.analyze("polca", store, force=True, **basis, **options, **engine).load()
        explained = float(polca["polca"].sum(["step", "basis"]).mean())
        change = float(polca["loss_change"].sum("step").mean())
        print(
            f"{label}: mean loss change over the run {change:.3f}, explained by the basis {explained:.3f}", flush=True
        )
        if label == "POLCA":
            order_note = first_vs_second_order(polca)
            print(f"App. F: {order_note}", flush=True)
        rows.append((label, *top3(store, "polca", engine, label)))
    # after every POLCA on the chronological basis: it replaces the stored hessian-basis
    ckpt.analyze("hessian-basis", store, order="shuffled", force=True, **basis, **engine)
    ckpt.analyze("polca", store, force=True, second_order="none", **engine)
    rows.append(("shuffled basis, first order", *top3(store, "polca", engine, "shuffled basis, first order")))
    # last: the costliest row (50 directions x Simpson's three gradients per checkpoint pair)
    ckpt.analyze("lca", store, parameters=50, force=True, **engine)
    rows.append(("LCA, 50 parameters", *top3(store, "lca", engine, "LCA, 50 parameters")))
    print(f"\ntop-3 carry homogeneity ({store}, basis every {args.every} steps)")
    print(f"{'method':<28} {'unrestricted':<24} {'10s/100s restricted':<24} paper")
    for label, free, restricted, _ in rows:
        print(f"{label:<28} {' '.join(map(str, free)):<24} {' '.join(map(str, restricted)):<24} {PAPER.get(label, '')}")
    for label, _, _, detail in rows:
        print(f"  {label}: {detail}")
    print(f"App. F, first vs second order (POLCA, the paper's second order): {order_note}")
    print(f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
