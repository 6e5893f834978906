"""A conformance kit for analyzer authors: subclass :class:`AnalyzerTests` in your test suite.

Like zarr's ``StoreTests``, the base class holds the tests every analyzer must
pass; a test module only says which analyzer, with which options, on which store::

    from ckpt.plugins.testing import AnalyzerTests

    import my_plugin

    class TestWeightNorm(AnalyzerTests):
        analyzer_class = my_plugin.WeightNorm
        plugin = my_plugin          # not needed once the package is installed

        def make_store(self, tmp_path):
            return write_small_run(tmp_path / "run.zarr")

The tests use the real engine and real stores: nothing is mocked. This module
imports pytest, so import it from tests only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import dask
import numpy as np
import pytest
import xarray as xr
from dask.callbacks import Callback

import ckpt.store as ckptstore
from ckpt.plugins._analyzer import PER_PAIR, PER_RUN, Analyzer, Option
from ckpt.plugins._context import AnalysisContext
from ckpt.plugins._engine import run, stored_provenance
from ckpt.plugins._manager import Registry, load_registry
from ckpt.plugins._runtime import TaskSpec, clear_cache


class _CountComputes(Callback):
    """Counts the graphs a local Dask scheduler starts (xarray's ``raise_if_dask_computes`` idea)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _start(self, dsk: Any) -> None:
        self.count += 1


def check_figure(figure: Any, *, panels: int | None = None) -> np.ndarray:
    """Assert that ``figure`` is a drawable, labelled matplotlib Figure; return it rendered (RGBA pixels).

    Checked: it renders to PNG; the image is not blank (over 0.5% of its pixels differ from the
    background, in more than two colours); every panel with something drawn in it has a y label
    and an x label or title (a twin axes shares its x axis); and, with ``panels``, the number of
    panels (axes with their axis shown, twins counted once).
    """
    import io

    from matplotlib.figure import Figure
    from matplotlib.image import imread

    assert isinstance(figure, Figure), f"expected a matplotlib Figure, got {type(figure).__name__}"
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=50)
    buffer.seek(0)
    pixels = imread(buffer, format="png")
    flat = pixels.reshape(-1, pixels.shape[-1])
    background = flat[0]
    drawn = np.any(np.abs(flat - background) > 0.02, axis=1)
    assert drawn.mean() > 0.005, f"the figure is blank ({drawn.mean():.2%} of its pixels drawn)"
    assert len(np.unique(flat[drawn][:, :3].round(2), axis=0)) > 2, "the figure has two colours or fewer"
    shown = [axes for axes in figure.axes if axes.axison]
    # a twin (twinx) sits exactly over an earlier panel and shares its x axis
    twins = {
        id(later)
        for index, later in enumerate(shown)
        for earlier in shown[:index]
        if later.get_position().bounds == earlier.get_position().bounds
    }
    for axes in shown:
        if not (axes.lines or axes.collections or axes.patches or axes.images):
            continue
        where = axes.get_title() or f"panel {shown.index(axes)}"
        assert axes.get_ylabel(), f"{where}: no y label"
        assert axes.get_xlabel() or axes.get_title() or id(axes) in twins, f"{where}: no x label or title"
    if panels is not None:
        count = len([axes for axes in shown if id(axes) not in twins])
        assert count == panels, f"expected {panels} panels, found {count}"
    return pixels


class AnalyzerTests:
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
        cls = self.analyzer_class
        registry = load_registry()
        if registry.analyzers.get(cls.name) is not cls:
            assert self.plugin is not None, f"analyzer {cls.name!r} is not registered: set `plugin` to its module"
            registry = load_registry(extra=[self.plugin])
        found = registry.analyzers.get(cls.name)
        assert found is cls, f"{cls.name!r} is registered as {found!r}, not {cls.__qualname__} (see the warnings)"
        return registry

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
            results[name] = report.dataset
        context = AnalysisContext(ckptstore.open(path), self.expected_steps(path), TaskSpec(str(path)), results)
        with _CountComputes() as counter:
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

    def test_figures(self, store: Path, registry: Registry) -> None:
        """``plot`` draws the stored result: named matplotlib Figures, not blank, with labelled panels."""
        cls = self.analyzer_class
        result = run(cls.name, store, registry=registry, **self.options).dataset
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
