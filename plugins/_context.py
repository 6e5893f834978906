"""Deprecated alias of :mod:`ckpt.engine.context`, until ``ckpt.plugins.testing`` imports it from there.

Its names resolve on first use, so that the plugin host imports no engine module when it is
imported (imports point down: docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module("ckpt.engine.context"), name)
