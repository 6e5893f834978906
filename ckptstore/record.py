"""Validating what a store says about itself before anything uses it: a store is data.

Stores travel between people, and everything in them can be edited by hand or by
an attacker: the commit record (the root ``zarr.json``: ``attrs["ckpt"]`` and the
consolidated snapshot of every node), node names, shapes and chunk grids. Before
the reader, the writer or zarr acts on any of it, :func:`parse_record` and
:func:`validate_record` check it against the rules of docs/store-format.md
("Validation"), and anything else is one :class:`~ckpt.errors.CorruptRecordError`
naming the field, what was found and what was expected. Reads are bounded by the
bytes a store actually holds (:func:`check_claimed_bytes`, :func:`row_bound`), so
a claimed shape can never make ckpt allocate memory its bytes do not justify.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any, NoReturn, TypeGuard

import numpy as np

from ckpt.errors import CorruptRecordError, NotAStoreError, UnsupportedFormatError
from ckpt.store.chunks import CHUNK_DIGESTS
from ckpt.store.format import (
    ANALYSES,
    CHECKPOINTS,
    DATA,
    DIGESTS,
    ENCODED_DTYPES,
    FACTORY_RE,
    FINISHED,
    FORMAT_NAME,
    FORMAT_VERSION,
    METRIC_DIGESTS,
    NATIVE_DTYPES,
    PARENT,
    READABLE_VERSIONS,
    ROOT_ATTR,
    STEP,
)
from ckpt.store.lineage import parent_problem
from ckpt.store.provenance import STEPS

MAX_RECORD_BYTES = 256 * 2**20
"""Largest ``zarr.json`` read (the root record of a 1,000-checkpoint, 150-tensor run is ~3 MB)."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of lists and objects accepted in a ``zarr.json`` (ckpt writes at most ~8)."""

MAX_DIMS = 32
"""Most dimensions of a stored array (numpy's own limit is 64)."""

MAX_ELEMENTS = 2**56
"""Elements an array's shape may claim: its bytes (at most 8 an element) must count in an int64."""

MAX_CHUNK_BYTES = 2**31
"""Largest chunk of a data, metrics or result array (ckpt writes at most tens of MB); checkpoint chunks are
bounded by their stored bytes instead (:func:`row_bound`)."""

CLAIM_SLACK_BYTES = 256 * 2**20
"""What a whole-array read may claim beyond ``CLAIM_EXPANSION`` times the bytes stored (chunks equal to the
fill value are not written by zarr, so a small array may legitimately hold fewer bytes than it reads as)."""

CLAIM_EXPANSION = 256
"""How many times its stored bytes a whole data, metrics or step array may claim to read as."""

COMPRESSED_EXPANSION = 2**16
"""How many times its stored bytes a compressed checkpoint row may decompress to (zstd of constant data
reaches a few thousand; uncompressed rows must match their bytes exactly)."""

ARRAY_CODECS = ("bytes", "vlen-utf8")
"""The array-to-bytes codecs ckpt writes: ``bytes`` (numbers), ``vlen-utf8`` (text)."""

BYTES_CODECS = ("zstd", "crc32c")
"""The bytes-to-bytes codecs ckpt writes, in their order: a compressor (results, ``compressor="zstd"``), the checksum.
Any other codec (gzip, blosc, sharding, transpose ...) is refused: only ckpt's own are bounded in what they decode
to (:mod:`ckpt.store.codecs`)."""

_FORBIDDEN = re.compile(r"[/\\\x00-\x1f\x7f]")

VARIABLE_LENGTH_ITEMSIZE = 64
"""Bytes assumed per element of a variable-length (string) array when bounding a read."""


def name_problem(name: object, what: str) -> str | None:
    r"""Why ``name`` cannot be one path component of a store (a node name), or None when it can.

    A node name is a non-empty string of at most 255 printable characters other than ``/`` and ``\\``,
    not ``.`` or ``..``. The writer refuses such names (:func:`ckpt.store.format.check_name`) and
    the reader refuses records holding them: a name is never a path outside its group.
    """
    if not isinstance(name, str) or not name:
        return f"{what} names must be non-empty strings, got {name!r}"
    if len(name) > 255:
        return f"{what} name {name[:40]!r}... is {len(name)} characters long; at most 255 are allowed"
    if _FORBIDDEN.search(name) or not name.isprintable():
        return f"{what} name {name!r} contains '/', '\\' or a control character; join nested names with '.'"
    if name in (".", ".."):
        return f"{what} name {name!r} is a path, not a name"
    return None


def parse_record(raw: bytes, where: str, key: str = "zarr.json") -> dict[str, Any]:
    """Decode a ``zarr.json`` document, bounded in size and depth; CorruptRecordError when it is not one."""
    if len(raw) > MAX_RECORD_BYTES:
        msg = (
            f"{key} of {where} is {len(raw):,} bytes, more than the {MAX_RECORD_BYTES:,} a store's metadata may "
            "hold: it was not written by ckpt; restore the store from a copy"
        )
        raise CorruptRecordError(msg)
    problem: str | None
    try:
        document = json.loads(raw)
    except RecursionError:
        document = None
        problem = f"is nested deeper than the {MAX_JSON_DEPTH} levels a store's metadata may use"
    except (UnicodeDecodeError, ValueError) as exc:
        document = None
        problem = f"is not valid JSON ({exc})"
    else:
        problem = None if isinstance(document, dict) else "is not a JSON object"
        if problem is None and _depth(document) > MAX_JSON_DEPTH:
            problem = f"is nested deeper than the {MAX_JSON_DEPTH} levels a store's metadata may use"
    if problem is not None:
        msg = f"{key} of {where} {problem}: it is damaged or was not written by ckpt; restore the store from a copy"
        raise CorruptRecordError(msg)
    return document


def _depth(document: Any) -> int:
    """The nesting depth of a decoded JSON document, without recursion."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        value, depth = pending.pop()
        values: Iterable[Any]
        if isinstance(value, dict):
            values = value.values()
        elif isinstance(value, list):
            values = value
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            return depth
        pending.extend((v, depth + 1) for v in values if isinstance(v, dict | list))
    return deepest


def _fail(where: str, field: str, found: Any, expected: str) -> NoReturn:
    shown = repr(found)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    msg = (
        f"the commit record of {where} is invalid: {field} is {shown}, expected {expected}; the store was "
        "damaged or edited by hand: restore it from a copy"
    )
    raise CorruptRecordError(msg)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_meta(attributes: Any, where: str) -> dict[str, Any]:
    """Check the root attributes' ``ckpt`` entry (format, version, model spec, digests ...); return it."""
    if not isinstance(attributes, dict):
        _fail(where, "attributes", attributes, "a JSON object")
    meta = attributes.get(ROOT_ATTR)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        msg = f"{where} is a zarr group but not a ckpt store (no attrs['ckpt']['format'] == {FORMAT_NAME!r})"
        raise NotAStoreError(msg)
    version = meta.get("format_version")
    if not _is_int(version):
        _fail(where, "format_version", version, f"an integer (this ckpt reads {list(READABLE_VERSIONS)})")
    if version not in READABLE_VERSIONS:
        newer = version > FORMAT_VERSION
        hint = "upgrade ckpt (pip install -U ckpt-dynamics)"
        hint = hint if newer else "convert it with the ckpt version that wrote it"
        readable = ", ".join(f"v{v}" for v in READABLE_VERSIONS)
        msg = f"{where} uses store format v{version}; this ckpt reads {readable} only: {hint}"
        raise UnsupportedFormatError(msg)
    for key in ("framework", "objective", "created"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            _fail(where, key, meta[key], "a string or null")
    model = meta.get("model")
    if model is not None:
        if not isinstance(model, dict) or not isinstance(model.get("factory"), str):
            _fail(where, "model", model, 'an object {"factory": "package.module:function", "config": {...}}')
        if not FACTORY_RE.fullmatch(model["factory"]):
            _fail(where, "model.factory", model["factory"], "a 'package.module:function' name")
        config = model.get("config")
        if config is not None and not (isinstance(config, dict) and all(k.isidentifier() for k in config)):
            _fail(where, "model.config", config, "an object whose keys are keyword-argument names")
    history = meta.get("history", [])
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        _fail(where, "history", history, "a list of objects")
    if meta.get("attrs") is not None and not isinstance(meta["attrs"], dict):
        _fail(where, "attrs", meta["attrs"], "an object or null")
    if meta.get(FINISHED) is not None and not isinstance(meta[FINISHED], bool):
        _fail(where, FINISHED, meta[FINISHED], "true, false or absent")
    problem = parent_problem(meta.get(PARENT))
    if problem is not None:
        _fail(where, *problem)
    digests = meta.get(DIGESTS)
    if digests is not None:
        if not isinstance(digests, dict):
            _fail(where, DIGESTS, digests, 'an object {"<step>": ["<digest>", ...]}')
        for step, values in digests.items():
            if not re.fullmatch(r"0|[1-9][0-9]{0,18}", step):
                _fail(where, f"a key of {DIGESTS}", step, "a step (a non-negative integer)")
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                _fail(where, f"{DIGESTS}[{step!r}]", values, "a list of digests (strings)")
    if version >= 2 and (not isinstance(meta.get(DIGESTS), dict) or not isinstance(meta.get(METRIC_DIGESTS), dict)):
        missing = DIGESTS if not isinstance(meta.get(DIGESTS), dict) else METRIC_DIGESTS
        _fail(where, missing, meta.get(missing), f"present in a format v{version} store (it binds data to steps)")
    metric_digests = meta.get(METRIC_DIGESTS)
    if metric_digests is not None and not (
        isinstance(metric_digests, dict) and all(isinstance(v, str) for v in metric_digests.values())
    ):
        _fail(where, METRIC_DIGESTS, metric_digests, 'an object {"<column>": "<digest>"}')
    return meta


def validate_nodes(nodes: Any, where: str) -> dict[str, dict[str, Any]]:
    """Check the consolidated snapshot: every key a path of safe names, every node a well-formed document."""
    if not isinstance(nodes, dict):
        _fail(where, "consolidated_metadata.metadata", nodes, "an object {path: node}")
    for path, node in nodes.items():
        for part in path.split("/"):
            problem = name_problem(part, "node")
            if problem is not None:
                _fail(where, "a node path", path, f"a path of node names ({problem})")
        if not isinstance(node, dict) or node.get("node_type") not in ("group", "array"):
            _fail(where, f"node {path!r}", node, "a zarr group or array document")
        if not isinstance(node.get("attributes", {}), dict):
            _fail(where, f"attributes of {path!r}", node.get("attributes"), "an object")
        if not isinstance(node.get("attributes", {}).get(ROOT_ATTR, {}), dict):
            _fail(where, f"attributes.ckpt of {path!r}", node["attributes"][ROOT_ATTR], "an object")
        provenance = node.get("attributes", {}).get(ROOT_ATTR, {})
        steps = provenance.get(STEPS, [])  # checked whole by Provenance where a result is read
        if (
            path.count("/") == 1
            and path.startswith("analyses/")
            and not (isinstance(steps, list) and all(_is_int(s) for s in steps))
        ):
            _fail(where, f"the steps of result {path!r}", steps, "a list of steps (integers)")
        if path.count("/") == 1 and path.startswith(f"{DATA}/"):
            _validate_split(path, provenance, where)
        if node["node_type"] == "array":
            _validate_array(path, node, where)
    _validate_checkpoints(nodes, where)
    return nodes


def _validate_split(path: str, attrs: dict[str, Any], where: str) -> None:
    """A data split's summary: label names, and counts of examples and datapoints."""
    labels = attrs.get("labels", [])
    if not isinstance(labels, list) or any(name_problem(label, "label") is not None for label in labels):
        _fail(where, f"the labels of split {path!r}", labels, "a list of label names")
    for count in ("examples", "datapoints"):
        value = attrs.get(count)
        if value is not None and not (_is_int(value) and value >= 0):
            _fail(where, f"the {count} of split {path!r}", value, "a non-negative integer")


def _validate_array(path: str, node: dict[str, Any], where: str) -> None:
    shape = node.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_int(n) and n >= 0 for n in shape):
        _fail(where, f"shape of {path!r}", shape, f"a list of at most {MAX_DIMS} non-negative integers")
    if math.prod(shape) > MAX_ELEMENTS:
        _fail(where, f"shape of {path!r}", shape, f"at most {MAX_ELEMENTS:,} elements (a 64-bit count of bytes)")
    grid = node.get("chunk_grid")
    configuration = grid.get("configuration") if isinstance(grid, dict) else None
    chunks = configuration.get("chunk_shape") if isinstance(configuration, dict) else None
    if (
        not isinstance(grid, dict)
        or grid.get("name") != "regular"
        or not isinstance(chunks, list)
        or len(chunks) != len(shape)
        or not all(_is_int(n) and n > 0 for n in chunks)
    ):
        _fail(where, f"chunk grid of {path!r}", grid, f"a regular grid of {len(shape)} positive chunk sizes")
    names = node.get("dimension_names")
    if names is not None and (
        not isinstance(names, list) or len(names) != len(shape) or not all(isinstance(n, str | None) for n in names)
    ):
        _fail(where, f"dimension_names of {path!r}", names, f"null or {len(shape)} names")
    digests = node["attributes"].get(CHUNK_DIGESTS) if isinstance(node.get("attributes"), dict) else None
    if digests is not None and not (isinstance(digests, dict) and all(isinstance(v, str) for v in digests.values())):
        _fail(where, f"the chunk digests of {path!r}", digests, "an object of chunk -> digest strings")
    if names is None and shape and path.startswith(f"{ANALYSES}/"):  # xarray cannot open a result without
        _fail(where, f"dimension_names of {path!r}", names, f"{len(shape)} names (a result's dimensions)")
    if not isinstance(node.get("data_type"), str | dict):
        _fail(where, f"data_type of {path!r}", node.get("data_type"), "a zarr data type")
    codecs = node.get("codecs")
    if not isinstance(codecs, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in codecs):
        _fail(where, f"codecs of {path!r}", codecs, "a list of codec objects")
    names = [c["name"] for c in codecs]
    rest = iter(BYTES_CODECS)
    if not names or names[0] not in ARRAY_CODECS or not all(name in rest for name in names[1:]):
        expected = (
            f"the codecs ckpt writes ({' or '.join(ARRAY_CODECS)}, then {', then '.join(BYTES_CODECS)}, each optional)"
        )
        _fail(where, f"codecs of {path!r}", names, expected)
    dtype = node["attributes"].get(ROOT_ATTR, {}).get("dtype") if isinstance(node.get("attributes"), dict) else None
    if dtype is not None and (
        not isinstance(dtype, str) or (dtype not in ENCODED_DTYPES and dtype not in NATIVE_DTYPES)
    ):
        _fail(where, f"the logical dtype of {path!r}", dtype, "a dtype name ckpt stores (float32, bfloat16 ...)")
    if not path.startswith(f"{CHECKPOINTS}/") and _chunk_bytes(node) > MAX_CHUNK_BYTES:
        _fail(where, f"chunk shape of {path!r}", chunks, f"chunks of at most {MAX_CHUNK_BYTES:,} bytes")


def _validate_checkpoints(nodes: dict[str, dict[str, Any]], where: str) -> None:
    """Checkpoint arrays: one row per committed step, one chunk per row."""
    step = nodes.get(f"{CHECKPOINTS}/{STEP}")
    if step is not None and (step["node_type"] != "array" or len(step["shape"]) != 1):
        _fail(where, f"{CHECKPOINTS}/{STEP}", step.get("shape"), "a one-dimensional array")
    committed = step["shape"][0] if step is not None else 0
    for path, node in nodes.items():
        if not path.startswith(f"{CHECKPOINTS}/") or path.count("/") != 1 or node["node_type"] != "array":
            continue
        if path == f"{CHECKPOINTS}/{STEP}":
            continue
        shape, chunks = node["shape"], node["chunk_grid"]["configuration"]["chunk_shape"]
        if not shape or shape[0] != committed:
            _fail(where, f"shape of {path!r}", shape, f"{committed} rows, one per committed checkpoint")
        if chunks[0] != 1 or any(c < n for c, n in zip(chunks[1:], shape[1:], strict=True)):
            # the format's [1, *shape]: one chunk per row, so no row names more chunk files than one
            _fail(where, f"chunk shape of {path!r}", chunks, f"one whole checkpoint per chunk {[1, *shape[1:]]}")
        if not isinstance(node["data_type"], str) or node["data_type"] not in NATIVE_DTYPES:
            _fail(where, f"data_type of {path!r}", node["data_type"], "a numeric dtype (float32, uint16 ...)")
    order = nodes.get(CHECKPOINTS, {}).get("attributes", {}).get(ROOT_ATTR, {}).get("tensors", [])
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        _fail(where, f"{CHECKPOINTS} attrs tensors", order, "a list of tensor names")


def validate_record(document: Any, where: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Check a decoded root ``zarr.json``; return its attributes and its snapshot of committed nodes."""
    from ckpt.store.codecs import install

    install()  # before zarr parses any of the store's metadata: its zstd frames are bounded (ckpt.store.codecs)
    if not isinstance(document, dict) or document.get("node_type") != "group" or document.get("zarr_format") != 3:
        msg = f"{where} is not a ckpt store: its root is not a zarr v3 group"
        raise NotAStoreError(msg)
    attributes = document.get("attributes", {})
    validate_meta(attributes, where)
    consolidated = document.get("consolidated_metadata") or {}
    if not isinstance(consolidated, dict):
        _fail(where, "consolidated_metadata", consolidated, "an object")
    nodes = validate_nodes(consolidated.get("metadata") or {}, where)
    meta = attributes[ROOT_ATTR]
    digests = meta.get(DIGESTS)
    order = nodes.get(CHECKPOINTS, {}).get("attributes", {}).get(ROOT_ATTR, {}).get("tensors", [])
    if digests:
        tensors = [p.split("/", 1)[1] for p in nodes if p.startswith(f"{CHECKPOINTS}/") and p.count("/") == 1]
        tensors = [t for t in tensors if nodes[f"{CHECKPOINTS}/{t}"]["node_type"] == "array" and t != STEP]
        if sorted(order) != sorted(tensors):
            _fail(where, f"{CHECKPOINTS} attrs tensors", order, f"the {len(tensors)} tensors of the checkpoints")
        for step, values in digests.items():
            if len(values) != len(order):
                _fail(where, f"{DIGESTS}[{step!r}]", f"{len(values)} digests", f"{len(order)}, one per tensor")
    return attributes, nodes


def itemsize(node: dict[str, Any]) -> int:
    """Bytes per element of a stored array (variable-length types: :data:`VARIABLE_LENGTH_ITEMSIZE`)."""
    data_type = node.get("data_type")
    try:
        size = np.dtype(data_type).itemsize if isinstance(data_type, str) else 0
    except TypeError:
        size = 0
    return size or VARIABLE_LENGTH_ITEMSIZE


def _chunk_bytes(node: dict[str, Any]) -> int:
    return math.prod(node["chunk_grid"]["configuration"]["chunk_shape"]) * itemsize(node)


def claimed_bytes(node: dict[str, Any]) -> int:
    """Bytes a whole read of the array would allocate, by its recorded shape."""
    return math.prod(node["shape"]) * itemsize(node)


def check_claimed_bytes(node: dict[str, Any], stored: int, what: str, where: str) -> None:
    """Refuse a whole read of an array that claims far more than its ``stored`` bytes can hold."""
    claimed = claimed_bytes(node)
    if claimed > stored * CLAIM_EXPANSION + CLAIM_SLACK_BYTES:
        msg = (
            f"{what} of {where} claims a shape of {node['shape']} ({claimed:,} bytes) but only {stored:,} bytes "
            "are stored: its metadata was damaged or edited; restore the store from a copy"
        )
        raise CorruptRecordError(msg)


def is_compressed(node: dict[str, Any]) -> bool:
    """Whether an array's codecs include more than the bytes codec and a crc32c checksum."""
    codecs = node.get("codecs") or []
    return any(not isinstance(c, dict) or c.get("name") not in ("bytes", "crc32c") for c in codecs)


def row_bound(node: dict[str, Any], stored: int | None) -> str | None:
    """Why one checkpoint row of ``node`` cannot be read from ``stored`` bytes, or None when it can.

    An uncompressed row is exactly its shape's bytes (plus 4 per chunk with a crc32c); a
    compressed one may expand at most :data:`COMPRESSED_EXPANSION` times. None stored
    bytes mean its chunk is missing: read as the fill value when the row is at most
    :data:`MAX_CHUNK_BYTES` (the digest then decides), refused when larger.
    """
    row = math.prod(node["shape"][1:]) * itemsize(node)
    if stored is None:
        # zarr leaves a chunk equal to the fill value unwritten where the writer went through it
        # (compressed or remote stores): it reads as zeros and the commit record's digest decides
        return None if row <= MAX_CHUNK_BYTES else f"its chunk is missing and its shape claims {row:,} bytes"
    if is_compressed(node):
        limit = stored * COMPRESSED_EXPANSION
        if row > limit:
            return f"it claims {row:,} bytes, more than its {stored:,} compressed bytes can hold"
        return None
    checksum = 4 if any(isinstance(c, dict) and c.get("name") == "crc32c" for c in node.get("codecs") or []) else 0
    chunks = node["chunk_grid"]["configuration"]["chunk_shape"]
    count = math.prod(-(-n // c) for n, c in zip(node["shape"][1:], chunks[1:], strict=True))
    padded = math.prod(chunks[1:]) * itemsize(node) * count + checksum * count
    if stored != padded:
        return f"its chunks hold {stored:,} bytes where its shape needs {padded:,}"
    return None


__all__ = [
    "ARRAY_CODECS",
    "BYTES_CODECS",
    "MAX_CHUNK_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_RECORD_BYTES",
    "check_claimed_bytes",
    "claimed_bytes",
    "name_problem",
    "parse_record",
    "row_bound",
    "validate_meta",
    "validate_nodes",
    "validate_record",
]
