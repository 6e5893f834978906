"""The thin layer between ckpt.store and zarr: opening stores, the commit record, locks.

The locks themselves are :mod:`ckpt.store.file_locks` (``DirectoryLock``, ``FileLock``, re-exported here).

The commit record of a store is the consolidated metadata in its root
``zarr.json``: a snapshot of every committed node (group or array) with the
shape it had at the last commit. Writing that one key is the commit; it is a
single atomic put (zarr's LocalStore writes a temporary file and renames it;
object stores replace keys atomically). Readers, including plain
``xr.open_zarr``, open the root through its consolidated metadata and so see
exactly the committed state, whatever a running writer has put beyond it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import google_crc32c
import numpy as np
import zarr
import zarr.errors
import zarr.storage
from zarr.codecs import BytesCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.metadata import ArrayV3Metadata
from zarr.core.sync import sync

from ckpt.errors import NotAStoreError, StoreError, StoreNotFoundError
from ckpt.store import links
from ckpt.store.file_locks import DirectoryLock as DirectoryLock
from ckpt.store.file_locks import FileLock as FileLock

ROOT_KEY = "zarr.json"

try:  # the Rust codec pipeline: faster chunk I/O where zarr reads and writes checkpoint arrays
    import zarrs  # noqa: F401

    _ZARRS = True
except ImportError:  # pragma: no cover - zarrs ships wheels for common platforms
    _ZARRS = False


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for fsspec URLs such as ``memory://run.zarr`` or ``s3://bucket/run.zarr``."""
    return "://" in str(path) and not str(path).startswith("file://")


def local_path(path: str | os.PathLike[str]) -> Path | None:
    """The filesystem path of a local store, or None for a remote URL."""
    text = str(path)
    if text.startswith("file://"):
        text = text.removeprefix("file://")
    return None if is_url(text) else Path(text)


def open_zarr_store(
    path: str | os.PathLike[str], *, read_only: bool, storage_options: dict[str, Any] | None = None
) -> zarr.abc.store.Store:
    """Return the zarr Store object for a local path or an fsspec URL.

    A local store opened for writing must hold no symbolic link (:func:`ckpt.store.links.check_no_links`):
    zarr's ``LocalStore`` follows links, and every write of ckpt to a local store goes through
    the store this returns or through its lock files (:class:`FileLock`), which follow none.

    Raises
    ------
    NotAStoreError
        A local path that is a file.
    StoreLinkError
        ``read_only`` is false and the local store holds a symbolic link.
    StoreError
        A URL whose scheme fsspec does not know, or whose filesystem package is not installed.
    """
    local = local_path(path)
    if local is not None:
        if local.exists() and not local.is_dir():
            msg = f"{path} is a file, not a ckpt store (a store is a folder); pass the store's folder"
            raise NotAStoreError(msg)
        if not read_only and local.is_dir():
            links.check_no_links(local, path)
        return zarr.storage.LocalStore(local, read_only=read_only)
    try:
        return zarr.storage.FsspecStore.from_url(str(path), storage_options=storage_options, read_only=read_only)
    except ImportError as exc:  # fsspec knows the scheme; its filesystem package is missing
        scheme = str(path).split("://")[0]
        msg = f"cannot open {path}: {exc} (the {scheme}:// filesystem is a separate package, e.g. pip install s3fs)"
        raise StoreError(msg) from None
    except ValueError as exc:  # "Protocol not known"
        msg = f"cannot open {path}: {exc}; use a local path or a URL fsspec knows (s3://, gs://, memory:// ...)"
        raise StoreError(msg) from None


def fast_io(array: Any) -> Any:
    """Give a checkpoint array (``zarr.Array`` or ``AsyncArray``) the zarrs codec pipeline, if local.

    zarrs writes a checkpoint a few times faster than zarr's Python pipeline
    (bench/store.py; docs/performance.md, "Checkpoint I/O"). Whole
    checkpoints of a local store are now read and written without zarr
    (:class:`WholeChunks`); zarrs serves the rest: ``Store.read_tensor``, the lazy
    ``Store.checkpoints``, compressed stores. The pipeline is set on our own arrays only: zarr's
    global ``codec_pipeline.path`` setting is process-wide, and switching it
    around our calls leaked into other threads' arrays (seen in the test suite).
    """
    target = getattr(array, "_async_array", array)
    if _ZARRS and isinstance(target.store_path.store, zarr.storage.LocalStore):
        from zarrs import ZarrsCodecPipeline

        pipeline = ZarrsCodecPipeline.from_array_metadata_and_store(
            array_metadata=target.metadata, store=target.store_path.store
        )
        object.__setattr__(target, "codec_pipeline", pipeline)  # AsyncArray is a frozen dataclass
    return array


@dataclass(frozen=True)
class WholeChunks:
    """The chunk files of a local array with one chunk per row, read without zarr (:func:`read_rows`).

    Only arrays in the layout ckpt writes checkpoints in by default qualify
    (:meth:`of`): a local store, ``chunks=(1, *shape)``, and the bytes codec in
    native byte order followed by crc32c. Remote stores, ``compressor="zstd"``,
    sharding and arrays written by other tools are read by zarr.
    """

    folder: Path
    """Where the array's chunk files are."""
    metadata: ArrayV3Metadata
    """The array's committed metadata (its chunk key encoding names the files)."""
    dtype: np.dtype
    """The stored numpy dtype."""
    nbytes: int
    """Bytes of one row, without the 4 bytes of its checksum."""

    @classmethod
    def of(cls, store: zarr.abc.store.Store, path: str, metadata: Any) -> WholeChunks | None:
        """The chunk files of the array at ``path``, or None when zarr must read it."""
        if not isinstance(store, zarr.storage.LocalStore) or not isinstance(metadata, ArrayV3Metadata):
            return None
        # the grid as the spec writes it: zarr's class for it moved (RegularChunkGrid in 3.1,
        # RegularChunkGridMetadata from 3.2 on), its JSON did not
        grid: dict[str, Any] = metadata.chunk_grid.to_dict()  # JSON, of the shape the spec gives
        if grid.get("name") != "regular" or tuple(grid["configuration"]["chunk_shape"]) != (1, *metadata.shape[1:]):
            return None
        codecs = tuple(metadata.codecs)
        if len(codecs) != 2 or not isinstance(codecs[0], BytesCodec) or not isinstance(codecs[1], Crc32cCodec):
            return None
        # the bytes codec sets the byte order on disk; a new array's in-memory dtype may say otherwise
        dtype = np.dtype(metadata.dtype.to_native_dtype()).newbyteorder("=")
        endian = getattr(codecs[0].endian, "value", codecs[0].endian)  # an Endian enum to zarr 3.2, a str from 3.3
        native = endian == sys.byteorder
        nbytes = math.prod(metadata.shape[1:]) * dtype.itemsize
        if (dtype.itemsize > 1 and not native) or nbytes == 0:  # zarr writes no chunk of 0 bytes
            return None
        return cls(Path(store.root) / path, metadata, dtype, nbytes)

    def _file(self, row: int) -> Path:
        return self.folder / self.metadata.encode_chunk_key((row,) + (0,) * (self.metadata.ndim - 1))

    def size_of(self, row: int) -> int | None:
        """The size of row ``row``'s chunk file, or None when it is missing or not a regular file."""
        try:
            info = os.lstat(self._file(row))
        except OSError:
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None

    def read_into(self, row: int, buffer: np.ndarray) -> np.ndarray | None:
        """Row ``row``, read into ``buffer`` (``nbytes + 4`` bytes) and checked; None when it is not intact.

        One ``readinto`` of the chunk file, then its crc32c checked as zarr's
        ``Crc32cCodec`` does. None when the file is missing, has the wrong size or
        fails its checksum.
        """
        try:
            with open(os.open(self._file(row), os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as file:
                size = os.fstat(file.fileno()).st_size
                # numpy declares ndarray a Buffer only for Python >= 3.12; it is one on 3.11 too
                if size != self.nbytes + 4 or file.readinto(buffer) != size:  # type: ignore[arg-type]
                    return None
        except OSError:
            return None
        data = buffer[: self.nbytes]
        if google_crc32c.value(data) != int.from_bytes(buffer[self.nbytes :].tobytes(), "little"):
            return None
        return data.view(self.dtype).reshape(self.metadata.shape[1:])

    def write(self, row: int, array: np.ndarray) -> bool:
        """Write row ``row`` as zarr would (the array's bytes, then their crc32c); False if zarr must write it.

        ``array`` must hold the row as stored (C-contiguous, of the stored dtype);
        another array returns False without writing anything. The file is
        written in place, not renamed into place: checkpoint chunks are written
        once, beyond the committed rows, so a crash leaves a partial chunk only
        where the next writer trims it (as with the zarrs pipeline).

        Why not zarr: one ``setitem`` per array, even gathered in one event-loop
        call, is several times slower than one ``writev`` per file, which is as fast
        as ``torch.save`` of the same tensors into one file (bench/store.py, "write
        bf16"; docs/performance.md, "Checkpoint I/O").
        Creating the file is most of that cost: see :func:`ckpt.store.writer_rows.write_rows`.
        """
        if array.dtype != self.dtype or not array.flags.c_contiguous or array.nbytes != self.nbytes:
            return False
        checksum = google_crc32c.value(array).to_bytes(4, "little")  # numpy arrays are hashed in place
        data = memoryview(array.reshape(-1)).cast("B")  # type: ignore[arg-type]  # a Buffer on 3.11 too (above)
        path = self._file(row)
        if path.parent != self.folder:  # a chunk key encoding with "/" separators
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)  # never through a link
        try:
            pending = [data, memoryview(checksum)]
            while pending:  # writev may write less than asked (a signal, a full disk raises)
                written = os.writev(fd, pending)
                while pending and written >= len(pending[0]):
                    written -= len(pending.pop(0))
                if pending:
                    pending[0] = pending[0][written:]
        finally:
            os.close(fd)
        return True


def read_rows(arrays: dict[str, WholeChunks], row: int) -> dict[str, np.ndarray | None]:
    """Row ``row`` of every array, read from its chunk file into one new block of memory.

    An array is None where its chunk is missing, has the wrong size or fails its
    crc32c checksum: the caller then reads it through zarr, which names the
    damage (or returns the fill value, which the commit record's digest refuses).
    The arrays returned are views of one block of memory.

    Why not zarr: one ``getitem`` per array, even gathered in one event-loop
    call, is slower than ``torch.load`` of the same tensors (``threading.max_workers``
    and ``codec_pipeline.direct_io`` did not help): every array costs an event-loop
    task and a thread hop, and zarrs reads each chunk into a buffer of its own before
    copying it out. Why one block: in a fresh buffer per tensor the first touch of each
    4 KiB page faults, which costs more than the copy itself; numpy backs blocks of
    4 MiB and more with huge pages, an order of magnitude fewer faults (bench/store.py,
    "read every step"; docs/performance.md, "Checkpoint I/O").
    """
    align = 64  # every array starts on a cache line, as numpy's own allocations do
    offsets, total = {}, 0
    # memory is taken only for chunk files whose size is what their recorded shape needs: a shape
    # edited in the record must not size an allocation (a stat is cheap beside the read)
    intact = {name: chunks for name, chunks in arrays.items() if chunks.size_of(row) == chunks.nbytes + 4}
    for name, chunks in intact.items():
        offsets[name] = total
        total += -(-(chunks.nbytes + 4) // align) * align
    block = np.empty(total + align, np.uint8)
    start = -block.ctypes.data % align
    block = block[start : start + total]
    return {
        name: chunks.read_into(row, block[offsets[name] : offsets[name] + chunks.nbytes + 4])
        if name in intact
        else None
        for name, chunks in arrays.items()
    }


def read_json(store: zarr.abc.store.Store, key: str, where: str = "the store") -> dict[str, Any] | None:
    """The JSON document at ``key`` (bounded in size and depth: :func:`ckpt.store.record.parse_record`), or None."""
    from ckpt.store.record import parse_record

    buffer = sync(store.get(key, prototype=default_buffer_prototype()))
    if buffer is None:
        return None
    return parse_record(buffer.to_bytes(), where, key)


def write_json(store: zarr.abc.store.Store, key: str, document: dict[str, Any]) -> None:
    """Write ``document`` at ``key`` in one put (atomic on every zarr store we use)."""
    # compact: with indent, json falls back to its pure-Python encoder (much slower on the root record)
    data = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))


def node_json(node: zarr.Array | zarr.Group) -> dict[str, Any]:
    """The ``zarr.json`` document of an open node, exactly as zarr would write it."""
    buffers = node.metadata.to_buffer_dict(default_buffer_prototype())
    return json.loads(buffers[ROOT_KEY].to_bytes())


def empty_group_json(attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A group's metadata document, as it appears inside a consolidated snapshot."""
    return {
        "attributes": attributes or {},
        "zarr_format": 3,
        "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}},
        "node_type": "group",
    }


def root_document(attributes: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The root ``zarr.json``: the store's attributes plus the snapshot of committed nodes."""
    return {
        "attributes": attributes,
        "zarr_format": 3,
        "consolidated_metadata": {
            "kind": "inline",
            "must_understand": False,
            "metadata": dict(sorted(nodes.items())),
        },
        "node_type": "group",
    }


def read_root(store: zarr.abc.store.Store, where: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Read the root attributes and the committed snapshot, or say why this is no store."""
    from ckpt.store.record import validate_record

    try:
        document = read_json(store, ROOT_KEY, where)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        document = None
    if document is None:
        local = local_path(where)
        if local is not None and not local.exists():
            msg = f"no store at {where}: the path does not exist"
            raise StoreNotFoundError(msg)
        msg = f"{where} is not a ckpt store (it has no zarr.json); create one with ckpt.create() or `ckpt import`"
        raise NotAStoreError(msg)
    attributes, nodes = validate_record(document, where)  # a store is data: nothing is used unchecked
    return attributes, dict(nodes)


def open_root_group(store: zarr.abc.store.Store, where: str = "the store") -> zarr.Group:
    """Open the root group through its consolidated snapshot (the committed state), validated first.

    The record is checked (:func:`read_root`) before zarr parses it: zarr resolves node names
    as paths and allocates what shapes claim. What zarr still cannot parse (an unknown codec or
    data type) is a :class:`~ckpt.errors.CorruptRecordError`, not zarr's traceback.
    """
    from ckpt.errors import CorruptRecordError

    read_root(store, where)
    try:
        return zarr.open_group(store, mode="r", use_consolidated=True)
    except (  # a fill value too large for its data type is an OverflowError (ArithmeticError)
        ValueError,
        TypeError,
        KeyError,
        LookupError,
        ArithmeticError,
        NotImplementedError,
        zarr.errors.BaseZarrError,
    ) as exc:
        msg = f"zarr cannot read the commit record of {where} ({type(exc).__name__}: {exc}); restore it from a copy"
        raise CorruptRecordError(msg) from None


def array_at(group: zarr.Group, path: str, where: str = "the store") -> zarr.Array:
    """The array at ``path`` below ``group``: a group there is a :class:`~ckpt.errors.CorruptRecordError`."""
    return _node_at(group, path, zarr.Array, "an array", where)


def group_at(group: zarr.Group, path: str, where: str = "the store") -> zarr.Group:
    """The group at ``path`` below ``group``: an array there is a :class:`~ckpt.errors.CorruptRecordError`."""
    return _node_at(group, path, zarr.Group, "a group", where)


_Node = TypeVar("_Node", zarr.Array, zarr.Group)


def _node_at(group: zarr.Group, path: str, kind: type[_Node], wanted: str, where: str) -> _Node:
    from ckpt.errors import CorruptRecordError

    node = group[path]
    if not isinstance(node, kind):
        found = "a group" if isinstance(node, zarr.Group) else "an array"
        msg = f"{path!r} in the commit record of {where} is {found} where {wanted} belongs; restore it from a copy"
        raise CorruptRecordError(msg)
    return node


def stored_bytes(store: zarr.abc.store.Store, key: str) -> int | None:
    """Bytes stored under ``key`` (one chunk), or None when it is missing.

    A local store's chunk must be a regular file: a symlink or a device is not a chunk ckpt
    wrote, and reading ``/dev/zero`` would never end.
    """
    local = getattr(store, "root", None)
    if isinstance(store, zarr.storage.LocalStore) and local is not None:
        try:
            info = os.lstat(Path(local) / key)
        except OSError:
            return None
        return info.st_size if stat.S_ISREG(info.st_mode) else None
    try:
        return int(sync(store.getsize(key)))
    except (FileNotFoundError, OSError, KeyError):
        return None


def prefix_bytes(store: zarr.abc.store.Store, prefix: str) -> int:
    """Bytes stored under ``prefix`` (an array's chunks), symlinks and special files not counted."""
    if isinstance(store, zarr.storage.LocalStore):
        total, folder = 0, Path(store.root) / prefix
        for dirpath, _, files in os.walk(folder):
            for name in files:
                with contextlib.suppress(OSError):
                    info = os.lstat(os.path.join(dirpath, name))
                    total += info.st_size if stat.S_ISREG(info.st_mode) else 0
        return total
    try:
        return int(sync(store.getsize_prefix(prefix)))
    except (FileNotFoundError, OSError):
        return 0


def is_analysis_node(path: str) -> bool:
    """True for nodes below ``analyses/``, which the engine (not the checkpoint writer) commits."""
    return path.startswith("analyses/")


def commit(
    store: zarr.abc.store.Store,
    where: str,
    *,
    attributes: dict[str, Any] | None,
    nodes: dict[str, dict[str, Any]],
    owns: Any,
) -> None:
    """Merge ``nodes`` into the commit record and write it, under the commit lock.

    The record on disk is re-read so that concurrent committers (a training
    run and an analysis) never drop each other's nodes: every entry for which
    ``owns(path)`` is true is replaced by ``nodes``; the others are kept.
    ``attributes`` replaces the root attributes unless it is None.
    """
    local = local_path(where)
    with DirectoryLock(local):
        disk_attributes, disk_nodes = read_root(store, where)
        merged = {k: v for k, v in disk_nodes.items() if not owns(k)}
        merged.update({k: v for k, v in nodes.items() if owns(k)})
        write_json(store, ROOT_KEY, root_document(disk_attributes if attributes is None else attributes, merged))


@contextlib.contextmanager
def translated_read_errors(
    describe: str, remedy: str = "restore the store from a copy (or re-import the checkpoint)"
) -> Iterator[None]:
    """Turn zarr/zarrs decoding failures into :class:`CorruptChunkError` naming ``describe`` and ``remedy``."""
    from ckpt.errors import CorruptChunkError

    try:
        yield
    except FileNotFoundError:
        raise
    except (ValueError, RuntimeError, OSError) as exc:
        # Reading a committed chunk has no other failure mode than bad bytes: zarr raises
        # ValueError on a checksum mismatch or a chunk of the wrong size, zarrs RuntimeError.
        text = str(exc)
        msg = (
            f"corrupt data in {describe}: {text}. The bytes on disk are not the chunk that was written (they "
            f"fail its crc32c checksum, or have the wrong size); {remedy}"
        )
        raise CorruptChunkError(msg) from None
