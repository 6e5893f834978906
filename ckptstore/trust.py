"""Which model factories a store may make ckpt run: a store is data, its factory is code.

Analyzers rebuild a run's model by importing and calling the factory the store
names (``"package.module:function"`` with the store's config as keyword
arguments). Stores travel between people, so a factory is run only when it is
trusted, in the spirit of ``trust_remote_code`` in the Hugging Face ecosystem:

1. *registered* factories: each ``module:function`` that an installed
   distribution declares in the ``ckpt.factories`` entry-point group
   (:data:`FACTORY_GROUP`). ckpt declares its own sandboxes' and the Hugging Face
   importer's factories there, exactly as a third-party plugin package declares
   its models. Only the exact function named is trusted, never the rest of its
   module or package: ``ckpt.cli.main:cli`` is ckpt's code but no factory, so a
   store cannot make ckpt call it.
2. whatever the user allowed: ``ckpt analyze --trust-factory PATTERN`` or the
   setting ``CKPT_TRUSTED_FACTORIES`` (comma-separated patterns, in the
   environment, so that worker processes inherit it). A pattern is a module
   (trusting it and its submodules), a ``module:function``, or ``*``.

The factory names of stores written by ckpt 0.1 are mapped to their current
names first (:data:`ckpt.store.format.RENAMED_FACTORIES`). Anything else is
refused with :class:`ckpt.errors.UntrustedFactoryError` before its module is
imported: importing a module runs its code. Deciding reads distribution
metadata only; it imports no plugin.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re

from ckpt.errors import UntrustedFactoryError
from ckpt.store.format import FACTORY_RE, RENAMED_FACTORIES, current_factory

TRUST_ENV = "CKPT_TRUSTED_FACTORIES"
"""Environment variable holding the user's trusted factory patterns, comma-separated."""

FACTORY_GROUP = "ckpt.factories"
"""Entry-point group in which a distribution registers its model factories (``name = "module:function"``)."""

_PATTERN_RE = re.compile(r"\*|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?")


def allowed_patterns() -> list[str]:
    """The patterns the user allowed (``CKPT_TRUSTED_FACTORIES``), in order."""
    return [p.strip() for p in os.environ.get(TRUST_ENV, "").split(",") if p.strip()]


def allow(*patterns: str) -> None:
    """Trust factories matching ``patterns`` in this process and the worker processes it starts.

    Parameters
    ----------
    *patterns
        Modules (``"mypkg.models"``), ``"module:function"`` names, or ``"*"`` (everything).

    Raises
    ------
    UntrustedFactoryError
        A pattern is none of these.
    """
    for pattern in patterns:
        if not _PATTERN_RE.fullmatch(pattern.strip()):
            msg = f"--trust-factory {pattern!r} is not a module, a module:function or '*'"
            raise UntrustedFactoryError(msg)
    merged = list(dict.fromkeys([*allowed_patterns(), *(p.strip() for p in patterns)]))
    os.environ[TRUST_ENV] = ",".join(merged)


@functools.lru_cache(maxsize=1)
def registered_factories() -> dict[str, str]:
    """Every registered model factory -> who registered it, in words.

    Read from the ``ckpt.factories`` entry points of the installed distributions
    (metadata only: nothing is imported). An entry whose value is not a plain
    ``module:function`` is ignored: it could not be what a store names.
    """
    found: dict[str, str] = {}
    for entry in importlib.metadata.entry_points(group=FACTORY_GROUP):
        if not FACTORY_RE.fullmatch(entry.value):
            continue
        dist = entry.dist
        who = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
        found.setdefault(entry.value, f"registered by {who} (entry point {entry.name!r} in {FACTORY_GROUP})")
    return found


def trust_reason(factory: str) -> str | None:
    """Why ``factory`` may be run, in words (the rule that trusts it), or None when it is not trusted."""
    if not isinstance(factory, str) or not FACTORY_RE.fullmatch(current_factory(factory)):
        return None
    name = current_factory(factory)
    module = name.partition(":")[0]
    registered = registered_factories().get(name)
    if registered is not None:
        return registered if factory not in RENAMED_FACTORIES else f"{registered}; recorded as {factory}"
    for pattern in allowed_patterns():
        if pattern == "*" or name == pattern or module == pattern or module.startswith(f"{pattern}."):
            return f"allowed by {TRUST_ENV}={pattern}"
    return None


def check_trusted(factory: str, where: str) -> None:
    """Raise :class:`UntrustedFactoryError` unless ``factory`` may be run (see the module docs)."""
    if trust_reason(factory) is not None:
        return
    name = current_factory(factory)
    if not isinstance(factory, str) or not FACTORY_RE.fullmatch(name):
        msg = f"{where} names the model factory {factory!r}, which is not a 'package.module:function' name"
        raise UntrustedFactoryError(msg)
    module = name.partition(":")[0]
    msg = (
        f"{where} names the model factory {factory!r}, which is not a registered model factory (none of the "
        f"installed packages declares it in the {FACTORY_GROUP!r} entry points); rebuilding the model would run "
        f"that code. If you trust this store, allow it: --trust-factory {name} (or {TRUST_ENV}={name}, or "
        f"ckpt.store.allow({name!r}) in Python; the module, {module}, allows all of it)"
    )
    raise UntrustedFactoryError(msg)


__all__ = [
    "FACTORY_GROUP",
    "TRUST_ENV",
    "allow",
    "allowed_patterns",
    "check_trusted",
    "registered_factories",
    "trust_reason",
]
