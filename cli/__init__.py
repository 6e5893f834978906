"""The ``ckpt`` command line: one module per command group. The only layer that prints or exits."""
