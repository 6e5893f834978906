"""The examples in the library's docstrings run (``>>>`` lines not marked ``+SKIP``).

Most examples need a store or a model and are marked ``+SKIP``; the ones that are not
must work as written, so that a renamed function or a changed output fails here.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

PACKAGES = tuple(
    tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
)
"""The packages pyproject.toml installs (a new layer package is covered when it is added there)."""


def library_modules() -> list[str]:
    """Every module of ckpt's packages, except the ``python -m`` entry points (importing them runs the CLI)."""
    names = set(PACKAGES)
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names.update(f"{package}.{m.name}" for m in pkgutil.iter_modules(path) if m.name != "__main__")
    return sorted(names)


def test_the_library_has_running_examples() -> None:
    """The check below runs something: at least a few examples are not skipped."""
    tried = 0
    for name in library_modules():
        runner = doctest.DocTestRunner()
        for test in doctest.DocTestFinder(exclude_empty=True).find(importlib.import_module(name)):
            runner.run(test, out=lambda _: None)
        tried += runner.tries
    assert tried >= 5, f"only {tried} docstring examples run"


@pytest.mark.parametrize("name", library_modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in doctest.DocTestFinder(exclude_empty=True).find(module):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
