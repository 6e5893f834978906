"""Child for tests/test_memory_budget.py: run one ``ckpt`` command under an address-space limit.

Usage: ``python memory_child.py EXTRA_BYTES ckpt-args...``. The child first imports what an
analysis imports (torch, transformers, dask, xarray, zarr, scipy), so that the limit, set to its
address space at that point plus EXTRA_BYTES, bounds what the command itself allocates: the
memory budget it was given (``--max-memory``) and the process's own overhead. It prints its
peak RSS on the last line of stderr.
"""

from __future__ import annotations

import importlib.util
import resource
import sys


def address_space() -> int:
    """Bytes of virtual memory this process maps now (``VmSize``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    msg = "no VmSize in /proc/self/status"
    raise RuntimeError(msg)


def main() -> None:
    extra, args = int(sys.argv[1]), sys.argv[2:]
    import dask.array  # noqa: F401
    import scipy.linalg  # noqa: F401
    import torch
    import transformers  # noqa: F401
    import xarray  # noqa: F401
    import zarr  # noqa: F401

    import ckpt.analyzers.hessian_basis
    import ckpt.cli.main
    import ckpt.engine.pipeline

    # torch's CUDA builds bring triton, which the analysis loads on its way (172 MiB mapped); CPU builds have none
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401

    torch.set_num_threads(1)
    limit = address_space() + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.argv = ["ckpt", *args]
    try:
        ckpt.cli.main.main()
    finally:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"peak RSS {peak}", file=sys.stderr)


if __name__ == "__main__":
    main()
