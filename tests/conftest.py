"""Shared fixtures: real stores on disk, the real ``ckpt`` command, tree digests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.store.trust import TRUST_ENV

CKPT = Path(sys.executable).with_name("ckpt")

# The test suite's stores name factories in the test package (tests.models:mlp ...): trust them, as a
# user trusts their own code, in this process and in every `ckpt` it starts. tests/test_trust.py
# clears it to check the refusals.
os.environ[TRUST_ENV] = "tests"


def run_ckpt(
    *args: str, cwd: Path | None = None, timeout: float = 120, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ckpt`` console script, as a user would."""
    command = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]
    # the repository root on the path: stores in tests name model factories like tests.models:mlp
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path, **(extra_env or {})}
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


def assert_refused(path: Path, analyzer: str, args: list[str], expected: str) -> None:
    """``ckpt analyze ANALYZER PATH ARGS`` fails with one ``Error:`` line containing ``expected``, store unchanged."""
    before = tree_digest(path)
    done = run_ckpt("analyze", analyzer, str(path), "--no-progress", *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith("Error:") and expected in lines[0], lines[0]
    assert tree_digest(path) == before


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
def one_thread() -> Iterator[None]:
    """One torch thread for tests of tiny models (extra threads only add contention on a small, busy CPU).

    Modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``; the
    worker caches are cleared afterwards.
    """
    import torch

    from ckpt.plugins import clear_cache

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    clear_cache()


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


def write_gpt2_run(folder: Path, checkpoints: int = 1, sequences: int = 16, length: int = 24) -> Path:
    """``folder/run.zarr``: a 1.7M-parameter GPT-2 (vocabulary 4,096) imported from ``save_pretrained`` folders.

    A checkpoint every two AdamW steps on 8 random sequences of 32 tokens, and an eval split of
    ``sequences`` random sequences of ``length`` tokens (seeded).
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=4, n_embd=192, vocab_size=4096, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 4096, (8, 32), generator=torch.Generator().manual_seed(1))
    for checkpoint in range(1, checkpoints + 1):
        for _ in range(2):
            loss = model(ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.save_pretrained(folder / "run" / f"checkpoint-{checkpoint}")
    np.save(folder / "ids.npy", np.random.default_rng(2).integers(0, 4096, (sequences, length)))
    store = folder / "run.zarr"
    imported = run_ckpt("import", str(folder / "run"), str(store))
    assert imported.returncode == 0, imported.stderr
    added = run_ckpt("data", "add", str(store), "eval", "--inputs", str(folder / "ids.npy"))
    assert added.returncode == 0, added.stderr
    return store


def write_mlp_run(
    path: Path,
    steps: int = 6,
    *,
    examples: int = 50,
    seed: int = 0,
    optimizer: Any = None,
    attrs: dict[str, Any] | None = None,
    factory: str = "tests.models:mlp",
    config: dict[str, Any] | None = None,
) -> Path:
    """A real (small) training run of ``tests.models:mlp`` with an eval split, as users write one.

    ``optimizer(parameters)`` builds the optimizer (default SGD, lr 0.5); ``attrs`` are the
    run's recorded settings (``ckpt.create(attrs=...)``); ``factory`` and ``config`` the
    model spec the store records (default: the model that was trained).
    """
    import torch

    from tests.models import mlp

    torch.manual_seed(seed)
    model = mlp()
    inputs, targets = torch.randn(examples, 3), torch.randint(0, 4, (examples,))
    optimizer = (optimizer or (lambda p: torch.optim.SGD(p, lr=0.5)))(model.parameters())
    with ckptstore.create(path, model=factory, config=config or {}, objective="cross-entropy", attrs=attrs) as writer:
        writer.add_data("eval", inputs=inputs, targets=targets, labels={"odd": targets % 2})
        for step in range(steps):
            writer.write(step, model)
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return path


@pytest.fixture
def mlp_store(tmp_path: Path) -> Path:
    """A 6-checkpoint run of a tiny MLP classifier with 50 eval examples."""
    return write_mlp_run(tmp_path / "mlp.zarr")
