"""The checkpoints of a source folder: their format, steps and files, found before anything is loaded.

:func:`discover` lists the checkpoints of a folder of torch or safetensors files, or of Hugging
Face Trainer ``checkpoint-N`` folders, each with its step (from a ``--step-pattern``, the name, or
what the checkpoint records) and the files holding its tensors; what a name cannot tell is an
error before the destination is created. Also what an HF run records (:data:`HF_FACTORY`,
:func:`hf_model_config`). Re-exported by :mod:`ckpt.store.importers`, where it was first defined.
"""

from __future__ import annotations

import json
import os
import re
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.errors import ImportFormatError, StoreNotFoundError

FORMATS = ("torch", "safetensors", "hf")
"""Source formats of :func:`import_checkpoints` (``"auto"`` picks one of them)."""

_SUFFIXES = {"torch": (".pt", ".pth", ".bin", ".ckpt"), "safetensors": (".safetensors",)}  # .ckpt: Lightning
_HF_DIR = re.compile(r"checkpoint-\d+")
HF_WEIGHTS = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")
"""The weight files of an HF checkpoint folder (or Hub revision), by preference; an index names its shards."""
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


def compile_step_pattern(step_pattern: str) -> tuple[re.Pattern[str], int | str]:
    """Validate a ``--step-pattern``: the compiled pattern and its step group (an ``ImportFormatError`` if bad)."""
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
    for name in HF_WEIGHTS:
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
    compiled = None if step_pattern is None else compile_step_pattern(step_pattern)
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
                raise ImportFormatError(f"{sub} holds no model weights: expected one of {', '.join(HF_WEIGHTS)}")
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


__all__ = [
    "FORMATS",
    "HF_CAUSAL_LM",
    "HF_FACTORY",
    "HF_NOT_MODEL_CONFIG",
    "HF_STATE",
    "HF_WEIGHTS",
    "CheckpointSource",
    "compile_step_pattern",
    "detect_format",
    "discover",
    "hf_model_config",
    "skipped_files",
]
