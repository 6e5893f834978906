"""How to rebuild the model of a run: :class:`ModelSpec`, a trusted factory and its config, checked before it runs.

Re-exported by :mod:`ckpt.store.reader`, where it was first defined (:attr:`Store.model` gives one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt.errors import StoreError
from ckpt.runtime import collection_paused
from ckpt.store.format import current_factory
from ckpt.store.model_build import build_model, check_model, model_on_meta
from ckpt.store.selection import TensorSelection
from ckpt.store.trust import check_trusted, trust_reason


@dataclass(frozen=True)
class ModelSpec:
    """How to rebuild the model of a run: an importable factory and its JSON config."""

    factory: str
    """``"package.module:function"``; called as ``function(**config)``."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the factory (JSON-serialisable)."""
    source: str = field(default="", compare=False)
    """The store the spec was read from (named in errors)."""
    checkpoint: Mapping[str, tuple[Any, ...]] | None = field(default=None, compare=False, repr=False)
    """Tensor name -> (shape, bytes) of one of the store's checkpoints: the model built must fit it.

    :attr:`Store.model` sets it (with each tensor's logical dtype, a third entry); None (a spec made to
    train a model) checks the config's schema only.
    """
    selection: TensorSelection | None = field(default=None, compare=False, repr=False)
    """The store's tensor selection (``ckpt import --tensors``): ``checkpoint`` is that subset of the model's."""

    def build(self) -> Any:
        """Import the factory and call it with the config; returns the model.

        The factory must be trusted (:mod:`ckpt.store.trust`): it is checked
        before its module is imported, since importing runs code. A factory
        named by an older ckpt is imported under its current name
        (:data:`ckpt.store.format.RENAMED_FACTORIES`). The config is data: it is
        checked against the factory's schema (:mod:`ckpt.store.factory_config`)
        and, for a spec read from a store, the model is built on torch's ``meta``
        device first and compared with the stored tensors, its own buffers bounded
        by the stored bytes, before anything is allocated (:mod:`ckpt.store.model_build`).

        Raises
        ------
        UntrustedFactoryError
            The factory is neither ckpt's, nor an installed plugin package's, nor allowed by the user.
        StoreError
            The factory cannot be imported.
        ModelConfigError
            The config does not fit the factory or the checkpoints, or the factory failed.
        """
        check_trusted(self.factory, self.source or "the model spec")
        with collection_paused():  # imports its library (transformers: seconds); see ckpt.runtime
            factory = self._import()
            name, where = current_factory(self.factory), self.source or "the model spec"
            return build_model(factory, self.config, name, where, self.checkpoint, self.selection)

    def check(self) -> bool:
        """Check the spec as :meth:`build` does, allocating nothing: whether it could be checked.

        The factory's schema, then the model built on ``meta`` and compared with the stored
        tensors (``ckpt verify`` uses this). False when the factory is not trusted (its code is
        never imported to check it), or when its code cannot run on ``meta``.

        Raises
        ------
        StoreError
            A trusted factory that cannot be imported.
        ModelConfigError
            The config does not fit the factory or the checkpoints, or the factory failed.
        """
        if trust_reason(self.factory) is None or self.checkpoint is None:
            return False
        with collection_paused():
            factory = self._import()
            name, where = current_factory(self.factory), self.source or "the model spec"
            return check_model(factory, self.config, name, where, self.checkpoint, self.selection)

    def on_meta(self) -> Any:
        """The model as :meth:`check` builds it on ``meta``: modules, names, shapes and dtypes, no values.

        For looking the model's structure up without allocating it, on a store imported with
        ``--tensors`` too (only its stored tensors are compared). None when the spec records no
        checkpoint or its factory's code cannot run on ``meta``.

        Raises
        ------
        UntrustedFactoryError, StoreError, ModelConfigError
            As :meth:`build`.
        """
        check_trusted(self.factory, self.source or "the model spec")
        if self.checkpoint is None:
            return None
        with collection_paused():
            factory = self._import()
            name, where = current_factory(self.factory), self.source or "the model spec"
            return model_on_meta(factory, self.config, name, where, self.checkpoint, self.selection)

    def _import(self) -> Callable[..., Any]:
        module_name, _, attr = current_factory(self.factory).partition(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            msg = f"cannot import the model factory {self.factory!r} ({exc}); install the package that defines it"
            top = module_name.split(".")[0]
            here = Path.cwd()
            missing = isinstance(exc, ModuleNotFoundError) and exc.name == top
            if missing and ((here / f"{top}.py").is_file() or (here / top).is_dir()):
                # the ckpt command does not put the current folder on Python's path, as `python -c` would
                msg += f" (pip install -e .), or put this folder on Python's path: PYTHONPATH={here}"
            raise StoreError(msg) from exc


__all__ = ["ModelSpec"]
