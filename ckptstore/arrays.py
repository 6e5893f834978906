"""Turning framework arrays into numpy arrays and back, losslessly.

The writer accepts numpy arrays, torch tensors (any device, any strides,
float16/bfloat16/float8), JAX arrays and anything exposing ``__array__`` or
DLPack. torch is imported only when a torch tensor is actually seen, so the
store stays usable (and fast to import) without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckpt.errors import UnsupportedTensorError
from ckpt.store.format import ENCODED_DTYPES, NATIVE_DTYPES, STEP


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _torch_to_numpy(tensor: Any) -> tuple[np.ndarray, str]:
    import torch

    if tensor.layout != torch.strided:
        msg = f"sparse or quantized layout {tensor.layout} is not supported; call .to_dense() first"
        raise UnsupportedTensorError(msg)
    if tensor.device.type == "meta":
        msg = "the tensor lives on the 'meta' device and holds no data"
        raise UnsupportedTensorError(msg)
    tensor = tensor.detach()
    logical = str(tensor.dtype).removeprefix("torch.")
    if logical in ENCODED_DTYPES:
        # numpy has no bfloat16/float8: keep the bit patterns (lossless).
        carrier = torch.int16 if ENCODED_DTYPES[logical] == "uint16" else torch.uint8
        tensor = tensor.view(carrier)
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    try:
        array = tensor.cpu().numpy()
    except TypeError as exc:  # complex32, float8_e8m0fnu, bits8 ...: numpy has no equivalent
        msg = f"dtype {tensor.dtype} cannot be stored ({exc})"
        raise UnsupportedTensorError(msg) from None
    if logical in ENCODED_DTYPES:
        array = array.view(ENCODED_DTYPES[logical])
    return array, logical


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray turns 0-d arrays into 1-d ones; scalars must stay 0-d
    return array if array.flags.c_contiguous else array.copy(order="C")


def native(array: np.ndarray) -> np.ndarray:
    """``array`` in native byte order and C order: the values as every writer hashes and stores them.

    A big-endian ``.npy`` (``>i8``) was hashed as given and written little-endian by zarr: the
    committed split then failed its own hash. One copy at most (none when already native and C order).
    """
    if array.dtype.byteorder not in "=|":
        return array.astype(array.dtype.newbyteorder("="), order="C")
    return _contiguous(array)


def to_numpy(value: Any) -> tuple[np.ndarray, str]:
    """Convert an array-like to a C-contiguous numpy array in native byte order, and its logical dtype.

    Parameters
    ----------
    value
        A numpy array, torch tensor, JAX array, or any object with
        ``__array__`` or ``__dlpack__``.

    Returns
    -------
    array, dtype
        The numpy array that is stored (bit patterns for encoded dtypes such as
        bfloat16) and the name of the dtype the value really has.

    Raises
    ------
    UnsupportedTensorError
        When the value cannot be converted or its dtype cannot be stored.

    """
    if isinstance(value, np.ndarray):
        array = value
    elif _is_torch_tensor(value):
        array, logical = _torch_to_numpy(value)
        return native(array), logical
    elif hasattr(value, "__array__"):
        array = np.asarray(value)
    elif hasattr(value, "__dlpack__"):
        array = np.from_dlpack(value)
    else:
        try:
            array = np.asarray(value)
        except Exception as exc:  # numpy raises many types for odd inputs
            msg = f"cannot convert a {type(value).__name__} to an array ({exc})"
            raise UnsupportedTensorError(msg) from exc
    logical = array.dtype.name
    if logical in ENCODED_DTYPES:
        # ml_dtypes arrays (JAX's bfloat16) -> the same bit patterns
        array = array.view(ENCODED_DTYPES[logical])
    elif logical not in NATIVE_DTYPES:
        msg = f"dtype {array.dtype} of a {type(value).__name__} cannot be stored (numeric and bool dtypes only)"
        raise UnsupportedTensorError(msg)
    return native(array), logical


def decode_numpy(array: np.ndarray, logical: str) -> np.ndarray:
    """Return the stored ``array`` viewed as its logical dtype (ml_dtypes for bfloat16/float8)."""
    if logical in ENCODED_DTYPES:
        import ml_dtypes

        return array.view(getattr(ml_dtypes, logical))
    return array


def decode_torch(array: np.ndarray, logical: str, device: Any = None) -> Any:
    """Return the stored ``array`` as a torch tensor of its logical dtype on ``device``."""
    import torch

    if logical in ENCODED_DTYPES:
        carrier = torch.int16 if ENCODED_DTYPES[logical] == "uint16" else torch.uint8
        signed = array.view("int16") if carrier is torch.int16 else array
        tensor = torch.from_numpy(_contiguous(signed)).view(getattr(torch, logical))
    else:
        tensor = torch.from_numpy(_contiguous(array))
    return tensor.to(device) if device is not None else tensor


def count_nonfinite(array: np.ndarray, logical: str) -> int:
    """Number of NaN/inf entries of a stored array (0 for integer and bool dtypes)."""
    values = decode_numpy(array, logical)
    if logical in ENCODED_DTYPES:
        values = values.astype(np.float32)
    if not np.issubdtype(values.dtype, np.inexact):
        return 0
    return int(values.size - np.count_nonzero(np.isfinite(values)))


def tensor_digest(array: np.ndarray) -> str:
    """The digest the commit record binds a stored tensor with: xxh3-64 of its little-endian C-order bytes, hex.

    Computed from the array as stored (bfloat16 as its uint16 bits), at write time
    and again at read time, so that a chunk read as zarr's fill value (missing),
    copied from another step or tensor, or changed is told from the real one.
    xxh3 rather than the stores' own crc32c: it hashes the array in place, where
    google-crc32c needs a bytes copy and zlib.crc32 is several times slower
    (docs/performance.md, "Checkpoint I/O").
    """
    import xxhash

    data = np.ascontiguousarray(array)
    if data.dtype.byteorder == ">" or (data.dtype.byteorder == "=" and np.little_endian is False):
        data = data.astype(data.dtype.newbyteorder("<"))
    # numpy declares ndarray a Buffer only for Python >= 3.12; it is one on 3.11 too
    return xxhash.xxh3_64_hexdigest(memoryview(data).cast("B") if data.size else b"")  # type: ignore[arg-type]


def column_digest(name: str, values: list[Any]) -> str:
    """The digest of a committed metrics column (``step`` as int64, metrics as float64)."""
    return tensor_digest(np.asarray(values, dtype=np.int64 if name == STEP else np.float64))


def read_here(array: Any) -> np.ndarray:
    """The values of a stored (lazy) result's array, read by the calling thread alone.

    For tasks: ``.values`` would hand the chunk reads to the scheduler running the task. On a
    ``distributed`` worker the task's thread then secedes and another task takes its place; when
    that one waits for the same value (:meth:`ckpt.plugins.Worker.cached`), nothing is left to run the reads.
    POLCA on a 2-worker LocalCluster hung that way.
    """
    return np.asarray(array.compute(scheduler="sync").values)


__all__ = [
    "column_digest",
    "count_nonfinite",
    "decode_numpy",
    "decode_torch",
    "native",
    "read_here",
    "tensor_digest",
    "to_numpy",
]
