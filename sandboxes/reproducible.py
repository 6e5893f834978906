"""Pinning torch's CPU kernels, so that a run's weights do not depend on the CPU's instruction set.

torch picks its CPU kernels by the instruction set of the machine (AVX-512,
AVX2 or the portable default) and MKL picks its own code path the same way;
floating-point sums in another order give other roundings, and 2,000 steps of
training turn them into other weights, other clusters and another finding.
Measured on the 2-core AMD EPYC (AVX-512) machine, 100 steps of the
``addition`` default preset, final weights' sha256:

- torch's default, and MKL forced to AVX2 (``MKL_ENABLE_INSTRUCTIONS=AVX2``):
  the same weights (``0a6f69dd6b0a``), so MKL was not what differed here;
- torch forced to its AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``, what an
  AVX2-only CPU runs): other weights (``3088009fc968``);
- pinned (the settings below), with MKL allowed AVX-512 or only AVX2: the
  same weights either way;
- pinned on one thread instead of two: other weights, since the thread count
  splits the sums; so the thread count is pinned too.

(The hashes and the pinned figures are in docs/sandboxes.md.) On a 2-core
Intel Xeon with AVX-512 (2026-11-25) the pin held against the instruction sets
too (once it pinned MKL's dispatch as well), but its pinned weights differ from
the AMD EPYC's: 100 steps ``ef856b454ac0`` against ``1f69ae6d258b``, and the
demo's seed 0 prints other figures; which kernel differs between the vendors
was not found. What stays different: AMD against Intel CPUs, x86-64 CPUs without
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
    # with AVX2 (x86-64 CPUs since 2013). COMPATIBLE (any x86-64) cost 1.8x per training step
    # against 1.2x for AVX2 (20 steps of the addition default on one thread: 3.6 s, 2.4 s, 2.0 s
    # unpinned); what it adds is only CPUs older than AVX2.
    "MKL_CBWR": "AVX2",
    # oneDNN (used by some ops) limited to the same instruction set
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    # and MKL's dispatch too: on an Intel Xeon with AVX-512 (2026-11-25), MKL_CBWR=AVX2 did not stop a
    # user's MKL_ENABLE_INSTRUCTIONS=AVX512 from changing the pinned weights (30 steps: 1926a7f0e094
    # against 7669f23f5f00); on the AMD EPYC where the pin was first measured it had not mattered
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
