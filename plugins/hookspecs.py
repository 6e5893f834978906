"""The hooks a ckpt plugin can implement.

A plugin is a module (or object) with functions named after these hooks and
decorated with :data:`ckpt.plugins.hookimpl`. It is found through the ``ckpt``
entry-point group of its distribution::

    [project.entry-points.ckpt]
    my-plugin = "my_package.ckpt_plugin"

ckpt's own analyzers, objectives and importers register through these same
hooks, listed by ``ckpt plugins``. Every hook receives a
``register`` callback, so ckpt owns validation and duplicate names in one
place: a second registration of a name is a warning naming both plugins, and
the first one is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.plugins._importers import Importer
    from ckpt.plugins.analyzer import Analyzer
    from ckpt.plugins.objectives import Objective
    from ckpt.plugins.tasks import LazyTask, Task

PROJECT = "ckpt"
"""pluggy project name; also the entry-point group plugins are discovered in."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def ckpt_register_analyzers(register: Callable[[type[Analyzer]], None]) -> None:
    """Register analyzer classes.

    Parameters
    ----------
    register
        Call ``register(AnalyzerSubclass)`` once per analyzer (a subclass of
        :class:`ckpt.plugins.Analyzer`); the class's ``name`` is the name users
        type (``ckpt analyze NAME``).

    Examples
    --------
    >>> @hookimpl
    ... def ckpt_register_analyzers(register):
    ...     register(WeightNorm)
    """


@hookspec
def ckpt_register_objectives(register: Callable[[str, Objective], None]) -> None:
    """Register per-datapoint loss functions (objectives).

    Parameters
    ----------
    register
        Call ``register(name, objective)`` with a :class:`ckpt.plugins.Objective`:
        ``losses(outputs, targets, mask)`` returns one loss per datapoint,
        ``datapoints(targets, mask)`` says which (example, position) each one is.
        Stores name their objective in ``attrs["ckpt"]["objective"]``.

    Examples
    --------
    >>> @hookimpl
    ... def ckpt_register_objectives(register):
    ...     register("mse", Objective(losses=per_example_mse, datapoints=every_example))
    """


@hookspec
def ckpt_register_importers(register: Callable[[str, Importer], None]) -> None:
    """Register importers of existing runs, for ``ckpt import --format NAME``.

    Parameters
    ----------
    register
        Call ``register(name, importer)`` with a :class:`ckpt.plugins.Importer`: a
        one-line ``description`` and ``run(src, dest, *, model, config, objective,
        step_pattern, key, overwrite)``, which creates the store ``dest`` with
        :func:`ckpt.store.create`.

    Examples
    --------
    >>> @hookimpl
    ... def ckpt_register_importers(register):
    ...     register("orbax", Importer("Orbax checkpoint folders", import_orbax))
    """


@hookspec
def ckpt_register_tasks(register: Callable[[str, Task | LazyTask], None]) -> None:
    """Register training tasks (sandboxes) for ``ckpt train TASK``.

    Parameters
    ----------
    register
        Call ``register(name, task)`` with an instance of a :class:`ckpt.plugins.Task`
        subclass (or a :class:`ckpt.plugins.tasks.LazyTask`): its data, model factory,
        optimizer, presets and typed options. ``ckpt train`` runs it with the shared
        loop, which writes through :func:`ckpt.store.create`.

    Examples
    --------
    >>> @hookimpl
    ... def ckpt_register_tasks(register):
    ...     register("modular-addition", ModularAddition())
    """


__all__ = [
    "PROJECT",
    "ckpt_register_analyzers",
    "ckpt_register_importers",
    "ckpt_register_objectives",
    "ckpt_register_tasks",
    "hookimpl",
    "hookspec",
]
