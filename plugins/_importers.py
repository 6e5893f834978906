"""Importers of existing runs, as plugins: the built-in torch, safetensors and HF formats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt.plugins.hookspecs import hookimpl


@dataclass(frozen=True)
class Importer:
    """A source format ``ckpt import --format NAME`` understands.

    Attributes
    ----------
    description
        One line for ``ckpt plugins``.
    run
        ``run(src, dest, **options)`` imports ``src`` into a new store ``dest``.
    """

    description: str
    run: Callable[..., Any]


def _builtin(format_name: str) -> Callable[..., Any]:
    def run(src: str, dest: str, **options: Any) -> Any:
        from ckpt.store.importers import import_checkpoints

        return import_checkpoints(src, dest, format=format_name, **options)

    return run


@hookimpl
def ckpt_register_importers(register: Callable[[str, Importer], None]) -> None:
    """Register the importers that ship with ckpt.store."""
    register("torch", Importer("a folder of torch .pt/.pth/.bin/.ckpt (Lightning) state_dicts", _builtin("torch")))
    register("safetensors", Importer("a folder of .safetensors files", _builtin("safetensors")))
    register(
        "hf",
        Importer(
            "Hugging Face Trainer checkpoint-N/ folders (sharded or not), with their model, objective and log",
            _builtin("hf"),
        ),
    )
