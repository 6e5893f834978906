"""Earlier versions of analysis results, kept for the Datasets that opened them (docs/store-format.md §1.5.1).

A result replaced or regrown is not deleted: its folder ``analyses/<name>`` is moved, whole,
to ``.snapshots/analyses/<name>/<version>`` before the new one is written (a rename on a local
store). A Dataset opened before (:meth:`Store.analysis`) reads the current folder; a chunk there
that no longer matches the digest it opened with is looked up in the kept versions, newest
first, and used only when it matches that digest. So a held Dataset reads exactly what it
opened, or raises :class:`~ckpt.errors.StaleResultError` once no kept version holds it.

``<version>`` is the UTC time the version was retired (``20260102T030405123456Z``) and a random
suffix. Kept versions are deleted by one rule, applied at every commit of the result: a version
retired more than :data:`SNAPSHOT_GRACE_S` ago goes, except the most recently retired one;
``ckpt rm`` deletes a result's versions with it, and ``ckpt repair`` deletes them all.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import secrets
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ckpt.errors import CkptError
from ckpt.store import _zarr
from ckpt.store.format import ANALYSES, SNAPSHOTS

SNAPSHOT_GRACE_S = 3600.0
"""How long a retired version of a result is kept (beyond the most recent one, always kept).

Why an hour: a notebook holding a view reads it within a session; results are small beside the
checkpoints, but a regrown basis is not, so versions do not pile up past that."""

_STAMP = "%Y%m%dT%H%M%S%fZ"

Earlier = Callable[[str, tuple[slice, ...], "str | None"], "np.ndarray | None"]
"""``(variable, region, digest)``: the values of that chunk in a kept version whose digest matches, or None."""


def versions_prefix(name: str) -> str:
    """Where the kept versions of result ``name`` are: ``.snapshots/analyses/<name>``."""
    return f"{SNAPSHOTS}/{ANALYSES}/{name}"


def _children(zstore: Any, prefix: str) -> list[str]:
    async def listed() -> list[str]:
        return [child async for child in zstore.list_dir(prefix)]

    try:
        return sorted(sync(listed()))
    except OSError:  # none kept (or a file where the folder belongs: nothing to read in it)
        return []


def versions(zstore: Any, name: str) -> list[str]:
    """The kept versions of result ``name``, oldest first (only names of the form ckpt writes)."""
    return [v for v in _children(zstore, versions_prefix(name)) if _retired_at(v) is not None]


def _retired_at(version: str) -> _dt.datetime | None:
    stamp, _, suffix = version.partition("-")
    if not (suffix.isalnum() and len(suffix) <= 16):
        return None
    try:
        return _dt.datetime.strptime(stamp, _STAMP).replace(tzinfo=_dt.UTC)
    except ValueError:
        return None


def retire(zstore: Any, where: str, name: str) -> None:
    """Move the folder of result ``name`` (already out of the commit record) to a new kept version.

    Local stores rename the folder (one step); object stores copy its objects, then delete them.
    """
    now = _dt.datetime.now(_dt.UTC)
    target = f"{versions_prefix(name)}/{now.strftime(_STAMP)}-{secrets.token_hex(4)}"
    source = f"{ANALYSES}/{name}"
    local = _zarr.local_path(where)
    if local is not None:
        (local / target).parent.mkdir(parents=True, exist_ok=True)
        os.rename(local / source, local / target)
        return

    async def keys() -> list[str]:
        return [key async for key in zstore.list_prefix(f"{source}/")]

    for key in sync(keys()):
        value = sync(zstore.get(key, prototype=default_buffer_prototype()))
        if value is not None:
            sync(zstore.set(f"{target}/{key.removeprefix(source + '/')}", value))
    sync(zstore.delete_dir(source))


def prune(zstore: Any, name: str, *, grace_s: float | None = None) -> list[str]:
    """Delete the kept versions of ``name`` retired over ``grace_s`` ago, but the most recent; return them.

    ``grace_s`` defaults to :data:`SNAPSHOT_GRACE_S` as it is when called.
    """
    grace_s = SNAPSHOT_GRACE_S if grace_s is None else grace_s
    kept = versions(zstore, name)
    now = _dt.datetime.now(_dt.UTC)
    gone = [v for v in kept[:-1] if (now - _retired_at(v)).total_seconds() > grace_s]  # type: ignore[operator]
    for version in gone:
        sync(zstore.delete_dir(f"{versions_prefix(name)}/{version}"))
    if not versions(zstore, name):
        sync(zstore.delete_dir(versions_prefix(name)))
    return gone


def drop(zstore: Any, name: str | None = None, where: str | None = None) -> list[str]:
    """Delete the kept versions of result ``name`` (all results' when None); return what was deleted.

    With ``where`` (the store's path), a plain file or a link in place of ``.snapshots`` is
    removed itself (never followed), as the folder would have been.
    """
    local = None if where is None else _zarr.local_path(where)
    if local is not None and ((local / SNAPSHOTS).is_symlink() or (local / SNAPSHOTS).is_file()):
        (local / SNAPSHOTS).unlink()
        return [SNAPSHOTS]
    if name is None:
        names = _children(zstore, f"{SNAPSHOTS}/{ANALYSES}")
        gone = [f"{versions_prefix(n)}/{v}" for n in names for v in _children(zstore, versions_prefix(n))]
        sync(zstore.delete_dir(SNAPSHOTS))
        return gone
    gone = [f"{versions_prefix(name)}/{v}" for v in _children(zstore, versions_prefix(name))]
    sync(zstore.delete_dir(versions_prefix(name)))
    return gone


def earlier_chunks(zstore: Any, where: str, name: str) -> Earlier:
    """What a held Dataset of result ``name`` looks a rewritten chunk up in (:data:`Earlier`).

    Each kept version is opened lazily by xarray (decoded as the digests were taken) the first
    time it is needed. A version deleted meanwhile, or one that does not decode, holds nothing.
    """
    from ckpt.store.chunks import block_digest

    opened: dict[str, Any] = {}
    listed: list[list[str]] = []  # the versions as last listed: listed again only when they hold nothing

    def find(variable: str, region: tuple[slice, ...], digest: str | None) -> np.ndarray | None:
        if digest is None:
            return None
        for fresh in (False, True):
            if fresh or not listed:
                listed[:] = [versions(zstore, name)]
            for version in reversed(listed[0]):
                try:
                    values = _read(zstore, where, name, version, opened, variable, region)
                except (CkptError, OSError, KeyError, ValueError, RuntimeError, TypeError):
                    continue  # pruned while read, or not a version ckpt wrote: not this one
                if values is not None and block_digest(values) == digest:
                    return values
        return None

    return find


def _read(
    zstore: Any,
    where: str,
    name: str,
    version: str,
    opened: dict[str, Any],
    variable: str,
    region: tuple[slice, ...],
) -> np.ndarray | None:
    import xarray as xr

    from ckpt.store.record import validate_nodes

    if version not in opened:
        prefix = f"{versions_prefix(name)}/{version}"
        local = _zarr.local_path(where)
        if local is not None and _holds_a_link(local, prefix):  # reads never leave the store
            return None
        # a kept version is data like the rest: its metadata is checked, bounded, before zarr parses it
        nodes = {}
        for child in ["", *_children(zstore, prefix)]:
            document = _zarr.read_json(zstore, f"{prefix}/{child}/{_zarr.ROOT_KEY}".replace("//", "/"), where)
            if document is not None:
                nodes[f"{ANALYSES}/{name}/{child}".rstrip("/")] = document
        if f"{ANALYSES}/{name}/{variable}" not in nodes:
            return None
        validate_nodes(nodes, where)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opened[version] = xr.open_zarr(zstore, group=prefix, consolidated=False, chunks=None)
    dataset = opened[version]
    if variable not in dataset.variables:
        return None
    held = dataset.variables[variable]
    if any(r.stop > n for r, n in zip(region, held.shape, strict=True)) or len(region) != held.ndim:
        return None
    with _zarr.translated_read_errors(f"kept version {version} of analysis {name!r}"):
        return np.asarray(held[region].values)


def _holds_a_link(local: Any, prefix: str) -> bool:
    """Whether the folder ``prefix`` of the local store at ``local``, or anything in it, is a symbolic link."""
    top = local / prefix
    for folder in (local / SNAPSHOTS, top.parent.parent, top.parent, top):
        if folder.is_symlink():
            return True
    for root, folders, files in os.walk(top):
        if any(os.path.islink(os.path.join(root, entry)) for entry in (*folders, *files)):
            return True
    return False


def quietly_prune(zstore: Any, name: str) -> None:
    """:func:`prune`, where failing to delete an old version must not fail the commit that was just made."""
    with contextlib.suppress(OSError, CkptError):
        prune(zstore, name)


__all__ = [
    "SNAPSHOT_GRACE_S",
    "Earlier",
    "drop",
    "earlier_chunks",
    "prune",
    "quietly_prune",
    "retire",
    "versions",
    "versions_prefix",
]
