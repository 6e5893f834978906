"""The example plugin (docs/examples/ckpt-example-plugin), installed as users install plugins.

It is installed once into a temporary folder (the venv is left as it is) and
found by the real ``ckpt`` command through its ``ckpt`` entry point on PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import run_ckpt

pytestmark = pytest.mark.slow  # installs packages or starts many ckpt processes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "ckpt-example-plugin"


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``extra_env`` for run_ckpt that puts the installed example plugin on the path."""
    root = tmp_path_factory.mktemp("example-plugin")
    # build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds
    source = shutil.copytree(EXAMPLE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = root / "site"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    command += ["--disable-pip-version-check", "--quiet", "--target", str(site), str(source)]
    installed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert installed.returncode == 0, f"pip could not install the example plugin:\n{installed.stderr}"
    # run_ckpt puts the repository root on PYTHONPATH, and extra_env replaces it: keep both
    path = [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def test_plugins_lists_it_with_its_package(plugin_env: dict[str, str]) -> None:
    result = run_ckpt("plugins", extra_env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^  weight-norm\s+ckpt-example-plugin 0\.1\.0\s+L2 norm", result.stdout, re.M), result.stdout
    assert "Warning" not in result.stderr, result.stderr


def test_not_installed_in_the_venv() -> None:
    result = run_ckpt("plugins")
    assert result.returncode == 0, result.stderr
    assert "weight-norm" not in result.stdout, "the example plugin leaked into the venv"


def test_analyze_help_lists_it(plugin_env: dict[str, str]) -> None:
    result = run_ckpt("analyze", "--help", extra_env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^  weight-norm\s+L2 norm of every tensor", result.stdout, re.M), result.stdout


def test_analyze_stores_the_norms(plugin_env: dict[str, str], mlp_store: Path) -> None:
    result = run_ckpt("analyze", "weight-norm", str(mlp_store), "--no-progress", extra_env=plugin_env)
    assert result.returncode == 0, result.stderr
    assert "weight-norm: computed 6 step(s), reused 0 stored" in result.stdout
    store = ckptstore.open(mlp_store)
    norms = store.analysis("weight-norm")["norm"].load()
    assert norms.dims == ("step", "tensor")
    assert list(norms["step"].values) == list(store.steps)
    assert list(norms["tensor"].values) == store.tensor_names
    for step in store.steps:
        for name, tensor in store.tensors(step).items():
            expected = np.linalg.norm(tensor.astype(np.float64))
            actual = float(norms.sel(step=step, tensor=name))
            np.testing.assert_allclose(actual, expected, err_msg=f"norm of {name!r} at step {step}")
    shown = run_ckpt("show", str(mlp_store), "weight-norm", extra_env=plugin_env)
    assert shown.returncode == 0, shown.stderr
    assert "weight-norm v1" in shown.stdout
    # its figure, drawn by ckpt plot through the installed plugin, and in the report
    out = mlp_store.parent / "norms.png"
    plotted = run_ckpt("plot", str(mlp_store), "weight-norm", "--out", str(out), extra_env=plugin_env)
    assert plotted.returncode == 0, plotted.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    page = mlp_store.parent / "report.html"
    reported = run_ckpt("report", str(mlp_store), "--out", str(page), extra_env=plugin_env)
    assert reported.returncode == 0, reported.stderr
    assert 'alt="weight-norm norms"' in page.read_text()


def test_its_own_suite_passes_the_conformance_kit(plugin_env: dict[str, str], tmp_path: Path) -> None:
    """The plugin's tests (the kit's, figures included, and its own) pass against the installed plugin."""
    env = {**os.environ, **plugin_env}
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(EXAMPLE / "tests")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"test_figures PASSED", result.stdout), result.stdout[-3000:]
