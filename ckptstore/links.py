"""ckpt writes only inside a local store, and never through a symbolic link.

A store is data, and tar, rsync and ``cp -a`` keep symbolic links: a store can arrive with
``.locks``, a folder below it or a chunk file that is a link to somewhere else. zarr's
``LocalStore`` and the kernel's ``mkdir``, ``open``, ``unlink`` and ``rmdir`` follow links in
every component of a path but the last, so a write, a lock file or a pruned folder would land
outside the store. Two rules keep every write inside it:

- the lock code reaches its folders and files from the store's root folder one component at a
  time (:func:`open_folder`: ``openat`` with ``O_NOFOLLOW | O_DIRECTORY``, ``mkdirat``), so a link
  met on the way is refused before anything is created or removed;
- before a local store is opened for writing (:func:`ckpt.store._zarr.open_zarr_store`), the
  whole store is walked without following links (:func:`check_no_links`) and a store holding
  one is refused: ckpt's writers (zarr's included) then reach only real folders and files.

The user's own path to the store's root may be a link; everything below the root may not.
``ckpt verify`` names every link it finds (:func:`find_links`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence

from ckpt.errors import StoreError, StoreLinkError

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def link_error(where: str | os.PathLike[str], relative: str) -> StoreLinkError:
    """The error for a symbolic link at ``relative`` (a path below the root) of the store ``where``."""
    msg = (
        f"{where} holds a symbolic link {relative}, and ckpt never writes through a link (it could point "
        "outside the store): replace the link with the real folder or file it stands for, or restore the "
        "store from a copy"
    )
    return StoreLinkError(msg)


def find_links(root: str | os.PathLike[str], limit: int | None = None) -> list[str]:
    """The symbolic links below the folder ``root`` (relative, ``/``-separated), none followed.

    One ``scandir`` per folder: the entries' types come with the listing, so a store of tens of
    thousands of chunk files is walked without a ``stat`` each, a small part of opening it to write.

    Parameters
    ----------
    root
        A local store's folder (itself may be a link: the user's own path).
    limit
        Stop after this many links (None: all of them).

    Returns
    -------
    list of str
        The links found, in walking order (a folder's entries before its subfolders').

    Raises
    ------
    StoreError
        A folder below ``root`` cannot be listed.
    """
    found: list[str] = []
    pending = [("", os.fspath(root))]
    while pending:
        prefix, folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except (NotADirectoryError, FileNotFoundError):
            continue  # removed meanwhile
        except PermissionError:  # a folder that can be written but not listed could hide a link
            msg = (
                f"cannot list {prefix.rstrip('/') or 'the root folder'} of {root} to check that it holds no "
                "symbolic link (permission denied): give yourself read access to the store's folders"
            )
            raise StoreError(msg) from None
        subfolders = []
        for entry in entries:
            relative = f"{prefix}{entry.name}"
            if entry.is_symlink():
                found.append(relative)
                if limit is not None and len(found) >= limit:
                    return found
            elif entry.is_dir(follow_symlinks=False):
                subfolders.append((f"{relative}/", entry.path))
        pending.extend(reversed(subfolders))
    return found


def check_no_links(root: str | os.PathLike[str], where: str | os.PathLike[str] | None = None) -> None:
    """Refuse, naming the first, a local store that holds a symbolic link anywhere below its root.

    Raises
    ------
    StoreLinkError
        ``root`` holds a symbolic link.
    """
    links = find_links(root, limit=1)
    if links:
        raise link_error(root if where is None else where, links[0])


def open_root(root: str | os.PathLike[str]) -> int:
    """A descriptor of the store's root folder, the only component ckpt follows a link in (the user's path)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_folder(parent: int, name: str, where: str | os.PathLike[str], relative: str, *, create: bool = False) -> int:
    """A descriptor of the folder ``name`` in the folder ``parent``, never through a link; made when ``create``.

    Parameters
    ----------
    parent
        The descriptor of the folder holding it.
    name
        One path component.
    where, relative
        The store and the folder's path below its root, for the messages.
    create
        Make the folder when it is missing.

    Raises
    ------
    StoreLinkError
        ``name`` is a symbolic link.
    StoreError
        ``name`` is a file, not a folder.
    FileNotFoundError
        It is missing (and not ``create``).
    """
    while True:
        try:
            return os.open(name, _FOLDER, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            # made by another process meanwhile, or a link there: the next open says which
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=parent)
        except NotADirectoryError:  # O_DIRECTORY | O_NOFOLLOW on a link is ENOTDIR, as on a file
            raise not_a_folder(parent, name, where, relative) from None


def not_a_folder(parent: int, name: str, where: str | os.PathLike[str], relative: str) -> StoreError:
    """The error for ``name`` in ``parent`` that is no folder: a link (:func:`link_error`) or a file."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        mode = 0
    if stat.S_ISLNK(mode):
        return link_error(where, relative)
    msg = (
        f"{relative} of {where} is a file where ckpt keeps a folder: the store is damaged; remove the file "
        "or restore the store from a copy"
    )
    return StoreError(msg)


def open_folders(
    root: str | os.PathLike[str], parts: Sequence[str], where: str | os.PathLike[str], *, create: bool = False
) -> list[int]:
    """Descriptors of the root and of each folder of ``parts`` below it, reached without following links.

    The caller closes them (:func:`close_all`). On an error none is left open.
    """
    fds = [open_root(root)]
    try:
        for depth, name in enumerate(parts):
            fds.append(open_folder(fds[-1], name, where, "/".join(parts[: depth + 1]), create=create))
    except BaseException:
        close_all(fds)
        raise
    return fds


def open_file(parent: int, name: str, where: str | os.PathLike[str], relative: str) -> int:
    """Open (creating it) the regular file ``name`` in the folder ``parent`` for reading, never through a link.

    Raises
    ------
    StoreLinkError
        ``name`` is a symbolic link.
    FileNotFoundError
        ``parent`` was removed meanwhile (a folder being pruned takes no new entries).
    """
    try:
        return os.open(name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_error(where, relative) from None
        raise


def close_all(fds: Sequence[int]) -> None:
    """Close every descriptor of ``fds``."""
    for fd in fds:
        os.close(fd)


def split(relative: str) -> list[str]:
    """The components of a ``/``-separated path below a store's root (empty: the root)."""
    return [part for part in relative.split("/") if part]


__all__ = [
    "check_no_links",
    "close_all",
    "find_links",
    "link_error",
    "not_a_folder",
    "open_file",
    "open_folder",
    "open_folders",
    "open_root",
    "split",
]
