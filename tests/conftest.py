"""Shared fixtures: real stores on disk, the real ``ckpt`` command, tree digests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckptstore

CKPT = Path(sys.executable).with_name("ckpt")


def run_ckpt(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ckpt`` console script, as a user would."""
    command = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "cli"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env, check=False
    )


def tree_digest(path: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``path``: equal digests = unchanged store."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def make_tensors(step: int) -> dict[str, np.ndarray]:
    """Deterministic tensors of a checkpoint, recomputable from the step alone."""
    rng = np.random.default_rng(step)
    return {
        "embed.weight": rng.standard_normal((10, 4)).astype(np.float32),
        "block.0.fc.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "block.0.fc.bias": rng.standard_normal(8).astype(np.float16),
        "counter": np.asarray(step, dtype=np.int64),
    }


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    """A store with three checkpoints (steps 0, 10, 20), metrics and an eval split."""
    path = tmp_path / "run.zarr"
    with ckptstore.create(path, model="tests.models:tiny", config={"d": 4}, objective="cross-entropy") as w:
        for step in (0, 10, 20):
            w.write(step, make_tensors(step), metrics={"loss": 1.0 / (step + 1)})
        w.add_data(
            "eval",
            inputs=np.arange(12).reshape(6, 2),
            targets=np.arange(6) % 3,
            labels={"parity": np.arange(6) % 2},
        )
    return path
