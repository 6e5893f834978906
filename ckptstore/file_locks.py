"""Advisory ``flock`` locks on a local store's folders and lock files: one writer, one committer at a time.

``flock`` is released by the kernel when its holder dies, so a crashed process never leaves a stale
lock. Folders and lock files are reached from the store's root one component at a time, never
through a symbolic link (:mod:`ckpt.store.links`). Re-exported by :mod:`ckpt.store._zarr`, where
they were first defined.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ckpt.errors import StoreLockedError
from ckpt.store import links


class DirectoryLock:
    """An advisory ``flock`` on a directory of a local store (no-op for remote stores).

    ``flock`` is released by the kernel when the holder dies, so a crashed
    process never leaves a stale lock behind. The store's own folders carry
    these locks (``zarr.json`` is renamed over at every commit, so it could not).

    Two locks exist (docs/store-format.md, "One writer at a time"): the
    *writer lock* on ``checkpoints/``, held by a checkpoint writer for its
    whole session, and the *commit lock* on the store's root, held for the
    milliseconds of a read-merge-write of the root ``zarr.json``. Neither
    folder is made anew while its store exists (a store replaced as a whole is
    swapped in by ``rename``, under the old store's writer lock); what is, a
    result's folder, is locked through a :class:`FileLock`.

    The folder is reached from the store's root one component at a time, never through a
    symbolic link (:mod:`ckpt.store.links`): only the root, the user's own path, may be one.

    Parameters
    ----------
    root
        The store's root folder; None for a remote store (the lock does nothing).
    folder
        The locked folder, ``/``-separated below ``root`` (empty: the root itself).
    """

    def __init__(self, root: Path | None, folder: str = "") -> None:
        self._root = root
        self._parts = links.split(folder)
        self._fd: int | None = None

    def acquire(self, *, blocking: bool, busy_message: str = "") -> None:
        """Take the lock; when not ``blocking``, raise StoreLockedError(busy_message) if it is held.

        Raises
        ------
        StoreLinkError
            A folder on the way is a symbolic link.
        """
        if self._root is None:
            return
        import fcntl

        fds = links.open_folders(self._root, self._parts, self._root)
        links.close_all(fds[:-1])
        fd = fds[-1]
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(busy_message) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        self.acquire(blocking=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class FileLock(DirectoryLock):
    """An advisory ``flock`` on a lock file of a local store (no-op for remote stores).

    For what is rewritten while it is locked: a result's folder is made anew when the result
    is replaced, and a lock on the old folder would exclude nobody who opens the new one. A lock
    file is never replaced while it is held: only its holder removes it, just before letting
    go, and whoever locked a file that was removed meanwhile (its path now names another file,
    or none) lets go of it and locks the one there now. Every holder therefore holds the file
    its path names, and excludes everyone else locking that path. A killed holder leaves an
    unlocked file behind (the kernel releases the ``flock``), which the next holder takes over.

    The file and its folders are reached, made and removed from the store's root one component
    at a time (``openat``, ``mkdirat``, ``unlinkat``, ``rmdir`` relative to the folder's
    descriptor), never through a symbolic link: a link on the way is a
    :class:`~ckpt.errors.StoreLinkError` before anything is made or removed.

    Parameters
    ----------
    root
        The store's root folder; None for a remote store (the lock does nothing).
    path
        The lock file, ``/``-separated below ``root``.
    prune
        A folder on ``path`` (``/``-separated below ``root``): the folders between the lock file
        and it (included) are made when the lock is taken and removed, when empty, when it is
        released, so that a store looks as it did before (a refused ``ckpt analyze`` leaves it
        unchanged, down to its folder listing). None: no folder is removed.
    shared
        A shared lock (``LOCK_SH``), which excludes exclusive holders only. Its holder removes the
        file on release only when it can turn its lock exclusive without waiting (no other holder
        is left); a process opening the file meanwhile finds it removed and starts over.
    """

    def __init__(self, root: Path | None, path: str = "", prune: str | None = None, *, shared: bool = False) -> None:
        parts = links.split(path)
        super().__init__(root, "/".join(parts[:-1]))
        self._name = parts[-1] if parts else ""
        self._relative = "/".join(parts)
        self._prune = 0 if prune is None else len(self._parts) - len(links.split(prune)) + 1
        self._shared = shared
        self._folders: list[int] = []

    def acquire(self, *, blocking: bool, busy_message: str = "") -> None:
        """Take the lock; when not ``blocking``, raise StoreLockedError(busy_message) if it is held.

        Raises
        ------
        StoreLinkError
            The lock file or a folder on the way is a symbolic link.
        """
        if self._root is None:
            return
        import fcntl

        while True:
            folders = links.open_folders(self._root, self._parts, self._root, create=True)
            try:
                fd = links.open_file(folders[-1], self._name, self._root, self._relative)
            except FileNotFoundError:  # another holder pruned the empty folder meanwhile: make it again
                links.close_all(folders)
                continue
            except BaseException:
                links.close_all(folders)
                raise
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if self._shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
                opened = os.fstat(fd)
                try:
                    named = os.stat(self._name, dir_fd=folders[-1], follow_symlinks=False)
                except FileNotFoundError:
                    named = None
            except BlockingIOError:
                os.close(fd)
                links.close_all(folders)
                raise StoreLockedError(busy_message) from None
            except BaseException:
                os.close(fd)
                links.close_all(folders)
                raise
            if named is not None and (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino):
                self._fd, self._folders = fd, folders
                return
            os.close(fd)  # its holder removed it between our open and our lock: take the one there now
            links.close_all(folders)

    def release(self) -> None:
        """Remove the lock file (a shared one only when no other holder is left) and release the lock (idempotent)."""
        if self._fd is None:
            return
        last = True
        if self._shared:
            import fcntl

            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                last = False  # another holder: the file stays theirs
        folders, self._folders = self._folders, []
        try:
            if last:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._name, dir_fd=folders[-1])  # while still held: nobody takes a file going away
            os.close(self._fd)
            self._fd = None
            for depth in range(len(self._parts), len(self._parts) - self._prune, -1):
                try:  # only when empty: another process's lock file keeps it; a link is never followed
                    os.rmdir(self._parts[depth - 1], dir_fd=folders[depth - 1])
                except OSError:
                    break
        finally:
            links.close_all(folders)


__all__ = ["DirectoryLock", "FileLock"]
