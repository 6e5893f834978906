"""The ``ckpt`` command group and the one place where errors become exit codes.

Every user mistake ends as a single line ``Error: ...`` on stderr and a
non-zero exit status, never a traceback: ``CkptError`` (bad store, bad input),
click's usage errors (unknown option, missing argument) and interrupts alike.
A traceback means a bug in ckpt, and is kept so that it can be reported.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ckpt import DISTRIBUTION

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


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
        except click.Abort:
            fail("aborted", EXIT_INTERRUPTED)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code or EXIT_ERROR)
        except CkptError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED)
        if isinstance(result, int) and not isinstance(result, bool):
            sys.exit(result)  # click returns the exit code of --help/--version here
        sys.exit(0)


@click.group(cls=CkptGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name=DISTRIBUTION, prog_name="ckpt", message="%(prog)s %(version)s")
def cli() -> None:
    """ckpt: analyze how neural networks learn, from a store of their checkpoints.

    Training writes checkpoints into a chunked Zarr store (RUN.zarr); ckpt
    imports existing runs, inspects stores, and runs analyzers over them.
    """


def _register_commands() -> None:
    # one module per command group; imported here, not at package import
    from ckpt.cli import analyze, demo, info, io, train

    commands = (info.info, info.verify, io.import_command, io.repair)
    commands += (analyze.analyze, analyze.plugins_command, analyze.show, analyze.rm_command)
    commands += (train.train_command, demo.demo)
    for command in commands:
        cli.add_command(command)


_register_commands()


def main() -> None:
    """Entry point of the ``ckpt`` console script."""
    cli.main(prog_name="ckpt")
