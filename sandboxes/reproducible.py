"""Pinning torch's CPU kernels, so that a run's weights do not depend on the CPU's instruction set.

torch picks its CPU kernels by the instruction set of the machine (AVX-512,
AVX2 or the portable default) and MKL picks its own code path the same way;
floating-point sums in another order give other roundings, and 2,000 steps of
training turn them into other weights, other clusters and another finding.
Comparing the final weights' hashes of short ``addition`` runs (docs/sandboxes.md,
"The same figures on any x86-64 CPU?"):

- MKL's instruction set alone did not change the weights, torch's AVX2 kernels
  (what an AVX2-only CPU runs) did;
- pinned (the settings below), MKL allowed AVX-512 or only AVX2 gives the same
  weights either way;
- the thread count splits the sums, so it is pinned too.

Across CPU vendors the pin holds against the instruction sets (once it pins MKL's
dispatch as well), but an AMD and an Intel CPU still train different pinned weights;
which kernel differs between them was not found. What stays different:
AMD against Intel CPUs, x86-64 CPUs without
AVX2 (MKL's pinned path needs it), other CPU architectures (ARM has neither these kernels nor MKL), other torch or MKL
versions, and GPUs. The settings are read when torch
first runs an operation, so they must be set before that, in a fresh process.
"""

from __future__ import annotations

import os
import sys

PINNED = {
    # torch's portable kernels instead of the AVX2/AVX-512 ones picked at run time
    "ATEN_CPU_CAPABILITY": "default",
    # MKL's conditional numerical reproducibility on its AVX2 code path, the same on every CPU
    # with AVX2 (x86-64 CPUs since 2013). COMPATIBLE (any x86-64) costs more per training step than
    # AVX2 (docs/sandboxes.md, "The same figures on any x86-64 CPU?"); what it adds is only CPUs
    # older than AVX2.
    "MKL_CBWR": "AVX2",
    # oneDNN (used by some ops) limited to the same instruction set
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # and MKL's dispatch too: on an Intel CPU with AVX-512, MKL_CBWR=AVX2 alone did not stop a user's
    # MKL_ENABLE_INSTRUCTIONS=AVX512 from changing the pinned weights (docs/sandboxes.md, "The same
    # figures on any x86-64 CPU?"); on AMD it had not mattered
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
"""Environment settings that make torch's CPU arithmetic the same on every x86-64 CPU."""

PINNED_THREADS = 2
"""Intra-op threads of a pinned run: a fixed count (not the core count), since it splits the sums."""


def pin_cpu_kernels() -> str | None:
    """Pin torch's CPU kernels and thread count for this process, if torch has not started yet.

    Returns
    -------
    str or None
        ``None`` when pinned; otherwise why not (torch was already imported, so
        the settings would come too late to take effect everywhere).
    """
    if "torch" in sys.modules:
        return "torch was imported before the kernels could be pinned; run in a fresh process"
    os.environ.update(PINNED)
    import torch

    torch.set_num_threads(PINNED_THREADS)
    return None


def kernel_description() -> str:
    """One line on the CPU kernels and threads torch uses in this process."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    pinned = all(os.environ.get(key) == value for key, value in PINNED.items()) and capability == "DEFAULT"
    state = "pinned: the same arithmetic whatever the instruction set" if pinned else "this CPU's fastest, not pinned"
    return f"CPU kernels: {capability} ({state}), {torch.get_num_threads()} torch threads"


__all__ = ["PINNED", "PINNED_THREADS", "kernel_description", "pin_cpu_kernels"]
