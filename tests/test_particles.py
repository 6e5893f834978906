"""The ``particles`` sandbox: its potentials against brute-force loops, and runs measured like any store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers import embedding_geometry as eg
from ckpt.engine.pipeline import run
from ckpt.engine.worker import clear_cache
from ckpt.sandboxes.base import train
from ckpt.sandboxes.modular_addition import all_pairs
from ckpt.sandboxes.particles import Particles, ParticleSystem, alignment_potential, clustering_potential
from tests.helpers import run_ckpt

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def brute_clustering(sums: np.ndarray, classes: np.ndarray, temperature: float) -> list[float]:
    """The soft nearest-neighbour potential, one pair sum and one neighbour at a time."""
    scale = temperature * np.mean([s @ s for s in sums])
    values = []
    for p in range(len(sums)):
        weights = {q: math.exp(-float((sums[p] - sums[q]) @ (sums[p] - sums[q])) / scale) for q in range(len(sums))}
        weights.pop(p)
        same = [w for q, w in weights.items() if classes[q] == classes[p]]
        values.append(-math.log(sum(same) / sum(weights.values())) if same else 0.0)
    return values


def brute_alignment(sums: np.ndarray, classes: np.ndarray, width: float) -> list[float]:
    values = []
    for p in range(len(sums)):
        total = 0.0
        for q in range(len(sums)):
            if q == p:
                continue
            cosine = sums[p] @ sums[q] / (np.linalg.norm(sums[p]) * np.linalg.norm(sums[q]))
            sign = -1.0 if classes[q] == classes[p] else 1.0
            total += sign * math.exp(-(1 - cosine**2) / (2 * width**2))
        values.append(total / (len(sums) - 1))
    return values


def test_potentials_match_brute_force_loops() -> None:
    generator = torch.Generator().manual_seed(3)
    sums = torch.randn(12, 2, generator=generator, dtype=torch.float64)
    classes = torch.tensor([0, 1, 2, 0, 1, 2, 0, 3, 1, 2, 0, 1])  # class 3 has one pair sum: no pull
    got = clustering_potential(sums, classes, 0.3).numpy()
    np.testing.assert_allclose(got, brute_clustering(sums.numpy(), classes.numpy(), 0.3), rtol=1e-12)
    assert got[7] == 0.0
    got = alignment_potential(sums, classes, 0.4).numpy()
    np.testing.assert_allclose(got, brute_alignment(sums.numpy(), classes.numpy(), 0.4), rtol=1e-12)


def test_the_forces_pull_a_class_together_and_push_classes_apart() -> None:
    # two pair sums of one class and one of another, on a line: the clustering force
    # (minus the gradient) moves the same-class ones towards each other and the odd one away
    sums = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.5, 0.0]], dtype=torch.float64, requires_grad=True)
    classes = torch.tensor([0, 0, 1])
    clustering_potential(sums, classes, 1.0).sum().backward()
    force = -sums.grad
    assert force[0, 0] > 0  # towards its class mate at x=1
    assert force[2, 0] > 0  # away from the other class
    # alignment: two axes of one class 0.3 rad apart rotate towards each other
    angles = torch.tensor([0.0, 0.3, 1.6], dtype=torch.float64, requires_grad=True)
    alignment_potential(torch.stack([angles.cos(), angles.sin()], 1), classes, 0.5).sum().backward()
    assert angles.grad[0] < 0 and angles.grad[1] > 0  # descending moves 0 up and 1 down: together


def test_the_potential_is_blind_to_position_and_scale() -> None:
    torch.manual_seed(0)
    model = ParticleSystem(n=7)
    pairs = all_pairs(7)
    before = model(pairs)
    with torch.no_grad():
        model.embed.weight.mul_(3.0).add_(torch.tensor([2.0, -1.0]))
    torch.testing.assert_close(model(pairs), before, rtol=1e-5, atol=1e-6)


def test_a_run_is_a_store_that_embedding_geometry_measures(tmp_path: Path) -> None:
    path = tmp_path / "particles.zarr"
    train(Particles(), path, steps=300, every=100, seed=0, n=7, alignment=0.0)
    store = ckptstore.open(path)
    assert [int(s) for s in store.steps] == [0, 100, 200, 300]
    assert store.model.factory == "ckpt.sandboxes.particles:build_model" and store.objective is None
    potential = store.metrics["clustering_potential"].values
    assert potential[-1] < potential[0]  # gradient descent on the potential
    result = run("embedding-geometry", path).dataset.load()
    for step in (0, 300):
        table = store.tensors(step)["embed.weight"].astype(np.float64)
        assert float(result["grid_imperfection"].sel(step=step)) == pytest.approx(eg.grid_imperfection(table)[0])
        assert float(result["circularity"].sel(step=step)) == pytest.approx(eg.circularity(table)[0])
    clear_cache()


def test_per_datapoint_analyzers_refuse_a_potential_that_couples_the_pairs(tmp_path: Path) -> None:
    path = tmp_path / "particles.zarr"
    train(Particles(), path, steps=2, every=1, seed=0, n=5)
    before = sorted(p.name for p in path.iterdir())
    done = run_ckpt("analyze", "loss", str(path))
    assert done.returncode != 0
    assert done.stderr.startswith("Error:") and "objective" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in path.iterdir()) == before
