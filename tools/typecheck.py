"""Run mypy on ckpt's packages, which live in folders not named after them.

Why this script exists: ``pyproject.toml`` maps each package of the import root ``ckpt`` to a folder of
its own (``ckpt.store`` is ``ckptstore/``, ``ckpt.plugins`` is ``plugins/``, ...; see
``[tool.setuptools.package-dir]``), and the editable install resolves them with an import hook that mypy
cannot follow. So this script builds, in a temporary folder, the tree mypy expects (``ckpt/store`` a
symlink to ``ckptstore/``, and so on, read from pyproject rather than written here), runs mypy there with
the repository's ``[tool.mypy]`` configuration, and rewrites the paths mypy prints back to the repository's
files (``ckpt/store/reader.py`` becomes ``ckptstore/reader.py``), so each error points at a file one can
open.

Usage::

    python tools/typecheck.py                    # what [tool.mypy] names (packages, modules)
    python tools/typecheck.py -p ckpt.analyzers  # or any mypy arguments

The exit status is mypy's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(pyproject: dict) -> dict[str, str]:
    """Return each package's folder, relative to the repository, from ``[tool.setuptools.package-dir]``.

    Parameters
    ----------
    pyproject : dict
        The parsed ``pyproject.toml``.

    Returns
    -------
    dict of str to str
        Dotted package name -> folder (``{"ckpt.store": "ckptstore", ...}``).
    """
    return dict(pyproject["tool"]["setuptools"]["package-dir"])


def build_tree(dirs: dict[str, str], where: Path) -> dict[str, str]:
    """Link each package's folder into ``where`` at the path its dotted name gives.

    Parameters
    ----------
    dirs : dict of str to str
        Package -> folder, as :func:`package_dirs` returns.
    where : Path
        An empty folder: the tree is built in it.

    Returns
    -------
    dict of str to str
        Path prefix in the tree (``"ckpt/store/"``) -> the repository's (``"ckptstore/"``), longest first,
        to rewrite mypy's output with.
    """
    # parents before children: ``ckpt`` is linked whole only if no subpackage needs a place inside it
    nested = {name for name in dirs if any(other.startswith(name + ".") for other in dirs)}
    for name, folder in sorted(dirs.items()):
        target = where.joinpath(*name.split("."))
        source = ROOT / folder
        if name in nested:  # a real folder holding the package's files, so that subpackages fit beside them
            target.mkdir(parents=True, exist_ok=True)
            for entry in source.iterdir():
                if not (target / entry.name).exists():
                    (target / entry.name).symlink_to(entry)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():  # the parent's link to a folder of the same name (ckpt/ckpt?): replace it
                target.unlink()
            target.symlink_to(source, target_is_directory=True)
    prefixes = {"/".join(name.split(".")) + "/": folder.rstrip("/") + "/" for name, folder in dirs.items()}
    return dict(sorted(prefixes.items(), key=lambda item: -len(item[0])))


def rewrite(line: str, prefixes: dict[str, str]) -> str:
    """Rewrite the tree's paths in one line of mypy's output to the repository's.

    Parameters
    ----------
    line : str
        A line mypy printed.
    prefixes : dict of str to str
        As :func:`build_tree` returns.

    Returns
    -------
    str
        The line, its paths pointing at the repository's files.
    """
    pattern = re.compile(r"(?<![\w/.])(" + "|".join(re.escape(prefix) for prefix in prefixes) + r")(?=[\w/]*\.pyi?\b)")
    return pattern.sub(lambda match: prefixes[match.group(1)], line)


def main(argv: list[str]) -> int:
    """Build the tree, run mypy in it and print its output with the repository's paths.

    Parameters
    ----------
    argv : list of str
        mypy's arguments; with none, mypy checks the ``packages`` and ``modules`` ``[tool.mypy]`` names.

    Returns
    -------
    int
        mypy's exit status.
    """
    config = ROOT / "pyproject.toml"
    with tempfile.TemporaryDirectory(prefix="ckpt-typecheck-") as tmp:
        prefixes = build_tree(package_dirs(tomllib.loads(config.read_text())), Path(tmp))
        # the cache stays in the repository (it is keyed by module, not by the tree's path)
        command = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(ROOT / ".mypy_cache")]
        done = subprocess.run([*command, *argv], cwd=tmp, capture_output=True, text=True, check=False)
    for stream, text in ((sys.stdout, done.stdout), (sys.stderr, done.stderr)):
        for line in text.splitlines(keepends=True):
            stream.write(rewrite(line.replace(tmp + "/", ""), prefixes))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
