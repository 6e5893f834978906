"""Quickstart: train a small torch model and record its checkpoints in a ckpt store.

Run: ``python docs/examples/quickstart.py quickstart.zarr`` then ``ckpt info quickstart.zarr``.

The task is 3-class classification of points in the plane by angle sector; a
2-32-3 MLP learns it in a few hundred full-batch steps. Training writes a
checkpoint every 25 steps (and densely at the start), the training loss and
accuracy as metrics, and a held-out evaluation split with a label, through the
same public API any training loop uses.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import ckpt.store as ckptstore


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points uniform in [-1, 1]^2, labelled by which third of the circle their angle falls in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    angle = torch.atan2(x[:, 1], x[:, 0]) + torch.pi
    return x, (angle / (2 * torch.pi / 3)).long().clamp(max=2)


def main(path: str) -> None:
    """Train the model, writing checkpoints, metrics and eval data to ``path``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x_train, y_train = make_data(512, seed=1)
    x_eval, y_eval = make_data(256, seed=2)
    checkpoint_steps = set(range(0, 10)) | set(range(0, 401, 25))

    with ckptstore.create(path, objective="cross-entropy", framework="torch", overwrite=True, attrs={"seed": 0}) as w:
        w.add_data(
            "eval",
            inputs=x_eval,
            targets=y_eval,
            labels={"upper_half": (x_eval[:, 1] > 0).long()},
        )
        for step in range(401):
            logits = model(x_train)
            loss = torch.nn.functional.cross_entropy(logits, y_train)
            if step in checkpoint_steps:
                accuracy = (logits.argmax(-1) == y_train).float().mean()
                w.write(step, model, metrics={"loss": loss.item(), "accuracy": accuracy.item()})
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    store = ckptstore.open(path)
    final = store.metrics.sel(step=store.steps[-1])
    print(
        f"wrote {len(store.steps)} checkpoints (steps {store.steps[0]}..{store.steps[-1]}) to {path}; "
        f"final training loss {float(final['loss']):.3f}, accuracy {float(final['accuracy']):.1%}"
    )
    weights = store.checkpoints["0.weight"]  # lazy xarray: nothing read until used
    drift = np.linalg.norm(weights.isel(step=-1).values - weights.isel(step=0).values)
    print(f"first-layer weights moved by {drift:.2f} (L2) over the run")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "quickstart.zarr")
