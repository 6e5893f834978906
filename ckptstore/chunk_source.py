"""The tensors of a store's checkpoints as readers see them: their schema, the chunks dask reads, NaN/inf counts.

Re-exported by :mod:`ckpt.store.reader`, where they were first defined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ckpt.store import _zarr
from ckpt.store.format import ROOT_ATTR


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one tensor of the checkpoint schema."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """Logical dtype name (``bfloat16`` even though the bits are stored as uint16)."""
    nbytes: int
    """Bytes of one checkpoint of this tensor."""


def logical_dtype(node: dict[str, Any]) -> str:
    """The logical dtype of a checkpoint array (``bfloat16`` for bits stored as uint16)."""
    return node.get("attributes", {}).get(ROOT_ATTR, {}).get("dtype") or str(node["data_type"])


class ChunkSource:
    """Array-like handed to ``dask.array.from_array``: reads a region, names what was corrupt."""

    def __init__(
        self,
        array: zarr.Array,
        name: str,
        steps: np.ndarray,
        verify: Callable[..., None],
        check_rows: Callable[..., None],
    ) -> None:
        self.array = array
        self.name = name
        self.steps = steps
        self.verify = verify
        self.check_rows = check_rows
        self.shape = array.shape
        self.dtype = array.dtype
        self.ndim = array.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        step_key = key[0] if isinstance(key, tuple) else key
        steps = self.steps[step_key]
        where = f"tensor {self.name!r} at step {np.atleast_1d(steps).tolist()}"
        self.check_rows([self.name], np.atleast_1d(np.arange(len(self.steps))[step_key]).tolist())
        with _zarr.translated_read_errors(where):
            values = np.asarray(self.array[key])
        rest = key[1:] if isinstance(key, tuple) else ()
        whole = all(
            isinstance(k, slice) and k.indices(n) == (0, n, 1) for k, n in zip(rest, self.shape[1:], strict=False)
        )
        if whole and len(rest) == len(self.shape) - 1:  # dask reads whole tensors (one chunk per step)
            for row, step in zip(values.reshape(-1, *self.shape[1:]), np.atleast_1d(steps), strict=True):
                self.verify(self.name, int(step), row)
        return values


def nonfinite_counts(values: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """Tensor name -> (NaN count, inf count) for the floating-point tensors holding any (decoded values)."""
    found = {}
    for name, value in values.items():
        array = np.asarray(value)
        if array.dtype.kind not in "fc" and "float" not in str(array.dtype):  # bf16/float8 are ml_dtypes
            continue
        finite = np.isfinite(array)
        if not finite.all():
            nan = int(np.isnan(array).sum())
            found[name] = (nan, int(finite.size - finite.sum()) - nan)
    return found


def describe_nonfinite(step: int, counts: dict[str, tuple[int, int]]) -> str:
    """``tensor 'w' at step 3 (2 NaN, 1 inf)``, one per tensor, joined."""
    return "; ".join(f"tensor {n!r} at step {step} ({nan} NaN, {inf} inf)" for n, (nan, inf) in counts.items())


def steps_span(steps: list[int]) -> str:
    """``3 steps (0..20)``: how many steps, first and last (for messages)."""
    return f"{len(steps)} steps ({steps[0]}..{steps[-1]})" if steps else "no steps"


__all__ = ["ChunkSource", "TensorInfo", "describe_nonfinite", "logical_dtype", "nonfinite_counts", "steps_span"]
