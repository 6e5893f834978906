"""Waiting, cheaply, for a store's commit record to change: what a follower does between checkpoints.

A writer commits by replacing the root ``zarr.json`` (docs/store-format.md §4), so that one
object is all a follower has to watch. :class:`RecordWatch` wakes when it may have changed:

- a local store: file-system notifications on the store's folder (``watchfiles``, inotify,
  FSEvents or ReadDirectoryChangesW), checked against the record's ``stat`` at every wake (at
  least every :data:`TICK` seconds), so that a shared file system whose notifications do not
  cross machines (NFS) is still seen, by polling;
- an fsspec store (``s3://`` ...), or a local one where ``watchfiles`` is not installed: polling
  the record's size, modification time and ETag, with a backoff from ``fastest`` to ``slowest``
  seconds while nothing changes, back to ``fastest`` after a change.

A wake is a hint, never a fact: the follower re-reads the commit record and compares what it
holds. An idle watch sleeps in the kernel (or in ``time.sleep``), not in Python.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from ckpt.errors import AnalysisError

TICK = 0.5
"""Longest a notified wait sleeps before it looks at the clock (and the record's stat) again."""

RECORD = "zarr.json"
"""The root metadata file: the commit record, replaced whole by each commit."""


DEFAULT_EVERY = 60.0
"""Seconds between two recomputations of a per-run analyzer while checkpoints arrive."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "": 1.0}


def parse_duration(value: str | float, what: str) -> float:
    """Seconds in ``value``: a number of seconds, or a number followed by one of the units ms, s, m (or min) and h.

    Raises
    ------
    AnalysisError
        Not a duration, or not a positive one, naming ``what``.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min|m|h|)\s*", str(value))
        if found is None:
            msg = f"{what} must be a duration such as 30s, 5m or 1h, got {value!r}"
            raise AnalysisError(msg)
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    if not seconds > 0 or seconds == float("inf"):
        msg = f"{what} must be a positive duration such as 30s, 5m or 1h, got {value!r}"
        raise AnalysisError(msg)
    return seconds


def _is_local(where: str) -> bool:
    return where.startswith("file://") or "://" not in where


class RecordWatch:
    """Wakes when the commit record of the store at ``where`` may have changed.

    Parameters
    ----------
    where
        Path or fsspec URL of the store.
    storage_options
        fsspec options of a remote store.
    fastest, slowest
        The polling interval's bounds in seconds: ``fastest`` after a change, growing by half
        each quiet poll up to ``slowest``.
    notify
        Use file-system notifications on a local store where ``watchfiles`` is installed
        (False: poll, as on an object store).
    """

    def __init__(
        self,
        where: str,
        storage_options: dict[str, Any] | None = None,
        *,
        fastest: float = 0.2,
        slowest: float = 5.0,
        notify: bool = True,
    ) -> None:
        self._fastest, self._slowest = fastest, slowest
        self._interval = fastest
        self._events: Iterator[set[Any]] | None = None
        if _is_local(where):
            folder = where.removeprefix("file://")
            record = os.path.join(folder, RECORD)
            self._signature: Callable[[], Any] = lambda: _stat(record)
            if notify:
                self._events = _notifications(folder, TICK)
        else:
            self._signature = _remote_signature(where, storage_options)
        self._seen = self._signature()

    @property
    def notified(self) -> bool:
        """Whether this watch wakes on file-system notifications (else it polls)."""
        return self._events is not None

    def wait(self, timeout: float) -> bool:
        """Block until the record changed or ``timeout`` seconds passed; whether it changed.

        A notification or a changed signature wakes it; the signature is then remembered, so that
        the next call waits for the next change.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            left = deadline - time.monotonic()
            if self._events is not None and left > 0:
                next(self._events)  # a set of changes, or empty after at most TICK seconds
            elif left > 0:
                time.sleep(min(self._interval, left))
                self._interval = min(self._slowest, self._interval * 1.5)
            signature = self._signature()
            if signature != self._seen:
                self._seen = signature
                self._interval = self._fastest
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        """Stop the notifications (the watch polls afterwards)."""
        events, self._events = self._events, None
        if events is not None:
            events.close()  # type: ignore[attr-defined]


def _stat(record: str) -> tuple[int, int, int] | None:
    """What changes when the record is replaced: its inode, size and modification time (None: absent)."""
    try:
        found = os.stat(record)
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)


def _notifications(folder: str, timeout: float) -> Iterator[set[Any]] | None:
    """The changes to ``folder``'s own ``zarr.json`` (not its subfolders'), or None without watchfiles."""
    try:
        import watchfiles
    except ImportError:
        return None

    def is_record(_change: Any, path: str) -> bool:
        return os.path.basename(path) == RECORD

    return iter(
        watchfiles.watch(
            folder,
            watch_filter=is_record,
            recursive=False,
            rust_timeout=int(timeout * 1000),
            yield_on_timeout=True,
            debounce=200,  # a commit is one rename: no burst of changes to group
            raise_interrupt=True,
        )
    )


def _remote_signature(where: str, storage_options: dict[str, Any] | None) -> Callable[[], Any]:
    """A function reading the remote record's size, time and ETag (what changes when it is replaced)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(where, **(storage_options or {}))
    record = f"{root.rstrip('/')}/{RECORD}"

    def signature() -> Any:
        fs.invalidate_cache(record)  # else s3fs answers from its listing cache
        try:
            info = fs.info(record)
        except (FileNotFoundError, OSError):
            return None
        keys = ("size", "ETag", "etag", "mtime", "LastModified", "last_modified", "created", "generation")
        return tuple(str(info.get(key)) for key in keys)

    return signature


__all__ = ["DEFAULT_EVERY", "RECORD", "TICK", "RecordWatch", "parse_duration"]
