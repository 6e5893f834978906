"""The built-in ``loss`` analyzer passes the analyzer conformance kit (ckpt.plugins.testing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ckpt.analyzers.loss import Loss
from ckpt.plugins.testing import AnalyzerTests
from tests.conftest import write_mlp_run


class TestLossConformance(AnalyzerTests):
    analyzer_class = Loss
    # 50 examples in blocks of 16: several tasks per step, so their concatenation is covered too
    options: ClassVar[dict[str, Any]] = {"block_examples": 16}

    def make_store(self, tmp_path: Path) -> Path:
        return write_mlp_run(tmp_path / "run.zarr")
