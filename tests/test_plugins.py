"""The plugin host: discovery through entry points, broken plugins, duplicates, meta-tests on the hooks."""

from __future__ import annotations

import inspect
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import ckpt.plugins
from ckpt.engine.settings import FOLLOW_OPTIONS
from ckpt.plugins import PluginWarning, hookspecs, load_registry
from ckpt.plugins.manager import get_plugin_manager
from tests.helpers import run_ckpt

ROOT = Path(__file__).resolve().parents[1]
HOOKS = [name for name, value in vars(hookspecs).items() if name.startswith("ckpt_") and callable(value)]

THIRD_PARTY = {
    "broken_plugin.py": "raise ImportError('needs the missing package frobnitz')\n",
    "dup_plugin.py": textwrap.dedent(
        """
        from ckpt.plugins import Analyzer, hookimpl

        class FakeLoss(Analyzer):
            name = "loss"
            description = "a second analyzer named loss"

        @hookimpl
        def ckpt_register_analyzers(register):
            register(FakeLoss)
        """
    ),
    "extra_plugin.py": textwrap.dedent(
        """
        from pathlib import Path

        import numpy as np
        import ckpt.store as ckptstore
        from ckpt.plugins import hookimpl
        from ckpt.plugins import Importer
        from ckpt.plugins import CROSS_ENTROPY, Objective

        def half(outputs, targets, mask):
            return 0.5 * CROSS_ENTROPY.losses(outputs, targets, mask)

        def import_npz(src, dest, *, model=None, config=None, objective=None, overwrite=False, **ignored):
            with ckptstore.create(dest, model=model, config=config, objective=objective, overwrite=overwrite) as w:
                for path in sorted(Path(src).glob("*.npz"), key=lambda p: int(p.stem)):
                    w.write(int(path.stem), dict(np.load(path)))

        @hookimpl
        def ckpt_register_objectives(register):
            register("half-cross-entropy", Objective(half, CROSS_ENTROPY.datapoints, "half the cross-entropy"))

        @hookimpl
        def ckpt_register_importers(register):
            register("npz", Importer("a folder of STEP.npz files", import_npz))
        """
    ),
    "task_plugin.py": textwrap.dedent(
        """
        from ckpt.plugins import hookimpl
        from ckpt.plugins import Task

        class Countdown(Task):
            name = "countdown"
            description = "a task that only counts"
            factory = "tests.models:mlp"
            presets = {"default": {"steps": 1}}

        @hookimpl
        def ckpt_register_tasks(register):
            register("countdown", Countdown())
        """
    ),
}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder on sys.path holding three installed distributions' files (as pip would lay them out)."""
    site = tmp_path / "site"
    site.mkdir()
    for name, code in THIRD_PARTY.items():
        (site / name).write_text(code)
    for dist, entry in (
        ("broken_pkg-1.0", "broken = broken_plugin"),
        ("dup_pkg-2.1", "dup = dup_plugin"),
        ("task_pkg-0.3", "tasks = task_plugin"),
        ("extra_pkg-0.1", "extra = extra_plugin"),
    ):
        info = site / f"{dist}.dist-info"
        info.mkdir()
        name, version = dist.rsplit("-", 1)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[ckpt]\n{entry}\n")
    return site


def test_entry_point_plugins_broken_and_duplicate(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(site))
    with pytest.warns(PluginWarning) as caught:
        registry = load_registry()
    messages = [str(w.message) for w in caught]
    assert any(
        "plugin 'broken' from broken-pkg 1.0 failed to load and is skipped: ImportError: needs the missing package" in m
        for m in messages
    ), messages
    assert any(
        "analyzer 'loss' registered by plugin 'dup' from dup-pkg 2.1 is ignored: the name is taken by plugin "
        "'ckpt.analyzers.loss' from ckpt" in m
        for m in messages
    ), messages
    assert registry.analyzers["loss"].__module__ == "ckpt.analyzers.loss", "the first registration wins"
    assert "countdown" in registry.tasks
    assert registry.provider("tasks", "countdown").package == "task-pkg"


def test_the_cli_keeps_working_with_broken_plugins(site: Path, mlp_store: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    result = run_ckpt("plugins", extra_env=env)
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("Warning: ") for w in warnings), result.stderr
    assert "plugin 'broken' from broken-pkg 1.0 failed to load" in result.stderr
    assert "countdown" in result.stdout and "task-pkg 0.3" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("  ") and line.strip() != "(none)"]
    starts = {re.match(r"  \S+\s+\S+ \S+\s+", line).end() for line in rows if len(line.split()) > 3}
    assert len(starts) == 1, "descriptions start in one column, whatever the package names' lengths"
    analyzed = run_ckpt("analyze", "loss", str(mlp_store), "--no-progress", extra_env=env)
    assert analyzed.returncode == 0, analyzed.stderr
    assert "Traceback" not in analyzed.stderr


def test_objective_and_importer_plugins_work_through_the_cli(site: Path, mlp_store: Path, tmp_path: Path) -> None:
    import numpy as np

    import ckpt.store as ckptstore

    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    ce = run_ckpt("analyze", "loss", str(mlp_store), "--no-progress", extra_env=env)
    half = run_ckpt("analyze", "loss", str(mlp_store), "--objective", "half-cross-entropy", extra_env=env)
    assert half.returncode == 0 and ce.returncode == 0, half.stderr
    assert "computed 6 step(s)" in half.stdout, "another objective is another result"
    halved = ckptstore.open(mlp_store).analysis("loss")["loss"].values
    assert ckptstore.open(mlp_store).analysis("loss").attrs["ckpt"]["options"]["objective"] == "half-cross-entropy"
    run_ckpt("analyze", "loss", str(mlp_store), "--no-progress", extra_env=env)
    np.testing.assert_allclose(halved, 0.5 * ckptstore.open(mlp_store).analysis("loss")["loss"].values, rtol=1e-6)

    src = tmp_path / "npz"
    src.mkdir()
    for step in (3, 10):
        np.savez(src / f"{step}.npz", w=np.full((2, 2), step, np.float32))
    imported = run_ckpt("import", str(src), str(tmp_path / "npz.zarr"), "--format", "npz", extra_env=env)
    assert imported.returncode == 0, imported.stderr
    store = ckptstore.open(tmp_path / "npz.zarr")
    assert store.steps.tolist() == [3, 10]
    np.testing.assert_array_equal(store.tensors(10)["w"], np.full((2, 2), 10, np.float32))


def test_manager_is_built_by_a_factory_not_at_import() -> None:
    first, _ = get_plugin_manager(entry_points=False)
    second, _ = get_plugin_manager(entry_points=False)
    assert first is not second
    assert first.get_plugin("ckpt.analyzers.loss") is not None


def test_registration_validates_analyzers() -> None:
    class NotAnAnalyzer:
        name = "x"

    class Plugin:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(NotAnAnalyzer)

    with pytest.warns(PluginWarning, match="is not a subclass of ckpt.plugins.Analyzer"):
        registry = load_registry(entry_points=False, extra=[Plugin()])
    assert "x" not in registry.analyzers

    class RegistersAType:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(int)

    with pytest.warns(PluginWarning, match="<class 'int'> is not a subclass of ckpt.plugins.Analyzer"):
        load_registry(entry_points=False, extra=[RegistersAType()])


@pytest.mark.parametrize("count", [0, 2.5, True])
def test_min_checkpoints_must_be_a_positive_int(count: object) -> None:
    odd = type("Odd", (ckpt.plugins.Analyzer,), {"name": "odd", "description": "d", "min_checkpoints": count})

    class Plugin:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(odd)

    with pytest.warns(PluginWarning, match="min_checkpoints must be an int of at least 1"):
        registry = load_registry(entry_points=False, extra=[Plugin()])
    assert "odd" not in registry.analyzers


@pytest.mark.parametrize("setting", [*ckpt.plugins.analyzer.ENGINE_SETTINGS, *FOLLOW_OPTIONS])
def test_an_option_may_not_shadow_an_engine_setting(setting: str) -> None:
    """An option named like a setting or ``--follow``'s options would make every ``ckpt analyze`` fail to build."""
    shadowing = type(
        "Shadowing",
        (ckpt.plugins.Analyzer,),
        {"name": "shadowing", "description": "d", setting: ckpt.plugins.Option(str, "x", "an option")},
    )

    class Plugin:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(shadowing)

    with pytest.warns(PluginWarning, match=f"declares option '{setting}', which is an engine setting"):
        registry = load_registry(entry_points=False, extra=[Plugin()])
    assert "shadowing" not in registry.analyzers
    assert any(f"option '{setting}'" in problem for problem in registry.problems)


def test_a_malformed_analyzer_is_skipped_alone_with_its_reason() -> None:
    """A bad Option default or an int version names the analyzer; the plugin's other analyzers still register."""

    def analyzer(name: str, **attributes: Any) -> type:
        return type(name.title(), (ckpt.plugins.Analyzer,), {"name": name, "description": "d", **attributes})

    bad_default = analyzer("bad-default", n=ckpt.plugins.Option(int, "3", "a count"))
    int_version = analyzer("int-version", version=2)
    fine = analyzer("fine")

    class Plugin:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(bad_default)
            register(int_version)
            register(fine)

    with pytest.warns(PluginWarning):
        registry = load_registry(entry_points=False, extra=[Plugin()])
    assert "fine" in registry.analyzers, "registered after the bad ones"
    assert "bad-default" not in registry.analyzers and "int-version" not in registry.analyzers
    problems = " | ".join(registry.problems)
    assert "analyzer Bad-Default" in problems and "option 'n' of analyzer 'bad-default': '3' is not a int" in problems
    assert "analyzer 'int-version': version must be a non-empty str" in problems


def test_one_registry_per_process() -> None:
    from ckpt.cli.analyze import registry as cli_registry
    from ckpt.plugins.manager import registry, reset_registry

    assert registry() is registry() is cli_registry()
    reset_registry()
    rebuilt = registry()
    assert rebuilt is cli_registry()
    assert set(rebuilt.analyzers) >= {"loss", "polca", "hessian-basis"}


def test_extra_plugins_already_registered_are_not_registered_twice() -> None:
    import ckpt.analyzers.loss

    registry = load_registry(entry_points=False, extra=[ckpt.analyzers.loss])
    assert registry.provider("analyzers", "loss").package == "ckpt-dynamics"


def test_builtin_objectives_and_importers_register_through_hooks() -> None:
    registry = load_registry(entry_points=False)
    assert {"cross-entropy", "token-cross-entropy"} <= set(registry.objectives)
    assert {"torch", "safetensors", "hf"} <= set(registry.importers)
    assert registry.provider("objectives", "cross-entropy").package == "ckpt-dynamics"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert doc.splitlines()[0].endswith("."), f"{hook}: a one-line summary first"
    assert "Parameters\n----------\nregister\n" in doc, f"{hook}: document the register callback (numpydoc)"
    assert "Examples\n--------\n>>> " in doc, f"{hook}: give an example (numpydoc)"
    assert f"`{hook}" in (ROOT / "docs" / "plugins.md").read_text(), f"{hook}: missing from docs/plugins.md"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_tested(hook: str) -> None:
    implemented_here = any(hook in code for code in THIRD_PARTY.values())
    others = [p for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_plugins.py"]
    assert implemented_here or any(hook in p.read_text() for p in others), f"no test implements {hook}"
    assert hook in {name for name, _ in inspect.getmembers(get_plugin_manager(entry_points=False)[0].hook)}
