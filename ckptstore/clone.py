"""A hard-linked clone of a local store: a piece of it replaced aside, then swapped in whole.

Replacing a piece in place (a data split with ``--overwrite``) removes the old one before the new one
is complete: a crash in between leaves neither. Instead the store is cloned beside itself
(:func:`ckpt.store.publish.staging_path`), every file a hard link to the store's own but for the
pieces left out, the new piece is written and committed in the clone, and the clone is swapped in
with :func:`ckpt.store.publish.publish` (one ``renameat2(RENAME_EXCHANGE)``): the store is the old
one or the new one at every instant.

Writing into the clone never changes a file of the store: zarr's ``LocalStore`` writes every key to a
temporary file renamed over the key, so the clone's key gets a new file while the store's keeps its
own. A clone costs one ``mkdir`` per folder and one ``link`` per file, no byte of data: small next to
writing the piece.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Collection
from pathlib import Path

from ckpt.errors import StoreError
from ckpt.store import links

_CANNOT_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
"""``link`` failures of the file system, not of the store: the file is copied instead."""


def link_clone(source: Path, target: Path, *, leave_out: Collection[str], where: str | os.PathLike[str]) -> int:
    """Make ``target`` a clone of the store folder ``source``, its files hard links to ``source``'s.

    No symbolic link is followed, nor cloned: a store holding one is refused (:mod:`ckpt.store.links`).
    Where the file system cannot link (another device below the store, no hard links), a file is copied.

    Parameters
    ----------
    source
        The store's folder.
    target
        Where the clone is made; must not exist.
    leave_out
        Paths below the root (``/``-separated: ``"data/eval"``, ``".locks"``) left out of the clone,
        folders with all they hold.
    where
        The store as the user named it, for the messages.

    Returns
    -------
    int
        The files cloned.

    Raises
    ------
    StoreLinkError
        A symbolic link below the store's root (the clone so far is left for the caller to remove).
    StoreError
        Something below the root that is neither a folder nor a regular file.
    """
    skipped = set(leave_out)
    os.mkdir(target)
    files = 0
    pending = [("", os.fspath(source), os.fspath(target))]
    while pending:
        prefix, folder, clone = pending.pop()
        with os.scandir(folder) as entries:
            listed = list(entries)
        for entry in listed:
            relative = f"{prefix}{entry.name}"
            if relative in skipped:
                continue
            copy = os.path.join(clone, entry.name)
            if entry.is_symlink():
                raise links.link_error(where, relative)
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(copy)
                pending.append((f"{relative}/", entry.path, copy))
            elif entry.is_file(follow_symlinks=False):
                _link(entry.path, copy)
                files += 1
            else:
                msg = (
                    f"{relative} of {where} is neither a folder nor a regular file (a device, socket or pipe): "
                    "ckpt did not write it; remove it, or restore the store from a copy"
                )
                raise StoreError(msg)
    return files


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _CANNOT_LINK:
            raise
        shutil.copyfile(source, target, follow_symlinks=False)


__all__ = ["link_clone"]
