"""``ckpt data add`` and ``ckpt set-model``: attaching evaluation data and a model to a store after the fact.

A store imported from a framework's checkpoint folder holds weights only; these commands add what
analyzers need beside them without re-importing (which would drop stored results). Results that
depended on what changed become stale by their provenance and are recomputed, never reused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


def _check_npy_header(file: Path, what: str) -> None:
    """Refuse a ``.npy`` whose header numpy would act on badly, from the header alone (nothing is loaded).

    A header is data: more than :data:`~ckpt.store.record.MAX_DIMS` dimensions ended in a traceback
    deep in zarr, and a shape whose bytes exceed the file's made numpy try to allocate them (10^11
    rows: 1.5 TiB) before finding the file short.
    """
    import math

    import numpy as np
    from numpy.lib import format as npy

    from ckpt.store.record import MAX_DIMS

    with file.open("rb") as stream:
        version = npy.read_magic(stream)
        if version not in ((1, 0), (2, 0)):  # 3.0 is for non-latin-1 field names: structured, refused anyway
            msg = f"{file} is a .npy file of format version {version[0]}.{version[1]}; save it with numpy.save"
            raise ValueError(msg)
        read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read_header(stream)
        data_bytes = file.stat().st_size - stream.tell()
    if len(shape) > MAX_DIMS:
        msg = f"{file} has {len(shape)} dimensions; at most {MAX_DIMS} are supported"
        raise click.BadParameter(msg, param_hint=what)
    claimed = math.prod(shape) * np.dtype(dtype).itemsize
    if not dtype.hasobject and claimed > data_bytes:
        msg = (
            f"{file}: its header claims shape {shape} ({claimed:,} bytes) but the file holds {data_bytes:,} bytes "
            "of data: it is truncated or was not written by numpy.save"
        )
        raise click.BadParameter(msg, param_hint=what)


def _load_array(path: str, what: str) -> Any:
    import numpy as np

    file = Path(path)
    if not file.is_file():
        raise click.BadParameter(f"{path} does not exist", param_hint=what)
    try:
        _check_npy_header(file, what)  # before numpy allocates what the header claims
        return np.load(file, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise click.BadParameter(f"{path} is not a .npy array ({exc})", param_hint=what) from None


def _labels(values: tuple[str, ...]) -> dict[str, Any]:
    labels = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=FILE.npy, got {value!r}", param_hint="--labels")
        labels[name] = _load_array(path, f"--labels {name}")
    return labels


def _text_tokens(path: str, tokenizer: str, length: int) -> Any:
    """Token ids ``[examples, length]`` of a text file, one example per non-empty line, right-padded with -100."""
    import numpy as np

    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise click.UsageError("--text needs transformers (pip install 'ckpt-dynamics[hf]')") from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as exc:
        msg = f"cannot load the tokenizer {tokenizer!r} ({str(exc).splitlines()[0]}): pass a local tokenizer folder"
        raise click.UsageError(msg) from None
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise click.BadParameter(f"{path} has no non-empty line", param_hint="--text")
    encoded = [tok(line)["input_ids"][:length] for line in lines]
    ids = np.full((len(encoded), length), -100, dtype=np.int64)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
    return ids, lines


@click.group("data")
def data() -> None:
    """Evaluation data of a store: ckpt data add STORE SPLIT ..."""


@data.command("add")
@click.argument("store", metavar="STORE")
@click.argument("split", metavar="SPLIT")
@click.option(
    "--inputs", metavar="FILE.npy", help="Model inputs, first dim = examples (token ids for a language model)."
)
@click.option(
    "--targets",
    metavar="FILE.npy",
    help="Targets (default: the inputs). For causal-lm, unshifted labels as Hugging Face takes them: the "
    "objective pairs the logits at t with the target at t+1.",
)
@click.option("--mask", metavar="FILE.npy", help="Boolean, shape of the targets: which tokens are datapoints.")
@click.option("--labels", multiple=True, metavar="NAME=FILE.npy", help="A per-example or per-token label (repeatable).")
@click.option("--text", metavar="FILE.txt", help="A text file, one example per line, tokenized with --tokenizer.")
@click.option("--tokenizer", metavar="DIR", help="With --text: a Hugging Face tokenizer folder.")
@click.option("--length", type=click.IntRange(min=2), default=128, show_default=True, help="With --text: tokens kept.")
@click.option("--overwrite", is_flag=True, help="Replace an existing split of that name.")
def add_command(
    store: str,
    split: str,
    inputs: str | None,
    targets: str | None,
    mask: str | None,
    labels: tuple[str, ...],
    text: str | None,
    tokenizer: str | None,
    length: int,
    overwrite: bool,
) -> None:
    """Add the evaluation data SPLIT to STORE, from .npy files or a text file and a tokenizer.

    Results computed before are kept but become stale (their provenance names the data they saw):
    the next ckpt analyze recomputes them.
    """
    import numpy as np

    import ckpt.store as ckptstore

    if (inputs is None) == (text is None):
        raise click.UsageError("pass --inputs FILE.npy, or --text FILE.txt with --tokenizer DIR")
    strings = None
    if text is not None:
        if tokenizer is None:
            raise click.UsageError("--text needs --tokenizer DIR (a Hugging Face tokenizer folder)")
        values, strings = _text_tokens(text, tokenizer, length)
        mask_values = values != -100
        values = np.where(mask_values, values, 0)  # padding: any valid id, masked out below
        target_values = values
    else:
        values = _load_array(inputs, "--inputs")
        target_values = _load_array(targets, "--targets") if targets else None
        mask_values = _load_array(mask, "--mask") if mask else None
    label_values = _labels(labels)
    # every check before the store is opened for writing: a refused command leaves it byte for byte
    from ckpt.errors import DataError
    from ckpt.store.data import check_data

    if split in ckptstore.open(store).splits and not overwrite:
        msg = f"data split {split!r} already exists in {store}; pass --overwrite to replace it"
        raise DataError(msg)
    check_data(split, values, target_values, mask_values, label_values, strings)
    writer = ckptstore.open(store, mode="a")
    try:
        writer.add_data(split, values, target_values, mask_values, label_values, text=strings, overwrite=overwrite)
    finally:
        writer.close()
    opened = ckptstore.open(store)
    examples = opened.data(split).attrs["examples"]
    click.echo(f"added split {split!r} to {store}: {examples} examples, {_scored(opened, split)}")


def _scored(store: Any, split: str) -> str:
    """The datapoints the store's objective scores in ``split`` (what ``loss`` will count), said as such.

    A causal LM scores each position with a next-token target and mask, not each example nor each
    kept token. Without a registered objective: the count stored with the split (the mask's tokens,
    else the examples).
    """
    from ckpt.cli.analyze import registry
    from ckpt.plugins import datapoint_index

    name = store.objective
    if name is None or name not in registry().objectives:
        return f"{store.data(split).attrs['datapoints']} datapoints"
    example, _ = datapoint_index(store, split, name)
    return f"{len(example)} datapoints of objective {name!r}"


@click.command("set-model")
@click.argument("store", metavar="STORE")
@click.option("--model", "factory", metavar="ENTRYPOINT", help="Model factory 'package.module:function'.")
@click.option("--config", metavar="JSON", help="JSON object of keyword arguments for the factory.")
@click.option("--hf-config", metavar="CONFIG.json", help="A Hugging Face config.json: rebuild with transformers.")
@click.option("--objective", metavar="NAME", help="Per-datapoint loss (ckpt plugins lists them).")
def set_model(
    store: str, factory: str | None, config: str | None, hf_config: str | None, objective: str | None
) -> None:
    """Set or change the model spec and objective of STORE.

    Results computed with another model or objective become stale (provenance): the next ckpt
    analyze recomputes them.
    """
    import ckpt.store as ckptstore
    from ckpt.cli.analyze import registry
    from ckpt.cli.io import parse_config

    if factory is None and hf_config is None and objective is None:
        raise click.UsageError("pass --model (with --config), --hf-config, or --objective")
    if factory is not None and hf_config is not None:
        raise click.UsageError("--model and --hf-config both name a model: pass one")
    settings: dict[str, Any] = {}
    if hf_config is not None:
        from ckpt.plugins.huggingface import FACTORY, model_config

        try:
            loaded = json.loads(Path(hf_config).read_text())
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"cannot read {hf_config} ({exc})", param_hint="--hf-config") from None
        settings.update(model=FACTORY, config=model_config(loaded))
    elif factory is not None:
        if ":" not in factory:
            raise click.BadParameter(f"expected 'package.module:function', got {factory!r}", param_hint="--model")
        settings.update(model=factory, config=parse_config(config) or {})
    if objective is not None:
        known = registry().objectives
        if objective not in known:
            choices = ", ".join(sorted(known))
            raise click.BadParameter(
                f"unknown objective {objective!r}; choose from {choices}", param_hint="--objective"
            )
        settings["objective"] = objective
    writer = ckptstore.open(store, mode="a")
    try:
        writer.set_model(**settings)
    finally:
        writer.close()
    opened = ckptstore.open(store)
    model = opened.model.factory if opened.model else "-"
    click.echo(f"{store}: model {model}, objective {opened.objective or '-'}")


__all__ = ["add_command", "data", "set_model"]
