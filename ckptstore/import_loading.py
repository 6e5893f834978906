"""Loading one checkpoint of an import: a torch or safetensors file (or an HF folder's shards), safely.

Torch files are unpickled with ``weights_only`` (no code runs); a checkpoint dict's state_dict is
found by its key; the shards of a sharded checkpoint are merged, a tensor in two shards refused.
:func:`checkpoint_loader` adds transformers' key conversion for runs the Hugging Face factory
rebuilds. Re-exported by :mod:`ckpt.store.importers`, where it was first defined.
"""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ckpt.errors import ImportFormatError, ModelConfigError
from ckpt.store.import_sources import FORMATS, HF_FACTORY, CheckpointSource

# entries of a training loop's checkpoint dict that commonly hold the model's state_dict
_STATE_DICT_KEYS = ("model", "state_dict", "model_state_dict", "module")


def _is_state_dict(obj: Any) -> bool:
    import torch

    tensors = isinstance(obj, Mapping) and all(isinstance(v, torch.Tensor) for v in obj.values())
    return tensors and bool(obj) and all(isinstance(k, str) for k in obj)


def _state_dict(obj: Any, file: Path, key: str | None) -> dict[str, Any]:
    """Return the mapping name -> tensor inside what ``torch.load`` returned."""
    entries = ", ".join(map(repr, list(obj)[:10])) if isinstance(obj, Mapping) else type(obj).__name__
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            raise ImportFormatError(f"{file} has no entry {key!r}; its entries are: {entries}")
        if not _is_state_dict(obj[key]):
            raise ImportFormatError(f"entry {key!r} of {file} is not a mapping name -> tensor")
        return dict(obj[key])
    if _is_state_dict(obj):
        return dict(obj)
    if not isinstance(obj, Mapping):
        raise ImportFormatError(f"{file} holds a {type(obj).__name__}, not a state_dict (a mapping name -> tensor)")
    candidates = [k for k in _STATE_DICT_KEYS if _is_state_dict(obj.get(k))]
    if len(candidates) == 1:
        return dict(obj[candidates[0]])
    msg = f"{file} is not a state_dict, nor holds one under a single key among {', '.join(_STATE_DICT_KEYS)}"
    raise ImportFormatError(f"{msg}; its entries are: {entries}; pass key= (--key) naming the model weights")


def _refusal(file: Path, why: str) -> str:
    """What ckpt says when torch's safe unpickler refuses ``file``: never torch's own advice.

    torch's message suggests ``weights_only=False``, which runs whatever the pickle holds: the one
    thing to avoid with a file from someone else. This says what was refused and why, and how a
    user who trusts the file can convert it.
    """
    found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", why)
    if found is None:
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", why)
        reason = detail.group(1).strip() if detail else "not a pickle of tensors"
        return f"cannot load {file}: it is corrupt or not a torch checkpoint ({reason})"
    return (
        f"refusing to load {file}: its pickle calls {found.group(1)}, and ckpt loads pickled checkpoints only "
        "when they hold nothing but tensors and plain containers, because unpickling anything else can run "
        "arbitrary code. If you trust this file and its author, load it in Python yourself and save its "
        "state_dict as safetensors (safetensors.torch.save_file(state_dict, 'step_N.safetensors')), then "
        "import that folder"
    )


def _load_file(file: Path, key: str | None) -> dict[str, Any]:
    import torch

    try:
        if file.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            return load_file(file, device="cpu")
        # mmap leaves the pages on disk until the writer reads them; legacy (non-zip) files cannot be mapped
        with warnings.catch_warnings():  # torch's warnings about the file are not the user's business here
            warnings.simplefilter("ignore")
            obj = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except pickle.UnpicklingError as exc:  # weights_only refuses what could run code, and fails on garbage
        raise ImportFormatError(_refusal(file, str(exc))) from None
    except Exception as exc:  # zip and safetensors failures have many types; all mean "unreadable"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImportFormatError(f"cannot load {file}: {first}") from exc
    return _state_dict(obj, file, key)


def load_checkpoint(
    source: CheckpointSource,
    format: str,  # noqa: A002 - the public name matches --format
    key: str | None = None,
) -> dict[str, Any]:
    """Load the tensors of one checkpoint, merging the shards of a sharded HF checkpoint.

    Parameters
    ----------
    source
        A checkpoint from :func:`discover`.
    format
        Its format, one of :data:`FORMATS`.
    key
        Entry of a torch checkpoint dict holding the state_dict; by default the
        file itself, or its one ``model``/``state_dict``/``model_state_dict``/
        ``module`` entry that maps names to tensors.

    Returns
    -------
    dict
        Tensor name -> CPU ``torch.Tensor``.

    Raises
    ------
    ImportFormatError
        Naming the file that could not be loaded and why.

    """
    if format not in FORMATS:
        raise ImportFormatError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    tensors: dict[str, Any] = {}
    for file in source.files:
        for name, tensor in _load_file(file, key).items():
            if name in tensors:
                raise ImportFormatError(f"tensor {name!r} of {source.path} is in more than one shard ({file.name})")
            tensors[name] = tensor
    return tensors


def checkpoint_loader(
    fmt: str, key: str | None, model: str | None, config: Mapping[str, Any] | None
) -> Callable[[CheckpointSource], dict[str, Any]]:
    """The function loading one checkpoint of an import: :func:`load_checkpoint`, then key conversion.

    For a run the Hugging Face factory rebuilds, the conversion is transformers' own, to the names
    of the model built from the config (:func:`ckpt.store.hf_keys.hf_state_dict`).
    """
    if model != HF_FACTORY or config is None:
        return lambda source: load_checkpoint(source, fmt, key)
    from ckpt.store.hf_keys import hf_state_dict

    def load(source: CheckpointSource) -> dict[str, Any]:
        tensors = load_checkpoint(source, fmt, key)
        try:
            return hf_state_dict(config, tensors)
        except ModelConfigError as exc:
            msg = f"cannot import {source.path}: {exc}"
            raise ImportFormatError(msg) from None

    return load


__all__ = ["checkpoint_loader", "load_checkpoint"]
