"""Evaluation data splits: validating what ``Writer.add_data`` is given, and its content hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ckpt.errors import DataError, InvalidNameError, UnsupportedTensorError
from ckpt.store.arrays import to_numpy
from ckpt.store.format import DATA_VARIABLES, LABELS, check_name


def check_data(
    split: str,
    inputs: Any,
    targets: Any,
    mask: Any,
    labels: Mapping[str, Any],
    text: Sequence[str] | None,
) -> dict[str, tuple[np.ndarray, tuple[str, ...]]]:
    """Validate and convert a data split's arrays; name each one's dimensions.

    Returns
    -------
    dict
        ``{"inputs": (array, dims), ..., "labels/<name>": (array, dims)}``.

    Raises
    ------
    DataError, InvalidNameError
        Naming the split, the array and what was expected.
    """

    def convert(value: Any, what: str) -> np.ndarray:
        try:
            array, logical = to_numpy(value)
        except UnsupportedTensorError as exc:
            raise DataError(f"data split {split!r}: {what}: {exc}") from None
        if logical != array.dtype.name:
            msg = f"data split {split!r}: {what} has dtype {logical}; store data as float32 or integers"
            raise DataError(msg)
        if array.ndim == 0:
            raise DataError(f"data split {split!r}: {what} must have a first dimension of examples")
        return array

    arrays: dict[str, np.ndarray] = {"inputs": convert(inputs, "inputs")}
    n = len(arrays["inputs"])
    if targets is not None:
        arrays["targets"] = convert(targets, "targets")
    if mask is not None:
        m = convert(mask, "mask")
        if m.dtype != np.bool_:
            if not np.isin(m, (0, 1)).all():
                raise DataError(f"data split {split!r}: mask must be boolean (or 0/1), got dtype {m.dtype}")
            m = m.astype(bool)
        ref = arrays.get("targets", arrays["inputs"])
        if m.shape != ref.shape[: m.ndim] or m.ndim < 1:
            which = "targets" if "targets" in arrays else "inputs"
            msg = f"data split {split!r}: mask has shape {m.shape}; expected the leading shape of {which} {ref.shape}"
            raise DataError(msg)
        arrays["mask"] = m
    if text is not None:
        if isinstance(text, str) or not all(isinstance(t, str) for t in text):
            raise DataError(f"data split {split!r}: text must be a sequence of strings, one per example")
        arrays["text"] = np.array(list(text), dtype=object)
    for name, value in labels.items():
        problem = check_name(name, "label")
        if problem:
            raise InvalidNameError(problem)
        if name in DATA_VARIABLES:
            raise InvalidNameError(f"label name {name!r} clashes with the data variable of that name")
        arrays[f"{LABELS}/{name}"] = convert(value, f"label {name!r}")
    for name, array in arrays.items():
        if len(array) != n:
            msg = f"data split {split!r}: {name} has {len(array)} examples; expected {n} like inputs"
            raise DataError(msg)
    token_shape = arrays["mask"].shape[1:] if "mask" in arrays else arrays.get("targets", np.zeros(n)).shape[1:]
    result = {}
    for name, array in arrays.items():
        short = name.removeprefix(f"{LABELS}/")
        dims = ["example"]
        k = len(token_shape)
        if k and array.shape[1 : 1 + k] == token_shape:
            dims += ["position"] + [f"position.{j}" for j in range(1, k)]
        dims += [f"{short}.{j}" for j in range(len(dims), array.ndim)]
        result[name] = (array, tuple(dims))
    return result


def data_digest(variables: dict[str, tuple[np.ndarray, tuple[str, ...]]]) -> str:
    """The content hash of a split, as docs/store-format.md section 1.4 defines it (of its little-endian bytes)."""
    digest = hashlib.sha256()
    for name in sorted(variables):
        array = variables[name][0]
        if array.dtype.kind != "O" and array.dtype.str.startswith(">"):
            # hashed as stored, little-endian: the hash of a split never depends on the order it came in
            array = array.astype(array.dtype.newbyteorder("<"))
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(array.tobytes() if array.dtype.kind != "O" else json.dumps(array.tolist()).encode())
    return digest.hexdigest()


__all__ = ["check_data", "data_digest"]
