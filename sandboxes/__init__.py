"""Training sandboxes (three from the seed papers, one for text), registered as ``ckpt_register_tasks`` plugins.

- ``sparse-modular-addition`` (Clustering Head): a d=2 transformer on sparse modular addition.
- ``modular-addition`` (Clustering and Alignment): 2-D embeddings, constant attention, an MLP.
- ``addition`` (Hidden Breakthroughs): a decoder-only transformer on 3-digit addition.
- ``tiny-lm``: a word-level causal LM on a bundled public-domain English text (the text path).

Each trains with an ordinary PyTorch loop (:func:`sandboxes.base.train`) and
writes through the public ckptstore writer. Imports point down: sandboxes →
plugins → ckptstore.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from plugins.hookspecs import hookimpl

TASK_MODULES = {
    "sparse-modular-addition": "sandboxes.sparse_modular_addition:SparseModularAddition",
    "modular-addition": "sandboxes.modular_addition:ModularAddition",
    "addition": "sandboxes.addition:Addition",
    "tiny-lm": "sandboxes.tiny_lm:TinyLM",
}


@hookimpl
def ckpt_register_tasks(register: Callable[[str, Any], None]) -> None:
    """Register the sandboxes (imported here, so that importing ckpt stays cheap)."""
    for name, target in TASK_MODULES.items():
        module_name, _, attr = target.partition(":")
        register(name, getattr(importlib.import_module(module_name), attr)())
