"""Python's cyclic garbage collector, kept out of ckpt's start-up and exit.

Importing torch, transformers, dask, xarray and zarr creates about 750,000 objects that live
as long as the process, and every full collection while they are being created walks all of
them again; the interpreter's exit collects them once more. Neither finds garbage worth the
time, which is most of a command's start-up and exit (docs/performance.md, "Start-up and imports").

So imports and model building (:meth:`ckpt.store.ModelSpec.build`: the factory's import and
call) run with the collector paused (:func:`collection_paused`,
harmless in any process: it is turned back on as it was), and the ``ckpt`` console script
freezes every object at exit (``gc.freeze`` as an ``atexit`` handler, :func:`ckpt.cli.main.main`:
its own process only, never a notebook or a test process that goes on running). Objects are
still freed by reference counting then; only those in reference cycles are left to the
operating system, as at ``os._exit``, so a file must be closed by whoever wrote it (ckpt writes
through ``with`` blocks and zarr, which close theirs). The computation itself runs with the
collector as the user has it: the graphs it builds must be freed as they are let go.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

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


__all__ = ["collection_paused"]
