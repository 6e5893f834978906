"""Atomic publishing: building a store aside and moving it into place in one step.

``create``, ``ckpt import`` and ``ckpt repair`` never write a store where readers
can see it half-built. They build it in a hidden staging sibling
(:func:`staging_path`, :func:`staging_url`) and then :func:`publish` it: one
``rename`` for a new store, one ``renameat2(RENAME_EXCHANGE)`` swap for a
replaced one (docs/store-format.md, "Commit protocol"). Object stores have no
rename: :func:`publish_url` copies the staged store in with its root record last.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from ckpt.errors import NotAStoreError, StoreExistsError, UnsupportedFormatError
from ckpt.store import _zarr
from ckpt.store._zarr import local_path  # re-exported: where a store is on disk, for the engine
from ckpt.store.format import CHECKPOINTS
from ckpt.store.reader import check_format
from ckpt.store.results import store_lock


def occupied(where: str, local: Path | None, storage_options: dict[str, Any] | None) -> bool:
    """Whether creating a store at ``where`` would write over something.

    Parameters
    ----------
    where
        The destination, a local path or a URL.
    local
        ``where`` as a local path (:func:`ckpt.store._zarr.local_path`), or None for a URL.
    storage_options
        Passed to fsspec for URLs.

    Returns
    -------
    bool
        At a URL, whether a store is there; locally, whether anything but an empty folder is.
    """
    if local is None:
        zstore = _zarr.open_zarr_store(where, read_only=True, storage_options=storage_options)
        return _zarr.read_json(zstore, _zarr.ROOT_KEY) is not None
    return bool(local.exists() and (not local.is_dir() or any(local.iterdir())))


STAGING_PREFIX = "."
STAGING_SUFFIX = ".incomplete-"
"""A store being created or imported is built at ``.<name>.incomplete-<id>`` beside its destination."""


def _target(final: Path) -> Path:
    """Where ``final`` is: the user's own path to a store may be a link, and a swap replaces what it points to."""
    return Path(os.path.realpath(final)) if final.is_symlink() else final


def staging_path(final: Path) -> Path:
    """A fresh hidden sibling of ``final`` to build a store in, moved into place when complete."""
    final = _target(final)
    return final.parent / f"{STAGING_PREFIX}{final.name}{STAGING_SUFFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ReplaceLocks:
    """The locks that :func:`lock_replaceable` holds, released together."""

    def __init__(self, *locks: Any) -> None:
        self._locks = locks

    def release(self) -> None:
        """Release them, the last taken first (idempotent)."""
        for lock in reversed(self._locks):
            lock.release()


def lock_replaceable(where: str, local: Path | None, storage_options: dict[str, Any] | None) -> ReplaceLocks:
    """Take the writer lock and the store-wide lock of the ckpt store at ``where``, to replace it; refuse anything else.

    ``overwrite`` replaces a store, never a folder of other files: a user's ``precious.txt``
    is not deleted because a path was mistyped.

    Parameters
    ----------
    where
        The store to be replaced, a local path or a URL.
    local
        ``where`` as a local path, or None for a URL (object stores have no lock).
    storage_options
        Passed to fsspec for URLs.

    Returns
    -------
    ReplaceLocks
        The store's writer lock and its store-wide lock (exclusive: no result is being
        written, :func:`ckpt.store.results.store_lock`), held: release them once the
        replacement is published.

    Raises
    ------
    StoreExistsError
        When ``where`` holds something other than a ckpt store this ckpt writes.
    StoreLockedError
        When another process is writing checkpoints or a result to it.
    """
    try:
        attrs, _ = _zarr.read_root(_zarr.open_zarr_store(where, read_only=True, storage_options=storage_options), where)
        check_format(attrs, where)
    except (NotAStoreError, UnsupportedFormatError) as exc:
        msg = f"refusing to overwrite {where}: it is not a ckpt store this ckpt writes ({exc}); remove it yourself"
        raise StoreExistsError(msg) from None
    lock = _zarr.DirectoryLock(local, CHECKPOINTS)
    lock.acquire(
        blocking=False,
        busy_message=f"another process is writing to {where}; it cannot be overwritten until that writer closes",
    )
    try:
        return ReplaceLocks(lock, store_lock(where, exclusive=True))  # a no-op lock for a URL
    except BaseException:
        lock.release()
        raise


def publish(staged: Path, final: Path, *, replace: bool) -> None:
    """Move the complete store ``staged`` to ``final`` (replacing the store there when ``replace``).

    A new store appears in one ``rename``. A replaced one is swapped with the new one
    in one ``renameat2(RENAME_EXCHANGE)`` and then deleted. Where the system cannot
    swap (not Linux), the old store is renamed aside first: a crash between the two
    renames then leaves it, complete, at ``.<name>.replaced-<id>``, never a mix of both runs.
    Where ``final`` is a link (the user's own path), the store it points to is replaced.
    """
    final = _target(final)
    if not replace:
        os.rename(staged, final)
        return
    if _exchange(staged, final):  # one atomic swap: final is the old store or the new one, at every instant
        shutil.rmtree(staged, ignore_errors=True)  # now the old store
        return
    aside = final.parent / f"{STAGING_PREFIX}{final.name}.replaced-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.rename(final, aside)
    os.rename(staged, final)
    shutil.rmtree(aside, ignore_errors=True)


def staging_url(final: str) -> str:
    """A fresh hidden sibling prefix of the URL ``final`` to build a replacement store in."""
    parent, _, name = final.rstrip("/").rpartition("/")
    return f"{parent}/{STAGING_PREFIX}{name}{STAGING_SUFFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def publish_url(staged: str, final: str, storage_options: dict[str, Any] | None = None) -> None:
    """Replace the store at URL ``final`` with the complete store at ``staged`` (object stores cannot swap).

    The old store is deleted, then the new one's objects are copied in (server-side where
    the file system can) with its root ``zarr.json`` last, then ``staged`` is deleted.
    Until that last put ``final`` holds no store, never a mix of the two; a crash before it
    leaves the complete new store at ``staged`` (docs/store-format.md §4.3.1).
    """
    import fsspec

    fs, source = fsspec.core.url_to_fs(staged, **(storage_options or {}))
    _, target = fsspec.core.url_to_fs(final, **(storage_options or {}))
    source, target = source.rstrip("/"), target.rstrip("/")
    remove_store(final, storage_options)
    root = f"{source}/{_zarr.ROOT_KEY}"
    objects = [path for path in fs.find(source) if path != root]
    if objects:
        fs.copy(objects, [target + path[len(source) :] for path in objects])
    fs.copy(root, f"{target}/{_zarr.ROOT_KEY}")
    fs.rm(source, recursive=True)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system has no such call."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
    if result != 0:
        errno = ctypes.get_errno()
        if errno in (38, 22, 95):  # ENOSYS, EINVAL, EOPNOTSUPP: the kernel or file system cannot swap
            return False
        raise OSError(errno, os.strerror(errno), str(second))
    return True


def remove_store(where: str, storage_options: dict[str, Any] | None = None) -> None:
    """Delete the store at ``where`` (a local folder or a URL), if there is one."""
    local = _zarr.local_path(where)
    if local is not None:
        shutil.rmtree(local, ignore_errors=True)
        return
    import fsspec

    fs, path = fsspec.core.url_to_fs(where, **(storage_options or {}))
    root = f"{path.rstrip('/')}/{_zarr.ROOT_KEY}"
    if fs.exists(root):  # first: the store is gone for readers at once, not half-deleted under its record
        fs.rm(root)
    if fs.exists(path):
        fs.rm(path, recursive=True)


__all__ = [
    "STAGING_PREFIX",
    "STAGING_SUFFIX",
    "ReplaceLocks",
    "local_path",
    "lock_replaceable",
    "occupied",
    "publish",
    "publish_url",
    "remove_store",
    "staging_path",
    "staging_url",
]
