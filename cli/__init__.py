"""The ``ckpt`` command line: one module per command group. The only layer that prints or exits."""

__all__: list[str] = []  # the package's modules are its API
