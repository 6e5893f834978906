"""``python -m ckpt`` runs the ``ckpt`` command."""

from ckpt.cli.main import main

main()
