"""``python -m cli`` runs the ``ckpt`` command."""

from cli.main import main

main()
