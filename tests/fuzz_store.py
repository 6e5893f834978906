"""A fuzzer of hostile stores: mutate a real store, run every reading command, judge what they print.

Used by ``tests/test_fuzz_store.py`` (1,000 mutants in CI, seeded and derandomized). More by hand::

    CKPT_FUZZ_EXAMPLES=20000 CKPT_FUZZ_SEED=7 pytest tests/test_fuzz_store.py -x

Design. The base store is a real training run (``ckpt.plugins.testing.write_example_run``) with an eval split,
a label, metrics and a stored ``loss`` result. Each mutant is a copy with one to three mutations:
JSON edits of the root record (its ``attrs["ckpt"]`` and consolidated metadata) or of a node's
``zarr.json`` (a key deleted, a value of another type, a huge or negative number, a node renamed
to a path such as ``../x``, JSON nested 5,000 deep), files truncated or filled with invalid bytes,
chunk files deleted, truncated, flipped, copied over another step's, swapped, replaced by a symbolic
link (to a canary file outside the store, or to a folder) or by a folder, and whole groups deleted
or replaced by a file.

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


def _edit_json(file: Path, rng: random.Random) -> str:
    try:
        document = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return f"{file.name}: unreadable, left"
    paths = [p for p in _json_paths(document) if p]
    if not paths:
        return "empty document"
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
    return f"{file.parent.name}/{file.name}: {how} at {list(target)[:6]}"


def mutate(mutant: Mutant, rng: random.Random) -> None:
    """Apply one random mutation to ``mutant`` (recorded in ``mutant.done``)."""
    store = mutant.path
    chunks = [p for p in _files(store, "checkpoints/*/c*")]
    kind = rng.choice(("root", "root", "root", "node", "truncate", "bytes", "chunk", "chunk", "chunk", "group"))
    if kind == "root":
        mutant.done.append(_edit_json(store / "zarr.json", rng))
    elif kind == "node":
        nodes = _files(store, "**/zarr.json")
        mutant.done.append(_edit_json(rng.choice(nodes), rng))
    elif kind in ("truncate", "bytes"):
        file = rng.choice(_files(store, "**/*"))
        data = file.read_bytes()
        new = data[: rng.randrange(len(data) + 1)] if kind == "truncate" else b"\xff\xfe\x00" + data[3:]
        file.write_bytes(new)
        mutant.damaged_checkpoint |= file in chunks and new != data
        mutant.done.append(f"{kind} {file.relative_to(store)}")
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


def _mutate_chunk(mutant: Mutant, chunks: list[Path], rng: random.Random) -> None:
    chunk = rng.choice(chunks)
    how = rng.choice(("delete", "flip", "copy", "swap", "link-file", "link-dir", "folder"))
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
