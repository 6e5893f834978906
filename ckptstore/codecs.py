"""Bounded decoding: a zstd frame is checked against its chunk's shape before it is decompressed.

A chunk's shape bounds what a read allocates only if the codec does too: a zstd frame of
128 KB can declare (or, streamed, produce) gigabytes, and zarrs and numcodecs allocate what it
says (issue 68: a 136-byte tensor's chunk inflated to 7 GB in ``ckpt verify``). Every zstd frame
zarr decodes in a ckpt process goes through :class:`BoundedZstdCodec` (:func:`install`), which
walks the frame's headers (RFC 8878) first and refuses, as
:class:`~ckpt.errors.CorruptChunkError`, a frame that declares no content size, declares more
than the chunk's shape holds, whose blocks regenerate more than it declares, uses a dictionary,
or is followed by another frame. numcodecs then decompresses into a buffer of the declared size,
which a frame cannot overrun. ckpt itself always writes single frames with their content size.
"""

from __future__ import annotations

import math

from zarr.codecs import ZstdCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer

from ckpt.errors import CorruptChunkError

MAGIC = 0xFD2FB528
"""The first four bytes (little-endian) of a zstd frame."""

BLOCK_MAX = 128 * 1024
"""The largest block a zstd frame may hold (Block_Maximum_Size)."""

VLEN_ITEM_BYTES = 4 + 1024
"""Bytes a variable-length string element may decode to (its 4-byte length and up to 1 KiB of text:
ckpt's string variables are names); a chunk of strings also gets :data:`VLEN_SLACK_BYTES`."""

VLEN_SLACK_BYTES = 2**20


def decoded_limit(chunk_spec: ArraySpec) -> int:
    """The most bytes a chunk of ``chunk_spec`` can decode to before its array-to-bytes codec."""
    count = math.prod(chunk_spec.shape)
    dtype = chunk_spec.dtype.to_native_dtype()
    if dtype.kind in "OT":  # variable-length strings (vlen-utf8): a count, then a length and text per element
        return 4 + count * VLEN_ITEM_BYTES + VLEN_SLACK_BYTES
    return count * dtype.itemsize


def frame_problem(data: memoryview, limit: int) -> str | None:
    """Why the bytes of a zstd-encoded chunk could decode to more than ``limit`` bytes, or None.

    Reads the frame header and the 3-byte header of every block, never their contents.
    """
    size = len(data)

    def field(start: int, length: int) -> int | None:
        return int.from_bytes(data[start : start + length], "little") if start + length <= size else None

    magic = field(0, 4)
    if magic != MAGIC:
        return "is not a zstd frame (it does not start with the zstd magic number)"
    descriptor = field(4, 1)
    if descriptor is None:
        return "is truncated in its frame header"
    fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
    has_checksum, dictionary_flag = (descriptor >> 2) & 1, descriptor & 3
    position = 5 + (0 if single_segment else 1)  # the window descriptor
    dictionary_bytes = (0, 1, 2, 4)[dictionary_flag]
    dictionary = field(position, dictionary_bytes) if dictionary_bytes else 0
    position += dictionary_bytes
    fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    declared = field(position, fcs_bytes) if fcs_bytes else None
    position += fcs_bytes
    if position > size or dictionary is None:
        return "is truncated in its frame header"
    if dictionary:
        return f"needs the zstd dictionary {dictionary}, which ckpt never writes"
    if declared is None:
        return f"declares no content size (the chunk's shape holds {limit:,} bytes)"
    declared += 256 if fcs_bytes == 2 else 0
    if declared > limit:
        return f"declares {declared:,} bytes, more than the {limit:,} bytes of the chunk's shape"
    regenerated = 0  # raw and RLE blocks say what they regenerate; compressed ones are bounded by the buffer
    while True:
        header = field(position, 3)
        if header is None:
            return "is truncated in a block header"
        last, kind, block = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3 or block > BLOCK_MAX:
            return "has an invalid block header"
        regenerated += block if kind in (0, 1) else 0
        if regenerated > declared:
            return f"has blocks that hold more than the {declared:,} bytes it declares"
        position += 3 + (1 if kind == 1 else block)
        if last:
            break
    position += 4 if has_checksum else 0
    if position > size:
        return "is truncated"
    if position < size:
        return "is followed by more bytes (more than one frame, or trailing data)"
    return None


class BoundedZstdCodec(ZstdCodec):
    """zarr's zstd codec, decoding a chunk only when :func:`frame_problem` finds nothing wrong with it."""

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        limit = decoded_limit(chunk_spec)
        # numpy declares ndarray a Buffer only for Python >= 3.12; it is one on 3.11 too
        problem = frame_problem(memoryview(chunk_bytes.as_numpy_array()).cast("B"), limit)  # type: ignore[arg-type]
        if problem is not None:
            msg = f"its zstd frame {problem}; decoding it was refused"
            raise CorruptChunkError(msg)
        return super()._decode_sync(chunk_bytes, chunk_spec)


_INSTALLED: list[bool] = []


def install() -> None:
    """Make zarr decode every ``zstd`` chunk in this process with :class:`BoundedZstdCodec` (idempotent).

    zarr picks a codec's class when it parses an array's metadata, from its registry and the
    ``codecs.zstd`` setting; ckpt sets both before it parses any store's metadata (the record is
    validated first, :func:`ckpt.store.record.validate_record`). Other zarr arrays of the process are
    decoded by the same class: it refuses only frames that could outgrow their chunk.
    """
    if _INSTALLED:
        return
    import zarr
    from zarr.registry import fully_qualified_name, register_codec

    register_codec("zstd", BoundedZstdCodec)
    zarr.config.set({"codecs.zstd": fully_qualified_name(BoundedZstdCodec)})
    _INSTALLED.append(True)


__all__ = ["BoundedZstdCodec", "decoded_limit", "frame_problem", "install"]
