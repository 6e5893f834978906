"""weight-norm passes ckpt's analyzer conformance kit, and its norms are right."""

from __future__ import annotations

from pathlib import Path

import ckpt_weight_norm
import numpy as np

import ckpt
import ckpt.store as ckptstore
from ckpt.plugins import Registry
from ckpt.plugins.testing import AnalyzerTests, write_example_run


class TestWeightNorm(AnalyzerTests):
    """Every test of the kit, on a small real training run, plus the analyzer's own."""

    analyzer_class = ckpt_weight_norm.WeightNorm
    plugin = ckpt_weight_norm  # registers it when the package is not installed
    # A check that does not apply would be opted out here, with the reason:
    # expected_failures = {"test_figures": "why it cannot pass"}

    def make_store(self, tmp_path: Path) -> Path:
        """Three checkpoints of a tiny MLP (a fresh store per test)."""
        return write_example_run(tmp_path / "run.zarr", steps=3)

    def test_norms_match_numpy(self, store: Path, registry: Registry) -> None:
        """The stored norms are numpy's (the kit's fixtures serve the analyzer's own tests too)."""
        result = ckpt.analyze("weight-norm", store, registry=registry)
        opened = ckptstore.open(store)
        for step in opened.steps:
            for name, tensor in opened.tensors(step).items():
                expected = np.linalg.norm(tensor.astype(np.float64))
                actual = float(result["norm"].sel(step=step, tensor=name))
                assert np.isclose(actual, expected), f"norm of {name} at step {step}: {actual} != {expected}"
