"""A registered factory's config is data: checked against the factory's schema and the stored shapes first.

Issue 68, findings 2, 6, 7 and 8: the Hugging Face factory let a store's config make transformers
import code the store shipped (after a prompt on standard input), or call any attribute of
``transformers``; a sandbox factory built whatever size a config asked for; a config whose buffers
(a causal mask) are far beyond the stored checkpoint was allocated before the shapes were compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.errors import CkptError
from ckpt.plugins.testing import write_example_run
from ckpt.store.importers import HF_FACTORY, hf_model_config
from tests.helpers import CKPT, invoke_ckpt, run_ckpt, tree_digest, write_gpt2_run

ROOT_DIR = Path(__file__).resolve().parents[1]
# what transformers says before it runs a repository's code (it asks on standard input)
PROMPTS = ("[y/N]", "Do you wish to run the custom code", "which must be executed", "Traceback")


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``Error:`` line of a refused command (and nothing else on stderr)."""
    assert result.returncode == 1, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr[-3000:]
    for text in PROMPTS:
        assert text not in result.stdout + result.stderr, text
    return lines[0]


def _answering_yes(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ckpt ARGS`` as its own process, with a user who answers "y" to any question on standard input."""
    command = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT_DIR), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [*command, *args], input="y\n" * 4, capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False
    )


def _hf_store(tmp_path: Path, config: dict[str, Any]) -> Path:
    """A store that names the Hugging Face factory with ``config`` (its checkpoints: a small MLP's)."""
    return write_example_run(tmp_path / "run.zarr", steps=1, examples=4, factory=HF_FACTORY, config=config)


def test_verify_of_an_hf_spec_prints_only_its_error_line(tmp_path: Path) -> None:
    """A library's log lines are not ckpt's: a refused ``verify`` prints its one ``Error:`` line only."""
    config = {"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 8}
    line = _one_error_line(run_ckpt("verify", str(_hf_store(tmp_path, config))))
    assert "model spec:" in line


def test_an_hf_config_that_names_the_stores_own_code_never_runs_it(tmp_path: Path) -> None:
    """Finding 2: ``auto_map`` + ``name_or_path`` inside the store made transformers ask, then run ``evil.py``."""
    canary = tmp_path / "EVIL-RAN"
    store = tmp_path / "run.zarr"
    config = {"model_type": "vit", "auto_map": {"AutoModelForCausalLM": "evil.Evil"}, "name_or_path": f"{store}/.hf"}
    _hf_store(tmp_path, config)
    (store / ".hf").mkdir()
    (store / ".hf" / "evil.py").write_text(f"open({str(canary)!r}, 'w').write('ran')\nclass Evil:\n    pass\n")
    (store / ".hf" / "config.json").write_text(json.dumps(config))
    before = tree_digest(store)
    line = _one_error_line(_answering_yes("analyze", "sparsity", str(store), "--no-progress", cwd=tmp_path))
    assert not canary.exists(), "the store's code ran"
    assert "'auto_map'" in line and HF_FACTORY in line, line
    verified = run_ckpt("verify", str(store))  # it said OK: the spec is checked too, nothing imported
    assert verified.returncode == 1 and "model spec:" in verified.stderr, verified.stderr
    assert "'auto_map'" in verified.stderr and not canary.exists(), verified.stderr
    assert tree_digest(store) == before


def test_an_hf_config_that_names_code_is_one_error_line_without_a_terminal(tmp_path: Path) -> None:
    """Finding 8: the same store with standard input closed was two transformers tracebacks and no Error: line."""
    store = _hf_store(tmp_path, {"model_type": "gpt2", "auto_map": {"AutoModelForCausalLM": "evil.Evil"}})
    line = _one_error_line(run_ckpt("analyze", "loss", str(store), "--no-progress"))
    assert "'auto_map'" in line and "names code" in line, line


@pytest.mark.parametrize(
    ("config", "named"),
    [
        # any attribute of transformers the store named was called with the config
        ({"model_type": "gpt2", "architectures": ["Trainer"]}, "'Trainer'"),
        ({"model_type": "gpt2", "architectures": ["BertModel"]}, "'BertModel'"),  # a model, not of gpt2
        ({"model_type": "gpt2", "trust_remote_code": True}, "'trust_remote_code'"),
        ({"model_type": "gpt2", "_name_or_path": "some-org/some-repo"}, "'_name_or_path'"),
        ({"model_type": "gpt2", "custom_pipelines": {"x": {"impl": "evil.Pipe"}}}, "'custom_pipelines'"),
        ({"model_type": "gpt2", "attn_implementation": "kernels-community/evil"}, "'attn_implementation'"),
        ({"model_type": "t5", "decoder": {"auto_map": {"AutoModel": "evil.Evil"}}}, "'decoder.auto_map'"),
        ({"model_type": "gpt2", "layers": [{"trust_remote_code": True}]}, "'layers.0.trust_remote_code'"),
        ({"model_type": "no-such-model"}, "'no-such-model'"),
    ],
)
def test_the_hf_factory_builds_only_transformers_own_model_classes(
    tmp_path: Path, config: dict[str, Any], named: str
) -> None:
    line = _one_error_line(run_ckpt("analyze", "loss", str(_hf_store(tmp_path, config)), "--no-progress"))
    assert named in line and HF_FACTORY in line, line


def test_the_importer_keeps_no_path_of_the_saved_config() -> None:
    """What ``config.json`` says of the file it was saved from is dropped; what names code is kept, to be refused."""
    saved = {"model_type": "gpt2", "_name_or_path": "/home/me/run", "_commit_hash": "abc", "transformers_version": "5"}
    assert hf_model_config(saved) == {"model_type": "gpt2"}
    assert "auto_map" in hf_model_config({**saved, "auto_map": {"AutoModel": "m.M"}})


@pytest.mark.parametrize(
    ("factory", "config", "named"),
    [
        # finding 6: built for minutes (6.4 GB) before a SystemError
        ("ckpt.sandboxes.addition:build_model", {"layers": 1000000, "d_model": 8, "heads": 2, "d_mlp": 8}, "layers"),
        # finding 6: a 40 GB allocation traceback
        ("ckpt.sandboxes.modular_addition:build_model", {"d": 100000, "hidden": 100000}, "'d'"),
    ],
)
def test_a_sandbox_config_out_of_its_bounds_is_refused_before_building(
    tmp_path: Path, factory: str, config: dict[str, Any], named: str
) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=1, examples=4, factory=factory, config=config)
    started = time.monotonic()
    line = _one_error_line(run_ckpt("analyze", "loss", str(store), "--no-progress", timeout=120))
    assert time.monotonic() - started < 60
    assert named in line and factory in line, line


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"n": 17, "d": 2, "hidden": 64, "depth": 3}, "'depth'"),  # a key the factory does not take
        ({"n": 17, "d": "2", "hidden": 64}, "'d'"),  # a string for an int
        ({"n": 17, "d": True, "hidden": 64}, "'d'"),  # JSON true is no int
        ({"n": 17, "d": 2.5, "hidden": 64}, "'d'"),
        ({"n": 1, "d": 2, "hidden": 64}, "'n'"),  # below its bound
    ],
)
def test_a_key_type_or_bound_the_factory_does_not_declare_is_named(config: dict[str, Any], named: str) -> None:
    spec = ckptstore.ModelSpec("ckpt.sandboxes.modular_addition:build_model", config, source="run.zarr")
    with pytest.raises(CkptError, match=named):
        spec.build()


def test_every_registered_sandbox_factory_declares_its_config() -> None:
    from ckpt.store.factory_config import config_schema
    from ckpt.store.trust import registered_factories

    ours = [name for name in registered_factories() if name.startswith("ckpt.") and name != HF_FACTORY]
    assert len(ours) >= 6
    for name in ours:
        module, _, attr = name.partition(":")
        schema = config_schema(getattr(__import__(module, fromlist=[attr]), attr))
        numeric = [key for key, field in schema.items() if field.kind in (int, float)]
        assert numeric and all(schema[key].bounded for key in numeric), (name, schema)


def test_an_in_bounds_config_for_other_shapes_is_refused_on_meta(tmp_path: Path) -> None:
    """Within the schema's bounds, yet not this store's model: compared on ``meta``, nothing allocated."""
    factory = "ckpt.plugins.examples:mlp"
    store = write_example_run(tmp_path / "run.zarr", steps=1, examples=4, config={"hidden": 1 << 16})
    spec = ckptstore.open(store).model
    assert spec.factory == factory
    with pytest.raises(CkptError, match=r"'0\.weight' of shape \[65536, 3\] \(stored \[8, 3\]\)"):
        spec.build()


def _gpt_neo_store(tmp_path: Path) -> Path:
    """A 2-layer GPT-Neo of 16 positions imported from a ``save_pretrained`` folder, with an eval split."""
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    config = GPTNeoConfig(
        num_layers=2,
        attention_types=[[["global", "local"], 1]],
        hidden_size=16,
        num_heads=2,
        vocab_size=64,
        max_position_embeddings=16,
        window_size=8,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPTNeoForCausalLM(config).save_pretrained(tmp_path / "run" / "checkpoint-1")
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 64, (4, 12)))
    store = tmp_path / "run.zarr"
    for args in (
        ["import", str(tmp_path / "run"), str(store)],
        ["data", "add", str(store), "eval", "--inputs", str(tmp_path / "ids.npy")],
    ):
        done = invoke_ckpt(*args)
        assert done.returncode == 0, done.stderr
    return store


def test_buffers_beyond_the_stored_bytes_are_refused_before_they_are_allocated(tmp_path: Path) -> None:
    """Finding 7: 50,000 positions for a 16-position store built a 10 GB causal mask before the shapes were compared."""
    store = _gpt_neo_store(tmp_path)
    analyzed = invoke_ckpt("analyze", "loss", str(store), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    saved = json.loads((tmp_path / "run" / "checkpoint-1" / "config.json").read_text())
    (tmp_path / "big.json").write_text(json.dumps({**saved, "max_position_embeddings": 50000}))
    changed = invoke_ckpt("set-model", str(store), "--hf-config", str(tmp_path / "big.json"))
    assert changed.returncode == 0, changed.stderr
    started = time.monotonic()
    line = _one_error_line(run_ckpt("analyze", "loss", str(store), "--no-progress", "--force"))
    assert time.monotonic() - started < 30
    assert "buffers beyond the 64.0 MiB" in line and "'bias'" in line and "[1, 1, 50000, 50000]" in line, line
    assert HF_FACTORY in line, line


def test_a_real_gpt2_run_still_builds_and_analyzes(tmp_path: Path) -> None:
    store = write_gpt2_run(tmp_path)
    spec = ckptstore.open(store).model
    assert set(spec.config) >= {"model_type", "architectures"} and "_name_or_path" not in spec.config
    model = spec.build()
    assert type(model).__name__ == "GPT2LMHeadModel"
    analyzed = invoke_ckpt("analyze", "loss", str(store), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    assert spec.check() is True, "checked on meta"
    verified = invoke_ckpt("verify", str(store))
    assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr


def test_verify_checks_the_model_config_against_the_checkpoints(tmp_path: Path) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=4, config={"hidden": 9})
    verified = run_ckpt("verify", str(store))
    assert verified.returncode == 1, verified.stderr
    assert "model spec:" in verified.stderr and "'0.weight' of shape [9, 3] (stored [8, 3])" in verified.stderr
    untrusted = write_example_run(tmp_path / "mine.zarr", steps=2, examples=4, factory="mypkg.models:build")
    verified = invoke_ckpt("verify", str(untrusted))
    assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr
    assert "(the model spec was not checked: mypkg.models:build is not trusted" in verified.stdout


def test_a_failing_factory_is_one_error_line_naming_it(tmp_path: Path) -> None:
    """A factory's own exception (the addition sandbox: heads must divide d_model) is an Error: naming it."""
    factory = "ckpt.sandboxes.addition:build_model"
    config = {"layers": 1, "d_model": 7, "heads": 2, "d_mlp": 8}
    store = write_example_run(tmp_path / "run.zarr", steps=1, examples=4, factory=factory, config=config)
    line = _one_error_line(run_ckpt("analyze", "loss", str(store), "--no-progress"))
    assert factory in line and "divisible" in line, line
