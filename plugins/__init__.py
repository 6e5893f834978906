"""The plugin host of ckpt: hookspecs, the plugin manager, the Analyzer base and the engine.

Depends on :mod:`ckptstore` only. Built by the engine issue; this package is
a placeholder so that the layers exist from the start.
"""
