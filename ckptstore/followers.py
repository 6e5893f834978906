"""Analyses that follow a run from its training loop: ``ckpt.create(path, follow=["loss", "grad-norms"])``.

A writer opened with ``follow`` starts, once the store is open for writing, one follower process
per analyzer: ``python -m ckpt analyze NAME STORE --follow`` with the trainer's interpreter, so
with the same installed plugins. The training loop never waits for them: a commit only rewrites
the store's record, which wakes the followers; they compute in their own processes and commit
their results into ``analyses/`` as ``ckpt analyze`` does. :meth:`ckpt.store.Writer.close` marks
the run finished; each follower then computes what is left and exits on its own, and the writer
does not wait for that.

The store layer imports nothing above it, so it knows the analyzers only through the command:
:func:`check_names` asks ``python -m ckpt analyze NAME --help`` of each name, in parallel, before
the store is created or opened, and an unknown name is one :class:`~ckpt.errors.InvalidArgumentError`
with the command's own reason (the registered names).

What the followers print goes to one log file, :func:`log_path`: ``STORE.follow.log`` beside a
local store, ``NAME.follow.log`` in the working folder for a URL (``follow_log`` chooses another).

Processes: each follower is reaped by a thread of the trainer while the trainer lives (no zombie
in a long notebook session); when the trainer exits first the follower is its orphan, adopted and
reaped by the system. When the trainer's interpreter exits with the writer still open (an
exception outside ``with``, ``sys.exit``, Ctrl-C), the followers get SIGINT, as from Ctrl-C:
what they committed stays, and ``ckpt analyze NAME STORE`` completes it later. A trainer killed
outright (SIGKILL, out of memory) runs no code: its followers wait for checkpoints that do not
come until they are interrupted (their process ids are in the log).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ckpt.errors import InvalidArgumentError
from ckpt.store import _zarr

LOG_SUFFIX = ".follow.log"
"""What a follower log's name adds to the store's."""

CHECK_TIMEOUT = 120.0
"""Seconds the name check waits for ``python -m ckpt analyze NAME --help``."""

_checked: set[str] = set()  # names the command accepted in this process: a callback checks, then creates


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckpt", *args]


def _refusal(name: str) -> str | None:
    """Why ``ckpt analyze NAME`` refuses ``name`` (its ``Error:`` line), or None when it is an analyzer."""
    done = subprocess.run(
        _command("analyze", name, "--help"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT,
        check=False,
    )
    if done.returncode == 0:
        return None
    lines = [line.removeprefix("Error: ") for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"ckpt analyze {name} exited with status {done.returncode}"


def check_names(follow: Sequence[str] | None) -> tuple[str, ...]:
    """The analyzer names of ``follow``, each accepted by ``ckpt analyze`` in this environment.

    Raises
    ------
    InvalidArgumentError
        ``follow`` is not a list of names, names one twice, or names no registered analyzer.
    """
    if follow is None:
        return ()
    if isinstance(follow, str) or not all(isinstance(name, str) for name in follow):
        msg = f"follow must be a list of analyzer names such as ['loss', 'grad-norms'], got {follow!r}"
        raise InvalidArgumentError(msg)
    names = tuple(follow)
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        msg = f"follow names {', '.join(map(repr, twice))} more than once; name each analyzer once"
        raise InvalidArgumentError(msg)
    unchecked = [name for name in names if name not in _checked]
    with ThreadPoolExecutor(max_workers=max(1, len(unchecked))) as pool:
        refusals = dict(zip(unchecked, pool.map(_refusal, unchecked), strict=True))
    for name, refusal in refusals.items():
        if refusal is not None:
            msg = f"follow={list(names)!r}: {refusal}"
            raise InvalidArgumentError(msg)
        _checked.add(name)
    return names


def log_path(where: str, log: str | os.PathLike[str] | None = None) -> Path:
    """The file the followers of the store at ``where`` write to (``log`` when given)."""
    if log is not None:
        return Path(log)
    local = _zarr.local_path(where)
    if local is not None:
        local = local.absolute()
        return local.with_name(local.name + LOG_SUFFIX)
    return Path.cwd() / (where.rstrip("/").rsplit("/", 1)[-1] + LOG_SUFFIX)


def _environment(where: str, storage_options: dict[str, Any] | None) -> dict[str, str]:
    """The trainer's environment, with a remote store's fsspec options where fsspec reads its configuration.

    ``FSSPEC_<PROTOCOL>`` (JSON) is fsspec's own configuration variable: the options reach the
    follower without appearing on its command line.
    """
    env = dict(os.environ)
    if storage_options and _zarr.local_path(where) is None:
        protocol = where.split("://", 1)[0].upper()
        try:
            env[f"FSSPEC_{protocol}"] = json.dumps(storage_options)
        except TypeError as exc:
            msg = f"follow passes storage_options to the followers as JSON, and these are not: {exc}"
            raise InvalidArgumentError(msg) from None
    return env


def check_followable(where: str, log: str | os.PathLike[str] | None = None) -> None:
    """Refuse a store that another process cannot open (``memory://``), or a log in no folder."""
    if where.startswith("memory://"):
        msg = f"follow runs analyzers in other processes, which cannot see {where}: write to a path or a remote URL"
        raise InvalidArgumentError(msg)
    folder = log_path(where, log).parent
    if not folder.is_dir():
        msg = f"the followers' log would be in {folder}, which is not a folder: create it or pass follow_log=..."
        raise InvalidArgumentError(msg)


class Followers:
    """The follower processes of one writer: started at once, never waited for by the training loop.

    Parameters
    ----------
    where
        The store's path or URL.
    names
        Analyzer names (checked by :func:`check_names`).
    storage_options
        fsspec options of a remote store.
    log
        The log file (default: :func:`log_path`).
    """

    def __init__(
        self,
        where: str,
        names: Sequence[str],
        *,
        storage_options: dict[str, Any] | None = None,
        log: str | os.PathLike[str] | None = None,
    ) -> None:
        check_followable(where, log)
        local = _zarr.local_path(where)
        target = str(local.absolute()) if local is not None else where
        env = _environment(where, storage_options)
        self.log = log_path(where, log)
        self.processes: list[subprocess.Popen[bytes]] = []
        with self.log.open("ab", buffering=0) as out:
            for name in names:
                command = _command("analyze", name, target, "--follow", "--no-progress")
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, close_fds=True
                )
                out.write(f"follower {name}: process {process.pid}: {' '.join(command[1:])}\n".encode())
                self.processes.append(process)
                # reaped while the trainer lives; the trainer never joins it
                threading.Thread(target=process.wait, name=f"ckpt-follow-{name}", daemon=True).start()
        atexit.register(self.interrupt)

    def interrupt(self) -> None:
        """SIGINT to the followers still running (the writer was not closed): committed work stays."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # exited since the poll
                    process.send_signal(signal.SIGINT)

    def release(self) -> None:
        """The run is finished: the followers complete it and exit on their own."""
        atexit.unregister(self.interrupt)


__all__ = ["LOG_SUFFIX", "Followers", "check_followable", "check_names", "log_path"]
