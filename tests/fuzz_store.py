"""A fuzzer of hostile stores: mutate a real store, run every reading command, judge what they print.

Used by ``tests/test_fuzz_store.py`` (120 mutants in CI that apply every operator, seeded and
derandomized; ``CKPT_FUZZ_EXAMPLES=2000`` for issue 68's count). More by hand::

    CKPT_FUZZ_EXAMPLES=20000 CKPT_FUZZ_SEED=7 pytest tests/test_fuzz_store.py -x

Design. The base store is a real training run (``ckpt.plugins.testing.write_example_run``) with an eval split,
a label, metrics and a stored ``loss`` result. Each mutant is a copy with one to three mutations:
JSON edits of the root record (its ``attrs["ckpt"]`` and consolidated metadata) or of a node's
``zarr.json`` (a key deleted, a value of another type, a huge or negative number, a node renamed
to a path such as ``../x``, JSON nested 5,000 deep), files truncated or filled with invalid bytes,
chunk files deleted, truncated, flipped, copied over another step's, swapped, replaced by a symbolic
link (to a canary file outside the store, or to a folder) or by a folder, and whole groups deleted
or replaced by a file. And the attacks that need to know the store's structure (issue 68): a model
spec naming a registered factory with a hostile config (wrong types, huge sizes, keys that name code
or files, a Hugging Face config with ``auto_map`` and a module shipped in the store) or naming code
that is no factory; a result's provenance of the wrong types or at odds with its data; the folders
ckpt writes into (``.locks``, a result, a checkpoint array, a split) replaced by links out of the
store; codec pipelines ckpt never writes, and a zstd frame that inflates to gigabytes.

The commands (``info``, ``verify``, ``show STORE loss``, ``analyze loss``, ``repair``, and ``report``
on every :data:`REPORT_EVERY`-th mutant: it draws figures, 10x slower) run in ONE long-lived worker
process (:func:`worker`) through ckpt's real click entry point, because starting ``ckpt`` costs
about a second of imports; the worker's data segment is limited (:data:`MEMORY_LIMIT`), so a memory
bomb is a ``MemoryError`` traceback (a failure) rather than a kill of the machine, and the parent
kills and restarts it when one command outlasts :data:`COMMAND_SECONDS` (a hang: a failure).

The oracle (:func:`judge`): exit status 0, 1, 2 or 3; no traceback; a failing command prints exactly
one ``Error:`` line on stderr (``Warning:`` lines may come before it), a succeeding one only
``Warning:`` lines; ``verify`` never exits 0 when a checkpoint chunk file was damaged; and nothing
outside the store changes (a canary folder beside it is hashed before and after, and the folder
holding them is listed).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("info", "@"),
    ("verify", "@"),
    ("show", "@", "loss"),
    ("analyze", "loss", "@", "--no-progress", "--scheduler", "sync"),
    ("repair", "@"),  # last: it changes the mutant
)
REPORT_EVERY = 25
"""``ckpt report`` runs on every n-th mutant only (it draws every figure: ~1 s)."""
COMMAND_SECONDS = 60.0
"""A command that runs longer is a hang."""
MEMORY_LIMIT = 6 * 2**30
"""The worker's data segment (RLIMIT_DATA): torch, zarr and dask run in ~1 GB; a bomb asks for far more."""

HOSTILE_VALUES: tuple[Any, ...] = (None, True, False, -1, 0, 10**12, 2**70, 1.5, "", "x", "../x", [], {}, [1, "a"])
HOSTILE_NAMES = ("../x", "a/../../b", "/abs", "", "x" * 300, "é", "a\x00b", "a\\b", ".", "__x", "zarr.json")


# -- mutations ------------------------------------------------------------------------------------
@dataclass
class Mutant:
    """A mutated copy of the base store and what was done to it."""

    path: Path
    canary: Path
    done: list[str] = field(default_factory=list)
    damaged_checkpoint: bool = False
    """A checkpoint chunk file was changed: ``verify`` must not pass."""
    kinds: list[str] = field(default_factory=list)
    """The kind of each mutation, for the counts the test prints."""
    operators: list[str] = field(default_factory=list)
    """Each mutation applied, as ``kind/how`` (one of :data:`OPERATORS`): the test checks each is exercised."""


def _files(store: Path, pattern: str) -> list[Path]:
    return sorted(p for p in store.glob(pattern) if p.is_file() and not p.is_symlink())


def _json_paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON document (keys and indices), breadth limited to keep draws cheap."""
    paths = [prefix]
    if isinstance(document, dict):
        for key, value in list(document.items())[:64]:
            paths += _json_paths(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document[:8]):
            paths += _json_paths(value, (*prefix, i))
    return paths


def _edit_json(file: Path, rng: random.Random) -> tuple[str | None, str]:
    """How ``file`` was edited (None: it was left as it was) and what was done."""
    try:
        document = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, f"{file.name}: unreadable, left"
    paths = [p for p in _json_paths(document) if p]
    if not paths:
        return None, "empty document"
    target = rng.choice(paths)
    parent = document
    for key in target[:-1]:
        parent = parent[key]
    last = target[-1]
    how = rng.choice(("delete", "value", "value", "rename", "deep"))
    if how == "delete" and isinstance(parent, dict):
        del parent[last]
    elif how == "rename" and isinstance(parent, dict):
        parent[rng.choice(HOSTILE_NAMES)] = parent.pop(last)
    elif how == "deep":
        parent[last] = "__DEEP__"
    else:
        how = "value"
        parent[last] = rng.choice(HOSTILE_VALUES)
    text = json.dumps(document).replace('"__DEEP__"', "[" * 5000 + "]" * 5000)
    file.write_text(text)
    return how, f"{file.parent.name}/{file.name}: {how} at {list(target)[:6]}"


def mutate(mutant: Mutant, rng: random.Random) -> None:
    """Apply one random mutation to ``mutant`` (recorded in ``mutant.done``)."""
    store = mutant.path
    chunks = [p for p in _files(store, "checkpoints/*/c*")]
    kind = rng.choice(KINDS)
    mutant.kinds.append(kind)
    if kind in STRUCTURED:
        STRUCTURED[kind](mutant, rng)
    elif kind in ("root", "node"):
        file = store / "zarr.json" if kind == "root" else rng.choice(_files(store, "**/zarr.json"))
        how, done = _edit_json(file, rng)
        mutant.done.append(done)
        if how is not None:
            mutant.operators.append(f"{kind}/{how}")
    elif kind in ("truncate", "bytes"):
        file = rng.choice(_files(store, "**/*"))
        data = file.read_bytes()
        new = data[: rng.randrange(len(data) + 1)] if kind == "truncate" else b"\xff\xfe\x00" + data[3:]
        file.write_bytes(new)
        mutant.damaged_checkpoint |= file in chunks and new != data
        mutant.done.append(f"{kind} {file.relative_to(store)}")
        mutant.operators.append(kind)
    elif kind == "chunk" and chunks:
        _mutate_chunk(mutant, chunks, rng)
    else:
        groups = [
            p
            for p in (store / "checkpoints", store / "data" / "eval", store / "analyses" / "loss")
            if p.is_dir() and not p.is_symlink()
        ]
        groups += [p for p in (store / "checkpoints").glob("*") if p.is_dir() and not p.is_symlink()]
        if not groups:
            return
        group = rng.choice(groups)
        shutil.rmtree(group)
        if rng.random() < 0.5:
            group.write_text("not a folder")
        mutant.damaged_checkpoint |= group.is_relative_to(store / "checkpoints")
        mutant.done.append(f"group {group.relative_to(store)} removed")
        mutant.operators.append("group")


CHUNK_DAMAGE = ("delete", "flip", "copy", "swap", "link-file", "link-dir", "folder")
_chunk_damage_turn = itertools.count()


def _mutate_chunk(mutant: Mutant, chunks: list[Path], rng: random.Random) -> None:
    chunk = rng.choice(chunks)
    # in turn, not drawn: a few dozen chunk mutations then apply every kind of damage whatever the
    # store's bytes do to the draws (a drawn one went missing from 120 mutants once a file's size changed)
    how = CHUNK_DAMAGE[next(_chunk_damage_turn) % len(CHUNK_DAMAGE)]
    data = chunk.read_bytes()
    if how == "delete":
        chunk.unlink()
    elif how == "flip":
        if not data:
            return
        i = rng.randrange(len(data))
        chunk.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    elif how in ("copy", "swap"):
        siblings = [c for c in chunk.parent.iterdir() if c.name.startswith("c") and c != chunk and c.is_file()]
        if not siblings:
            return
        other = rng.choice(siblings)
        if other.read_bytes() == data:
            return
        if how == "swap":
            chunk.write_bytes(other.read_bytes())
            other.write_bytes(data)
        else:
            chunk.write_bytes(other.read_bytes())
    elif how == "link-file":
        chunk.unlink()
        chunk.symlink_to(mutant.canary / "secret.bin")
    elif how == "link-dir":
        chunk.unlink()
        chunk.symlink_to(mutant.canary)
    else:
        chunk.unlink()
        chunk.mkdir()
    mutant.damaged_checkpoint = True
    mutant.done.append(f"chunk {chunk.relative_to(mutant.path)}: {how}")
    mutant.operators.append(f"chunk/{how}")


# -- attacks a user's trust depends on: factories, provenance, links, codecs --------------------------
KINDS = (
    *("root", "root", "root", "node", "truncate", "bytes", "chunk", "chunk", "chunk", "group"),
    *("factory", "factory", "provenance", "provenance", "link", "link", "codec", "codec"),
)
"""The mutation kinds, drawn uniformly (a kind named twice is drawn twice as often)."""

EVIL_MODULE = "import pathlib\npathlib.Path({canary!r}, 'code-ran').write_text('the store ran code')\nEvil = None\n"
"""A module a hostile store ships: importing it writes into the canary folder (judged as a change outside)."""

HOSTILE_CONFIG_ENTRIES: tuple[tuple[str, Any], ...] = (
    ("hidden", 10**7),  # a 10^7-unit MLP: 300 MB of parameters the stored 8-unit tensors do not justify
    ("hidden", 10**12),
    ("d_in", 2**40),
    ("classes", -1),
    ("hidden", "8"),
    ("hidden", 8.5),
    ("hidden", [8]),
    ("layers", 10**6),
    ("auto_map", {"AutoModel": "evil.Evil"}),
    ("trust_remote_code", True),
    ("name_or_path", "@/.hf"),
)
"""Entries put into the example model's config: types, huge values, keys that name code or files."""


def _hostile_hf_configs(store: Path) -> list[dict[str, Any]]:
    """Hugging Face model configs an attacker writes, with ``evil.py`` shipped at ``store/.hf``."""
    local = str(store / ".hf")
    tiny = {"n_layer": 1, "n_head": 1, "n_embd": 8, "vocab_size": 8}
    return [
        {"model_type": "vit", "auto_map": {"AutoModelForCausalLM": "evil.Evil"}, "name_or_path": local},
        {"model_type": "gpt2", "auto_map": {"AutoModelForCausalLM": "evil.Evil"}, "_name_or_path": local, **tiny},
        {"model_type": "gpt2", "architectures": ["Trainer"], **tiny},
        {"model_type": "gpt2", "architectures": ["AutoModel"], "trust_remote_code": True, **tiny},
        {
            "model_type": "gpt_neo",
            "max_position_embeddings": 50000,
            "num_layers": 1,
            "attention_types": [[["global"], 1]],
            "hidden_size": 8,
            "num_heads": 1,
            "vocab_size": 8,
        },
        {"model_type": "gpt2", "n_positions": 10**6, **tiny},
        {"model_type": "gpt2", **tiny, "n_layer": 10**5},
        {"model_type": "no-such-model"},
        {"model_type": 5},
        {},
    ]


def _load(file: Path) -> Any:
    """A JSON document an earlier mutation may have broken (None then: the mutation is skipped)."""
    try:
        return json.loads(file.read_text()) if file.is_file() and not file.is_symlink() else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _edit_root_attrs(store: Path, edit: Any) -> bool:
    root = store / "zarr.json"
    document = _load(root)
    ckpt = document.get("attributes", {}).get("ckpt") if isinstance(document, dict) else None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model", {}), dict):
        return False
    ckpt.setdefault("model", {})
    if not isinstance(ckpt["model"].get("config", {}), dict):
        return False
    edit(ckpt)
    root.write_text(json.dumps(document))
    return True


def _mutate_factory(mutant: Mutant, rng: random.Random) -> None:
    """The model spec names a registered factory with a hostile config, a factory that is no factory, or code."""
    store = mutant.path
    (store / ".hf").mkdir(exist_ok=True)
    (store / ".hf" / "evil.py").write_text(EVIL_MODULE.format(canary=str(mutant.canary)))
    how = rng.choice(("config", "config", "huggingface", "huggingface", "factory"))
    if how == "config":
        key, value = rng.choice(HOSTILE_CONFIG_ENTRIES)
        value = str(store / ".hf") if value == "@/.hf" else value
        _edit_root_attrs(store, lambda ckpt: ckpt["model"].setdefault("config", {}).__setitem__(key, value))
        mutant.done.append(f"model config {key}={str(value)[:40]}")
        mutant.operators.append("factory/config")
    elif how == "huggingface":
        config = rng.choice(_hostile_hf_configs(store))

        def spec(ckpt: dict[str, Any]) -> None:
            ckpt["model"] = {"factory": "ckpt.plugins.huggingface:build_model", "config": config}

        _edit_root_attrs(store, spec)
        mutant.done.append(f"huggingface config {sorted(config)[:4]} {config.get('model_type')!r}")
        mutant.operators.append("factory/huggingface")
    else:
        factory = rng.choice(("os:system", "evil:Evil", "ckpt.cli.main:cli", "ckpt.store:create", "builtins:exec"))
        _edit_root_attrs(store, lambda ckpt: ckpt["model"].__setitem__("factory", factory))
        mutant.done.append(f"factory {factory}")
        mutant.operators.append("factory/factory")


HOSTILE_PROVENANCE: tuple[tuple[str, Any], ...] = (
    ("analyzer", ["x"]),
    ("analyzer", "polca"),
    ("analyzer", 5),
    ("options", 5),
    ("options", []),
    ("options", {"split": {"a": 1}}),
    ("steps", ["a"]),
    ("steps", 10**20),
    ("steps", [0, 0, 0]),
    ("steps", [0, 1, 2, 3, 4]),
    ("steps", [-1]),
    ("version", 5),
    ("requires", "x"),
    ("requires", {"x": 5}),
    ("data_sha256", 5),
    ("created", {"a": "<script>alert(1)</script>"}),
)
"""Provenance entries of the stored ``loss`` result, of the wrong type or at odds with its data."""


def _mutate_provenance(mutant: Mutant, rng: random.Random) -> None:
    """Edit the ``loss`` result's provenance in the commit record and in its node, consistently."""
    key, value = rng.choice(HOSTILE_PROVENANCE)
    drop = rng.random() < 0.2
    root = mutant.path / "zarr.json"
    document = _load(root)
    metadata = document.get("consolidated_metadata", {}) if isinstance(document, dict) else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("metadata"), dict):
        return
    node_file = mutant.path / "analyses" / "loss" / "zarr.json"
    node = _load(node_file)
    for entry in (metadata["metadata"].get("analyses/loss"), node):
        attributes = entry.get("attributes") if isinstance(entry, dict) else None
        provenance = attributes.get("ckpt") if isinstance(attributes, dict) else None
        if isinstance(provenance, dict):
            if drop:
                provenance.pop(key, None)
            else:
                provenance[key] = value
    root.write_text(json.dumps(document))
    if node is not None:
        node_file.write_text(json.dumps(node))
    mutant.done.append(f"provenance {key} {'dropped' if drop else '= ' + str(value)[:30]}")
    mutant.operators.append(f"provenance/{'drop' if drop else 'value'}")


def _mutate_link(mutant: Mutant, rng: random.Random) -> None:
    """A folder where ckpt writes (locks, results, checkpoints, data) is a link out of the store."""
    store, canary = mutant.path, mutant.canary
    (canary / "store").write_text("a file named like a lock")
    (canary / "analyses" / "loss").mkdir(parents=True, exist_ok=True)
    how = rng.choice(("locks", "locks-analyses", "moved", "moved", "root-file"))
    if (store / ".locks").is_symlink():  # an earlier mutation linked it already
        return
    if how == "locks":
        shutil.rmtree(store / ".locks", ignore_errors=True)
        (store / ".locks").symlink_to(canary, target_is_directory=True)
        mutant.done.append("link .locks -> outside")
        mutant.operators.append("link/locks")
    elif how == "locks-analyses":
        (store / ".locks").mkdir(exist_ok=True)
        if (store / ".locks" / "analyses").is_symlink():
            return
        shutil.rmtree(store / ".locks" / "analyses", ignore_errors=True)
        (store / ".locks" / "analyses").symlink_to(canary / "analyses", target_is_directory=True)
        mutant.done.append("link .locks/analyses -> outside")
        mutant.operators.append("link/locks-analyses")
    elif how == "moved":
        folders = [p for p in (store / "analyses" / "loss", store / "data" / "eval") if p.is_dir()]
        folders += [p for p in (store / "checkpoints").glob("*") if p.is_dir() and not p.is_symlink()]
        folders = [p for p in folders if not p.is_symlink()]
        if not folders:
            return
        folder = rng.choice(folders)
        outside = canary / f"moved-{folder.name}"
        shutil.move(folder, outside)
        folder.symlink_to(outside, target_is_directory=True)
        mutant.damaged_checkpoint |= folder.is_relative_to(store / "checkpoints")
        mutant.done.append(f"link {folder.relative_to(store)} -> a copy outside")
        mutant.operators.append("link/moved")
    elif (store / "zarr.json").is_file() and not (store / "zarr.json").is_symlink():
        outside = canary / "zarr.json"
        shutil.copy(store / "zarr.json", outside)
        (store / "zarr.json").unlink()
        (store / "zarr.json").symlink_to(outside)
        mutant.done.append("link zarr.json -> a copy outside")
        mutant.operators.append("link/root-file")


def zstd_bomb(declared: int = 8 * 2**30) -> bytes:
    """A zstd frame of RLE blocks that declares and inflates to ``declared`` bytes (~4 bytes per 128 KiB).

    Written by hand from RFC 8878 (a frame header, then 3-byte block headers of type RLE each followed by
    its one byte): no compressor would take seconds and gigabytes to make it.
    """
    block = 128 * 1024
    header = (0xFD2FB528).to_bytes(4, "little") + bytes([0b1110_0000]) + declared.to_bytes(8, "little")
    blocks, left = bytearray(), declared
    while left:
        size = min(block, left)
        left -= size
        blocks += ((size << 3) | (1 << 1) | (left == 0)).to_bytes(3, "little") + b"\0"
    return header + bytes(blocks)


HOSTILE_CODECS: tuple[list[dict[str, Any]], ...] = (
    [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "zstd", "configuration": {"level": 0, "checksum": False}},
    ],
    [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}],
    [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}],
    [
        {"name": "transpose", "configuration": {"order": [0, 2, 1]}},
        {"name": "bytes", "configuration": {"endian": "little"}},
    ],
    [{"name": "numcodecs.pickle"}],
    [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "numcodecs.zlib", "configuration": {"level": 1}},
    ],
    [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [1, 10**6, 10**6],
                "codecs": [{"name": "bytes"}],
                "index_codecs": [{"name": "bytes"}, {"name": "crc32c"}],
            },
        }
    ],
)
"""Codec pipelines put on a checkpoint array: ones ckpt never writes (pickle, transpose, gzip, sharding)."""


def _mutate_codec(mutant: Mutant, rng: random.Random) -> None:
    """A checkpoint array's codecs replaced, or one of its chunks made a zstd bomb under zstd."""
    store = mutant.path
    root = store / "zarr.json"
    document = _load(root)
    metadata = document.get("consolidated_metadata", {}) if isinstance(document, dict) else None
    nodes = metadata.get("metadata") if isinstance(metadata, dict) else None
    if not isinstance(nodes, dict):
        return
    names = [
        k
        for k, v in nodes.items()
        if k.startswith("checkpoints/")
        and k != "checkpoints/step"
        and isinstance(v, dict)
        and v.get("node_type") == "array"
    ]
    if not names:
        return
    name = rng.choice(sorted(names))
    bomb = rng.random() < 0.4
    codecs = HOSTILE_CODECS[0] + [{"name": "crc32c"}] if bomb else rng.choice(HOSTILE_CODECS)
    nodes[name]["codecs"] = codecs
    root.write_text(json.dumps(document))
    node = _load(store / name / "zarr.json")
    if isinstance(node, dict):
        node["codecs"] = codecs
        (store / name / "zarr.json").write_text(json.dumps(node))
    mutant.damaged_checkpoint = True
    if bomb:
        chunks = _files(store / name, "c*")
        if chunks:
            frame = zstd_bomb()
            import google_crc32c

            rng.choice(chunks).write_bytes(frame + google_crc32c.value(frame).to_bytes(4, "little"))
    mutant.done.append(f"codecs of {name}: {[c['name'] for c in codecs]}{' + a zstd bomb' if bomb else ''}")
    mutant.operators.append(f"codec/{'bomb' if bomb else 'pipeline'}")


STRUCTURED = {
    "factory": _mutate_factory,
    "provenance": _mutate_provenance,
    "link": _mutate_link,
    "codec": _mutate_codec,
}
"""The kinds that know the store's structure (the others are blind edits of files)."""

OPERATORS = (
    *(f"{kind}/{how}" for kind in ("root", "node") for how in ("delete", "value", "rename", "deep")),
    *("truncate", "bytes", "group"),
    *(f"chunk/{how}" for how in CHUNK_DAMAGE),
    *("factory/config", "factory/huggingface", "factory/factory", "provenance/value", "provenance/drop"),
    *("link/locks", "link/locks-analyses", "link/moved", "link/root-file", "codec/pipeline", "codec/bomb"),
)
"""Every mutation operator (``kind/how``): a smaller sample of mutants must still apply each of them."""


# -- running and judging --------------------------------------------------------------------------
def tree_hash(path: Path) -> str:
    """One hash of every file (name and bytes) under ``path``."""
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        digest.update(str(file.relative_to(path)).encode())
        if file.is_file() and not file.is_symlink():
            digest.update(file.read_bytes())
    return digest.hexdigest()


def judge(command: tuple[str, ...], code: int | str, stdout: str, stderr: str, mutant: Mutant) -> str | None:
    """Why a command's outcome breaks the contract, or None when it keeps it."""
    if code == "timeout":
        return f"hang: more than {COMMAND_SECONDS:.0f} s"
    if code == "crash":
        return f"the worker died (killed for memory?): {stderr[-300:]}"
    if "Traceback" in stdout + stderr:
        return "traceback: " + " | ".join(stderr.strip().splitlines()[-3:])
    if code not in (0, 1, 2, 3):
        return f"exit status {code}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    others = [line for line in lines if not line.startswith("Warning: ")]
    quiet = code == 0 or (code == 3 and command[0] == "verify")  # 3: verify could not check everything
    if quiet and others:
        return f"exit {code} with stderr lines that are not warnings: {others[:2]}"
    if not quiet and (len(others) != 1 or not others[0].startswith("Error: ")):
        return f"exit {code} without exactly one Error: line: {others[:3]}"
    if command[0] == "verify" and code == 0 and mutant.damaged_checkpoint:
        return "verify passed a store whose checkpoint chunk was damaged"
    return None


class Worker:
    """One long-lived process running ckpt commands in-process (see the module docs)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        return subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz_store"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=root,
        )

    def run(self, args: list[str]) -> tuple[int | str, str, str]:
        """Exit status (or ``"timeout"``/``"crash"``), stdout and stderr of ``ckpt ARGS``."""
        import selectors

        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(args) + "\n")
        self.process.stdin.flush()
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        ready = selector.select(COMMAND_SECONDS)
        selector.close()
        if not ready:
            self.close()
            return "timeout", "", ""
        line = self.process.stdout.readline()
        if not line:
            self.close()
            return "crash", "", ""
        answer = json.loads(line)
        return answer["code"], answer["stdout"], answer["stderr"]

    def close(self) -> None:
        """Stop the worker."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def worker() -> None:
    """The worker's loop: one JSON list of arguments per line in, one JSON answer per line out."""
    import resource
    import traceback
    import warnings

    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))
    from ckpt.cli.main import cli

    answers = sys.stdout
    for line in sys.stdin:
        args = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        code: int = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the real command runs with PYTHONWARNINGS=ignore too
            try:
                cli.main(args, prog_name="ckpt")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # a bug: the real command would print this traceback
                traceback.print_exc(file=err)
                code = 1
        answers.write(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
        answers.flush()


if __name__ == "__main__":
    worker()
