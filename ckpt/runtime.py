"""Process-wide tuning of the interpreter and the C library: the garbage collector and glibc's allocator.

Both are settings of the whole process, which every layer of ckpt shares (the store builds
models, the engine runs computations, the ``ckpt`` command starts and exits), so they live
here at the root, beneath every layer, rather than in one of them.

**The cyclic garbage collector.** Importing torch, transformers, dask, xarray and zarr creates
about 750,000 objects that live as long as the process, and every full collection while they
are being created walks all of them again; the interpreter's exit collects them once more.
Neither finds garbage worth the time, which is most of a command's start-up and exit
(docs/performance.md, "Start-up and imports").

So imports and model building (:meth:`ckpt.store.ModelSpec.build`: the factory's import and
call) run with the collector paused (:func:`collection_paused`,
harmless in any process: it is turned back on as it was), and the ``ckpt`` console script
freezes every object at exit (``gc.freeze`` as an ``atexit`` handler, :func:`ckpt.cli.main.main`:
its own process only, never a notebook or a test process that goes on running). Objects are
still freed by reference counting then; only those in reference cycles are left to the
operating system, as at ``os._exit``, so a file must be closed by whoever wrote it (ckpt writes
through ``with`` blocks and zarr, which close theirs). The computation itself runs with the
collector as the user has it: the graphs it builds must be freed as they are let go.

**glibc's allocator.** ckpt's computations run on worker threads and free large tensors
between phases: :func:`use_one_heap` gives every thread glibc's one main heap,
:func:`freed_memory_kept_for_reuse` keeps freed blocks for the next allocations while a
computation that reuses them runs, and :func:`release_freed_memory` gives the freed memory
back where a phase ends. Each is a no-op where the C library is not glibc, or where the user
set glibc's allocator in the environment (:data:`GLIBC_MALLOC_VARIABLES`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
from collections.abc import Callable, Iterator

_lock = threading.Lock()
_pauses = 0
_enable_after = False


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Run the block with the cyclic garbage collector off, then turn it back on if it was on.

    Re-entrant and shared by threads: the collector comes back when the last block that paused
    it ends. Wrap imports and model building, never a computation.
    """
    global _pauses, _enable_after
    with _lock:
        if _pauses == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _enable_after:
                gc.enable()


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


__all__ = [
    "GLIBC_MALLOC_VARIABLES",
    "collection_paused",
    "freed_memory_kept_for_reuse",
    "release_freed_memory",
    "use_one_heap",
]
