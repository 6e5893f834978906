"""weight-norm passes ckpt's analyzer conformance kit, and its norms are right."""

from __future__ import annotations

from pathlib import Path

import ckpt_weight_norm
import numpy as np

import ckpt.store as ckptstore
from ckpt.plugins import Registry, analyze
from ckpt.plugins.testing import AnalyzerTests


def write_run(path: Path) -> Path:
    """Three checkpoints of three tensors (no model needed: weight-norm reads tensors only)."""
    rng = np.random.default_rng(0)
    with ckptstore.create(path) as writer:
        for step in (0, 100, 200):
            writer.write(
                step,
                {
                    "embed.weight": rng.standard_normal((16, 4)).astype(np.float32),
                    "fc.weight": rng.standard_normal((4, 4)).astype(np.float16),
                    "fc.bias": rng.standard_normal(4).astype(np.float32),
                },
            )
    return path


class TestWeightNorm(AnalyzerTests):
    """Every test of the kit, on the run of :func:`write_run`, plus the analyzer's own."""

    analyzer_class = ckpt_weight_norm.WeightNorm
    plugin = ckpt_weight_norm  # registers it when the package is not installed

    def make_store(self, tmp_path: Path) -> Path:
        """A small store for the kit's tests (a fresh one per test)."""
        return write_run(tmp_path / "run.zarr")

    def test_norms_match_numpy(self, store: Path, registry: Registry) -> None:
        """The stored norms are numpy's (the kit's fixtures serve the analyzer's own tests too)."""
        result = analyze("weight-norm", store, registry=registry)
        opened = ckptstore.open(store)
        for step in opened.steps:
            for name, tensor in opened.tensors(step).items():
                expected = np.linalg.norm(tensor.astype(np.float64))
                actual = float(result["norm"].sel(step=step, tensor=name))
                assert np.isclose(actual, expected), f"norm of {name} at step {step}: {actual} != {expected}"
