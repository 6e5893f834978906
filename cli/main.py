"""The ``ckpt`` command group and the one place where errors become exit codes.

Every user mistake ends as a single line ``Error: ...`` on stderr and a
non-zero exit status, never a traceback: ``CkptError`` (bad store, bad input),
click's usage errors (unknown option, missing argument) and interrupts alike.
A traceback means a bug in ckpt, and is kept so that it can be reported.
"""

from __future__ import annotations

import atexit
import gc
import sys
from typing import Any

import click

from ckpt import DISTRIBUTION

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNVERIFIED = 3
"""``ckpt verify``: nothing found corrupt, but pieces without digests could not be checked (format v1)."""
EXIT_INTERRUPTED = 130
INTERRUPTED = "interrupted; the store keeps what was committed before (an analysis resumes from there when rerun)"


def fail(message: str, code: int = EXIT_ERROR) -> None:
    """Print ``Error: message`` as one line on stderr and exit with ``code``."""
    one_line = " ".join(str(message).split())
    click.echo(f"Error: {one_line}", err=True)
    sys.exit(code)


class CkptGroup(click.Group):
    """A click group that reports errors as one ``Error:`` line instead of usage dumps and tracebacks."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 - see class docstring
        from ckpt.errors import CkptError  # imports nothing: cheap

        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "ckpt"
            fail(f"{exc.format_message()} (see '{where} --help')", EXIT_USAGE)
        except click.Abort:  # click's form of Ctrl-C
            fail(INTERRUPTED, EXIT_INTERRUPTED)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code or EXIT_ERROR)
        except CkptError as exc:
            fail(str(exc))
        except OSError as exc:
            message = environment_problem(exc)
            if message is None:
                raise  # not the environment: a bug, keep its traceback
            fail(message)
        except KeyboardInterrupt:
            fail(INTERRUPTED, EXIT_INTERRUPTED)
        if isinstance(result, int) and not isinstance(result, bool):
            sys.exit(result)  # click returns the exit code of --help/--version here
        sys.exit(0)


def environment_problem(exc: OSError) -> str | None:
    """The one-line message for a file system that refuses a write (read-only, no permission, full), else None.

    The commit protocol makes these safe to report and stop: whatever was half
    written is not in the commit record, so the store keeps its last committed state.
    """
    import errno

    where = exc.filename or "the store"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"cannot write {where}: {exc.strerror}. This command writes into the store (results, locks, its "
            "history); give it write access, or copy the store somewhere writable (cp -r) and use the copy"
        )
    if exc.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ELOOP):
        return (
            f"{where} is not what ckpt expects there ({exc.strerror}): a file stands where a folder belongs, or "
            "the reverse, or a link loops; the store's layout was damaged or edited by hand: check it with "
            "`ckpt verify` and restore it from a copy"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space left writing {where} ({exc.strerror}); nothing half-written was committed, so the store "
            "keeps its last committed state: free some space and run the command again"
        )
    return None


@click.group(cls=CkptGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name=DISTRIBUTION, prog_name="ckpt", message="%(prog)s %(version)s")
def cli() -> None:
    """ckpt: analyze how neural networks learn, from a store of their checkpoints.

    Training writes checkpoints into a chunked Zarr store (RUN.zarr); ckpt
    imports existing runs, inspects stores, and runs analyzers over them.
    """


def _register_commands() -> None:
    # one module per command group; imported here, not at package import
    from ckpt.cli import analyze, data, demo, info, io, plot, serve, train, watch

    commands = (info.info, info.verify, io.import_command, io.repair, io.upgrade, data.data, data.set_model)
    commands += (analyze.analyze, analyze.plugins_command, analyze.show, analyze.rm_command, watch.watch_command)
    commands += (plot.plot_command, plot.report_command, plot.animate_command, serve.serve_command)
    commands += (train.train_command, demo.demo)
    for command in commands:
        cli.add_command(command)


_register_commands()


def main() -> None:
    """Entry point of the ``ckpt`` console script."""
    from ckpt.runtime import use_one_heap

    use_one_heap()  # first, before any thread exists: glibc's setting holds for threads started after it
    # This process ends when the command does: at exit its objects are frozen, not collected once
    # more by the interpreter, most of exit once torch and transformers are imported (ckpt.runtime).
    # Registered first, so it runs after the handlers registered during the command (LIFO).
    atexit.register(gc.freeze)
    cli.main(prog_name="ckpt")


__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_UNVERIFIED",
    "EXIT_USAGE",
    "CkptGroup",
    "cli",
    "environment_problem",
    "fail",
    "main",
]
