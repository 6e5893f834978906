"""Hugging Face models in ckpt: the model factory that ``ckpt import`` records for a ``Trainer`` run.

A ``Trainer`` output folder holds ``checkpoint-N/`` folders, each with the model's ``config.json``.
Importing one records the model spec ``ckpt.plugins.huggingface:build_model`` with that config, so
that analyzers rebuild the model with ``transformers``' own classes and no code of the user's:

>>> model = build_model(**json.load(open("checkpoint-500/config.json")))  # doctest: +SKIP

``transformers`` is an optional dependency (``pip install 'ckpt-dynamics[hf]'``), imported only when
a model is built.
"""

from __future__ import annotations

import threading
from typing import Any

from ckpt.errors import StoreError
from ckpt.store.importers import HF_FACTORY as FACTORY
from ckpt.store.importers import hf_model_config as model_config

__all__ = ["FACTORY", "build_model", "model_config"]

_BUILD_LOCK = threading.Lock()


def build_model(**config: Any) -> Any:
    """Build the model a ``config.json`` describes, with freshly initialised weights (ckpt loads them).

    Parameters
    ----------
    **config
        The ``config.json`` of a checkpoint: ``model_type`` picks the configuration class and
        ``architectures[0]`` the model class (``GPT2LMHeadModel`` ...); without it, the
        causal-LM head of ``model_type``.

    Returns
    -------
    torch.nn.Module
        The model in float32, in eval mode.

    Raises
    ------
    StoreError
        When ``transformers`` is not installed, or the config names no known model.
    """
    # transformers' lazy module is not safe to initialise from several threads at once, and the
    # threaded scheduler builds one model per worker thread: "no attribute 'AutoConfig'" without this
    with _BUILD_LOCK:
        return _build(config)


def _build(config: dict[str, Any]) -> Any:
    try:
        import transformers
    except ImportError:
        msg = "this store's model is a Hugging Face model: install transformers (pip install 'ckpt-dynamics[hf]')"
        raise StoreError(msg) from None
    settings = dict(config)
    model_type = settings.pop("model_type", None)
    if model_type is None:
        raise StoreError("the Hugging Face model config has no model_type: record the checkpoint's config.json")
    architectures = settings.get("architectures") or []
    try:
        configuration = transformers.AutoConfig.for_model(model_type, **settings)
    except (ValueError, KeyError) as exc:
        msg = f"transformers {transformers.__version__} does not know model_type {model_type!r} ({exc})"
        raise StoreError(msg) from None
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        model_class = transformers.AutoModelForCausalLM
        model = model_class.from_config(configuration)
    else:
        model = model_class(configuration)
    return model.float().eval()
