"""Built-in analyzers of ckpt, each a plugin registered through the same hooks as third-party ones.

Depends on :mod:`ckpt.plugins` and :mod:`ckpt.store`, never on :mod:`ckpt.cli`.
"""

__all__: list[str] = []  # the package's modules are its API
