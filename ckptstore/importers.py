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
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.errors import CkptError, ImportFormatError, ModelConfigError, StoreExistsError, StoreNotFoundError
from ckpt.store import _zarr
from ckpt.store.format import ROOT_ATTR
from ckpt.store.publish import lock_replaceable, occupied, publish, publish_url, remove_store, staging_path, staging_url
from ckpt.store.reader import INCOMPLETE
from ckpt.store.selection import SELECTION_ATTR, TensorSelection, check_same_selection, parse_globs, select_steps
from ckpt.store.writer import create

FORMATS = ("torch", "safetensors", "hf")
"""Source formats of :func:`import_checkpoints` (``"auto"`` picks one of them)."""

_SUFFIXES = {"torch": (".pt", ".pth", ".bin", ".ckpt"), "safetensors": (".safetensors",)}  # .ckpt: Lightning
# entries of a training loop's checkpoint dict that commonly hold the model's state_dict
_STATE_DICT_KEYS = ("model", "state_dict", "model_state_dict", "module")
_HF_DIR = re.compile(r"checkpoint-\d+")
# what an HF Trainer checkpoint folder holds, by preference; an index names the shards of a sharded one
_HF_WEIGHTS = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")
# a name's step when it says so: step=000100 (Lightning), global_step_5, step-20, step100
_STEP_WORD = re.compile(r"(?<![a-z])(?:global_)?step[=_-]?(\d+)", re.IGNORECASE)
HF_STATE = "trainer_state.json"
"""What an HF Trainer checkpoint folder records of its run: global_step and the log."""
HF_FACTORY = "ckpt.plugins.huggingface:build_model"
"""The model factory an imported HF run records (rebuilds the model from its config.json with transformers)."""
HF_NOT_MODEL_CONFIG = ("_name_or_path", "name_or_path", "_commit_hash", "transformers_version", "torch_dtype", "dtype")
"""Entries of ``config.json`` that describe the saved file, not the architecture (dropped at any depth).

The folder or Hub revision a config was saved from is among them: the factory refuses a config that
names one (``ckpt.plugins.huggingface``), so imported runs keep none. Keys that name code
(``auto_map``) are kept, for the factory to refuse: without that code the run's model is not rebuilt.
"""
HF_CAUSAL_LM = ("ForCausalLM", "LMHeadModel")
"""Endings of the architecture names whose runs get the ``causal-lm`` objective."""


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
    skipped: tuple[str, ...] = ()
    """Files of the source folder that are not checkpoints of its format (named, never silently dropped)."""
    appended: bool = False
    """The store existed: ``steps`` are the checkpoints appended to it (none when it was up to date)."""
    kept: int = 0
    """With ``appended``: the checkpoints the store already held."""


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


def _pattern_step(path: Path, compiled: tuple[re.Pattern[str], int | str]) -> int:
    pattern, group = compiled
    match = pattern.search(path.name)
    value = match.group(group) if match else None
    if value is None or not value.isdecimal():
        found = "does not match" if match is None else f"gives {value!r}, not an integer, for"
        msg = f"cannot tell the step of {path}: its name {found} the step pattern '{pattern.pattern}'"
        raise ImportFormatError(f"{msg}; fix the pattern or move the file out of the folder")
    return int(value)


def _name_step(path: Path) -> int | None:
    """The step a name states: after the word ``step`` (``step=000100``), else its only integer.

    Returns None for a name without integers. A name with several integers and no ``step`` word
    (``ckpt-3-of-run7_epoch12.pt``) is ambiguous: an error, never a guess.
    """
    stem = path.name if path.is_dir() else path.stem
    stated = {int(v) for v in _STEP_WORD.findall(stem)}
    if len(stated) == 1:
        return stated.pop()
    numbers = [int(v) for v in re.findall(r"\d+", stem)]
    if not numbers:
        return None
    if len(set(numbers)) == 1:
        return numbers[0]
    listed = ", ".join(str(n) for n in dict.fromkeys(numbers))
    msg = f"cannot tell the step of {path} from its name: it holds the integers {listed}"
    raise ImportFormatError(f"{msg}; pass --step-pattern with a group capturing the step")


def _recorded_step(path: Path, files: tuple[Path, ...], fmt: str) -> tuple[int, str] | None:
    """The step a checkpoint records itself, and where it says so (None when it records none).

    An HF folder's ``trainer_state.json`` ``global_step``; a torch checkpoint dict's
    ``global_step`` (Lightning's ``.ckpt`` files, many training loops).
    """
    if fmt == "hf":
        state = path / HF_STATE
        if not state.is_file():
            return None
        try:
            value = json.loads(state.read_text())["global_step"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImportFormatError(f"cannot read the global_step of {state}: {exc!r}") from None
        return (int(value), f"its {HF_STATE} says global_step {value}") if isinstance(value, int) else None
    if fmt != "torch":
        return None
    import torch

    try:  # mmap: only the pickled header is read, not the tensors
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(files[0], map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(files[0]))
    except Exception:  # unreadable: the import names the file and why when it loads it
        return None
    value = obj.get("global_step") if isinstance(obj, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value, f"the file records global_step {value}"
    return None


def _step_of(path: Path, files: tuple[Path, ...], fmt: str, compiled: tuple[re.Pattern[str], int | str] | None) -> int:
    """The step of one checkpoint: the step pattern's, else the one it records, else its name's.

    A recorded step and a name that states another one disagree: an error naming both, since
    one of them is wrong (a renamed or copied file).
    """
    if compiled is not None:
        return _pattern_step(path, compiled)
    recorded = _recorded_step(path, files, fmt)
    try:
        named = _name_step(path)
    except ImportFormatError:
        if recorded is None:
            raise
        named = None  # an ambiguous name, but the checkpoint says which step it is
    if recorded is not None:
        step, where = recorded
        if named is not None and named != step:
            msg = f"{path}: its name says step {named} but {where}; one of them is wrong (a renamed or copied file?)"
            raise ImportFormatError(f"{msg}: fix the name, or pass --step-pattern to trust names")
        return step
    if named is None:
        raise ImportFormatError(f"cannot tell the step of {path}: its name holds no integer; pass --step-pattern")
    return named


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
        step is the one the checkpoint records (an HF folder's
        ``trainer_state.json``, a torch checkpoint dict's ``global_step``, as
        Lightning's ``.ckpt`` files have), else the one its name states (after
        the word ``step``, or its only integer); a name with several integers
        and no ``step`` word is ambiguous and an error, and so is a name that
        states another step than the checkpoint records.

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
        step = _step_of(path, files, fmt, compiled)
        if step in by_step:
            msg = f"{by_step[step].path} and {path} both have step {step}; remove one, or pass --step-pattern"
            raise ImportFormatError(msg)
        by_step[step] = CheckpointSource(step, path, files)
    return [by_step[s] for s in sorted(by_step)]


def skipped_files(src: str | os.PathLike[str], format: str = "auto") -> list[str]:  # noqa: A002
    """Names of the files of ``src`` that an import of ``format`` skips: not checkpoints of that format.

    ``ckpt import`` names them in a warning, so that a checkpoint saved under another suffix
    (or in another format) is never dropped without a word.
    """
    folder = _source_dir(src)
    fmt = detect_format(folder) if format == "auto" else format
    if fmt not in _SUFFIXES:
        return []
    return [p.name for p in _visible(folder) if p.is_file() and p.suffix.lower() not in _SUFFIXES[fmt]]


def hf_model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of an HF ``config.json`` that describe the architecture (what the model spec records)."""
    return {
        k: hf_model_config(v) if isinstance(v, Mapping) else v
        for k, v in config.items()
        if k not in HF_NOT_MODEL_CONFIG
    }


def _hf_run_metadata(sources: list[CheckpointSource]) -> tuple[dict[str, Any] | None, dict[int, dict[str, float]]]:
    """The last checkpoint's ``config.json`` (None without one) and the Trainer's log at each checkpoint's step.

    The log is the last checkpoint's ``trainer_state.json`` ``log_history`` (it holds every earlier
    entry); only entries logged at exactly a checkpoint's step are kept, numbers only.
    """
    last = sources[-1].path
    config = None
    if (last / "config.json").is_file():
        try:
            config = json.loads((last / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ImportFormatError(f"cannot read {last / 'config.json'}: {exc!r}") from None
    metrics: dict[int, dict[str, float]] = {}
    state = last / HF_STATE
    if state.is_file():
        try:
            history = json.loads(state.read_text()).get("log_history", [])
        except (OSError, ValueError, AttributeError) as exc:
            raise ImportFormatError(f"cannot read the log of {state}: {exc!r}") from None
        steps = {s.step for s in sources}
        for entry in history if isinstance(history, list) else []:
            step = entry.get("step") if isinstance(entry, dict) else None
            if step in steps:
                numbers = {
                    k: float(v)
                    for k, v in entry.items()
                    if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
                }
                metrics.setdefault(step, {}).update(numbers)
    return config, metrics


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


def _loader(
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


def _selecting(
    load: Callable[[CheckpointSource], dict[str, Any]], selection: TensorSelection | None
) -> Callable[[CheckpointSource], dict[str, Any]]:
    """``load``, keeping only the tensors ``selection`` names (after the key conversion): ``--tensors``."""
    if selection is None:
        return load
    return lambda source: selection.apply(load(source), str(source.path))[0]


def _append(
    src: str | os.PathLike[str],
    where: str,
    fmt: str,
    sources: list[CheckpointSource],
    load: Callable[[CheckpointSource], dict[str, Any]],
    logged: Mapping[int, Mapping[str, float]],
    skipped: list[str],
    progress: Callable[[int, int, int], None] | None,
    storage_options: dict[str, Any] | None,
    globs: tuple[str, ...] | None,
) -> ImportReport:
    """Append the checkpoints of ``src`` newer than the store's last one, after checking it is the same run.

    The same run: the store was imported from ``src`` in the same format, and the newest
    checkpoint both hold is bit-identical in both (when the source still has one: a ``Trainer``
    with ``save_total_limit`` deletes old checkpoints). A checkpoint older than the store's last
    that the store lacks cannot be inserted: an error. Each appended checkpoint is its own commit.
    """
    import numpy as np

    from ckpt.store import open as open_store

    store = open_store(where, storage_options=storage_options)
    attrs = store.attrs
    origin, stored_format = attrs.get("imported_from"), attrs.get("import_format")
    same_source = origin is not None and Path(str(origin)).resolve() == Path(src).resolve()
    if not same_source or stored_format != fmt:
        what = f"an import of {origin} ({stored_format})" if origin else "not an import"
        msg = f"{where} already exists and is {what}, not of {src} ({fmt}); pass --overwrite to replace it"
        raise StoreExistsError(f"{msg}, or choose another destination")
    check_same_selection(TensorSelection.of_store(attrs, where), globs, where)
    held = [int(s) for s in store.steps]
    last = held[-1] if held else -1
    by_step = {s.step: s for s in sources}
    missing = [s.step for s in sources if s.step < last and s.step not in set(held)]
    if missing:
        msg = f"{src} has checkpoints older than the last one in {where} ({last}) that the store lacks: {missing[:5]}"
        raise ImportFormatError(f"{msg}; re-import with --overwrite to rebuild the store")
    common = [step for step in held if step in by_step]
    if common:  # the newest checkpoint both hold must be the same bits
        step = common[-1]
        loaded = load(by_step[step])
        stored = store.tensors(step)
        differs = sorted(set(loaded) ^ set(stored)) or [
            name for name in loaded if not np.array_equal(_as_numpy(loaded[name]), stored[name])
        ]
        if differs:
            msg = f"{by_step[step].path} is not the checkpoint {where} holds at step {step} (tensor {differs[0]!r})"
            raise ImportFormatError(f"{msg}: another run in the same folder? Pass --overwrite to replace the store")
    new = [s for s in sources if s.step > last]
    if new:
        writer = open_store(where, mode="a", storage_options=storage_options)
        try:
            for done, source in enumerate(new, 1):
                writer.write(source.step, load(source), metrics=logged.get(source.step))
                if progress is not None:
                    progress(done, len(new), source.step)
        finally:
            writer.close()
    tensors = len(store.tensor_names)
    read = sum(f.stat().st_size for s in new for f in s.files)
    return ImportReport(where, fmt, [s.step for s in new], tensors, read, tuple(skipped), appended=True, kept=len(held))


def _as_numpy(tensor: Any) -> Any:
    """A torch tensor as the numpy array the store returns (bfloat16 through ml_dtypes)."""
    from ckpt.store.arrays import decode_numpy, to_numpy

    return decode_numpy(*to_numpy(tensor))


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
    tensors: str | Sequence[str] | None = None,
    steps: str | None = None,
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
    tensors
        ``fnmatch`` globs (``--tensors``): only the tensors whose names, after the key conversion,
        match one are imported; the store records the selection (:mod:`ckpt.store.selection`). A
        glob that matches no tensor is an error.
    steps
        Steps and inclusive step ranges (``--steps``: ``0,1000-5000,100000-``): only those
        checkpoints are imported (:func:`ckpt.store.selection.select_steps`).

    Returns
    -------
    ImportReport

    Raises
    ------
    StoreNotFoundError, ImportFormatError
        Before anything is written, or after removing the partial destination.
    StoreExistsError
        When ``dest`` exists, ``overwrite`` is false and it is not an import of ``src``. An import
        of ``src`` is brought up to date instead: the checkpoints newer than its last are appended
        (after checking that the newest checkpoint both hold is the same), as for a run that is
        still training.

    """
    fmt = detect_format(src) if format == "auto" else format
    sources = discover(src, fmt, step_pattern)
    if steps is not None:
        chosen = set(select_steps(steps, [s.step for s in sources], f"checkpoint of {src}"))
        sources = [s for s in sources if s.step in chosen]
    globs = parse_globs(tensors)
    selection = TensorSelection(globs) if globs else None
    if key is not None and fmt == "safetensors":
        raise ImportFormatError("key= (--key) applies to torch files; safetensors files hold tensors directly")
    where, local = str(dest), _zarr.local_path(dest)
    if local is not None and local.resolve() in (Path(src).resolve(), *Path(src).resolve().parents):
        # create(overwrite=True) would delete the very files about to be read
        raise ImportFormatError(f"the destination {where} is, or contains, the source folder {src}")
    attrs: dict[str, Any] = {"imported_from": str(src), "import_format": fmt}
    logged: dict[int, dict[str, float]] = {}
    if fmt == "hf":  # the run describes itself: its model (config.json), objective and log
        hf_config, logged = _hf_run_metadata(sources)
        if hf_config is not None and model is None:
            model, config = HF_FACTORY, hf_model_config(hf_config)
            architecture = (hf_config.get("architectures") or [""])[0]
            if objective is None and architecture.endswith(HF_CAUSAL_LM):
                objective = "causal-lm"
    if model == HF_FACTORY and config is not None:  # a config.json given with --config: only its architecture
        config = hf_model_config(config)
    load = _selecting(_loader(fmt, key, model, config), selection)
    skipped = skipped_files(src, fmt)
    # Locally the store is built beside dest and moved into place when complete: a killed import
    # leaves dest as it was (absent, or the old store), never a store with part of the run. An object
    # store has no rename: a new store is built in place, marked incomplete until its last commit (so
    # readers refuse a killed import, and a rerun replaces it); a replacement is built at a sibling
    # prefix and copied in, root record last, once complete (docs/store-format.md §4.3.1).
    options = storage_options if local is None else None
    exists = occupied(where, local, options)
    interrupted = local is None and exists and _interrupted_import(where, options)
    if exists and not overwrite and not interrupted:
        # a run that is still training: append what the store does not have yet
        return _append(src, where, fmt, sources, load, logged, skipped, progress, options, globs)
    first = None
    if selection is not None:  # the first checkpoint gives the selection's record (and errors) before any store
        loaded, measured = selection.apply(_loader(fmt, key, model, config)(sources[0]), str(sources[0].path))
        first, attrs[SELECTION_ATTR] = loaded, measured.to_json()
    old_lock = lock_replaceable(where, local, options) if exists else None
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
        bytes_read, count, current = 0, 0, sources[0]
        try:
            for done, current in enumerate(sources, 1):
                loaded, first = first if first is not None else load(current), None
                count = len(loaded)
                bytes_read += sum(f.stat().st_size for f in current.files)
                writer.write(current.step, loaded, metrics=logged.get(current.step))
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
    return ImportReport(where, fmt, [s.step for s in sources], count, bytes_read, tuple(skipped))


# -- what the Hub import (ckpt.store.hub) shares with this one: a revision is a Trainer folder -----------
HF_WEIGHTS = _HF_WEIGHTS
"""The weight files of an HF checkpoint folder (or Hub revision), by preference; an index names its shards."""
compile_step_pattern = _compile
"""Validate a ``--step-pattern``: the compiled pattern and its step group (an ``ImportFormatError`` if bad)."""
checkpoint_loader = _loader
"""``checkpoint_loader(format, key, model, config)``: the loader of one checkpoint, with the key conversion."""


__all__ = [
    "FORMATS",
    "HF_CAUSAL_LM",
    "HF_FACTORY",
    "HF_NOT_MODEL_CONFIG",
    "HF_STATE",
    "HF_WEIGHTS",
    "CheckpointSource",
    "ImportReport",
    "checkpoint_loader",
    "compile_step_pattern",
    "detect_format",
    "discover",
    "hf_model_config",
    "import_checkpoints",
    "load_checkpoint",
    "skipped_files",
]
