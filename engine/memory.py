"""The memory budget (``--max-memory``): one engine setting from which analyzers size their blocks.

The engine resolves the budget once per run (a size the user gives, else a
share of what the machine has free) and divides it among the tasks that run at
the same time on this machine; each task reads its share as
:attr:`ckpt.plugins.Worker.memory_budget`. An analyzer estimates its peak
before computing and either fits its blocks into that share or raises one
:class:`ckpt.errors.AnalysisError` naming the knob to turn.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator

from ckpt.errors import AnalysisError

__all__ = [
    "DEFAULT_SHARE",
    "GPU_SHARE",
    "default_budget",
    "format_size",
    "freed_memory_kept_for_reuse",
    "parse_size",
    "release_freed_memory",
    "use_one_heap",
]

DEFAULT_SHARE = 0.5
"""Share of the RAM available when a run starts that it may use by default: the rest is left to the
Python process itself (about 0.5 GiB of libraries), the page cache (the store's chunks), the Dask
scheduler and whatever else runs. A larger share let hessian-basis at GPT-2 small peak well above its plan
before its graph estimate was corrected (docs/performance.md, "Memory and the allocator")."""
GPU_SHARE = 0.8
"""Share of a CUDA device's free memory a run may use by default (the CUDA context and the caching
allocator's fragmentation take the rest)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str | int | float) -> int:
    """Bytes of a size such as ``12GiB``, ``500MB``, ``8g`` or ``4e9``.

    Raises
    ------
    AnalysisError
        When ``text`` is not a positive, finite size.
    """
    if isinstance(text, bool):
        text = str(text)
    if isinstance(text, int | float):
        number, unit = (float(text) if abs(text) < 2**1000 else math.inf), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        if match is None or match.group(2).lower() not in _UNITS:
            msg = f"--max-memory must be a size such as 8GiB, 12GB or 500MiB, got {text!r}"
            raise AnalysisError(msg)
        number, unit = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(number * _UNITS[unit]):  # 1e400 reads as infinity: no budget at all
        msg = f"--max-memory must be a finite size such as 8GiB, 12GB or 500MiB, got {text!r}"
        raise AnalysisError(msg)
    size = int(number * _UNITS[unit])
    if size <= 0:
        msg = f"--max-memory must be positive, got {text!r}"
        raise AnalysisError(msg)
    return size


def format_size(size: float) -> str:
    """``size`` bytes for a message: ``1.5 GiB``, ``300 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{int(size)} B"


def default_budget(device: str = "cpu") -> int:
    """:data:`GPU_SHARE` of the CUDA device's free memory, or :data:`DEFAULT_SHARE` of available RAM."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(GPU_SHARE * free)
    import psutil

    return int(DEFAULT_SHARE * psutil.virtual_memory().available)


def release_freed_memory() -> None:
    """Give the memory that freed tensors left in the C allocator's heap back to the system (glibc only).

    Tensors below glibc's mmap threshold (which rises to 32 MB as large blocks are freed) live in
    its heap, and freeing them does not shrink the process: the next phase's large tensors are
    mapped anew beside what the heap keeps: at GPT-2 small ``malloc_trim(0)`` gave back most of
    what freed autograd graphs left, without which hessian-basis' second basis checkpoint started
    gigabytes above its first (docs/performance.md, "Memory and the allocator"). A no-op where the
    C library is not glibc.

    glibc also gives each thread its own heap (arena) and keeps what a thread freed there for
    that thread's next allocations. Threads taking turns at the computation slot each kept the
    activations of their last turn, and ``grad-norms`` on two threads peaked well above a plain
    PyTorch loop, where one heap or one thread did not (docs/performance.md, "Memory and the
    allocator"). So each turn ends with this too, which is cheap beside a turn's computation.

    Where this process has used CUDA, the blocks torch's caching allocator keeps free are given
    back to the device too (``torch.cuda.empty_cache``): freed blocks are split for later, smaller
    tensors, and a block of the old size no longer fits in what is left: without this, hessian-basis
    on a GPU nearly doubled what it held from its third basis checkpoint on (docs/performance.md,
    "Memory and the allocator"). It is called where a phase ends
    (a basis checkpoint, a run), not after each turn on a GPU, where freed blocks are what make the
    next turn's allocations cheap.

    While :func:`freed_memory_kept_for_reuse` holds, the heap is not trimmed: its freed pages are what
    the next allocations are to reuse. It is trimmed when the last use leaves.
    """
    trim = _glibc_function("malloc_trim")
    if trim is not None and _kept_depth == 0:  # a lock would not help: a use may begin right after either way
        trim(0)
    torch = sys.modules.get("torch")  # never imported here: a process that has not used torch has no cache
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


GLIBC_MALLOC_VARIABLES = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_ARENA_TEST",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_TRIM_THRESHOLD_",
)
"""Environment variables by which a user sets glibc's allocator: when one is set, ckpt leaves it alone."""

_M_TRIM_THRESHOLD = -1  # the parameters of glibc's mallopt (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_GLIBC_MMAP_MAX = 65536  # glibc's default count of mapped blocks (DEFAULT_MMAP_MAX)


def use_one_heap() -> bool:
    """Make every thread allocate from glibc's one main heap (``M_ARENA_MAX`` 1); call before any thread exists.

    glibc gives each thread a heap (arena) of its own, of at most 64 MiB per piece, and maps any larger
    block afresh; it does so even with mmap turned off (:func:`freed_memory_kept_for_reuse`). ckpt's
    computations run on worker threads, so their large blocks could only be kept for reuse in the main
    heap. It also keeps a thread's freed memory from waiting in that thread's heap for its next turn
    (:func:`release_freed_memory`). Called first thing in the ``ckpt`` console script
    (``ckpt.cli.main.main``): glibc's setting holds for the threads started after it.

    Returns
    -------
    bool
        Whether it was set: False where the C library is not glibc, or a user set glibc's allocator
        themselves (any of :data:`GLIBC_MALLOC_VARIABLES`; ``MALLOC_ARENA_MAX=0`` is glibc's default).
    """
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_ARENA_MAX, 1) == 1


_kept_lock = threading.Lock()
_kept_depth = 0


@contextlib.contextmanager
def freed_memory_kept_for_reuse() -> Iterator[None]:
    """Within: glibc maps no block afresh and gives nothing back by itself; freed blocks wait for reuse.

    glibc maps every block above its mmap threshold (at most 32 MiB) afresh and unmaps it when freed,
    and shrinks its heap once the free top passes the trim threshold. A Hessian-vector product at
    GPT-2 small allocates and frees about 2 GB of such blocks (logits-sized tensors of 0.2 GB, the
    embedding's share of the product), so the kernel mapped and zeroed ~2 GB of fresh pages for every
    product. With no mmap, one heap (:func:`use_one_heap`) and no trimming, the freed blocks are
    reused: a fraction of the page faults and system time, and faster products (docs/analyzers.md,
    "hessian-basis"; docs/performance.md, "Memory and the allocator").

    It is kept to the computations it was measured on: hessian-basis's whole run, where the engine
    holds it (:attr:`ckpt.plugins.Analyzer.keeps_freed_memory`), and each search within it. Process-wide,
    it raised ``grad-norms``' peak memory well above a plain PyTorch loop's, where kept to the search
    it did not, because blocks of many sizes could no longer go back between uses. Why the whole run
    and not each search alone, as before: each basis checkpoint builds its graphs and fills its Lanczos
    vectors in memory the last one freed, and trimmed between them every page of it was faulted in
    afresh; kept for the run, the page faults and system time fell by more than half at about the
    same peak (docs/performance.md, "Memory and the allocator").

    Nested and concurrent uses hold the setting until the last one leaves, and the heap is not
    trimmed while one holds it (:func:`release_freed_memory`). When the last leaves, glibc's
    thresholds become what its own adjustment reaches once a large block has been freed (mmap above
    32 MiB, trim above 64 MiB), and the heap is trimmed. Nothing changes where the C library is not
    glibc, or where a user set glibc's allocator (:data:`GLIBC_MALLOC_VARIABLES`).
    """
    global _kept_depth
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    with _kept_lock:
        _kept_depth += 1
        if _kept_depth == 1:
            mallopt(_M_MMAP_MAX, 0)
            mallopt(_M_TRIM_THRESHOLD, -1)  # an int: glibc converts -1 to the largest size_t, "never"
    try:
        yield
    finally:
        with _kept_lock:
            _kept_depth -= 1
            last = _kept_depth == 0
            if last:
                mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
                mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)
                mallopt(_M_TRIM_THRESHOLD, 64 * 2**20)
        if last:  # a use still inside keeps what was freed for its own next allocations
            release_freed_memory()


def _mallopt() -> Callable[..., int] | None:
    """Glibc's ``mallopt``, or None where there is none or the user set glibc's allocator in the environment."""
    import os

    if any(name in os.environ for name in GLIBC_MALLOC_VARIABLES):
        return None
    return _glibc_function("mallopt")


@functools.cache
def _glibc_function(name: str) -> Callable[..., int] | None:
    """The C function ``name`` among the process's own symbols, looked up once (None where it is not there)."""
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):  # no such symbol (musl, macOS), or no CDLL(None) (Windows)
        return None
