"""One import root: what an installed ckpt puts into an environment, how fast its command starts, old stores.

These run real subprocesses (an interpreter outside the checkout, the installed
``ckpt`` command, a wheel built by setuptools) and look at what they imported.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

import ckpt
import ckpt.store as ckptstore
from ckpt.store.format import RENAMED_FACTORIES
from tests.helpers import run_ckpt, tree_digest

ROOT = Path(__file__).resolve().parents[1]
LEGACY_STORE = ROOT / "tests" / "data" / "v0.1.0-modular-addition.zarr"
OLD_TOP_LEVEL = (
    "cli",
    "plugins",
    "analyzers",
    "sandboxes",
    "ckptstore",
    "numerics",
    "engine",
)  # folders, not import names
HEAVY = ("zarr", "xarray", "dask", "torch")


def _outside_checkout(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in this interpreter from ``cwd``, with nothing of the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.mark.parametrize("name", OLD_TOP_LEVEL)
def test_old_top_level_names_are_not_installed(tmp_path: Path, name: str) -> None:
    result = _outside_checkout(f"import {name}", tmp_path)
    assert result.returncode != 0
    assert f"No module named '{name}'" in result.stderr


def test_the_facade_works_from_outside_the_checkout(tmp_path: Path) -> None:
    code = (
        "import sys, ckpt; "
        "assert callable(ckpt.analyze) and callable(ckpt.analyze_runs) and callable(ckpt.open) "
        "and callable(ckpt.create); "
        "heavy = [m for m in ('zarr', 'xarray', 'dask', 'torch') if m in sys.modules]; "
        "print(ckpt.__version__, ckpt.__file__, heavy)"
    )
    result = _outside_checkout(code, tmp_path)
    assert result.returncode == 0, result.stderr
    version, where, heavy = result.stdout.split(maxsplit=2)
    assert version == ckpt.__version__ != "0.0.0+unknown"
    assert Path(where).resolve() == ROOT / "ckpt" / "__init__.py"
    assert heavy.strip() == "['zarr', 'xarray']"  # ckpt.open resolved: the store's reader, and no more


@pytest.mark.slow
def test_wheel_holds_one_tree(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="the test extra installs setuptools to build the wheel")
    source = tmp_path / "source"  # setuptools writes build/ next to pyproject.toml: not into the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("ckpt", "ckptstore", "numerics", "plugins", "engine", "analyzers", "sandboxes", "cli"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("ckpt_dynamics-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"ckpt", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    packages = {name.rsplit("/", 1)[0] for name in names if name.endswith("__init__.py")}
    layers = ("store", "numerics", "plugins", "engine", "analyzers", "analyzers/figures", "sandboxes", "cli")
    assert packages == {"ckpt", *(f"ckpt/{p}" for p in layers)}
    assert "ckpt/sandboxes/data/grimm.txt" in names  # package data travels with the renamed package
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "ckpt = ckpt.cli.main:main" in entry_points


STARTUP_PROBE = """
import json, sys
from ckpt.cli.main import cli
try:
    cli.main(args=sys.argv[1:], prog_name="ckpt")
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'xarray', 'dask', 'distributed', 'torch'})
print(json.dumps({"code": code, "heavy": heavy}))
"""


def _startup(*args: str, cwd: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", STARTUP_PROBE, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


HELP_INVOCATIONS = [
    ("--help",),
    ("--version",),
    *((command, "--help") for command in ("info", "verify", "import", "repair", "analyze", "plugins", "show")),
    *((command, "--help") for command in ("train", "demo")),
    ("analyze", "loss", "--help"),
    ("analyze", "polca", "--help"),
    ("plugins",),
]


@pytest.mark.parametrize("args", HELP_INVOCATIONS, ids=" ".join)
def test_help_imports_no_heavy_library(tmp_path: Path, args: tuple[str, ...]) -> None:
    probe = _startup(*args, cwd=tmp_path)
    assert probe == {"code": 0, "heavy": []}


def test_info_imports_no_torch(tmp_path: Path) -> None:
    probe = _startup("info", str(LEGACY_STORE), cwd=tmp_path)
    assert probe["code"] == 0
    assert "torch" not in probe["heavy"]
    assert {"zarr", "xarray"} <= set(probe["heavy"])  # it did read the store


@pytest.mark.parametrize("args", [("show", "loss"), ("verify",), ("plot", "loss"), ("report",)], ids=" ".join)
def test_reading_a_result_does_not_import_distributed(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Given no scheduler, dask imports distributed to look for a cluster's client: 0.3-0.65 s of these commands."""
    store = tmp_path / "old.zarr"
    shutil.copytree(LEGACY_STORE, store)
    for step in (["upgrade", str(store)], ["analyze", "loss", str(store), "--force", "--no-progress"]):
        done = run_ckpt(*step)  # digests, and a result as this version writes it
        assert done.returncode == 0, done.stderr
    command, *rest = args
    probe = _startup(command, str(store), *rest, cwd=tmp_path)
    assert probe["code"] == 0
    assert "dask" in probe["heavy"] and "distributed" not in probe["heavy"]  # it did read the result with dask


def test_a_store_of_the_previous_release_analyzes_unchanged(tmp_path: Path) -> None:
    """``tests/data/v0.1.0-modular-addition.zarr`` was written by ckpt 0.1.0 with its old factory name."""
    before = tree_digest(LEGACY_STORE)
    store = tmp_path / "old.zarr"
    shutil.copytree(LEGACY_STORE, store)
    assert ckptstore.open(store).model.factory == "sandboxes.modular_addition:build_model"

    info = run_ckpt("info", str(store))
    assert info.returncode == 0, info.stderr
    assert "sandboxes.modular_addition:build_model" in info.stdout
    result = run_ckpt("analyze", "loss", str(store), "--force", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "loss: computed 3 step(s), reused 0 stored" in result.stdout

    old = ckptstore.open(LEGACY_STORE).analysis("loss").load()
    new = ckptstore.open(store).analysis("loss").load()
    assert old.ckpt.computed_by == "ckpt 0.1.0"
    assert new.ckpt.computed_by == f"ckpt {ckpt.__version__}"
    assert new.ckpt.options == old.ckpt.options
    np.testing.assert_array_equal(new["loss"].values, old["loss"].values)
    np.testing.assert_array_equal(new["step"].values, [0, 20, 40])
    assert tree_digest(LEGACY_STORE) == before  # the shipped store was only read


def test_old_factory_names_map_to_importable_ones() -> None:
    import importlib

    assert set(RENAMED_FACTORIES) == {
        f"sandboxes.{m}:build_model" for m in ("addition", "modular_addition", "sparse_modular_addition", "tiny_lm")
    }
    for new in RENAMED_FACTORIES.values():
        module, _, attr = new.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))
    # a user's own package called `sandboxes` is not rewritten
    spec = ckptstore.ModelSpec("sandboxes.mine:build", {})
    with pytest.raises(ckpt.errors.StoreError, match=r"'sandboxes\.mine:build'"):
        spec.build()


def _imports_of(path: Path, package: str) -> set[str]:
    """Every module of ``package`` that ``path`` imports, at module level or inside functions.

    ``from package import submodule`` counts as importing the submodule only; importing
    any other name from ``package`` counts as importing the package's ``__init__``.
    Imports under ``if TYPE_CHECKING:`` never run and do not count.
    """
    tree = ast.parse(path.read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
            submodules = {a.name for a in node.names if (path.parent / f"{a.name}.py").exists()}
            if node.module != package or len(submodules) < len(node.names):
                found.add(node.module)
            if node.module == package:
                found.update(f"{package}.{name}" for name in submodules)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(package))
    return found


PACKAGE_FOLDERS = {"ckpt.plugins": "plugins", "ckpt.engine": "engine", "ckpt.numerics": "numerics"}
"""The layer packages whose modules must import each other in one direction only."""


@pytest.mark.parametrize("package", sorted(PACKAGE_FOLDERS))
def test_no_package_has_an_import_cycle(package: str) -> None:
    """The modules of each layer package import each other in one direction only (function bodies included).

    A package ``__init__`` imports (or lazily re-exports) its modules, so none of them may import
    the package itself.
    """
    folder = ROOT / PACKAGE_FOLDERS[package]
    modules = {f"{package}.{p.stem}": p for p in folder.glob("*.py") if p.stem != "__init__"}
    edges = {
        name: {m for m in _imports_of(path, package) if m in modules and m != name} for name, path in modules.items()
    }
    for name, path in modules.items():
        assert package not in _imports_of(path, package) - set(modules), f"{name} imports the package"
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        assert name not in visiting, f"import cycle: {' -> '.join([*visiting[visiting.index(name) :], name])}"
        visiting.append(name)
        for target in sorted(edges[name]):
            visit(target)
        visiting.pop()
        order.append(name)

    for name in sorted(modules):
        visit(name)
    if package == "ckpt.plugins":
        assert order.index("ckpt.plugins.analyzer") < order.index("ckpt.plugins.manager")
        assert order.index("ckpt.plugins.manager") < order.index("ckpt.plugins.tasks")
    if package == "ckpt.engine":
        assert order.index("ckpt.engine.worker") < order.index("ckpt.engine.context")
        assert order.index("ckpt.engine.context") < order.index("ckpt.engine.pipeline")
    if package == "ckpt.numerics":
        assert order.index("ckpt.numerics.derivatives") < order.index("ckpt.numerics.compiled")


def test_lint_bans_the_old_top_level_names(tmp_path: Path) -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    source = tmp_path / "uses_old_names.py"
    source.write_text(
        '"""Old imports."""\n\nimport ckptstore\nfrom plugins.engine import run\n\nprint(ckptstore, run)\n'
    )
    command = [ruff, "check", "--config", str(ROOT / "pyproject.toml"), "--select", "TID251"]
    result = subprocess.run(
        [*command, "--output-format", "concise", str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "`ckptstore` is banned" in result.stdout
    assert "`plugins` is banned" in result.stdout


def test_task_descriptions_match_their_classes() -> None:
    """The sandboxes register lazily with a description of their own: it must be the class's."""
    from ckpt.plugins.manager import registry
    from ckpt.plugins.tasks import resolve_task
    from ckpt.sandboxes import TASKS

    for name, (_, description) in TASKS.items():
        task = registry().tasks[name]
        assert task.description == description == resolve_task(task).description


PLUGIN_API_LIMIT = 30
"""The most names ``ckpt.plugins.__all__`` may hold: what docs/plugins.md teaches, nothing else (issue 70)."""

INTERNAL_PACKAGES = ("ckpt.engine", "ckpt.numerics")
"""Layers beneath the plugin API: the guide and the example plugin reach them only through ``ckpt.plugins``."""


def _plugin_imports(source: str) -> tuple[set[str], set[str]]:
    """(names imported from ``ckpt.plugins``, other modules of ckpt's layers imported) in ``source``.

    Other: any module of :data:`INTERNAL_PACKAGES` or of ``ckpt.plugins`` but the conformance kit
    (``ckpt.plugins.testing``).
    """
    names, other = set(), set()

    def hidden(module: str) -> bool:
        internal = any(module == p or module.startswith(f"{p}.") for p in INTERNAL_PACKAGES)
        return internal or (module.startswith("ckpt.plugins.") and module != "ckpt.plugins.testing")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "ckpt.plugins":
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and hidden(node.module or ""):
            other.add(node.module)
        elif isinstance(node, ast.Import):
            other.update(a.name for a in node.names if hidden(a.name))
    return names, other


def _guide_sources() -> dict[str, str]:
    """The import lines of docs/plugins.md's Python blocks, and every file of docs/examples/, by where."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs" / "examples").rglob("*.py")}
    guide = (ROOT / "docs" / "plugins.md").read_text()
    for number, block in enumerate(re.findall(r"```python\n(.+?)\n```", guide, flags=re.S)):
        # some blocks are fragments (a signature, a method): their import lines are what counts
        imports = [line.strip() for line in block.splitlines() if line.strip().startswith("from ckpt")]
        sources[f"docs/plugins.md block {number}"] = "\n".join(imports)
    return sources


def test_plugin_guide_and_example_use_only_the_plugin_api() -> None:
    """What a plugin author is taught imports ``ckpt.plugins``'s names and the kit, nothing beneath them."""
    import ckpt.plugins

    used = set()
    for where, source in _guide_sources().items():
        names, other = _plugin_imports(source)
        assert not other, f"{where} imports {sorted(other)}, beneath the plugin API"
        used |= names
    assert used <= set(ckpt.plugins.__all__), sorted(used - set(ckpt.plugins.__all__))
    assert {"Analyzer", "Worker", "PER_PAIR", "Objective", "Importer", "Task", "Registry"} <= used
    for name in ckpt.plugins.__all__:
        assert hasattr(ckpt.plugins, name), name


COMPLETING_NAMES = {"PER_CHECKPOINT", "CAUSAL_LM", "CROSS_ENTROPY", "TOKEN_CROSS_ENTROPY", "PluginWarning"}
"""API names no code of the guide uses: the rest of sets it uses part of, and what a broken plugin warns."""


def test_the_plugin_api_is_what_the_guide_teaches() -> None:
    """``__all__`` is the names the guide's code and the example plugin use, and :data:`COMPLETING_NAMES`.

    At most :data:`PLUGIN_API_LIMIT`, each with a line in the guide's "Every public name" section.
    """
    import ckpt.plugins

    assert len(ckpt.plugins.__all__) <= PLUGIN_API_LIMIT
    guide = (ROOT / "docs" / "plugins.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.+?)\n```", guide, flags=re.S))
    code += "\n".join(p.read_text() for p in (ROOT / "docs" / "examples").rglob("*.py"))
    used = {name for name in ckpt.plugins.__all__ if re.search(rf"\b{name}\b", code)}
    assert set(ckpt.plugins.__all__) - used == COMPLETING_NAMES
    section = guide.split("## Every public name", 1)[1].split("\n## ", 1)[0].split("**Moved.**")[0]
    listed = set(re.findall(r"`(\w+)", section))
    assert set(ckpt.plugins.__all__) <= listed, sorted(set(ckpt.plugins.__all__) - listed)


def test_builtin_plugins_import_only_public_modules_of_the_layers_beneath() -> None:
    """ckpt's analyzers and sandboxes use the engine, numerics and host modules, as pytest's plugins ``_pytest``.

    They import those layers' public modules (private ones are checked for every module by
    :func:`test_no_module_imports_another_modules_private_names`) and never a deprecated alias of
    ``ckpt.plugins``, which would warn.
    """
    import ckpt.plugins

    for folder in ("analyzers", "sandboxes", "cli", "engine"):
        for path in (ROOT / folder).rglob("*.py"):
            names, _ = _plugin_imports(path.read_text())
            assert names <= set(ckpt.plugins.__all__), (
                f"{path.relative_to(ROOT)}: {sorted(names - set(ckpt.plugins.__all__))}"
            )


def test_a_name_that_left_the_plugin_api_warns_and_names_its_home() -> None:
    import ckpt.numerics.lanczos_sizes
    import ckpt.plugins

    expected = (
        r"^ckpt\.plugins\.lanczos_bytes is deprecated and will be removed in 0\.3; "
        r"import it from ckpt\.numerics\.lanczos_sizes$"
    )
    with pytest.warns(DeprecationWarning, match=expected):
        alias = ckpt.plugins.lanczos_bytes
    assert alias is ckpt.numerics.lanczos_sizes.lanczos_bytes
    with pytest.warns(DeprecationWarning, match="import it from ckpt.plugins.manager$"):
        from ckpt.plugins import registry
    assert registry is ckpt.plugins.manager.registry
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        ckpt.plugins.nonesuch  # noqa: B018


@pytest.mark.parametrize("name", sorted(__import__("ckpt.plugins").plugins.DEPRECATED))
def test_every_deprecated_alias_resolves_to_its_new_home(name: str) -> None:
    """Each name 0.2's development exported, and the API no longer does, is its new home's object."""
    import ckpt.plugins

    home = importlib.import_module(ckpt.plugins.DEPRECATED[name])
    with pytest.warns(DeprecationWarning, match=f"import it from {re.escape(home.__name__)}$"):
        alias = getattr(ckpt.plugins, name)
    assert alias is getattr(home, name)
    assert name not in ckpt.plugins.__all__


LAYER_PACKAGES = {
    "ckpt": "ckpt",
    "ckptstore": "ckpt.store",
    "numerics": "ckpt.numerics",
    "plugins": "ckpt.plugins",
    "engine": "ckpt.engine",
    "analyzers": "ckpt.analyzers",
    "sandboxes": "ckpt.sandboxes",
    "cli": "ckpt.cli",
}


def _library_modules(root: Path) -> dict[str, Path]:
    """Every module of the installed package, by its import name (``ckpt.store.writer`` ...)."""
    modules = {}
    for folder, package in LAYER_PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__") and name != "__main__")


def _modules_without_all(root: Path) -> list[str]:
    """Public modules (no ``_`` in their own name) that do not declare ``__all__``, or name what they lack."""
    problems = []
    for path in _library_modules(root).values():
        relative = str(path.relative_to(root))
        if _is_private(path.stem) or path.stem == "__main__":
            continue
        tree = ast.parse(path.read_text())
        bound, exported = set(), None
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(node, ast.Assign | ast.AnnAssign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in targets
            ):
                try:
                    exported = ast.literal_eval(node.value) if node.value is not None else []
                except ValueError:  # computed (ckpt.errors): checked where it is imported
                    exported = []
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            else:
                for target in targets if isinstance(node, ast.Assign | ast.AnnAssign) else []:
                    bound.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        if exported is None:
            problems.append(f"{relative} has no __all__")
            continue
        if "__getattr__" in bound:  # names loaded on first use (PEP 562)
            continue
        missing = sorted(set(exported) - bound - {"__version__"})
        if missing:
            problems.append(f"{relative}: __all__ names {missing}, which it does not define")
    return problems


def _private_imports(root: Path) -> list[str]:
    """Imports of another module's private names, or of a private module from outside its package."""
    problems = []
    for name, path in _library_modules(root).items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckpt"):
                for alias in node.names:  # `from ckpt.store import _zarr` inside ckpt.store is a private module
                    own_submodule = node.module == package and (path.parent / f"{alias.name}.py").exists()
                    if _is_private(alias.name) and not own_submodule:
                        where = f"{path.relative_to(root)}:{node.lineno}"
                        problems.append(f"{where} imports {alias.name} from {node.module}")
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.startswith("ckpt")]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                for i, part in enumerate(parts):
                    owner = ".".join(parts[:i])
                    if _is_private(part) and owner != package:
                        problems.append(f"{path.relative_to(root)}:{node.lineno} imports {module}, private to {owner}")
                        break
    return problems


def test_every_public_module_declares_its_api() -> None:
    """A module is private (``_name``) or says what it exports, as pytest and pooch do (issue 31)."""
    assert _modules_without_all(ROOT) == []


def test_no_package_exports_a_name_one_of_its_modules_has() -> None:
    """``ckpt.store.upgrade`` the function must stay the function once a module imports its submodules.

    Importing a submodule binds its name in the package (the import system does it), so a
    package exporting ``f`` lazily from a module also named ``f`` hands out that module to
    whoever asks after the first import of it.
    """
    clashes = []
    for folder, package in LAYER_PACKAGES.items():
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            if (ROOT / folder / f"{name}.py").exists() or (ROOT / folder / name / "__init__.py").exists():
                exported = getattr(module, name)
                if not isinstance(exported, types.ModuleType):
                    clashes.append(f"{package}.{name}")
    assert clashes == [], f"exported names that are also module names: {clashes}"


def test_no_module_imports_another_modules_private_names() -> None:
    """``_name`` is private to its module, ``_module`` to its package: other layers use public homes."""
    assert _private_imports(ROOT) == []


LAYER_RANKS = {
    "ckpt": 0,  # the root: ckpt.errors, ckpt.runtime and the lazy facade
    "ckpt.store": 1,
    "ckpt.numerics": 2,
    "ckpt.plugins": 3,
    "ckpt.engine": 4,
    "ckpt.analyzers": 5,
    "ckpt.sandboxes": 5,
    "ckpt.cli": 6,
}
"""Imports point down: a module imports its own package and lower ranks (docs/architecture.md)."""

UPWARD_INSIDE_FUNCTIONS = {("ckpt.plugins", "ckpt.engine")}
"""(importer, imported) layers allowed upward inside a function body or under TYPE_CHECKING only:
the plugin host's facade (``ckpt.analyze`` ...) loads the engine when it is called."""

UPWARD_MODULES = {("ckpt.plugins.testing", "ckpt.engine")}
"""(module, imported layer) allowed upward anywhere: the conformance kit runs analyses through the
engine, and ``import ckpt.plugins`` never imports the kit (it imports pytest)."""


def _layer(module: str) -> str:
    return max((p for p in LAYER_RANKS if module == p or module.startswith(f"{p}.")), key=len)


def _layer_violations(root: Path) -> list[str]:
    """Imports of a higher layer, or of a sibling layer of the same rank, anywhere in a library module."""
    problems = []
    for name, path in _library_modules(root).items():
        if name in {"ckpt", "ckpt.__main__"}:  # the facade names its layers lazily; `python -m ckpt` runs the CLI
            continue
        tree = ast.parse(path.read_text())
        deferred = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            or (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            for inner in ast.walk(node)
        }
        source = _layer(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ckpt"):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.startswith("ckpt")]
            else:
                continue
            for module in modules:
                target = _layer(module)
                if target == source or LAYER_RANKS[target] < LAYER_RANKS[source]:
                    continue
                if (source, target) in UPWARD_INSIDE_FUNCTIONS and id(node) in deferred:
                    continue
                if (name, target) in UPWARD_MODULES:
                    continue
                problems.append(f"{path.relative_to(root)}:{node.lineno} ({source}) imports {module} ({target})")
    return problems


def test_imports_point_down_the_layers() -> None:
    """cli -> analyzers, sandboxes -> engine -> plugins -> numerics -> store -> the root, never back up.

    Function bodies count: a lazy import is still a dependency. The exceptions are named in
    :data:`UPWARD_INSIDE_FUNCTIONS` and :data:`UPWARD_MODULES`.
    """
    assert _layer_violations(ROOT) == []


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    for folder in LAYER_PACKAGES:
        (tmp_path / folder).mkdir()
    (tmp_path / "ckptstore" / "reader.py").write_text("def f():\n    from ckpt.plugins import registry\n")
    (tmp_path / "numerics" / "maths.py").write_text("import ckpt.cli.main\n")
    assert _layer_violations(tmp_path) == [
        "ckptstore/reader.py:2 (ckpt.store) imports ckpt.plugins (ckpt.plugins)",
        "numerics/maths.py:1 (ckpt.numerics) imports ckpt.cli.main (ckpt.cli)",
    ]


def test_every_error_and_warning_class_lives_in_ckpt_errors() -> None:
    """One hierarchy in one module; other modules re-export (``ckpt.plugins.PluginWarning``), never define."""
    import ckpt.errors

    defined_elsewhere = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in _library_modules(ROOT).values()
        if path != ROOT / "ckpt" / "errors.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base).endswith(("Error", "Exception", "Warning")) for base in node.bases)
    ]
    assert defined_elsewhere == []
    assert {"PluginWarning", "CkptError", "CkptWarning"} <= set(ckpt.errors.__all__)
    assert all(issubclass(getattr(ckpt.errors, name), Exception | Warning) for name in ckpt.errors.__all__)


# Imports that only an optional feature makes (its module says so); everything else must be a dependency.
OPTIONAL_IMPORTS = {
    "transformers": "hf",  # Hugging Face runs and callbacks
    "huggingface-hub": "hf",  # ckpt.store.hub: importing a Hub repository by revision
    "dask-cuda": "gpu",  # one worker per GPU
    "lightning": "test",  # ckpt.store.lightning: for users who train with Lightning, who have it
    "pytest": "test",  # ckpt.plugins.testing, the conformance kit: for plugin authors' test suites
}


def _requirement_names(requirements: list[str]) -> set[str]:
    """Normalised distribution names of ``requirements``, with those their extras bring (``dask[distributed]``)."""
    names = set()
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement)
        names.add(match.group(1))
        names.update(extra.strip() for extra in (match.group(2) or "").split(",") if extra.strip())
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names}


def test_every_third_party_import_is_declared() -> None:
    """What the package imports, pyproject.toml declares (scikit-learn was imported and not declared)."""
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = _requirement_names(project["dependencies"])
    extras = {extra: _requirement_names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    distributions = packages_distributions()
    imported: dict[str, set[str]] = {}
    for path in _library_modules(ROOT).values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "ckpt":
                    continue
                for distribution in distributions.get(top, [top.replace("_", "-")]):
                    imported.setdefault(re.sub(r"[-_.]+", "-", distribution).lower(), set()).add(path.name)
    undeclared = {name: sorted(where) for name, where in imported.items() if name not in required}
    assert set(undeclared) == set(OPTIONAL_IMPORTS), undeclared
    for name, extra in OPTIONAL_IMPORTS.items():
        assert name in extras[extra], f"{name} is not in the {extra!r} extra"
