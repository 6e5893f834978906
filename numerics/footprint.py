"""How much memory a torch computation allocates, counted op by op: how analyzers size their blocks.

:func:`peak_bytes` and :func:`held_bytes` run a computation once under a torch dispatch mode
and add up the storages its ops allocate; the engine's memory budget
(:mod:`ckpt.engine.memory`) is what the counts are held against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["held_bytes", "peak_bytes"]


def peak_bytes(run: Callable[[], object]) -> int:
    """Most bytes held at once by the tensors that ``run()`` allocates, op by op (any device).

    A torch dispatch mode sees every aten op ``run`` executes, including those
    that ``torch.func.vmap`` and ``jvp`` lower their batched and dual tensors to;
    it adds up the storages each op allocates (outputs that alias an input, views
    and in-place ops, allocate nothing) and subtracts each when it is freed. The
    tensors that existed before (parameters, data) are not counted; nor are an
    op's internal workspaces, which the callers' margins cover. Deterministic:
    unlike the process's RSS it does not depend on the allocator or on what
    other threads do, and it needs no CUDA.

    Parameters
    ----------
    run
        The computation to measure, called once (in this thread).
    """
    return _count_allocations(run)[0]


def held_bytes(run: Callable[[], object]) -> int:
    """Bytes that the tensors ``run()`` allocated still hold when it returns, its result kept alive.

    Counted as :func:`peak_bytes` counts them: e.g. an autograd graph built with
    ``create_graph=True`` (its saved tensors and the gradients), measured while
    the gradients that reference it exist. The result is dropped afterwards.
    """
    return _count_allocations(run)[1]


def _count_allocations(run: Callable[[], object]) -> tuple[int, int]:
    """(peak, held at the end with the result alive) bytes of the storages ``run()`` allocates."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    held: dict[int, int] = {}  # id of a live storage we counted -> its bytes
    live = peak = 0

    def freed(key: int) -> None:
        nonlocal live
        live -= held.pop(key, 0)

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            nonlocal live, peak
            out = func(*args, **(kwargs or {}))
            returns = func._schema.returns
            for index, tensor in enumerate(tree_leaves(out)):
                aliased = index < len(returns) and returns[index].alias_info is not None
                if not isinstance(tensor, torch.Tensor) or aliased:
                    continue
                storage = tensor.untyped_storage()
                if id(storage) in held:
                    continue
                held[id(storage)] = storage.nbytes()
                live += storage.nbytes()
                weakref.finalize(storage, freed, id(storage))
            peak = max(peak, live)
            return out

    with _Count():
        result = run()
    at_end = live
    del result
    return peak, at_end
