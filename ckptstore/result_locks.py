"""The locks of a store's results: one writer per result, and none while the store is replaced.

:func:`result_lock` holds ``.locks/analyses/<name>`` (and the store-wide lock ``.locks/store``
shared); :func:`store_lock` holds the store-wide lock, shared by result writers, exclusively by
one replacing the whole store. :class:`~ckpt.store.results.ResultSink` holds a result's lock for
as long as it writes. Re-exported by :mod:`ckpt.store.results`, where they were first defined.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ckpt.errors import InvalidNameError, StoreLockedError
from ckpt.store import _zarr
from ckpt.store.format import ANALYSES, LOCKS, check_name

STORE_LOCK = "store"
"""``.locks/store``: held shared by every process writing a result, exclusively by one replacing the store."""
_STORE_LOCK_TRIES = 20
"""Non-blocking tries, 50 ms apart, for a shared store lock: a last shared holder holds it exclusively
for the instant it takes to remove the file; a replacement holds it for minutes, and is refused."""


_REPLACING: set[Any] = set()
"""Local stores this process holds the store-wide lock of exclusively: its own result writes (``ckpt repair``
dropping results) need no shared lock there, and would be refused by their own process's lock."""


class _ExclusiveStoreLock(_zarr.FileLock):
    def __init__(self, root: Path, key: Any) -> None:
        super().__init__(root, f"{LOCKS}/{STORE_LOCK}", LOCKS)
        self._key = key

    def release(self) -> None:
        _REPLACING.discard(self._key)
        super().release()


def store_lock(path: str | os.PathLike[str], *, exclusive: bool) -> _zarr.FileLock:
    """Take the store-wide lock ``.locks/store`` of a local store (a no-op lock for a URL), held; release it.

    Shared by every process that writes a result (``ckpt analyze``, ``ckpt rm``, through
    :func:`result_lock`), exclusive for one that replaces the whole store (``ckpt import`` or
    ``ckpt create`` with ``--overwrite``, ``ckpt repair``): a result computed from the old store
    must never be committed into the new one, with the old one's provenance. Neither side waits:
    whichever comes second is refused with :class:`StoreLockedError`.
    """
    import time

    local = _zarr.local_path(path)
    key = None if local is None else local.resolve()
    if local is None or (not exclusive and key in _REPLACING):
        return _zarr.FileLock(None)
    lock: _zarr.FileLock
    if exclusive:
        lock = _ExclusiveStoreLock(local, key)
        busy = (
            f"an analysis is being computed or removed in {path} by another process; it cannot be replaced "
            "until that finishes: wait for it (or stop it), then run again"
        )
        lock.acquire(blocking=False, busy_message=busy)
        _REPLACING.add(key)
        return lock
    lock = _zarr.FileLock(local, f"{LOCKS}/{STORE_LOCK}", LOCKS, shared=True)
    busy = (
        f"{path} is being replaced by another process (ckpt import or create with --overwrite, or ckpt repair); "
        "run again once it is done"
    )
    for _ in range(_STORE_LOCK_TRIES - 1):
        try:
            lock.acquire(blocking=False, busy_message=busy)
            return lock
        except StoreLockedError:
            time.sleep(0.05)
    lock.acquire(blocking=False, busy_message=busy)
    return lock


class ResultLock:
    """The lock of one result, taken when made, with the store-wide lock held shared beneath it.

    What :func:`result_lock` and :class:`~ckpt.store.results.ResultSink` hold; see there.
    """

    def __init__(self, path: str | os.PathLike[str], name: str, *, blocking: bool) -> None:
        problem = check_name(name, "analysis")
        if problem:
            raise InvalidNameError(problem)
        lock = _zarr.FileLock(_zarr.local_path(path), f"{LOCKS}/{ANALYSES}/{name}", LOCKS)
        busy = (
            f"analysis {name!r} of {path} is being computed by another process; wait for it to finish "
            "(or stop it), then run again"
        )
        self._whole = store_lock(path, exclusive=False)
        try:
            lock.acquire(blocking=blocking, busy_message=busy)
        except BaseException:
            self._whole.release()
            raise
        self._lock: _zarr.FileLock | None = lock

    def release(self) -> None:
        """Let go of both locks (again: a no-op)."""
        if self._lock is None:
            return
        lock, self._lock = self._lock, None
        try:
            lock.release()
        finally:
            self._whole.release()


@contextlib.contextmanager
def result_lock(path: str | os.PathLike[str], name: str, *, blocking: bool = False) -> Iterator[None]:
    """Hold the lock of result ``name``: one process writes a result at a time (what :class:`ResultSink` holds).

    An advisory ``flock`` on the lock file ``.locks/analyses/<name>`` of a local store
    (:class:`~ckpt.store._zarr.FileLock`), not on the result's folder, which is made anew when
    the result is replaced. Without ``blocking`` (``ckpt analyze``, ``ckpt rm``), a second
    process gets :class:`StoreLockedError` instead of interleaving its blocks with the first
    one's; with it (a journal's pieces, committed by parallel tasks) it waits its turn. Results
    of other names are not held up. A crashed holder never leaves a stale lock (the kernel
    releases it). The store-wide lock is held shared meanwhile (:func:`store_lock`), so that the
    store is not replaced under the result. Remote stores have no lock: there the user must make
    sure one process writes a result at a time.
    """
    lock = ResultLock(path, name, blocking=blocking)
    try:
        yield
    finally:
        lock.release()


__all__ = ["STORE_LOCK", "ResultLock", "result_lock", "store_lock"]
