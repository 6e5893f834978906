"""Train the ``addition`` sandbox and report answer-token accuracy on the held-out eval split.

The issue's check: the default preset reaches >= 95% answer-token accuracy on
the eval split (1,250 held-out problems, 5,000 answer tokens) in a CPU-sized
run. The final model is rebuilt from the store (factory + stored tensors) and
evaluated on the stored split, so the figures are those an analyzer sees.

Usage::

    python repro/addition.py [--preset default] [--seed 0] [--store PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ckpt.sandboxes.addition import Addition
from ckpt.sandboxes.base import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default", choices=list(Addition.presets))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--store", default=None, help="Store path (default: a temporary directory).")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.store) if args.store else Path(tmp) / "addition.zarr"
        started = time.perf_counter()
        store = train(Addition(), path, preset=args.preset, seed=args.seed, device=args.device)
        elapsed = time.perf_counter() - started
        config = store.attrs["config"]
        print(
            f"preset {args.preset}, seed {args.seed}: {config['layers']} layers, d_model {config['d_model']}, "
            f"{config['heads']} heads, d_mlp {config['d_mlp']}, lr {config['lr']}, batch {config['batch_size']}, "
            f"{config['steps']} steps, {len(store.steps)} checkpoints"
        )
        print(f"training time (incl. checkpointing): {elapsed:.1f} s")

        step = int(store.steps[-1])
        model = store.model.build()
        model.load_state_dict(store.tensors(step, framework="torch"))
        model.eval()
        data = store.data("eval")
        inputs = torch.from_numpy(data["inputs"].values)
        with torch.no_grad():
            predicted = model(inputs).argmax(-1).numpy()
        mask = data["mask"].values
        hits = (predicted == data["targets"].values)[mask]
        place = data["place"].values[mask] if "place" in data else None
        carry = data["carry"].values[mask] if "carry" in data else None
        metrics = store.metrics.isel(step=-1)
        print(
            f"step {step}: answer-token accuracy on the eval split {hits.mean():.2%} ({hits.sum()}/{hits.size}); "
            f"recorded test_accuracy {float(metrics['test_accuracy']):.2%}, "
            f"train_accuracy {float(metrics['train_accuracy']):.2%}"
        )
        problems = hits.reshape(-1, 4).all(1)
        print(f"whole answers right: {problems.mean():.2%} of {problems.size} problems")
        if place is not None:
            names = ["1000s", "100s", "10s", "1s"]
            print("by place:  " + ", ".join(f"{names[p]} {hits[place == p].mean():.2%}" for p in range(4)))
        if carry is not None:
            print(
                "by carry:  "
                + ", ".join(f"carry={c} {hits[carry == c].mean():.2%} (n={int((carry == c).sum())})" for c in (0, 1))
            )
        if place is not None and carry is not None:
            cells = [
                f"{names[p]}/carry={c} {hits[(place == p) & (carry == c)].mean():.2%}"
                for p in range(3)  # no carry ever comes into the 1s
                for c in (0, 1)
                if np.any((place == p) & (carry == c))
            ]
            print("by place and carry: " + ", ".join(cells))


if __name__ == "__main__":
    main()
