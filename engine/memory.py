"""The memory budget (``--max-memory``): one engine setting from which analyzers size their blocks.

The engine resolves the budget once per run (a size the user gives, else a
share of what the machine has free) and divides it among the tasks that run at
the same time on this machine; each task reads its share as
:attr:`ckpt.plugins.Worker.memory_budget`. An analyzer estimates its peak
before computing and either fits its blocks into that share or raises one
:class:`ckpt.errors.AnalysisError` naming the knob to turn.
"""

from __future__ import annotations

import math
import re

from ckpt.errors import AnalysisError

__all__ = [
    "DEFAULT_SHARE",
    "GPU_SHARE",
    "default_budget",
    "format_size",
    "parse_size",
]

DEFAULT_SHARE = 0.5
"""Share of the RAM available when a run starts that it may use by default: the rest is left to the
Python process itself (about 0.5 GiB of libraries), the page cache (the store's chunks), the Dask
scheduler and whatever else runs. A larger share let hessian-basis at GPT-2 small peak well above its plan
before its graph estimate was corrected (docs/performance.md, "Memory and the allocator")."""
GPU_SHARE = 0.8
"""Share of a CUDA device's free memory a run may use by default (the CUDA context and the caching
allocator's fragmentation take the rest)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str | int | float) -> int:
    """Bytes of a size such as ``12GiB``, ``500MB``, ``8g`` or ``4e9``.

    Raises
    ------
    AnalysisError
        When ``text`` is not a positive, finite size.
    """
    if isinstance(text, bool):
        text = str(text)
    if isinstance(text, int | float):
        number, unit = (float(text) if abs(text) < 2**1000 else math.inf), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        if match is None or match.group(2).lower() not in _UNITS:
            msg = f"--max-memory must be a size such as 8GiB, 12GB or 500MiB, got {text!r}"
            raise AnalysisError(msg)
        number, unit = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(number * _UNITS[unit]):  # 1e400 reads as infinity: no budget at all
        msg = f"--max-memory must be a finite size such as 8GiB, 12GB or 500MiB, got {text!r}"
        raise AnalysisError(msg)
    size = int(number * _UNITS[unit])
    if size <= 0:
        msg = f"--max-memory must be positive, got {text!r}"
        raise AnalysisError(msg)
    return size


def format_size(size: float) -> str:
    """``size`` bytes for a message: ``1.5 GiB``, ``300 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{int(size)} B"


def default_budget(device: str = "cpu") -> int:
    """:data:`GPU_SHARE` of the CUDA device's free memory, or :data:`DEFAULT_SHARE` of available RAM."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(GPU_SHARE * free)
    import psutil

    return int(DEFAULT_SHARE * psutil.virtual_memory().available)
