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
small real run with a model. This module imports pytest, so import it from
tests only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import dask
import numpy as np
import pytest
import xarray as xr
from dask.callbacks import Callback

import ckpt.store as ckptstore
from ckpt.engine.context import AnalysisContext
from ckpt.engine.pipeline import run, stored_provenance
from ckpt.engine.worker import TaskSpec, clear_cache
from ckpt.errors import StoreExistsError
from ckpt.plugins._importers import Importer
from ckpt.plugins.analyzer import PER_PAIR, PER_RUN, Analyzer, Option
from ckpt.plugins.examples import EXAMPLE_FACTORY, mlp, tree_digest, write_example_run
from ckpt.plugins.manager import Registry, load_registry
from ckpt.plugins.objectives import Objective

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


class _CountComputes(Callback):
    """Counts the graphs a local Dask scheduler starts; fails the one past ``allowed`` as it starts."""

    def __init__(self, allowed: int | None = None) -> None:
        super().__init__()
        self.count = 0
        self.allowed = allowed

    def _start(self, dsk: Any) -> None:
        self.count += 1
        if self.allowed is not None and self.count > self.allowed:
            msg = f"{self.count} Dask computations started where at most {self.allowed} were expected"
            raise AssertionError(msg)


@contextmanager
def raise_if_dask_computes(allowed: int = 0) -> Iterator[_CountComputes]:
    """Fail a test whose block starts more than ``allowed`` Dask computations (xarray's helper of that name).

    The failing computation raises as it starts, so the traceback points at the line that
    computed (an ``.values``, ``.compute()``, a ``float()`` of a lazy value), and the
    yielded counter's ``count`` says how many started.

    >>> with raise_if_dask_computes():
    ...     dataset = analyzer.compute(ctx)  # building a graph computes nothing  # doctest: +SKIP
    """
    with _CountComputes(allowed) as counter:
        yield counter


def check_figure(figure: Any, *, panels: int | None = None) -> np.ndarray:
    """Assert that ``figure`` is a drawable, labelled matplotlib Figure; return it rendered (RGBA pixels).

    Checked: it renders to PNG; the image is not blank (over 0.5% of its pixels differ from the
    background, in more than two colours); every panel with something drawn in it has a y label
    and an x label or title (a twin axes shares its x axis); and, with ``panels``, the number of
    panels (axes with their axis shown, twins counted once). A colorbar is part of its panel,
    not a panel of its own: it is neither counted nor required to have a label.
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
    shown = [axes for axes in figure.axes if axes.axison and not _is_colorbar(axes)]
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


def _is_colorbar(axes: Any) -> bool:
    """Whether ``axes`` holds a colorbar (``figure.colorbar``), which belongs to the panel it describes."""
    # matplotlib has no public flag: its own Figure code tests these two (the label that
    # figure.colorbar gives the axes it makes, the attribute a Colorbar sets on any axes it draws in)
    return axes.get_label() == "<colorbar>" or getattr(axes, "_colorbar", None) is not None


def check_store(path: str | Path) -> ckptstore.Store:
    """Assert that the store at ``path`` is complete and intact, as ``ckpt verify`` checks it; return it opened.

    Every tensor of every checkpoint, every data split and the metrics are read (the
    reader raises on a piece that is missing or does not match its digest), and every
    piece has a digest to be checked against.
    """
    store = ckptstore.open(path)
    for step in store.steps:
        store.tensors(int(step))
    for split in store.splits:
        store.data(split)
    store.metrics  # noqa: B018 - reading checks the metrics against the commit record
    unverifiable = store.unverifiable_summary()
    assert unverifiable is None, f"{path}: pieces without a digest cannot be verified: {unverifiable}"
    return store


def check_description(description: Any, what: str) -> None:
    """Assert that ``description`` is a non-empty one-line str (``what`` names its owner in the message)."""
    assert isinstance(description, str), f"{what}: the description must be a str, got {description!r}"
    assert description.strip(), f"{what} has no description (one line for listings)"
    assert "\n" not in description.strip(), f"{what}: the description must be one line, got {description!r}"


def registry_with(kind: str, name: str, item: Any, plugin: Any) -> Registry:
    """The installed plugins (plus ``plugin`` when ``name`` is not among them), with ``item`` as ``name``.

    Parameters
    ----------
    kind
        ``"analyzers"``, ``"objectives"``, ``"importers"`` or ``"tasks"``.
    name
        The registered name.
    item
        What must be registered under ``name``; None accepts whatever is.
    plugin
        The module registering it, for when no installed package does.
    """
    registry = load_registry()
    if name not in getattr(registry, kind) or (item is not None and getattr(registry, kind)[name] is not item):
        assert plugin is not None, f"{kind[:-1]} {name!r} is not registered: set `plugin` to its module"
        registry = load_registry(extra=[plugin])
    found = getattr(registry, kind).get(name)
    assert found is not None, f"no {kind[:-1]} {name!r} is registered, even with `plugin` (see the warnings)"
    assert item is None or found is item, f"{name!r} is registered as {found!r}, not {item!r} (see the warnings)"
    return registry


class KitTests:
    """What every kit shares: opting checks out by name, with a reason.

    Attributes
    ----------
    expected_failures
        ``{check name: reason}``: checks known not to hold for this plugin, each with the
        reason why (shown by ``pytest -ra``). A name that is not one of the class's checks
        is an error when the class is defined, so a typo cannot silently drop a check.
    """

    expected_failures: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        checks = {name for name in dir(cls) if name.startswith("test_")}
        unknown = sorted(set(cls.expected_failures) - checks)
        if unknown:
            msg = (
                f"{cls.__qualname__}.expected_failures names {unknown}, which are not checks of the class; "
                f"its checks are: {', '.join(sorted(checks))}"
            )
            raise TypeError(msg)
        for name, reason in cls.expected_failures.items():
            if not (isinstance(reason, str) and reason.strip()):
                msg = f"{cls.__qualname__}.expected_failures[{name!r}] must give the reason, got {reason!r}"
                raise TypeError(msg)

    @pytest.fixture(autouse=True)
    def _expected_failure(self, request: pytest.FixtureRequest) -> None:
        # A strict xfail rather than a skip: the check still runs, and the day it passes
        # (the plugin was fixed, or the check changed) the run fails with "XPASS(strict)",
        # so an opt-out cannot outlive its reason. A skip would hide a fixed plugin forever.
        reason = self.expected_failures.get(request.node.originalname)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


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


class RegisteredTests(KitTests):
    """Base of the kits for what plugins register by name: objectives, importers, tasks.

    Attributes
    ----------
    name
        The name the item is registered under (what users type, or stores record).
    plugin
        The module with its ``ckpt_register_*`` hookimpl, registered for the tests when no
        installed package registers the item.
    expected_failures
        ``{check name: reason}`` of checks that do not hold for this item (see :class:`KitTests`).
    """

    kind: ClassVar[str]
    """The registry's kind of item: ``"objectives"``, ``"importers"`` or ``"tasks"``."""
    name: ClassVar[str]
    plugin: ClassVar[Any] = None

    def registered(self) -> Any:
        """The item registered as :attr:`name` (with :attr:`plugin` registered when it is not installed)."""
        return getattr(registry_with(self.kind, self.name, None, self.plugin), self.kind)[self.name]


class ObjectiveTests(RegisteredTests):
    """Base class of an objective's conformance tests (collected only through a ``Test*`` subclass).

    Subclasses implement :meth:`make_batch`; :meth:`reference_loss`
    adds the check that the per-datapoint losses average to the loss training minimises.

    Set :attr:`name` (the objective's registered name) and, while the package is not
    installed, :attr:`plugin`; see :class:`RegisteredTests`.
    """

    kind = "objectives"

    def make_batch(self) -> tuple[Any, Any, Any]:
        """Model outputs, targets and mask (or None) of a batch of at least two examples, as torch tensors.

        Called with torch seeded. Use the shapes the objective is for (``[N, classes]`` logits
        and ``[N]`` targets, ``[N, T, vocab]`` logits and ``[N, T]`` targets ...); a mask, where
        the objective reads one, should leave out some datapoints, so that the checks cover it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement make_batch(self)")

    def reference_loss(self, outputs: Any, targets: Any, mask: Any) -> Any:
        """The scalar loss training minimises on this batch, computed independently (None: not checked).

        For example ``torch.nn.functional.cross_entropy(outputs, targets)``, or a Hugging Face
        model's ``model(ids, labels=ids).loss``.
        """
        return None

    # -- fixtures and helpers ---------------------------------------------------------------
    @pytest.fixture
    def objective(self) -> Objective:
        """The registered objective (its plugin registered when it is not installed)."""
        return self.registered()

    @pytest.fixture
    def batch(self) -> tuple[Any, Any, Any]:
        """:meth:`make_batch`'s outputs, targets and mask, with torch seeded."""
        import torch

        torch.manual_seed(0)
        return self.make_batch()

    @staticmethod
    def datapoints(objective: Objective, targets: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
        """``objective.datapoints`` of torch targets and mask, as numpy arrays."""
        example, position = objective.datapoints(targets.numpy(), None if mask is None else mask.numpy())
        return np.asarray(example), np.asarray(position)

    # -- the tests ------------------------------------------------------------------------------
    def test_metadata(self, objective: Objective) -> None:
        """An :class:`ckpt.plugins.Objective` with callable parts and a one-line description."""
        assert isinstance(objective, Objective), f"{self.name!r} is a {type(objective).__name__}, not an Objective"
        assert callable(objective.losses), "`losses` must be callable"
        assert callable(objective.datapoints), "`datapoints` must be callable"
        check_description(objective.description, f"objective {self.name!r}")

    def test_one_loss_per_datapoint(self, objective: Objective, batch: tuple[Any, Any, Any]) -> None:
        """A finite 1-D loss per datapoint; datapoints are (example, position) pairs in row-major order."""
        import torch

        outputs, targets, mask = batch
        losses = objective.losses(outputs, targets, mask)
        example, position = self.datapoints(objective, targets, mask)
        assert isinstance(losses, torch.Tensor), f"losses must be a tensor, got {type(losses).__name__}"
        assert losses.ndim == 1, f"losses must be 1-D (one per datapoint), got shape {tuple(losses.shape)}"
        assert len(example) == len(position), f"{len(example)} examples but {len(position)} positions"
        assert len(losses) == len(example) > 0, f"{len(losses)} losses for {len(example)} datapoints"
        assert np.issubdtype(example.dtype, np.integer), f"examples must be integers, got {example.dtype}"
        assert np.issubdtype(position.dtype, np.integer), f"positions must be integers, got {position.dtype}"
        assert ((example >= 0) & (example < len(targets))).all(), f"examples outside 0..{len(targets) - 1}"
        positions = targets.shape[1] if targets.ndim > 1 else 0
        assert ((position == -1) | ((position >= 0) & (position < max(positions, 1)))).all(), (
            "positions must be -1 (the whole example) or a position of the targets"
        )
        order = np.lexsort((position, example))
        assert (order == np.arange(len(order))).all(), "datapoints are not in row-major (example, position) order"
        assert torch.isfinite(losses).all(), "losses hold NaN or inf"

    def test_a_block_of_examples_has_its_rows_of_the_losses(
        self, objective: Objective, batch: tuple[Any, Any, Any]
    ) -> None:
        """The engine evaluates examples in blocks: a block's losses and datapoints are the batch's for its examples."""
        import torch

        outputs, targets, mask = batch
        whole = objective.losses(outputs, targets, mask)
        example, position = self.datapoints(objective, targets, mask)
        half = len(targets) // 2
        for start, stop in ((0, half), (half, len(targets))):
            rows = slice(start, stop)
            part_mask = None if mask is None else mask[rows]
            part = objective.losses(outputs[rows], targets[rows], part_mask)
            part_example, part_position = self.datapoints(objective, targets[rows], part_mask)
            selected = (example >= start) & (example < stop)
            where = f"examples {start}..{stop - 1}"
            np.testing.assert_array_equal(part_example + start, example[selected], err_msg=f"{where}: datapoints")
            np.testing.assert_array_equal(part_position, position[selected], err_msg=f"{where}: positions")
            torch.testing.assert_close(part, whole[torch.from_numpy(selected)], msg=f"{where}: losses differ")

    def test_losses_are_deterministic(self, objective: Objective, batch: tuple[Any, Any, Any]) -> None:
        """The same batch gives the same losses, bit for bit (results are cached and compared)."""
        import torch

        first = objective.losses(*batch)
        second = objective.losses(*batch)
        assert torch.equal(first, second), "two calls on the same batch gave different losses"

    def test_each_loss_depends_on_its_example_only_in_float64(
        self, objective: Objective, batch: tuple[Any, Any, Any]
    ) -> None:
        """Gradients flow to the outputs of a datapoint's own example only, and float64 outputs stay float64."""
        import torch

        outputs, targets, mask = batch
        outputs = outputs.detach().double().requires_grad_(True)
        losses = objective.losses(outputs, targets, mask)
        # analyzers run in double precision (--dtype float64): a float32 loss would lose it
        assert losses.dtype == torch.float64, f"float64 outputs gave {losses.dtype} losses"
        example, _ = self.datapoints(objective, targets, mask)
        for index in (0, len(losses) - 1):
            (gradient,) = torch.autograd.grad(losses[index], outputs, retain_graph=True)
            assert torch.isfinite(gradient).all(), f"the gradient of loss {index} is not finite"
            assert gradient[int(example[index])].abs().sum() > 0, f"loss {index} does not depend on its example"
            others = torch.ones(len(outputs), dtype=torch.bool)
            others[int(example[index])] = False
            assert not gradient[others].any(), f"loss {index} depends on other examples than its own"

    def test_mean_is_the_training_loss(self, objective: Objective, batch: tuple[Any, Any, Any]) -> None:
        """The mean of the per-datapoint losses is :meth:`reference_loss`."""
        import torch

        reference = self.reference_loss(*batch)
        if reference is None:
            pytest.skip(f"{type(self).__name__} gives no reference_loss")
        mean = objective.losses(*batch).mean()
        torch.testing.assert_close(mean, torch.as_tensor(reference, dtype=mean.dtype), msg="mean loss differs")


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
