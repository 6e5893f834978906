"""Built-in analyzers of ckpt, each a plugin registered through the same hooks as third-party ones.

Depends on :mod:`plugins` and :mod:`ckptstore`, never on :mod:`cli`.
"""
