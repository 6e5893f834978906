"""``python -m ckpt.cli`` runs the ``ckpt`` command."""

from ckpt.cli.main import main

main()
