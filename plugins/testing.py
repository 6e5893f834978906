"""A conformance kit for analyzer authors: subclass :class:`AnalyzerTests` in your test suite.

Like zarr's ``StoreTests``, the base class holds the tests every analyzer must
pass; a test module only says which analyzer, with which options, on which store::

    from ckpt.plugins.testing import AnalyzerTests

    import my_plugin

    class TestWeightNorm(AnalyzerTests):
        analyzer_class = my_plugin.WeightNorm
        plugin = my_plugin          # not needed once the package is installed

        def make_store(self, tmp_path):
            return write_example_run(tmp_path / "run.zarr")

The tests use the real engine and real stores: nothing is mocked. A check that
does not apply to a plugin is opted out by name, with the reason, in
``expected_failures`` (scikit-learn's ``expected_failed_checks``). The same
module holds :class:`ObjectiveTests` and :class:`ImporterTests`; the kit for
tasks, which trains through the sandboxes' loop, is
:class:`ckpt.sandboxes.testing.TaskTests`. :func:`write_example_run` writes a
small real run with a model. Every name is imported from here: the checks and
the kits' bases are defined in ``_kit_checks``, the objectives' kit in
``_kit_objectives`` (one concern a module). This module imports pytest, so
import it from tests only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import dask
import numpy as np
import pytest
import xarray as xr

import ckpt.store as ckptstore
from ckpt.engine.context import AnalysisContext
from ckpt.engine.pipeline import run, stored_provenance
from ckpt.engine.worker import TaskSpec, clear_cache
from ckpt.errors import StoreExistsError
from ckpt.plugins._importers import Importer
from ckpt.plugins._kit_checks import (
    DaskComputeCounter,
    KitTests,
    RegisteredTests,
    check_description,
    check_figure,
    check_store,
    raise_if_dask_computes,
    registry_with,
)
from ckpt.plugins._kit_objectives import ObjectiveTests
from ckpt.plugins.analyzer import PER_PAIR, PER_RUN, Analyzer, Option
from ckpt.plugins.examples import EXAMPLE_FACTORY, mlp, tree_digest, write_example_run
from ckpt.plugins.manager import Registry

__all__ = [
    "EXAMPLE_FACTORY",
    "AnalyzerTests",
    "ImporterTests",
    "KitTests",
    "ObjectiveTests",
    "RegisteredTests",
    "check_description",
    "check_figure",
    "check_store",
    "mlp",
    "raise_if_dask_computes",
    "registry_with",
    "tree_digest",
    "write_example_run",
]


class AnalyzerTests(KitTests):
    """Base class of an analyzer's conformance tests (collected only through a ``Test*`` subclass).

    Attributes
    ----------
    analyzer_class
        The :class:`ckpt.plugins.Analyzer` subclass under test.
    options
        Options to run it with (default: its defaults).
    plugin
        The module (or object) with its ``ckpt_register_analyzers`` hookimpl, registered
        for the tests when the analyzer is not already registered by an installed package.
    expected_failures
        ``{check name: reason}`` of checks that do not hold for this analyzer (see :class:`KitTests`).
    """

    analyzer_class: ClassVar[type[Analyzer]]
    options: ClassVar[dict[str, Any]] = {}
    plugin: ClassVar[Any] = None

    def make_store(self, tmp_path: Path) -> Path:
        """Write a small real store the analyzer can run on, and return its path."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_store(self, tmp_path)")

    # -- fixtures and helpers ---------------------------------------------------------------
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Path]:
        """The store of :meth:`make_store`; the worker caches are cleared afterwards."""
        yield Path(self.make_store(tmp_path))
        clear_cache()

    @pytest.fixture
    def registry(self) -> Registry:
        """The installed plugins, plus :attr:`plugin` when the analyzer is not among them."""
        return registry_with("analyzers", self.analyzer_class.name, self.analyzer_class, self.plugin)

    def expected_steps(self, path: Path) -> list[int]:
        """Steps a complete result holds: every checkpoint, or the first step of every pair."""
        steps = [int(s) for s in ckptstore.open(path).steps]
        return steps[:-1] if self.analyzer_class.per == PER_PAIR else steps

    def graph(self, path: Path, registry: Registry) -> tuple[xr.Dataset, int]:
        """The analyzer's lazy Dataset over every expected step, as the engine builds it, and the computes."""
        analyzer = self.analyzer_class(**self.options)
        dependency_options = analyzer.dependency_options()
        results = {}
        for name in analyzer.requires:
            options = dependency_options.get(name, {})
            if options is None:  # the stored result's options, as the engine reads them
                options = dict((stored_provenance(ckptstore.open(path), name) or {}).get("options") or {})
            report = run(name, path, registry=registry, **options)
            assert report.dataset is not None  # run sets it once the result is stored
            results[name] = report.dataset
        context = AnalysisContext(ckptstore.open(path), self.expected_steps(path), TaskSpec(str(path)), results)
        with DaskComputeCounter() as counter:
            dataset = analyzer.compute(context)
        return dataset, counter.count

    # -- the tests ------------------------------------------------------------------------------
    def test_metadata(self) -> None:
        """Name, version, a one-line description; every option has help and a default of its type."""
        cls = self.analyzer_class
        assert isinstance(cls.name, str), f"`name` must be a str, got {cls.name!r}"
        assert cls.name, "set `name`: what users type after `ckpt analyze`"
        assert isinstance(cls.version, str), f"`version` must be a str, got {cls.version!r}"
        description = cls.description.strip()
        assert description, "set `description`: one line for `ckpt analyze --help`"
        assert "\n" not in description, f"`description` must be one line, got {description!r}"
        for key, option in cls.option_spec().items():
            assert isinstance(option, Option)
            assert option.help.strip(), f"option {key!r} has no help text"
            default = option.default
            assert default is None or isinstance(default, option.type), (
                f"option {key!r}: default {default!r} is not a {option.type.__name__}"
            )
            assert option.choices is None or default is None or default in option.choices, (
                f"option {key!r}: default {default!r} is not one of its choices {list(option.choices)}"
            )

    def test_compute_builds_a_lazy_graph(self, store: Path, registry: Registry) -> None:
        """``compute`` returns dask-backed variables and runs no dask computation."""
        dataset, computes = self.graph(store, registry)
        assert isinstance(dataset, xr.Dataset), f"compute returned {type(dataset).__name__}, not a Dataset"
        assert computes == 0, f"compute ran {computes} dask computation(s) while building the graph"
        assert dataset.data_vars, "compute returned a Dataset without data variables"
        for name, variable in dataset.data_vars.items():
            assert dask.is_dask_collection(variable.data), f"variable {name!r} is not dask-backed"

    def test_run_saves_the_graph_values(self, store: Path, registry: Registry) -> None:
        """The engine saves the graph's values in ``analyses/<name>``, with their provenance."""
        cls = self.analyzer_class
        expected = self.graph(store, registry)[0].compute(scheduler="sync")
        report = run(cls.name, store, registry=registry, **self.options)
        assert cls.name in ckptstore.open(store).analyses, f"no analyses/{cls.name} after a run"
        saved = ckptstore.open(store).analysis(cls.name)
        # the engine adds the running sums (``running_sums``) while it commits blocks
        expected_names = set(expected.data_vars) | set(cls.running_sums)
        assert set(saved.data_vars) == expected_names, "stored variables differ from the graph's"
        for name, variable in expected.data_vars.items():
            message = f"stored {name!r} differs from the computed graph"
            if np.issubdtype(variable.dtype, np.number):
                np.testing.assert_allclose(saved[name].values, variable.values, err_msg=message)
            else:
                np.testing.assert_array_equal(saved[name].values, variable.values, err_msg=message)
        provenance = saved.ckpt.provenance
        assert report.dataset is not None, "run() returned no dataset"
        assert report.dataset.ckpt.provenance == provenance, "run() returned another result than it saved"
        analyzer = cls(**self.options)
        assert provenance.get("analyzer") == cls.name, f"provenance names {provenance.get('analyzer')!r}"
        assert provenance.get("version") == str(cls.version), "provenance has another version"
        assert provenance.get("options") == analyzer.provenance()["options"], "provenance has other options"
        assert provenance.get("steps") == self.expected_steps(store), "provenance lists other steps"

    def test_second_run_reuses_everything(self, store: Path, registry: Registry) -> None:
        """A second run with the same options computes nothing."""
        name = self.analyzer_class.name
        first = run(name, store, registry=registry, **self.options)
        second = run(name, store, registry=registry, **self.options)
        assert first.computed_steps, "the first run computed nothing"
        assert second.computed_steps == [], f"the second run recomputed steps {second.computed_steps}"

    def append_checkpoint(self, path: Path) -> int:
        """Append one checkpoint after the store's last, and return its step.

        By default its tensors are the last checkpoint's, each floating-point one moved by
        a little seeded noise, at the step one interval past the last. Override it for a
        store whose checkpoints must come from training (e.g. a tied or constrained model).
        """
        store = ckptstore.open(path)
        steps = [int(s) for s in store.steps]
        step = steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1)
        rng = np.random.default_rng(step)
        moved = {}
        for name, value in store.tensors(steps[-1]).items():
            if np.issubdtype(value.dtype, np.floating):
                scale = 0.01 * (float(np.abs(value).mean()) or 1.0)
                value = (value + scale * rng.standard_normal(value.shape)).astype(value.dtype)
            moved[name] = value
        with ckptstore.open(path, mode="a") as writer:
            writer.write(step, moved)
        return step

    def test_a_new_checkpoint_computes_only_itself(self, store: Path, registry: Registry) -> None:
        """After a checkpoint is appended, a rerun computes only what it changes and equals a full recompute.

        Per checkpoint: only the new step; per pair: only the new pair (its first step is the
        old last); per run: everything again, since one value depends on every checkpoint. An
        analyzer whose dependency recomputed steps it had stored (a per-run dependency, such as
        ``hessian-basis``) is recomputed whole: its inputs changed.
        """
        cls = self.analyzer_class
        before = self.expected_steps(store)
        run(cls.name, store, registry=registry, **self.options)
        new = self.append_checkpoint(store)
        rerun = run(cls.name, store, registry=registry, **self.options)
        changed = [d.name for d in rerun.dependencies if set(d.computed_steps) - {new}]
        whole = cls.per == PER_RUN or bool(changed)
        computed = (
            self.expected_steps(store)
            if whole
            else [int(ckptstore.open(store).steps[-2])]
            if cls.per == PER_PAIR
            else [new]
        )
        assert rerun.computed_steps == computed, (
            f"after appending step {new}, a per={cls.per!r} analyzer computed steps {rerun.computed_steps}, "
            f"not {computed}"
        )
        if not whole:
            assert rerun.reused_steps == before, f"reused {rerun.reused_steps}, not the stored {before}"
        incremental = ckptstore.open(store).analysis(cls.name).load()
        full = run(cls.name, store, registry=registry, force=True, **self.options).dataset
        assert full is not None
        assert set(incremental.data_vars) == set(full.data_vars), "the incremental result has other variables"
        for name, variable in full.data_vars.items():
            message = f"{name!r} after appending step {new} differs from a full recompute"
            if np.issubdtype(variable.dtype, np.number):
                np.testing.assert_allclose(incremental[name].values, variable.values, rtol=1e-6, err_msg=message)
            else:
                np.testing.assert_array_equal(incremental[name].values, variable.values, err_msg=message)

    def test_figures(self, store: Path, registry: Registry) -> None:
        """``plot`` draws the stored result: named matplotlib Figures, not blank, with labelled panels."""
        cls = self.analyzer_class
        result = run(cls.name, store, registry=registry, **self.options).dataset
        assert result is not None  # run sets it once the result is stored
        figures = cls(**self.options).plot(result, ckptstore.open(store))
        assert isinstance(figures, dict), f"plot returned {type(figures).__name__}, not a dict of figures"
        if not figures:
            pytest.skip(f"analyzer {cls.name!r} draws no figures")
        for key, figure in figures.items():
            usable = isinstance(key, str) and bool(key) and not set(key) & set("/\\ \t\n")
            assert usable, f"figure name {key!r} is not usable in a file name (NAME-KEY.png)"
            check_figure(figure)

    def test_result_has_a_step_dim(self, store: Path, registry: Registry) -> None:
        """Results grow along ``step``: the store's steps, or the first steps of its pairs."""
        cls = self.analyzer_class
        result = run(cls.name, store, registry=registry, **self.options).dataset
        assert result is not None
        if cls.per == PER_RUN and "step" not in result.dims:
            pytest.skip("a per='run' result need not have a step dim")
        assert "step" in result.dims, f"result dims {tuple(result.dims)} have no 'step'"
        steps = [int(s) for s in result["step"].values]
        assert steps == self.expected_steps(store), f"result steps {steps} are not the store's"


IMPORT_OPTIONS: dict[str, Any] = {
    "model": None,
    "config": None,
    "objective": None,
    "step_pattern": None,
    "key": None,
    "overwrite": False,
}
"""The keyword arguments ``ckpt import`` passes to an importer's ``run`` (none given on the command line)."""


class ImporterTests(RegisteredTests):
    """Base class of an importer's conformance tests (collected only through a ``Test*`` subclass).

    Subclasses implement :meth:`make_source`.

    Set :attr:`name` (``ckpt import --format NAME``) and, while the package is not
    installed, :attr:`plugin`; see :class:`RegisteredTests`.

    Attributes
    ----------
    options
        Keyword arguments for ``run`` over :data:`IMPORT_OPTIONS` (what ``ckpt import`` passes).
    """

    kind = "importers"
    options: ClassVar[dict[str, Any]] = {}

    def make_source(self, folder: Path) -> dict[int, dict[str, np.ndarray]]:
        """Write a small run in the importer's format into the (empty, existing) ``folder``.

        Returns
        -------
        dict
            ``{step: {tensor name: array}}``: what the imported store must hold.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement make_source(self, folder)")

    # -- fixtures and helpers ---------------------------------------------------------------
    @pytest.fixture
    def importer(self) -> Importer:
        """The registered importer (its plugin registered when it is not installed)."""
        return self.registered()

    @pytest.fixture
    def source(self, tmp_path: Path) -> Iterator[tuple[Path, dict[int, dict[str, np.ndarray]]]]:
        """The folder :meth:`make_source` wrote and the tensors it expects; caches cleared afterwards."""
        folder = tmp_path / "source"
        folder.mkdir()
        yield folder, self.make_source(folder)
        clear_cache()

    def run_import(self, importer: Importer, src: Path, dest: Path, **options: Any) -> Any:
        """``importer.run(src, dest, ...)`` as ``ckpt import`` calls it, with :attr:`options` and ``options``."""
        return importer.run(str(src), str(dest), **{**IMPORT_OPTIONS, **self.options, **options})

    # -- the tests ------------------------------------------------------------------------------
    def test_metadata(self, importer: Importer) -> None:
        """An :class:`ckpt.plugins.Importer` with a callable ``run`` and a one-line description."""
        assert isinstance(importer, Importer), f"{self.name!r} is a {type(importer).__name__}, not an Importer"
        assert callable(importer.run), "`run` must be callable"
        check_description(importer.description, f"importer {self.name!r}")

    def test_import_holds_the_source_weights(self, importer: Importer, source: tuple, tmp_path: Path) -> None:
        """The store verifies and holds every expected step, with the source's tensors, dtypes and values."""
        folder, expected = source
        self.run_import(importer, folder, tmp_path / "run.zarr")
        store = check_store(tmp_path / "run.zarr")
        assert [int(s) for s in store.steps] == sorted(expected), f"steps {list(store.steps)}, not {sorted(expected)}"
        for step, tensors in expected.items():
            stored = store.tensors(step)
            assert sorted(stored) == sorted(tensors), f"step {step}: tensors {sorted(stored)}, not {sorted(tensors)}"
            for name, value in tensors.items():
                value = np.asarray(value)
                assert stored[name].dtype == value.dtype, (
                    f"step {step}, {name!r}: {stored[name].dtype}, not {value.dtype}"
                )
                np.testing.assert_array_equal(stored[name], value, err_msg=f"step {step}, {name!r} differs")

    def test_the_source_is_left_as_it_was(self, importer: Importer, source: tuple, tmp_path: Path) -> None:
        """Importing reads the source and writes nothing into it."""
        folder, _ = source
        before = tree_digest(folder)
        self.run_import(importer, folder, tmp_path / "run.zarr")
        assert tree_digest(folder) == before, "the import changed the source folder"

    def test_another_runs_store_is_kept_without_overwrite(
        self, importer: Importer, source: tuple, tmp_path: Path
    ) -> None:
        """Importing into a store of another source is refused (StoreExistsError); ``overwrite`` replaces it.

        (Importing the same source again may bring its store up to date, as ckpt's own importers
        do for a run that is still training; that is not checked.)
        """
        folder, _ = source
        other = tmp_path / "other"
        other.mkdir()
        self.make_source(other)
        dest = tmp_path / "run.zarr"
        self.run_import(importer, other, dest)
        before = tree_digest(dest)
        with pytest.raises(StoreExistsError):
            self.run_import(importer, folder, dest)
        assert tree_digest(dest) == before, "a refused import changed the existing store"
        self.run_import(importer, folder, dest, overwrite=True)
        check_store(dest)
