"""The conformance kits' checks and bases: what :mod:`ckpt.plugins.testing` exports besides the kits.

The assertions a plugin author's own tests use too (:func:`check_figure`, :func:`check_store`,
:func:`check_description`, :func:`raise_if_dask_computes`), the registry a kit runs against
(:func:`registry_with`) and the kits' bases (:class:`KitTests`, :class:`RegisteredTests`). Import
them from :mod:`ckpt.plugins.testing`; this module imports pytest, so import it from tests only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from dask.callbacks import Callback

import ckpt.store as ckptstore
from ckpt.plugins.manager import Registry, load_registry

__all__ = [
    "KitTests",
    "RegisteredTests",
    "check_description",
    "check_figure",
    "check_store",
    "raise_if_dask_computes",
    "registry_with",
]


class DaskComputeCounter(Callback):
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
def raise_if_dask_computes(allowed: int = 0) -> Iterator[DaskComputeCounter]:
    """Fail a test whose block starts more than ``allowed`` Dask computations (xarray's helper of that name).

    The failing computation raises as it starts, so the traceback points at the line that
    computed (an ``.values``, ``.compute()``, a ``float()`` of a lazy value), and the
    yielded counter's ``count`` says how many started.

    >>> with raise_if_dask_computes():
    ...     dataset = analyzer.compute(ctx)  # building a graph computes nothing  # doctest: +SKIP
    """
    with DaskComputeCounter(allowed) as counter:
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
