"""A store is data: the model factory it names runs only when registered (``ckpt.factories``) or allowed."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import ckpt
import ckpt.store as ckptstore
from ckpt.errors import UntrustedFactoryError
from ckpt.plugins.testing import write_example_run
from ckpt.store.trust import TRUST_ENV, trust_reason
from tests.helpers import run_ckpt, tree_digest

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
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=8, factory=factory, config=config)
    before = tree_digest(store)
    result = run_ckpt("analyze", "loss", str(store), "--no-progress", extra_env=UNTRUSTED)
    assert result.returncode == 1
    assert sign_of_running not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert f"names the model factory '{factory}', which is not a registered model factory" in lines[0]
    assert f"--trust-factory {factory}" in lines[0] and TRUST_ENV in lines[0]
    assert tree_digest(store) == before


def test_info_shows_the_factory_and_whether_it_is_trusted(tmp_path: Path) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=1, examples=4, factory="os:system", config={"command": "x"})
    shown = run_ckpt("info", str(store), extra_env=UNTRUSTED)
    assert shown.returncode == 0, shown.stderr
    assert "os:system" in shown.stdout
    assert "NOT trusted: analyzers that rebuild the model need --trust-factory os:system" in shown.stdout
    ours = run_ckpt("info", str(ROOT_DIR / "tests" / "data" / "v0.1.0-modular-addition.zarr"), extra_env=UNTRUSTED)
    # a ckpt 0.1 store names the sandbox by its old name, mapped to the registered one
    assert (
        f"factory: registered by ckpt-dynamics {ckpt.__version__} (entry point 'modular-addition' in "
        "ckpt.factories); recorded as sandboxes.modular_addition:build_model"
    ) in ours.stdout, ours.stdout


def test_the_user_allows_a_factory_by_option_or_setting(tmp_path: Path) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=8, factory="tests.models:mlp")
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


def _install_fake_plugin(site: Path, entry_points: str) -> None:
    """A distribution ``model-pkg`` on ``site`` (no pip): a package with a model, a helper and entry points."""
    (site / "model_pkg").mkdir(parents=True)
    (site / "model_pkg" / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A plugin package that ships its model, and a function that is not a model."""
            import os
            from tests.models import mlp

            def wipe(path):
                os.remove(path)
            '''
        )
    )
    info = site / "model_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: model-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    (info / "top_level.txt").write_text("model_pkg\n")


def test_factories_registered_by_installed_packages_are_trusted_and_nothing_else_of_them(tmp_path: Path) -> None:
    """A distribution declares its model factories (``ckpt.factories``): those run, its other functions never."""
    site = tmp_path / "site"
    _install_fake_plugin(site, "[ckpt]\nmodels = model_pkg\n\n[ckpt.factories]\nmlp = model_pkg:mlp\n")
    env = {**UNTRUSTED, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT_DIR)])}
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=8, factory="model_pkg:mlp")
    shown = run_ckpt("info", str(store), extra_env=env)
    assert "factory: registered by model-pkg 1.0 (entry point 'mlp' in ckpt.factories)" in shown.stdout, shown.stdout
    analyzed = run_ckpt("analyze", "loss", str(store), "--no-progress", extra_env=env)
    assert analyzed.returncode == 0, analyzed.stderr
    without = run_ckpt("info", str(store), extra_env={**UNTRUSTED, "PYTHONPATH": str(ROOT_DIR)})
    assert "NOT trusted" in without.stdout  # the same name, not installed
    # the same package's other function: the store names it, ckpt refuses it (before 0.3 the whole
    # namespace of a plugin package was trusted)
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    hostile = write_example_run(
        tmp_path / "hostile.zarr", steps=1, examples=4, factory="model_pkg:wipe", config={"path": str(canary)}
    )
    refused = run_ckpt("analyze", "loss", str(hostile), "--no-progress", extra_env=env)
    assert refused.returncode == 1 and "'model_pkg:wipe', which is not a registered model factory" in refused.stderr
    assert canary.read_text() == "still here"


def test_a_plugin_package_without_registered_factories_is_not_trusted(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_fake_plugin(site, "[ckpt]\nmodels = model_pkg\n")  # analyzers perhaps, but no model factory
    env = {**UNTRUSTED, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT_DIR)])}
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=8, factory="model_pkg:mlp")
    refused = run_ckpt("analyze", "loss", str(store), "--no-progress", extra_env=env)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("Error: ") and "--trust-factory model_pkg:mlp" in refused.stderr


@pytest.mark.parametrize(
    ("factory", "config"),
    [
        # runs a second ckpt command, which trusts `os` and calls os:system from another store
        ("ckpt.cli.main:cli", "nested"),
        ("ckpt:create", "create"),  # would write a store anywhere
        ("ckpt.store:allow", {}),  # would trust whatever it is given
    ],
)
def test_ckpt_functions_that_are_not_factories_never_run_from_a_store(
    tmp_path: Path, factory: str, config: object
) -> None:
    """The remote-code-execution finding of issue 28: ckpt's namespace is not trusted, its registered factories are."""
    marker = tmp_path / "RAN"
    inner = write_example_run(
        tmp_path / "B.zarr", steps=1, examples=4, factory="os:system", config={"command": f"touch {marker}"}
    )
    elsewhere = tmp_path / "elsewhere.zarr"
    if config == "nested":
        args = ["analyze", "loss", str(inner), "--trust-factory", "os", "--scheduler", "sync"]
        config = {"args": args, "standalone_mode": False}
    elif config == "create":
        config = {"path": str(elsewhere)}
    store = write_example_run(tmp_path / "A.zarr", steps=2, examples=8, factory=factory, config=config)
    before = tree_digest(store), tree_digest(inner)
    for command in (["analyze", "grad-norms", str(store), "--no-progress"], ["report", str(store)]):
        result = run_ckpt(*command, cwd=tmp_path, extra_env=UNTRUSTED)
        assert not marker.exists() and not elsewhere.exists(), command
        if command[0] == "analyze":
            assert result.returncode == 1 and result.stderr.startswith("Error: "), result.stderr
            assert f"'{factory}', which is not a registered model factory" in result.stderr
    shown = run_ckpt("info", str(store), extra_env=UNTRUSTED)
    assert f"NOT trusted: analyzers that rebuild the model need --trust-factory {factory}" in shown.stdout
    assert "part of ckpt" not in shown.stdout
    assert (tree_digest(store), tree_digest(inner)) == before


def test_every_task_factory_is_registered() -> None:
    """ckpt's own sandboxes and the HF importer record factories that a fresh install trusts."""
    from ckpt.plugins.manager import registry
    from ckpt.plugins.tasks import resolve_task
    from ckpt.store.importers import HF_FACTORY
    from ckpt.store.trust import registered_factories

    tasks = registry().tasks
    factories = {name: resolve_task(task).factory for name, task in tasks.items()}
    assert set(factories) >= {"addition", "modular-addition", "sparse-modular-addition", "particles", "tiny-lm"}
    for name, factory in {**factories, "hf import": HF_FACTORY}.items():
        assert factory in registered_factories(), f"{name}: {factory} is not in the ckpt.factories entry points"
        assert registered_factories()[factory].startswith(f"registered by ckpt-dynamics {ckpt.__version__}")


def test_the_python_api_refuses_and_allows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRUST_ENV, "")
    spec = ckptstore.open(
        write_example_run(tmp_path / "run.zarr", steps=1, examples=4, factory="tests.models:mlp")
    ).model
    with pytest.raises(UntrustedFactoryError, match=r"run\.zarr names the model factory 'tests\.models:mlp'"):
        spec.build()
    assert trust_reason("ckpt.sandboxes.addition:build_model").startswith("registered by ckpt-dynamics")
    assert trust_reason("ckpt.cli.main:cli") is None
    assert trust_reason("tests.models:mlp") is None
    ckptstore.allow("tests.models")
    assert trust_reason("tests.models:mlp") == f"allowed by {TRUST_ENV}=tests.models"
    assert spec.build()[0].in_features == 3
    assert os.environ[TRUST_ENV] == "tests.models"  # inherited by the worker processes ckpt starts
