"""Hugging Face models in ckpt: the model factory that ``ckpt import`` records for a ``Trainer`` run.

A ``Trainer`` output folder holds ``checkpoint-N/`` folders, each with the model's ``config.json``.
Importing one records the model spec ``ckpt.plugins.huggingface:build_model`` with that config, so
that analyzers rebuild the model with ``transformers``' own classes and no code of the user's:

>>> model = build_model(**json.load(open("checkpoint-500/config.json")))  # doctest: +SKIP

The config is data a store carries, so the factory lets it name no code and no file: it builds
only a class that transformers' own Auto mappings give for the config's ``model_type``, never
calls an Auto class (which would follow ``auto_map`` to code beside the config, or on the Hub,
after asking on standard input), and refuses with :class:`~ckpt.errors.ModelConfigError`, at any
depth of the config, the keys of :data:`CODE_KEYS` and an attention implementation other than
those of :data:`ATTENTION_IMPLEMENTATIONS` (a Hub repository of kernels is code). The keys of
:data:`PATH_KEYS` say where a config was saved from: dropped when empty, refused otherwise.

``transformers`` is an optional dependency (``pip install 'ckpt-dynamics[hf]'``), imported only when
a model is built.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from ckpt.errors import ModelConfigError, StoreError
from ckpt.store.importers import HF_FACTORY as FACTORY
from ckpt.store.importers import hf_model_config as model_config

__all__ = ["ATTENTION_IMPLEMENTATIONS", "CODE_KEYS", "FACTORY", "PATH_KEYS", "build_model", "model_config"]

CODE_KEYS = ("auto_map", "trust_remote_code", "custom_pipelines", "code_revision")
"""Config keys with which transformers imports or downloads code: refused wherever they appear."""
PATH_KEYS = ("name_or_path", "_name_or_path", "_commit_hash")
"""Config keys naming the folder or Hub revision a config was saved from: dropped when empty, else refused."""
ATTENTION_IMPLEMENTATIONS = (None, "eager", "sdpa")
"""The attention implementations a config may ask for (others include Hub repositories of kernels)."""
_ATTENTION_KEYS = ("attn_implementation", "_attn_implementation", "_attn_implementation_internal")

_BUILD_LOCK = threading.Lock()


def build_model(**config: Any) -> Any:
    """Build the model a ``config.json`` describes, with freshly initialised weights (ckpt loads them).

    Parameters
    ----------
    **config
        The ``config.json`` of a checkpoint: ``model_type`` picks the configuration class and
        ``architectures[0]`` the model class (``GPT2LMHeadModel`` ...), which must be one that
        transformers' Auto mappings give for that ``model_type``; without it, the causal-LM head
        of ``model_type``.

    Returns
    -------
    torch.nn.Module
        The model in float32, in eval mode.

    Raises
    ------
    StoreError
        When ``transformers`` is not installed.
    ModelConfigError
        The config names no model class of transformers' own, or names code or files.
    """
    # transformers' lazy module is not safe to initialise from several threads at once, and the
    # threaded scheduler builds one model per worker thread: "no attribute 'AutoConfig'" without this
    with _BUILD_LOCK:
        return _build(config)


def _refused(message: str) -> ModelConfigError:
    return ModelConfigError(f"the Hugging Face model config {message} ({FACTORY} builds transformers' own classes)")


def _data_only(config: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """``config`` without empty path keys; raises for a key that names code or a file, at any depth."""
    kept = {}
    for key, value in config.items():
        path = f"{where}{key}"
        if key in CODE_KEYS:
            raise _refused(
                f"has {path!r}, which names code for transformers to import: ckpt runs no code a store names; "
                "to analyze a model with custom code, record a factory of your own (ckpt set-model --model "
                "package.module:function, and --trust-factory it)"
            )
        if key in PATH_KEYS:
            if value in (None, ""):
                continue
            raise _refused(
                f"has {path!r} = {value!r}, a folder or Hub repository to load from: a store's model is rebuilt "
                "from its config alone; remove the key (ckpt set-model --hf-config CONFIG.json drops it)"
            )
        if key in _ATTENTION_KEYS and value not in ATTENTION_IMPLEMENTATIONS:
            allowed = ", ".join(repr(v) for v in ATTENTION_IMPLEMENTATIONS if v)
            raise _refused(f"has {path!r} = {value!r}; ckpt builds only the attention implementations {allowed}")
        kept[key] = _nested(value, f"{path}.")
    return kept


def _nested(value: Any, where: str) -> Any:
    """``value`` with the mappings inside it (sub-configs, lists of them) checked as :func:`_data_only` does."""
    if isinstance(value, Mapping):
        return _data_only(value, where)
    if isinstance(value, list):
        return [_nested(item, f"{where}{i}.") for i, item in enumerate(value)]
    return value


def _model_classes(transformers: Any, model_type: str) -> dict[str, Any]:
    """Name -> class of every model class transformers' Auto mappings give for ``model_type``."""
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for table in dir(modeling_auto):
        if table.startswith("MODEL") and table.endswith("_MAPPING_NAMES"):
            found = getattr(modeling_auto, table).get(model_type)
            names.update([found] if isinstance(found, str) else found or ())
    classes = {name: getattr(transformers, name, None) for name in sorted(names)}
    return {
        name: cls
        for name, cls in classes.items()
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
    }


def _build(config: dict[str, Any]) -> Any:
    try:
        import transformers
    except ImportError:
        msg = "this store's model is a Hugging Face model: install transformers (pip install 'ckpt-dynamics[hf]')"
        raise StoreError(msg) from None
    settings = _data_only(config)
    model_type = settings.pop("model_type", None)
    if not isinstance(model_type, str):
        raise _refused(f"has no model_type (it holds {model_type!r}): record the checkpoint's config.json")
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING:
        raise _refused(
            f"has the model_type {model_type!r}, which transformers {transformers.__version__} does not know"
        )
    architectures = settings.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise _refused(f"has architectures {architectures!r}, not a list of class names")
    classes = _model_classes(transformers, model_type)
    wanted = architectures[0] if architectures else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if wanted not in classes:
        known = ", ".join(classes) or "none"
        if not architectures:
            msg = f"names no architecture, and model_type {model_type!r} has no causal-LM class: add one of {known}"
            raise _refused(msg)
        raise _refused(
            f"names the model class {wanted!r}, which is not one of transformers' model classes for model_type "
            f"{model_type!r} ({known})"
        )
    # transformers logs its own advice on configs (generation token ids outside a small vocabulary, ...)
    # straight to stderr, where a command prints only ckpt's lines; what ckpt needs of the model it checks
    with _transformers_quiet(transformers):
        configuration = CONFIG_MAPPING[model_type](**settings)
        return classes[wanted](configuration).float().eval()


@contextlib.contextmanager
def _transformers_quiet(transformers: Any) -> Iterator[None]:
    """Keep the log of ``transformers`` to errors while a model is built (under ``_BUILD_LOCK``)."""
    logging = transformers.utils.logging
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)
