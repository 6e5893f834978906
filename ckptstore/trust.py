"""Which model factories a store may make ckpt run: a store is data, its factory is code.

Analyzers rebuild a run's model by importing and calling the factory the store
names (``"package.module:function"`` with the store's config as keyword
arguments). Stores travel between people, so a factory is run only when it is
trusted, in the spirit of ``trust_remote_code`` in the Hugging Face ecosystem:

1. factories of ckpt itself (``ckpt.*``, and the old names of its sandboxes);
2. factories in a package installed by a distribution that registers ckpt
   plugins (an entry point in the ``ckpt`` group): installing it was the
   user's decision to run its code;
3. whatever the user allowed: ``ckpt analyze --trust-factory PATTERN`` or the
   setting ``CKPT_TRUSTED_FACTORIES`` (comma-separated patterns, in the
   environment, so that worker processes inherit it). A pattern is a module
   (trusting it and its submodules), a ``module:function``, or ``*``.

Anything else is refused with :class:`ckpt.errors.UntrustedFactoryError` before
its module is imported: importing a module runs its code.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re

from ckpt.errors import UntrustedFactoryError
from ckpt.store.format import RENAMED_FACTORIES, current_factory

TRUST_ENV = "CKPT_TRUSTED_FACTORIES"
"""Environment variable holding the user's trusted factory patterns, comma-separated."""

PLUGIN_GROUP = "ckpt"
"""Entry-point group of ckpt plugins (the plugin host's ``PROJECT``)."""


def allowed_patterns() -> list[str]:
    """The patterns the user allowed (``CKPT_TRUSTED_FACTORIES``), in order."""
    return [p.strip() for p in os.environ.get(TRUST_ENV, "").split(",") if p.strip()]


def allow(*patterns: str) -> None:
    """Trust factories matching ``patterns`` in this process and the worker processes it starts.

    Parameters
    ----------
    *patterns
        Modules (``"mypkg.models"``), ``"module:function"`` names, or ``"*"`` (everything).
    """
    for pattern in patterns:
        if not re.fullmatch(r"\*|[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?", pattern.strip()):
            msg = f"--trust-factory {pattern!r} is not a module, a module:function or '*'"
            raise UntrustedFactoryError(msg)
    merged = list(dict.fromkeys([*allowed_patterns(), *(p.strip() for p in patterns)]))
    os.environ[TRUST_ENV] = ",".join(merged)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=1)
def _plugin_packages() -> dict[str, str]:
    """Top-level import names of installed distributions with ckpt plugins -> the distribution's name."""
    with_plugins = {
        _normalized(ep.dist.name) for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.dist is not None
    }
    packages: dict[str, str] = {}
    for top, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            if _normalized(dist) in with_plugins:
                packages.setdefault(top, dist)
    return packages


def trust_reason(factory: str) -> str | None:
    """Why ``factory`` may be run, in words, or None when it is not trusted."""
    name = current_factory(factory)
    module = name.partition(":")[0]
    if module == "ckpt" or module.startswith("ckpt."):
        return "part of ckpt" if factory not in RENAMED_FACTORIES else f"part of ckpt (now {name})"
    for pattern in allowed_patterns():
        if pattern == "*" or name == pattern or module == pattern or module.startswith(f"{pattern}."):
            return f"allowed by {TRUST_ENV}={pattern}"
    dist = _plugin_packages().get(module.split(".")[0])
    if dist is not None:
        return f"from {dist}, an installed ckpt plugin package"
    return None


def check_trusted(factory: str, where: str) -> None:
    """Raise :class:`UntrustedFactoryError` unless ``factory`` may be run (see the module docs)."""
    if trust_reason(factory) is not None:
        return
    pattern = factory.partition(":")[0]
    msg = (
        f"{where} names the model factory {factory!r}, which is neither part of ckpt nor of an installed "
        f"ckpt plugin package; rebuilding the model would run that code. If you trust this store, allow it: "
        f"--trust-factory {pattern} (or {TRUST_ENV}={pattern}, or ckpt.store.allow({pattern!r}) in Python)"
    )
    raise UntrustedFactoryError(msg)
