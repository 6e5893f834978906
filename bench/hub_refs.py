"""bench/store.py's Hub parts: a Pythia-shaped Hub cache, and a prototype of byte-range references into it.

Issue 69 item 6 asked whether a store could keep, instead of a copy of each tensor, only where the
tensor lies in the Hub cache's safetensors file (each tensor is one contiguous byte range there).
This module is the prototype measured by ``bench/store.py`` (``bench_byte_ranges``): a reference
table (per step and tensor: the blob's path in the cache, offset, length, dtype, shape, sha256 and
the store's own xxh3 digest), a reader that reads the ranges and checks their digests, and
the checks a ``verify`` would need. It is a measurement, not a library feature (see the decision
in docs/existing-runs.md, "Copies, not references into the Hub cache").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ckpt.errors import CorruptChunkError, MissingDataError

_SUITE = Path(__file__).resolve().parents[1] / "repro" / "pythia_suite.py"


def pythia_suite() -> Any:
    """repro/pythia_suite.py (a script, not a package): its Pythia-70m shape, layout and Hub cache writer."""
    if "pythia_suite" not in sys.modules:
        spec = importlib.util.spec_from_file_location("pythia_suite", _SUITE)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["pythia_suite"] = module
        spec.loader.exec_module(module)
    return sys.modules["pythia_suite"]


def build_cache(root: Path, repo: str, shape: str, steps: list[int], seed: int = 0) -> dict[str, Any]:
    """A Hub cache of ``repo`` under ``root``: a branch ``stepN`` per step, its config and one fp16 safetensors.

    The shape is repro/pythia_suite.py's (``70m``: hidden 512, 6 layers, 8 heads, intermediate
    2048, vocab 50304, 2048 positions; ``tiny`` for a smoke run); the weights are random, fresh
    per step, stored in float16 as Pythia's are, under Pythia's names (``embed_out.weight``).
    pythia-70m is one unsharded ``model.safetensors``, so is each revision here.
    """
    from safetensors.numpy import save

    suite = pythia_suite()
    config, layout = suite.model_layout(shape)
    cache = suite.Cache(root, repo)
    rng = np.random.default_rng(seed)
    config_blob = cache.blob(config)
    commits, sizes = {}, {}
    for step in steps:
        state = {name: (0.02 * rng.standard_normal(dims, dtype=np.float32)).astype(np.float16) for name, dims in layout}
        data = save(state)
        commits[step] = cache.commit(f"step{step}", {"config.json": config_blob, "model.safetensors": cache.blob(data)})
        sizes[step] = len(data)
        del state, data
    cache.ref("main", commits[steps[-1]])
    return {"folder": cache.folder, "commits": commits, "sizes": sizes, "tensors": len(layout)}


def safetensors_ranges(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """Name -> (dtype, shape, absolute byte range) of a safetensors file, and its data's start.

    safetensors' own API (``safe_open``) gives tensors but not where they lie: the header is read
    here as its format defines it (an 8-byte little-endian length, then that many bytes of JSON).
    """
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    start = 8 + length
    header.pop("__metadata__", None)
    return {
        name: {"dtype": info["dtype"], "shape": info["shape"], "begin": start + info["data_offsets"][0],
               "end": start + info["data_offsets"][1]}
        for name, info in header.items()
    }, start  # fmt: skip


_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
"""safetensors dtype names numpy reads (the bench writes F16, as Pythia's files are)."""


def write_references(folder: Path, commits: dict[int, str], table: Path) -> dict[str, Any]:
    """The reference table of ``commits`` (step -> commit of ``folder``, a repository in the Hub cache), as JSON.

    Per step: the blob the snapshot's ``model.safetensors`` links to (relative to the repository's
    cache folder, so that another ``HF_HUB_CACHE`` holding the same blobs resolves it), and per
    tensor its offset, length, dtype, shape, sha256 and xxh3-64 (the store's digest). Reading
    every byte once to digest it is what a copy costs too.
    """
    steps: dict[str, Any] = {}
    for step, commit in commits.items():
        link = folder / "snapshots" / commit / "model.safetensors"
        blob = Path(os.path.realpath(link))
        ranges, _ = safetensors_ranges(blob)
        tensors = {}
        with open(blob, "rb") as f:
            for name, r in ranges.items():
                part = os.pread(f.fileno(), r["end"] - r["begin"], r["begin"])
                tensors[name] = {
                    "offset": r["begin"], "length": r["end"] - r["begin"], "dtype": r["dtype"], "shape": r["shape"],
                    "sha256": hashlib.sha256(part).hexdigest(), "xxh3": xxhash.xxh3_64_hexdigest(part),
                }  # fmt: skip
        steps[str(step)] = {"commit": commit, "blob": str(blob.relative_to(folder)), "tensors": tensors}
    table.write_text(json.dumps({"format": "ckpt-byte-range-prototype", "steps": steps}))
    return {"steps": len(steps)}


def read_references(folder: Path, table: dict[str, Any], step: int, digest: str = "xxh3") -> dict[str, np.ndarray]:
    """The tensors of ``step``, each read from the byte range its reference names, its digest checked.

    ``digest``: ``xxh3`` (what the store checks on every read) or ``sha256``. Each range is read
    into a fresh array (one copy, as the store's reads make): a memory map would avoid it, but its
    views change under the reader if the cache's file does.
    """
    entry = table["steps"][str(step)]
    blob = folder / entry["blob"]
    try:
        f = open(blob, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        msg = f"step {step}: blob {entry['blob']} is not in the Hub cache at {folder} (deleted, or another machine)"
        raise MissingDataError(msg) from None
    out = {}
    with f:
        size = os.fstat(f.fileno()).st_size
        for name, ref in entry["tensors"].items():
            if ref["offset"] + ref["length"] > size:
                raise CorruptChunkError(f"step {step}: {name} lies past the end of {entry['blob']} (truncated)")
            array = np.empty(ref["shape"], dtype=_DTYPES[ref["dtype"]])
            raw = memoryview(array).cast("B") if array.size else memoryview(b"")
            f.seek(ref["offset"])
            f.readinto(raw)
            got = hashlib.sha256(raw).hexdigest() if digest == "sha256" else xxhash.xxh3_64_hexdigest(raw)
            if got != ref[digest]:
                msg = f"step {step}: the bytes of {name} in {entry['blob']} are not the recorded ones"
                raise CorruptChunkError(msg)
            out[name] = array
    return out


def verify_references(folder: Path, table: dict[str, Any]) -> list[str]:
    """What a ``verify`` of referenced checkpoints must check, each problem named: [] when all hold.

    Per step: the blob exists; its sha256 is its name (an LFS blob in the Hub cache is named by
    its content's sha256); every tensor's range is inside it and digests as recorded. The blob's
    own digest reads the whole file, as the range digests do: verifying costs a full read either way.
    """
    problems = []
    for step, entry in table["steps"].items():
        blob = folder / entry["blob"]
        if not blob.is_file():
            problems.append(f"step {step}: {entry['blob']} is missing")
            continue
        h = hashlib.sha256()
        with open(blob, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 24), b""):
                h.update(block)
        if h.hexdigest() != blob.name:
            problems.append(f"step {step}: {entry['blob']} does not hash to its name")
        try:
            read_references(folder, table, int(step), digest="sha256")
        except (MissingDataError, CorruptChunkError) as exc:
            problems.append(str(exc))
    return problems
