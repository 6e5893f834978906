"""Importing a folder of torch, safetensors or Hugging Face checkpoints into a new store.

The import streams (one checkpoint is loaded, written and dropped before the
next), and everything that file names tell (format, steps, shards) is checked
before the destination is created: an import leaves a complete store or none.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.errors import CkptError, ImportFormatError, StoreExistsError, StoreNotFoundError
from ckpt.store import _zarr
from ckpt.store.format import ROOT_ATTR
from ckpt.store.reader import INCOMPLETE
from ckpt.store.writer import (
    _exists,
    _replaceable,
    create,
    publish,
    publish_url,
    remove_store,
    staging_path,
    staging_url,
)

FORMATS = ("torch", "safetensors", "hf")
"""Source formats of :func:`import_checkpoints` (``"auto"`` picks one of them)."""

_SUFFIXES = {"torch": (".pt", ".pth", ".bin"), "safetensors": (".safetensors",)}
# entries of a training loop's checkpoint dict that commonly hold the model's state_dict
_STATE_DICT_KEYS = ("model", "state_dict", "model_state_dict", "module")
_HF_DIR = re.compile(r"checkpoint-\d+")
# what an HF Trainer checkpoint folder holds, by preference; an index names the shards of a sharded one
_HF_WEIGHTS = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class CheckpointSource:
    """One checkpoint of the source folder: its step, file or hf folder, and the files holding its tensors."""

    step: int
    path: Path
    files: tuple[Path, ...]  # several for a sharded HF checkpoint


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_checkpoints` wrote: ``tensors`` per checkpoint, ``bytes_read`` of source files."""

    dest: str
    format: str
    steps: list[int]
    tensors: int
    bytes_read: int


def _source_dir(src: str | os.PathLike[str]) -> Path:
    path = Path(src)
    if not path.exists():
        raise StoreNotFoundError(f"cannot import from {src}: the path does not exist")
    if not path.is_dir():
        raise ImportFormatError(f"cannot import from {src}: it is a file; pass the folder holding the checkpoints")
    return path


def _visible(path: Path) -> list[Path]:
    # dotfiles are editor/OS droppings (._step_1.pt on macOS), never checkpoints
    return sorted(p for p in path.iterdir() if not p.name.startswith("."))


def _files(folder: Path, fmt: str) -> list[Path]:
    return [p for p in _visible(folder) if p.is_file() and p.suffix.lower() in _SUFFIXES[fmt]]


def detect_format(src: str | os.PathLike[str]) -> str:
    """Guess the format of a folder of checkpoints.

    Parameters
    ----------
    src
        Folder holding the checkpoints.

    Returns
    -------
    str
        ``"hf"`` when it has ``checkpoint-N`` subfolders, else ``"safetensors"`` or ``"torch"``.

    Raises
    ------
    StoreNotFoundError
        When ``src`` does not exist.
    ImportFormatError
        When ``src`` is a file, holds no checkpoints, or both safetensors and torch files.

    """
    folder = _source_dir(src)
    if any(p.is_dir() and _HF_DIR.fullmatch(p.name) for p in _visible(folder)):
        return "hf"
    safetensors, torch = _files(folder, "safetensors"), _files(folder, "torch")
    if safetensors and torch:
        msg = f"{src} holds both safetensors ({safetensors[0].name}, ...) and torch files ({torch[0].name}, ...)"
        raise ImportFormatError(f"{msg}; pass --format safetensors or --format torch")
    if safetensors or torch:
        return "safetensors" if safetensors else "torch"
    msg = f"no checkpoints found in {src}: expected checkpoint-N subfolders (hf), *.safetensors files"
    raise ImportFormatError(f"{msg} or *.pt/*.pth/*.bin files (torch); pass --format")


def _compile(step_pattern: str) -> tuple[re.Pattern[str], int | str]:
    try:
        pattern = re.compile(step_pattern)
    except re.error as exc:
        raise ImportFormatError(f"step pattern '{step_pattern}' is not a valid regular expression: {exc}") from None
    if "step" in pattern.groupindex or pattern.groups == 1:
        return pattern, "step" if "step" in pattern.groupindex else 1
    msg = f"step pattern '{step_pattern}' must have exactly one capturing group, or a named group (?P<step>...)"
    raise ImportFormatError(msg)


def _step_of(path: Path, compiled: tuple[re.Pattern[str], int | str] | None) -> int:
    if compiled is None:  # the last integer: checkpoint-500, step_1000.pt, ckpt-3-of-run7_epoch12.pt -> 12
        numbers = re.findall(r"\d+", path.name if path.is_dir() else path.stem)
        if not numbers:
            raise ImportFormatError(f"cannot tell the step of {path}: its name holds no integer; pass --step-pattern")
        return int(numbers[-1])
    pattern, group = compiled
    match = pattern.search(path.name)
    value = match.group(group) if match else None
    if value is None or not value.isdecimal():
        found = "does not match" if match is None else f"gives {value!r}, not an integer, for"
        msg = f"cannot tell the step of {path}: its name {found} the step pattern '{pattern.pattern}'"
        raise ImportFormatError(f"{msg}; fix the pattern or move the file out of the folder")
    return int(value)


def _hf_files(folder: Path) -> tuple[Path, ...] | None:
    """Return the weight files of an HF checkpoint folder, or None when it holds none."""
    for name in _HF_WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return (path,)
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ImportFormatError(f"cannot read the shard index {path}: {exc!r}") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ImportFormatError(f"the shard index {path} names {missing[0]}, which is not in {folder}")
        return tuple(folder / s for s in shards)
    return None


def discover(
    src: str | os.PathLike[str],
    format: str = "auto",  # noqa: A002 - the public name matches --format
    step_pattern: str | None = None,
) -> list[CheckpointSource]:
    """Find the checkpoints of a folder and their steps, without loading any.

    Parameters
    ----------
    src
        Folder holding the checkpoints.
    format
        One of :data:`FORMATS`, or ``"auto"`` (:func:`detect_format`).
    step_pattern
        Regular expression searched in each file (or hf folder) name, whose one
        capturing group, or group named ``step``, is the step. By default the
        step is the last integer of the name without its suffix.

    Returns
    -------
    list of CheckpointSource
        Sorted by step.

    Raises
    ------
    StoreNotFoundError, ImportFormatError

    """
    folder = _source_dir(src)
    fmt = detect_format(folder) if format == "auto" else format
    if fmt not in FORMATS:
        raise ImportFormatError(f"format must be 'auto' or one of {', '.join(FORMATS)}, got {format!r}")
    compiled = None if step_pattern is None else _compile(step_pattern)
    found: list[tuple[Path, tuple[Path, ...]]] = []
    if fmt == "hf":
        for sub in (p for p in _visible(folder) if p.is_dir()):
            named = _HF_DIR.fullmatch(sub.name) is not None
            # by default only checkpoint-N folders count (HF's output folder also holds runs/ and
            # the final model); with a step pattern every subfolder holding weights does
            files = _hf_files(sub) if named or compiled is not None else None
            if files is not None:
                found.append((sub, files))
            elif named:
                raise ImportFormatError(f"{sub} holds no model weights: expected one of {', '.join(_HF_WEIGHTS)}")
    else:
        found = [(p, (p,)) for p in _files(folder, fmt)]
    if not found:
        expected = (
            "checkpoint-N subfolders (or --step-pattern)" if fmt == "hf" else "/".join(f"*{s}" for s in _SUFFIXES[fmt])
        )
        raise ImportFormatError(f"no checkpoints found in {src}: expected {expected} ({fmt} format)")
    by_step: dict[int, CheckpointSource] = {}
    for path, files in found:
        step = _step_of(path, compiled)
        if step in by_step:
            msg = f"{by_step[step].path} and {path} both have step {step}; pass --step-pattern to tell them apart"
            raise ImportFormatError(msg)
        by_step[step] = CheckpointSource(step, path, files)
    return [by_step[s] for s in sorted(by_step)]


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


def _load_file(file: Path, key: str | None) -> dict[str, Any]:
    import torch

    try:
        if file.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            return load_file(file, device="cpu")
        # mmap leaves the pages on disk until the writer reads them; legacy (non-zip) files cannot be mapped
        obj = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except pickle.UnpicklingError as exc:  # weights_only refuses what could run code, and fails on garbage
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found:
            msg = f"cannot load {file} safely: it holds a Python object ({found.group(1)}) besides tensors"
            raise ImportFormatError(f"{msg} and plain containers; re-save the model's state_dict alone") from exc
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(exc))
        why = detail.group(1).strip() if detail else str(exc).strip().split("\n")[0]
        raise ImportFormatError(f"cannot load {file}: it is corrupt or not a torch checkpoint ({why})") from exc
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


def _interrupted_import(where: str, storage_options: dict[str, Any] | None) -> bool:
    """Whether the store at URL ``where`` is one an import was building in place when it stopped."""
    try:
        zstore = _zarr.open_zarr_store(where, read_only=True, storage_options=storage_options)
        attrs, _ = _zarr.read_root(zstore, where)
    except CkptError:
        return False
    return bool(attrs.get(ROOT_ATTR, {}).get(INCOMPLETE))


def import_checkpoints(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    format: str = "auto",  # noqa: A002 - the public name matches --format
    model: str | None = None,
    config: Mapping[str, Any] | None = None,
    objective: str | None = None,
    framework: str | None = "torch",
    step_pattern: str | None = None,
    key: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int, int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ImportReport:
    """Import a folder of checkpoints into a new store, holding one checkpoint in memory at a time.

    Parameters
    ----------
    src
        Local folder of checkpoints (see :func:`discover`).
    dest
        Path or fsspec URL of the store to create. Locally the store appears complete or
        not at all; at a URL it is built in place, marked incomplete until its last commit
        (readers refuse it; a rerun replaces it).
    format, step_pattern
        See :func:`discover`.
    model, config, objective, framework, overwrite
        As for :func:`ckpt.create`.
    key
        Entry of torch checkpoint dicts holding the state_dict (see :func:`load_checkpoint`).
    progress
        Called as ``progress(done, total, step)`` after each checkpoint is written.
    storage_options
        fsspec options for a URL ``dest`` (credentials ...).

    Returns
    -------
    ImportReport

    Raises
    ------
    StoreNotFoundError, ImportFormatError
        Before anything is written, or after removing the partial destination.
    StoreExistsError
        When ``dest`` exists and ``overwrite`` is false.

    """
    fmt = detect_format(src) if format == "auto" else format
    sources = discover(src, fmt, step_pattern)
    if key is not None and fmt == "safetensors":
        raise ImportFormatError("key= (--key) applies to torch files; safetensors files hold tensors directly")
    where, local = str(dest), _zarr.local_path(dest)
    if local is not None and local.resolve() in (Path(src).resolve(), *Path(src).resolve().parents):
        # create(overwrite=True) would delete the very files about to be read
        raise ImportFormatError(f"the destination {where} is, or contains, the source folder {src}")
    attrs = {"imported_from": str(src), "import_format": fmt}
    # Locally the store is built beside dest and moved into place when complete: a killed import
    # leaves dest as it was (absent, or the old store), never a store with part of the run. An object
    # store has no rename: a new store is built in place, marked incomplete until its last commit (so
    # readers refuse a killed import, and a rerun replaces it); a replacement is built at a sibling
    # prefix and copied in, root record last, once complete (docs/store-format.md §4.3.1).
    options = storage_options if local is None else None
    exists = _exists(where, local, options)
    interrupted = local is None and exists and _interrupted_import(where, options)
    if exists and not overwrite and not interrupted:
        msg = f"{where} already exists; pass --overwrite to replace it, or choose another destination"
        raise StoreExistsError(msg)
    old_lock = _replaceable(where, local, options) if exists else None
    if local is not None:
        build = str(staging_path(local))
    else:
        build = staging_url(where) if exists and not interrupted else where
    try:
        writer = create(
            build,
            model=model,
            config=config,
            objective=objective,
            framework=framework,
            attrs=attrs,
            overwrite=interrupted,
            storage_options=options,
            _incomplete=f"import from {src}",
        )
        bytes_read, tensors, current = 0, 0, sources[0]
        try:
            for done, current in enumerate(sources, 1):
                loaded = load_checkpoint(current, fmt, key)
                tensors = len(loaded)
                bytes_read += sum(f.stat().st_size for f in current.files)
                writer.write(current.step, loaded)
                del loaded  # before the next load: memory holds one checkpoint
                if progress is not None:
                    progress(done, len(sources), current.step)
            writer._mark_complete()
            writer.close()
        except BaseException as exc:
            with contextlib.suppress(Exception):  # the store is deleted next; the original error is what matters
                writer.close()
            remove_store(build, options)
            if not isinstance(exc, Exception):
                raise  # an interrupt: nothing to explain
            # load errors name the file already; writer errors (schema, names, disk) name the step only
            msg = str(exc) if isinstance(exc, ImportFormatError) else f"cannot import {current.path}: {exc}"
            unchanged = "left as it was" if exists else "not created"
            raise ImportFormatError(f"{msg}; the destination {where} was {unchanged}") from exc
        if local is not None:
            publish(Path(build), local, replace=exists)
        elif build != where:
            publish_url(build, where, options)
    finally:
        if old_lock is not None:
            old_lock.release()
    return ImportReport(where, fmt, [s.step for s in sources], tensors, bytes_read)
