"""Generate docs/cli.md from the ``--help`` of every ``ckpt`` command.

Run ``python docs/gen_cli.py`` after changing a command; tests/test_docs.py
fails while docs/cli.md is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.testing import CliRunner

HEADER = """# CLI reference

Generated from `--help` by `python docs/gen_cli.py`; do not edit by hand.

Every command reports a mistake (missing path, not a store, corrupt data, bad
option) as one line starting `Error:` on stderr, exits non-zero (1 for a bad
store or input, 2 for a usage error) and leaves stores unchanged.
"""


def _commands(group: click.Group, prefix: list[str]) -> list[list[str]]:
    found = [prefix]
    for name in sorted(group.list_commands(click.Context(group))):
        command = group.get_command(click.Context(group), name)
        if isinstance(command, click.Group):
            found += _commands(command, [*prefix, name])
        else:
            found.append([*prefix, name])
    return found


def render() -> str:
    """The reference as Markdown."""
    from ckpt.cli.main import cli

    runner = CliRunner()
    parts = [HEADER]
    for path in _commands(cli, []):
        result = runner.invoke(cli, [*path, "--help"], prog_name="ckpt", terminal_width=100)
        title = " ".join(["ckpt", *path])
        parts.append(f"## `{title}`\n\n```\n{result.output.rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    target = Path(__file__).with_name("cli.md")
    target.write_text(render())
    sys.stdout.write(f"wrote {target}\n")
