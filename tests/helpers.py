"""Helpers shared by the test modules: ``ckpt`` commands, refusals, deterministic tensors, a GPT-2 run.

A command runs in the test's process (:func:`invoke_ckpt`) unless the test is about its process
(:func:`run_ckpt`: exit status and the one ``Error:`` line of a refusal, no traceback, signals,
the environment, isolation between processes).

Fixtures live in ``tests/conftest.py``; plugin authors' helpers (``write_example_run``,
``tree_digest``) are public, in :mod:`ckpt.plugins.testing`. This module imports no pytest at its top: the
writer and crash processes the tests start import it too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# from the light module, not ckpt.plugins.testing: the writer and crash processes import these helpers
from ckpt.plugins.examples import tree_digest

__all__ = [
    "CKPT",
    "assert_causal",
    "assert_refused",
    "eval_loss",
    "invoke_ckpt",
    "make_tensors",
    "registry_with",
    "run_ckpt",
    "run_repro",
    "sparse_modular_store",
    "state_dict",
    "tree_digest",
    "write_analyzed_run",
    "write_gpt2_run",
]

CKPT = Path(sys.executable).with_name("ckpt")


def run_ckpt(
    *args: str, cwd: Path | None = None, timeout: float = 120, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ckpt`` console script, as a user would: its own process, its own exit status.

    The process is forked from a server that has imported torch and the other heavy libraries once
    (tests/cli_forkserver.py says when it is not, and why); ``CKPT_TEST_EXEC=1`` runs every command
    from the console script instead.
    """
    command = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]
    # the repository root on the path: stores in tests name model factories like tests.models:mlp
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    base = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    env = {**base, **(extra_env or {})}
    if CKPT.exists() and os.environ.get("CKPT_TEST_EXEC") != "1":
        done = _fork_server().run(list(args), cwd, timeout, base, env)
        if done is not None:
            return done
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env, check=False
    )


@functools.cache
def _fork_server() -> Any:
    """This process's fork server (tests/cli_forkserver.py), stopped when the process exits."""
    import atexit

    from tests.cli_forkserver import ForkServer

    server = ForkServer(CKPT)
    atexit.register(server.close)
    return server


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


def state_dict(seed: int) -> dict[str, Any]:
    """A tiny torch state_dict holding every dtype an importer must keep bit-exact."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(3, 4, generator=g),
        "fc.bias": torch.randn(4, generator=g).half(),
        "emb.weight": torch.randn(5, 2, generator=g).to(torch.bfloat16),
        "counts": torch.randint(-1000, 1000, (2,), generator=g),
    }


def tiny_gpt2(vocab: int, dtype: Any = None) -> Any:
    """A seeded 2-layer GPT-2 (d 16, 16 positions) in eval mode, in ``dtype`` (default float32)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=16, vocab_size=vocab, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config).to(dtype or torch.float32).eval()


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


def set_provenance(store: Path, name: str, fields: dict[str, Any]) -> None:
    """Edit a stored result's provenance as an attacker would: in its ``zarr.json`` and in the commit record."""
    root = json.loads((store / "zarr.json").read_text())
    root["consolidated_metadata"]["metadata"][f"analyses/{name}"]["attributes"]["ckpt"].update(fields)
    (store / "zarr.json").write_text(json.dumps(root))
    node_path = store / "analyses" / name / "zarr.json"
    node = json.loads(node_path.read_text())
    node["attributes"]["ckpt"].update(fields)
    node_path.write_text(json.dumps(node))


def invoke_ckpt(
    *args: str, cwd: Path | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``ckpt ARGS`` in this process (click's ``CliRunner`` on ckpt's group): what a command does, fast.

    For tests of a command's output and of what it leaves in a store, not of its process: the same
    group, error handling and exit status as the console script, minus the interpreter start and
    the imports (:func:`run_ckpt` costs a process and ckpt's imports a command). A test of the
    process itself (exit status on a refusal, the one ``Error:`` line with no traceback, signals,
    the environment a process starts with, isolation between processes) uses :func:`run_ckpt`.
    An exception the group does not turn into an exit status is raised here, so the test fails
    on it with its traceback; warnings are ignored as ``run_ckpt``'s ``PYTHONWARNINGS`` does.
    """
    import contextlib
    import warnings

    from click.testing import CliRunner

    from ckpt.cli.main import cli

    runner = CliRunner(catch_exceptions=False)
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.invoke(cli, list(args), env=extra_env, prog_name="ckpt")
    return subprocess.CompletedProcess(["ckpt", *args], result.exit_code, result.stdout, result.stderr)


def weight_norm(worker: Any, step: int) -> dict[str, np.ndarray]:
    """``map_checkpoints``' per-step function for tests' small analyzers: the sum of the tensors' norms."""
    tensors = worker.tensors(step)
    return {"norm": np.array(sum(float(np.linalg.norm(t.astype(np.float64))) for t in tensors.values()))}


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """A local S3 server (moto) with the bucket ``runs``; yields the environment that points AWS clients at it."""
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        }
        # moto keeps its buckets in the process: a second server in the same pytest worker sees them
        s3fs.S3FileSystem(key="test", secret="test", endpoint_url=env["AWS_ENDPOINT_URL"]).makedirs(
            "runs", exist_ok=True
        )
        yield env
    finally:
        server.stop()


def registry_with(*analyzers: Any) -> Any:
    """The built-in registry plus ``analyzers``, registered through a plugin's hook as a third party's are."""
    import types

    from ckpt.plugins import hookimpl
    from ckpt.plugins.manager import load_registry

    @hookimpl
    def ckpt_register_analyzers(register: Any) -> None:
        for analyzer in analyzers:
            register(analyzer)

    return load_registry(extra=[types.SimpleNamespace(ckpt_register_analyzers=ckpt_register_analyzers)])


def write_analyzed_run(path: Path, steps: int = 3, examples: int = 8) -> Path:
    """A small example run (:func:`write_example_run`) with its ``loss`` computed: hostile-store tests' base."""
    from ckpt.plugins.examples import write_example_run

    write_example_run(path, steps=steps, examples=examples)
    analyzed = invoke_ckpt("analyze", "loss", str(path), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    return path


def sparse_modular_store(name: str, settings: dict[str, Any]) -> Any:
    """A module fixture: a run of the sparse-modular-addition sandbox trained once with ``settings``."""
    import pytest

    from ckpt.sandboxes.base import train
    from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition

    @pytest.fixture(scope="module")
    def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp(name) / "sma.zarr"
        train(SparseModularAddition(), path, **settings)
        return path

    return store


def run_repro(script: str, args: list[str], out: Path) -> tuple[Any, Any]:
    """``repro/SCRIPT.py`` imported as a module and its ``main(ARGS --out OUT)`` run: the module and its results."""
    import importlib

    repro = str(Path(__file__).resolve().parents[1] / "repro")
    sys.path.insert(0, repro)
    try:
        module = importlib.import_module(script)
        return module, module.main([*args, "--out", str(out)])
    finally:
        sys.path.remove(repro)


def assert_causal(model: Any, vocab: int, length: int, position: int, batch: int = 3) -> Any:
    """A token changed at ``position`` changes no output before it and some after it; the outputs before."""
    import torch

    inputs = torch.randint(0, vocab, (batch, length))
    changed = inputs.clone()
    changed[:, position] = (changed[:, position] + 1) % vocab
    with torch.no_grad():
        before, after = model(inputs), model(changed)
    assert before.shape == (batch, length, vocab)
    torch.testing.assert_close(before[:, :position], after[:, :position], rtol=0, atol=0)
    assert not torch.allclose(before[:, position:], after[:, position:])
    return inputs


def eval_loss(store: Path, ids: np.ndarray, folder: Path) -> Any:
    """``ids`` added as the ``eval`` split of ``store`` (``ckpt data add``); its loss, computed and loaded."""
    import ckpt.store as ckptstore

    np.save(folder / "ids.npy", ids)
    added = invoke_ckpt("data", "add", str(store), "eval", "--inputs", str(folder / "ids.npy"))
    assert added.returncode == 0, added.stderr
    analyzed = invoke_ckpt("analyze", "loss", str(store), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    return ckptstore.open(store).analysis("loss").load()
