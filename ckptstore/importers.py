"""Importing a folder of torch, safetensors or Hugging Face checkpoints into a new store.

The import streams (one checkpoint is loaded, written and dropped before the
next), and everything that file names tell (format, steps, shards) is checked
before the destination is created: an import leaves a complete store or none.
Finding the checkpoints is :mod:`ckpt.store.import_sources`, loading one
:mod:`ckpt.store.import_loading` (both re-exported here).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt.errors import CkptError, ImportFormatError, StoreExistsError
from ckpt.store import _zarr
from ckpt.store.format import ROOT_ATTR
from ckpt.store.import_loading import checkpoint_loader, load_checkpoint
from ckpt.store.import_sources import (
    FORMATS,
    HF_CAUSAL_LM,
    HF_FACTORY,
    HF_NOT_MODEL_CONFIG,
    HF_STATE,
    HF_WEIGHTS,
    CheckpointSource,
    compile_step_pattern,
    detect_format,
    discover,
    hf_model_config,
    skipped_files,
)
from ckpt.store.publish import lock_replaceable, occupied, publish, publish_url, remove_store, staging_path, staging_url
from ckpt.store.reader import INCOMPLETE
from ckpt.store.selection import SELECTION_ATTR, TensorSelection, check_same_selection, parse_globs, select_steps
from ckpt.store.writer import create


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
    load = _selecting(checkpoint_loader(fmt, key, model, config), selection)
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
        loaded, measured = selection.apply(checkpoint_loader(fmt, key, model, config)(sources[0]), str(sources[0].path))
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
