"""Training sandboxes (the papers', their particle simulation, text), registered as ``ckpt_register_tasks`` plugins.

- ``sparse-modular-addition`` (Clustering Head): a d=2 transformer on sparse modular addition.
- ``modular-addition`` (Clustering and Alignment): 2-D embeddings, constant attention, an MLP.
- ``particles`` (Clustering and Alignment): the embeddings alone, moved by pair-sum forces.
- ``addition`` (Hidden Breakthroughs): a decoder-only transformer on 3-digit addition.
- ``tiny-lm``: a word-level causal LM on a bundled public-domain English text (the text path).

Each trains with an ordinary PyTorch loop (:func:`ckpt.sandboxes.base.train`) and
writes through the public store writer. Imports point down: sandboxes →
plugins → store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ckpt.plugins import hookimpl
from ckpt.plugins.tasks import LazyTask

TASKS = {
    "sparse-modular-addition": (
        "ckpt.sandboxes.sparse_modular_addition:SparseModularAddition",
        "Clustering Head: a d=2 one-query transformer learns (x_1+...+x_k) mod p among L tokens.",
    ),
    "modular-addition": (
        "ckpt.sandboxes.modular_addition:ModularAddition",
        "(a+b) mod N on unordered pairs: 2-D embeddings, constant attention (E[a]+E[b]), a ReLU MLP.",
    ),
    "addition": (
        "ckpt.sandboxes.addition:Addition",
        "3-digit addition a+b= with a decoder-only transformer; loss on the 4 answer digits.",
    ),
    "particles": (
        "ckpt.sandboxes.particles:Particles",
        "Clustering and Alignment's particle simulation: N embeddings moved by pair-sum forces.",
    ),
    "tiny-lm": (
        "ckpt.sandboxes.tiny_lm:TinyLM",
        "Word-level causal LM on a bundled public-domain English text (Grimms' Fairy Tales).",
    ),
}
"""name -> (the Task class, its one-line description); a test checks the descriptions against the classes."""


@hookimpl
def ckpt_register_tasks(register: Callable[[str, Any], None]) -> None:
    """Register the sandboxes lazily: their modules import torch, which listing them must not."""
    for name, (target, description) in TASKS.items():
        register(name, LazyTask(name, target, description))


__all__ = ["TASKS", "ckpt_register_tasks"]
