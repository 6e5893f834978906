"""A Hugging Face checkpoint's tensors under the names of the model transformers builds from its config.

transformers renames checkpoint keys while it loads them (``from_pretrained``): GPTNeoX's
``embed_out`` became ``lm_head``, old layer norms say ``gamma``/``beta``, MoE checkpoints hold one
tensor per expert where the model has one stacked tensor, a base model's keys lack the head's
prefix. A store holds the tensors under the names of the model its factory builds, so an import
applies that same conversion: :func:`hf_state_dict`, with transformers' own conversion tables
(``get_model_conversion_mapping``) and its own rules for the keys a model may lack or ignore.

>>> tensors = hf_state_dict(json.load(open("config.json")), load_file("model.safetensors"))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable, Mapping
from copy import deepcopy
from typing import Any

from ckpt.errors import ModelConfigError

__all__ = ["hf_state_dict"]

_SHOWN = 3
"""Keys named on each side of a mismatch."""


def hf_state_dict(config: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Convert one checkpoint's tensors to the names, ties and shapes of the model its ``config.json`` describes.

    What ``from_pretrained`` does to a checkpoint's keys, without loading them into a model and
    without changing a dtype (a bfloat16 or float16 checkpoint stays one; the store keeps it losslessly):

    1. transformers' own checkpoint key conversion for the model class and ``model_type`` (renamings
       such as GPTNeoX's ``embed_out.*`` -> ``lm_head.*``, the legacy ``LayerNorm.gamma``, merged
       experts of MoE checkpoints, the base model's prefix added or stripped);
    2. tied weights once: a tensor the model ties to others (GPT-2's ``lm_head.weight`` is
       ``transformer.wte.weight``) is kept under the first of its names, as the model's
       ``named_parameters`` order them (the name :func:`ckpt.store.huggingface.untied_state` keeps);
       a checkpoint holding two different tensors for one tied parameter is refused (transformers
       unties them, with a warning: the config is not the checkpoint's);
    3. keys the model class declares ignorable on load (``_keys_to_ignore_on_load_unexpected``:
       old causal-mask buffers, per-layer ``rotary_emb.inv_freq``) are dropped, as transformers drops them.

    Then the result must be the model exactly: every parameter and persistent buffer held (a buffer
    transformers lets a checkpoint lack, ``_keys_to_ignore_on_load_missing``, is made by the model),
    no key left over, every shape the model's. The model is built once per config, on torch's
    ``meta`` device (no memory), through the store's Hugging Face factory
    (``ckpt.plugins.huggingface:build_model``): a config naming code is refused as it is at analysis.

    Call it once per checkpoint (per Hub revision); the built model and its conversion tables are
    cached per config. With transformers 4, which loads checkpoints under their own keys and has no
    conversion tables, the tensors come back as they are (the model build at analysis still
    compares every name and shape).

    Parameters
    ----------
    config
        The checkpoint's ``config.json`` as a dict (entries describing the saved file, such as
        ``_name_or_path`` or ``dtype``, are ignored).
    tensors
        Checkpoint key -> CPU ``torch.Tensor``, the merged shards of one checkpoint (what
        ``safetensors.torch.load_file`` or :func:`ckpt.store.importers.load_checkpoint` gives).

    Returns
    -------
    dict
        The built model's name -> tensor: the same tensor objects where only the name changed,
        new ones where transformers merges or splits tensors.

    Raises
    ------
    ModelConfigError
        The config builds no model of transformers' own (unknown ``model_type``, code named), or
        the tensors do not fit that model after conversion: one line naming a few keys the model
        lacks and a few the checkpoint lacks (or the shapes that differ), and what to do.
    StoreError
        transformers is not installed.
    """
    return _converter(_config_key(config))(tensors)


def _config_key(config: Mapping[str, Any]) -> str:
    from ckpt.store.importers import hf_model_config

    return json.dumps(hf_model_config(config), sort_keys=True)


@functools.lru_cache(maxsize=8)
def _converter(config_json: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    model = _meta_model(json.loads(config_json))
    if importlib.util.find_spec("transformers.conversion_mapping") is None:
        # transformers 4 loads checkpoints under their own keys: nothing to convert, and the
        # store's model build still compares every name and shape with the checkpoints
        return dict
    return functools.partial(_convert, model, _Conversion(model))


def _meta_model(config: dict[str, Any]) -> Any:
    """The model the store's HF factory builds from ``config``, on ``meta`` (shapes, names and ties only)."""
    import torch

    from ckpt.store.importers import HF_FACTORY
    from ckpt.store.reader import ModelSpec

    with torch.device("meta"):
        return ModelSpec(HF_FACTORY, config, source="the checkpoint's config.json").build()


class _Conversion:
    """transformers' checkpoint conversion for one model, and that model's expected keys."""

    def __init__(self, model: Any) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming

        transforms = get_model_conversion_mapping(model)
        self.renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        self.converters = [t for t in transforms if isinstance(t, WeightConverter)]
        self.by_pattern = {pattern: c for c in self.converters for pattern in c.source_patterns}
        self.expected = model.state_dict()  # meta tensors: names and shapes; tied names all present
        groups: dict[int, list[str]] = {}
        for name, parameter in model.named_parameters(remove_duplicate=False):
            groups.setdefault(id(parameter), []).append(name)
        self.tied = {name: group for group in groups.values() if len(group) > 1 for name in group}
        self.parameters = {name for group in groups.values() for name in group}
        self.base_prefix = model.base_model_prefix

    def rename(self, key: str) -> tuple[str, str | None]:
        """``key``'s name in the model, and the converter pattern it matched (None: a renaming only)."""
        from transformers.core_model_loading import rename_source_key

        # the same two tries as transformers' convert_and_load_state_dict_in_model
        renamed, pattern = rename_source_key(key, self.renamings, self.converters, self.base_prefix, self.expected)
        if renamed not in self.expected and key in self.expected:
            renamed, pattern = rename_source_key(key, [], [], self.base_prefix, self.expected)
        return renamed, pattern


def _convert(model: Any, conversion: _Conversion, tensors: Mapping[str, Any]) -> dict[str, Any]:
    # transformers has no function that converts a state dict without loading it into a model (which
    # would cast every tensor to the model's dtype and allocate it): this is the renaming and converting
    # half of its convert_and_load_state_dict_in_model, with its own transforms, in its own key order
    from transformers.core_model_loading import dot_natural_key

    converted: dict[str, Any] = {}
    pending: dict[str, Any] = {}  # first target name -> the converter collecting its source tensors
    unexpected: set[str] = set()
    seen: set[str] = set()  # the model's names given so far, tied ones each under its own
    for key in sorted(tensors, key=dot_natural_key):
        renamed, pattern = conversion.rename(key)
        if renamed not in conversion.expected:
            unexpected.add(renamed if pattern is None else key)
        elif pattern is None:
            _keep(converted, renamed, tensors[key], key, conversion, seen)
        else:
            converter = pending.setdefault(renamed, deepcopy(conversion.by_pattern[pattern]))
            converter.add_tensor(renamed, key, pattern, tensors[key])
    for first, converter in pending.items():
        try:
            produced = converter.convert(first, model=model, config=model.config)
        except Exception as exc:  # an op on tensors that do not fit it (a missing expert ...)
            sources = _shown(sorted(converter.layer_targets[first]))
            msg = (
                f"transformers' conversion of the checkpoint's {sources} into {first!r} of {type(model).__name__} "
                f"failed: {type(exc).__name__}: {exc}"
            )
            raise ModelConfigError(" ".join(msg.split())) from exc
        for name, value in produced.items():
            value = value[0] if isinstance(value, list) else value
            if name in conversion.expected:
                _keep(converted, name, value, first, conversion, seen)
            else:
                unexpected.add(name)
    _check(model, conversion, converted, unexpected)
    return converted


def _keep(converted: dict[str, Any], name: str, tensor: Any, key: str, conversion: _Conversion, seen: set[str]) -> None:
    """Put ``tensor`` under ``name``, or the first of its tied names; refuse a name given twice or a tie broken."""
    import torch

    if name in seen:
        msg = f"the checkpoint holds two tensors for {name!r} of the model (the second from its key {key!r})"
        raise ModelConfigError(msg)
    seen.add(name)
    group = conversion.tied.get(name, [name])
    held = next((n for n in group if n in seen and n != name), None)
    if held is None:
        converted[group[0]] = tensor
        return
    other = converted[group[0]]
    if other.shape != tensor.shape or other.dtype != tensor.dtype or not torch.equal(other, tensor):
        first, second = sorted((held, name), key=group.index)
        msg = (
            f"the checkpoint holds different tensors for {first!r} and {second!r}, which the model its config "
            "describes ties into one parameter (tie_word_embeddings is true); transformers unties them as it loads "
            "such a checkpoint, ckpt does not guess: import with --model ckpt.plugins.huggingface:build_model and "
            '--config giving the config with "tie_word_embeddings": false'
        )
        raise ModelConfigError(msg)


def _check(model: Any, conversion: _Conversion, converted: dict[str, Any], unexpected: set[str]) -> None:
    """Raise unless ``converted`` is exactly the model's tensors, after transformers' own ignore rules."""
    from transformers.utils.loading_report import LoadStateDictInfo

    held = {tied for name in converted for tied in conversion.tied.get(name, [name])}
    info = LoadStateDictInfo(
        missing_keys={name for name in conversion.expected if name not in held},
        unexpected_keys=set(unexpected),
        mismatched_keys=set(),
        error_msgs=[],
        conversion_errors={},
        skipped_pp_keys=set(),
    )
    lacking_parameters = {name for name in info.missing_keys if name in conversion.parameters}
    # transformers' rules for keys a checkpoint may lack or hold beyond the model (its private method,
    # the one from_pretrained applies): a parameter is never one a store may lack, so it is kept aside
    model._adjust_missing_and_unexpected_keys(info)
    missing = sorted(lacking_parameters | info.missing_keys)
    wrong = [
        f"{name} {list(tensor.shape)} (the model's {list(conversion.expected[name].shape)})"
        for name, tensor in converted.items()
        if tuple(tensor.shape) != tuple(conversion.expected[name].shape)
    ]
    if not missing and not info.unexpected_keys and not wrong:
        return
    import transformers

    built = f"the {type(model).__name__} that transformers {transformers.__version__} builds from its config"
    parts = []
    if missing:
        parts.append(f"the model has {len(missing)} tensor(s) the checkpoint lacks ({_shown(missing)})")
    if info.unexpected_keys:
        extra = sorted(info.unexpected_keys)
        parts.append(f"the checkpoint has {len(extra)} the model lacks ({_shown(extra)})")
    if wrong:
        parts.append(f"{len(wrong)} shape(s) differ ({_shown(wrong, quote=False)})")
    msg = (
        f"the checkpoint's tensors do not fit {built}, even after transformers' own key conversion: "
        f"{'; '.join(parts)}; check that the config.json is this checkpoint's, or import with --model and "
        "--config naming the model these tensors belong to"
    )
    raise ModelConfigError(msg)


def _shown(items: list[str], quote: bool = True) -> str:
    shown = ", ".join(repr(i) if quote else i for i in items[:_SHOWN])
    return shown + (f", and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")
