"""A store is data: the model factory it names runs only when trusted (ckpt's, an installed plugin's, or allowed)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import ckpt.store as ckptstore
from ckpt.errors import UntrustedFactoryError
from ckpt.store.trust import TRUST_ENV, trust_reason
from tests.conftest import run_ckpt, tree_digest, write_mlp_run

ROOT_DIR = Path(__file__).resolve().parents[1]

UNTRUSTED = {TRUST_ENV: ""}  # what a user has by default: nothing allowed


@pytest.mark.parametrize(
    ("factory", "config", "sign_of_running"),
    [
        ("builtins:print", {"sep": "RAN-PRINT"}, "RAN-PRINT"),
        ("this:d", {}, "Beautiful is better than ugly"),  # importing `this` prints the Zen of Python
        ("os:system", {"command": "echo RAN-SYSTEM"}, "RAN-SYSTEM"),
    ],
)
def test_an_untrusted_factory_is_refused_before_it_runs(
    tmp_path: Path, factory: str, config: dict, sign_of_running: str
) -> None:
    store = write_mlp_run(tmp_path / "run.zarr", steps=2, examples=8, factory=factory, config=config)
    before = tree_digest(store)
    result = run_ckpt("analyze", "loss", str(store), "--no-progress", extra_env=UNTRUSTED)
    assert result.returncode == 1
    assert sign_of_running not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    module = factory.partition(":")[0]
    assert f"names the model factory '{factory}'" in lines[0]
    assert f"--trust-factory {module}" in lines[0] and TRUST_ENV in lines[0]
    assert tree_digest(store) == before


def test_info_shows_the_factory_and_whether_it_is_trusted(tmp_path: Path) -> None:
    store = write_mlp_run(tmp_path / "run.zarr", steps=1, examples=4, factory="os:system", config={"command": "x"})
    shown = run_ckpt("info", str(store), extra_env=UNTRUSTED)
    assert shown.returncode == 0, shown.stderr
    assert "os:system" in shown.stdout
    assert "NOT trusted: analyzers that rebuild the model need --trust-factory os" in shown.stdout
    ours = run_ckpt("info", str(ROOT_DIR / "tests" / "data" / "v0.1.0-modular-addition.zarr"), extra_env=UNTRUSTED)
    assert "factory: part of ckpt (now ckpt.sandboxes.modular_addition:build_model)" in ours.stdout


def test_the_user_allows_a_factory_by_option_or_setting(tmp_path: Path) -> None:
    store = write_mlp_run(tmp_path / "run.zarr", steps=2, examples=8)  # tests.models:mlp
    refused = run_ckpt("analyze", "loss", str(store), "--no-progress", extra_env=UNTRUSTED)
    assert refused.returncode == 1 and "--trust-factory tests.models" in refused.stderr
    by_option = run_ckpt(
        "analyze", "loss", str(store), "--no-progress", "--trust-factory", "tests.models", extra_env=UNTRUSTED
    )
    assert by_option.returncode == 0, by_option.stderr
    by_setting = run_ckpt(
        "analyze", "loss", str(store), "--no-progress", "--force", extra_env={TRUST_ENV: "tests.models:mlp"}
    )
    assert by_setting.returncode == 0, by_setting.stderr
    other = run_ckpt("analyze", "loss", str(store), "--no-progress", "--force", extra_env={TRUST_ENV: "tests.model"})
    assert other.returncode == 1, "a pattern is a module, not a string prefix"
    bad = run_ckpt("analyze", "loss", str(store), "--trust-factory", "rm -rf /", extra_env=UNTRUSTED)
    assert bad.returncode == 1 and bad.stderr.startswith("Error: --trust-factory 'rm -rf /' is not a module")


def test_factories_of_installed_plugin_packages_are_trusted(tmp_path: Path) -> None:
    """A distribution with a ckpt entry point was installed by the user: its own factories run."""
    site = tmp_path / "site"
    (site / "model_pkg").mkdir(parents=True)
    (site / "model_pkg" / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A plugin package that ships its model."""
            from tests.models import mlp
            '''
        )
    )
    info = site / "model_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: model-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ckpt]\nmodels = model_pkg\n")
    (info / "top_level.txt").write_text("model_pkg\n")
    store = write_mlp_run(tmp_path / "run.zarr", steps=2, examples=8, factory="model_pkg:mlp")
    env = {**UNTRUSTED, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT_DIR)])}
    shown = run_ckpt("info", str(store), extra_env=env)
    assert "factory: from model-pkg, an installed ckpt plugin package" in shown.stdout, shown.stdout
    analyzed = run_ckpt("analyze", "loss", str(store), "--no-progress", extra_env=env)
    assert analyzed.returncode == 0, analyzed.stderr
    without = run_ckpt("info", str(store), extra_env={**UNTRUSTED, "PYTHONPATH": str(ROOT_DIR)})
    assert "NOT trusted" in without.stdout  # the same name, not installed as a plugin


def test_the_python_api_refuses_and_allows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRUST_ENV, "")
    spec = ckptstore.open(write_mlp_run(tmp_path / "run.zarr", steps=1, examples=4)).model
    with pytest.raises(UntrustedFactoryError, match=r"run\.zarr names the model factory 'tests\.models:mlp'"):
        spec.build()
    assert trust_reason("ckpt.sandboxes.addition:build_model") == "part of ckpt"
    assert trust_reason("tests.models:mlp") is None
    ckptstore.allow("tests.models")
    assert trust_reason("tests.models:mlp") == f"allowed by {TRUST_ENV}=tests.models"
    assert spec.build()[0].in_features == 3
    assert os.environ[TRUST_ENV] == "tests.models"  # inherited by the worker processes ckpt starts
