"""A fork server for the ``ckpt`` commands the tests run: each command is its own process, minus the imports.

Most of a test's ``ckpt`` command was Python importing torch, transformers, xarray, zarr and dask
before ckpt read a byte: 2.5-8 s a command on a 2-core CI machine, against well under a second of
work on the tiny stores of the tests. ``tests/helpers.py:run_ckpt`` runs its commands through this
server instead. The server imports those third-party libraries once, then forks one child per
command. The child is a separate process, like the console script's: it takes the command's
working directory, environment and ``sys.argv``, imports ckpt itself (ckpt's own modules are never
preloaded, so every command imports them afresh) and runs ``ckpt.cli.main:main``. Its exit status,
stdout and stderr are the command's, tracebacks included; it leaves as the interpreter does
(threads joined, atexit handlers run, streams flushed), less the module teardown.

What a child does not get afresh is the third-party imports. So the server runs in the test
process's environment, and a new server is started when that changes; a command with settings of
its own that a library may read on import (``PYTHONPATH``, thread counts, credentials: anything but
``CKPT_*``) runs as a plain subprocess, as does ``ckpt demo``, which pins torch's CPU kernels before
it imports torch, and a command started while another runs in the same test process.
``CKPT_TEST_EXEC=1`` runs every command from the console script; ``tests/test_demo.py`` and
``tests/test_figures_at_scale.py`` run it on every run.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOADED = (
    "numpy",
    "torch",
    "pandas",
    "xarray",
    "zarr",
    "dask.array",
    "click",
    "pluggy",
    "transformers.models.gpt2.modeling_gpt2",
)
"""Imported once by the server; every other module (ckpt's among them) is imported by each command."""

FRESH_PROCESS_COMMANDS = ("demo",)
"""Commands that must start torch themselves: ``ckpt demo`` pins torch's CPU kernels before importing it."""

SAFE_TO_CHANGE = (
    "CKPT_",
    "PYTEST_CURRENT_TEST",
    # written by libraries a test imports in its own process (hdbscan, lightning), read only when used:
    # a plain subprocess of that test inherits them, and the forked command gets them from its request
    "KMP_INIT_AT_FORK",
    "KMP_DUPLICATE_LIB_OK",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "TORCHINDUCTOR_CACHE_DIR",
)
"""Environment variables a command may set differently from the server: read when they are used, not on import."""

LOG = "CKPT_TEST_FORKSERVER_LOG"
"""Set to a file name: each command run as a plain subprocess, and each new server, appends why."""


def serve(script: str) -> None:
    """The server's loop: one JSON request a line on fd 0; the child's pid, then its status, on fd 1."""
    import importlib

    requests, answers = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for name in PRELOADED:
        importlib.import_module(name)
    # forking a process with Python threads running could copy a held lock; the native threads of the
    # BLAS libraries are made fork-safe by their own pthread_atfork handlers
    if threading.active_count() != 1:
        sys.exit(f"cli_forkserver: a preloaded library started Python threads: {threading.enumerate()}")
    gc.freeze()  # the preloaded objects are never collected: a child's collections need not copy their pages
    answers.write("ready\n")
    answers.flush()
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            answers.close()
            _become_the_command(script, request)  # never returns: the command exits the interpreter
        answers.write(f"{pid}\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(f"{os.waitstatus_to_exitcode(status)}\n")
        answers.flush()


def _become_the_command(script: str, request: dict) -> None:
    """In the child: the command's streams, directory, environment and arguments, then the console script."""
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        opened = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [script, *request["args"]]
    sys.path[0] = str(Path(script).parent)  # as for the console script: its own folder first
    try:
        from ckpt.cli.main import main

        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # as the interpreter does with an uncaught exception: its traceback, status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _exit(code: int) -> None:
    """Leave as the interpreter does, less the module teardown.

    Tearing down torch's and transformers' modules in a forked child touches (so copies) every
    page of the server's heap: 2.1 s a command, more than the command. The steps that can be seen
    from outside run as at a normal exit, in its order: non-daemon threads joined, atexit handlers,
    the streams flushed.
    """
    import atexit

    threading._shutdown()  # type: ignore[attr-defined] - the interpreter's own first step at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class ForkServer:
    """The client: starts the server on first use and runs one command at a time through it."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.env: dict[str, str] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.pending = b""
        self.broken = False
        self.lock = threading.Lock()

    def run(
        self, args: list[str], cwd: Path | None, timeout: float, base: dict[str, str], env: dict[str, str]
    ) -> subprocess.CompletedProcess[str] | None:
        """``ckpt ARGS`` in a forked child, or None where it must run as a plain subprocess.

        ``base`` is the test process's environment as every command gets it, ``env`` this
        command's (``base`` with its own settings). The server runs in ``base``: when that changes
        (dask writes ``PYTHONHASHSEED`` and two more into ``os.environ`` when a test starts worker
        processes) the next command starts a new server. A command's own settings that could
        matter on import make it a plain subprocess.
        """
        fresh = bool(args) and args[0] in FRESH_PROCESS_COMMANDS
        unsafe = _changed(env, base)
        if fresh or self.broken or unsafe:
            _log(args, f"run plain: {fresh=} {self.broken=} changed: {unsafe}")
            return None
        if not self.lock.acquire(blocking=False):  # another thread's command is running: no queue
            _log(args, "run plain: another command is running")
            return None
        try:
            moved = _changed(base, self.env)
            if self.process is not None and moved:
                _log(args, f"a new server: the test process's environment changed: {moved}")
                self.close()
            process = self._server(base)
            if process is None:
                return None
            return self._run(process, args, cwd, timeout, env)
        finally:
            self.lock.release()

    def _server(self, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        if self.process is None:
            here = Path(__file__).resolve()
            self.env = dict(env)
            self.process = subprocess.Popen(
                [sys.executable, str(here), str(self.script)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                env=env,
                cwd=here.parents[1],
            )
            self.pending = b""
            if self._line(None) != "ready":
                self.broken = True
                self.close()
        return self.process

    def _line(self, timeout: float | None) -> str | None:
        """The server's next answer, or None when it sends none within ``timeout`` seconds."""
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the ckpt fork server exited")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def _run(
        self, process: subprocess.Popen[bytes], args: list[str], cwd: Path | None, timeout: float, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        assert process.stdin is not None
        with tempfile.TemporaryDirectory(prefix="ckpt-cmd-") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            out.touch()
            err.touch()
            request = {"args": args, "cwd": str(cwd or Path.cwd()), "env": env, "stdout": str(out), "stderr": str(err)}
            process.stdin.write(json.dumps(request).encode() + b"\n")
            pid = int(self._line(None) or "")
            answer = self._line(timeout)
            if answer is None:  # as subprocess.run does: kill the command, then report the timeout
                with contextlib.suppress(ProcessLookupError):  # it ended as the time ran out
                    os.kill(pid, signal.SIGKILL)
                self._line(None)
            stdout, stderr = _as_text(out.read_bytes()), _as_text(err.read_bytes())
        command = [str(self.script), *args]
        if answer is None:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, int(answer), stdout, stderr)

    def close(self) -> None:
        """Stop the server (its running command, if any, finishes on its own)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def _changed(env: dict[str, str], other: dict[str, str]) -> list[str]:
    """The variables whose values differ between two environments, less those safe to change."""
    keys = env.keys() | other.keys()
    return sorted(k for k in keys if env.get(k) != other.get(k) and not k.startswith(SAFE_TO_CHANGE))


def _log(args: list[str], what: str) -> None:
    """What the client did with ``ckpt ARGS`` other than fork it, in the log if there is one."""
    if os.environ.get(LOG):
        with open(os.environ[LOG], "a") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST')}: ckpt {' '.join(args[:2])}: {what}\n")


def _as_text(data: bytes) -> str:
    """Bytes as ``subprocess.run(text=True)`` decodes them: the locale's encoding, universal newlines."""
    import locale

    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    serve(sys.argv[1])
