"""Where a Lanczos search keeps its vectors: rows of a torch tensor, or of an unlinked temporary file.

:class:`MemoryRows` and :class:`SpilledRows` hold ``[capacity, D]`` rows that
:func:`ckpt.numerics.lanczos.top_eigenpairs` reads and writes by blocks of columns (so that
nothing of 8·D is allocated); :class:`Tail` is the last rows of either, as a source of its own.
``hessian-basis`` also spills its earlier basis into :class:`SpilledRows`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ckpt.errors import AnalysisError


class MemoryRows:
    """Rows ``[capacity, D]`` of one torch tensor (on any device), read and written by column blocks."""

    def __init__(self, capacity: int, dimension: int, dtype: Any, device: str) -> None:
        import torch

        # torch.empty only reserves: pages are touched as rows are written
        self.data = torch.empty(capacity, dimension, dtype=dtype, device=device)
        self.dtype = dtype

    @classmethod
    def of(cls, data: Any) -> MemoryRows:
        """Rows over an existing ``[n, D]`` tensor, not copied."""
        rows = cls.__new__(cls)
        rows.data, rows.dtype = data, data.dtype
        return rows

    def block(self, count: int, columns: slice, first: int = 0) -> Any:
        """Rows ``[first:first + count]`` of the columns ``columns``."""
        return self.data[first : first + count, columns]

    def write(self, index: int, vector: Any) -> None:
        """Row ``index`` = ``vector``."""
        self.data[index] = vector

    def write_block(self, count: int, columns: slice, values: Any, first: int = 0) -> None:
        """Rows ``[first:first + count]`` of ``columns`` = ``values``."""
        self.data[first : first + count, columns] = values

    def wait(self) -> None:
        """Nothing to wait for: rows in memory are written at once."""

    def close(self) -> None:
        """Free the rows."""
        self.data = self.data.new_empty((0, self.data.shape[1]))  # no rows: their memory is freed


class SpilledRows:
    """Rows ``[capacity, D]`` in an unlinked temporary file, read and written by column blocks (CPU only).

    Why a file: at GPT-2 small a Lanczos vector is 0.5 GB, and the kept Hessian graphs of
    ``--samples 8`` (7.3 GiB while a product runs) leave no room for k + 4 of them in the
    default budget of a modest machine. Read back by ``pread`` into one block buffer, not mapped, so
    that the rows are never in the process's memory: the operating system's page cache holds
    them while memory is free and drops them to disk when it is not. A block read from the page
    cache is cheap beside a product (docs/performance.md, "Lanczos vectors").
    The file is unlinked as soon as it is made, so that a killed run leaves nothing behind.

    :meth:`write` of a whole row returns at once and writes in a background thread. Why: once a
    few GB of a search's rows are dirty, the kernel throttles the writer to the disk's speed, and the next
    Hessian-vector product, the longest part of a step, has no use for the row. Every other call
    waits for that write first (:meth:`wait`).
    """

    def __init__(self, capacity: int, dimension: int, dtype: Any, directory: str | None = None) -> None:
        import tempfile

        import torch

        self.capacity = capacity
        self.dimension = dimension
        self.dtype = dtype
        self.itemsize = torch.empty(0, dtype=dtype).element_size()
        self.numpy_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        self.file = tempfile.TemporaryFile(dir=directory, prefix="ckpt-lanczos-")  # noqa: SIM115 (closed by close())
        self.file.truncate(capacity * dimension * self.itemsize)
        self.buffer = np.empty(0, self.numpy_dtype)
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-lanczos-spill")
        self.pending: Future | None = None

    def wait(self) -> None:
        """Until the row given to :meth:`write` is in the file (its errors are raised here)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def _offset(self, row: int, column: int) -> int:
        return (row * self.dimension + column) * self.itemsize

    def block(self, count: int, columns: slice, first: int = 0) -> Any:
        """Rows ``[first:first + count]`` of ``columns``, read into a reused buffer (valid until the next read)."""
        import os

        import torch

        self.wait()
        width = columns.stop - columns.start
        if self.buffer.size < count * width:
            self.buffer = np.empty(count * width, self.numpy_dtype)
        out = self.buffer[: count * width].reshape(count, width)
        for row in range(count):
            view = memoryview(out[row]).cast("B")
            if os.preadv(self.file.fileno(), [view], self._offset(first + row, columns.start)) != view.nbytes:
                msg = f"a spilled Lanczos vector could not be read back from {self.file.name!r} (disk full?)"
                raise AnalysisError(msg)
        return torch.from_numpy(out)

    def write(self, index: int, vector: Any) -> None:
        """Row ``index`` = ``vector`` (a CPU tensor), written in the background.

        ``vector`` must not change until the next call on these rows (or :meth:`wait`).
        """
        self.wait()
        data = np.ascontiguousarray(vector.detach().cpu().numpy(), self.numpy_dtype)  # a view where it can be
        self.pending = self.writer.submit(self._write, index, 0, data)

    def write_block(self, count: int, columns: slice, values: Any, first: int = 0) -> None:
        """Rows ``[first:first + count]`` of ``columns`` = ``values``."""
        self.wait()
        data = values.detach().cpu().contiguous().numpy()
        for row in range(count):
            self._write(first + row, columns.start, data[row])

    def _write(self, row: int, column: int, data: np.ndarray) -> None:
        import os

        # numpy declares ndarray a Buffer only for Python >= 3.12; it is one on 3.11 too
        view = memoryview(np.ascontiguousarray(data, self.numpy_dtype)).cast("B")  # type: ignore[arg-type]
        if os.pwrite(self.file.fileno(), view, self._offset(row, column)) != view.nbytes:
            msg = "a Lanczos vector could not be spilled to the temporary directory (disk full?): raise --max-memory"
            raise AnalysisError(msg)

    def close(self) -> None:
        """Delete the file."""
        try:
            self.wait()
        finally:
            self.writer.shutdown()
            self.file.close()
            self.buffer = np.empty(0, self.numpy_dtype)


class Tail:
    """Rows ``[first:]`` of some rows, as a source of their own (the rows a new product is coupled to)."""

    def __init__(self, rows: Any, first: int) -> None:
        self.rows, self.first = rows, first

    def block(self, count: int, columns: slice) -> Any:
        """Rows ``[first:first + count]`` of the source's ``columns``."""
        return self.rows.block(count, columns, self.first)


__all__ = ["MemoryRows", "SpilledRows", "Tail"]
