"""One object writes an analysis result: ``ResultSink`` holds its lock, the store and its provenance (issue 70, item 3).

Real zarr stores on disk, real dask graphs; the crash is a real ``SIGKILL`` of a process in the
middle of writing a block.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dask
import dask.array
import numpy as np
import pytest
import xarray as xr

import ckpt.store as ckptstore
from ckpt.errors import InvalidArgumentError, StoreLockedError
from ckpt.store.provenance import Provenance
from ckpt.store.results import ResultSink, result_lock, write_analysis
from tests.helpers import tree_digest

REQUEST = Provenance(
    analyzer="toy", version="1", options={"k": 2}, data_sha256="d" * 64, model_sha256="m" * 64, requires={}
)


def _store(path: Path) -> Path:
    writer = ckptstore.create(path)
    for step in range(6):
        writer.write(step, {"w": np.full(3, step, np.float32)})
    writer.close()
    return path


def _block(steps: list[int]) -> xr.Dataset:
    values = np.asarray(steps, np.float64)
    return xr.Dataset(
        {"value": (("step",), values * 2.0), "row": (("step", "k"), np.outer(values, [1.0, -1.0]))},
        coords={"step": steps},
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return _store(tmp_path / "run.zarr")


def _stored(store: Path) -> xr.Dataset:
    return ckptstore.open(store).analysis("toy").load()


def test_blocks_appended_read_back_as_one_result(store: Path) -> None:
    with ResultSink.open(store, "toy", REQUEST) as sink:
        sink.append(_block([0, 1]))  # nothing covered yet: the first block starts the result
        sink.append(_block([2, 3, 4]))
        recorded = sink.append(_block([5]))
    xr.testing.assert_identical(_stored(store).drop_attrs(), _block([0, 1, 2, 3, 4, 5]))
    assert recorded.steps == (0, 1, 2, 3, 4, 5) == sink.steps


def test_the_provenance_recorded_is_the_one_given(store: Path) -> None:
    with ResultSink.open(store, "toy", REQUEST) as sink:
        recorded = sink.append(_block([0, 1, 2]))
    stored = ckptstore.open(store).analysis("toy").ckpt.provenance_record
    assert stored == recorded == sink.provenance
    assert stored.identity() == REQUEST.identity()
    assert stored.steps == (0, 1, 2) and stored.ckpt_version == str(ckptstore.__version__)
    assert stored.created is not None


def test_a_sink_given_covered_steps_appends_after_them(store: Path) -> None:
    with ResultSink.open(store, "toy", REQUEST) as sink:
        sink.replace(_block([0, 1, 2]))
    kept = ckptstore.open(store).analysis("toy").ckpt.provenance_record
    with ResultSink.open(ckptstore.open(store), "toy", kept) as sink:  # an opened Store does too
        sink.append(_block([3, 4]))
    xr.testing.assert_identical(_stored(store).drop_attrs(), _block([0, 1, 2, 3, 4]))


def test_replace_makes_the_result_anew(store: Path) -> None:
    with ResultSink.open(store, "toy", REQUEST) as sink:
        sink.append(_block([0, 1, 2, 3]))
        other = _block([1, 2]).assign(value=lambda d: d["value"] + 100)
        recorded = sink.replace(other)
        assert recorded.steps == (1, 2)
        per_run = xr.Dataset({"basis": (("k",), [1.0, 2.0])})  # no step dimension: covers the steps given
        assert sink.replace(per_run, steps=[0, 1, 2, 3, 4, 5]).steps == (0, 1, 2, 3, 4, 5)
    stored = ckptstore.open(store).analysis("toy")
    xr.testing.assert_identical(stored.load().drop_attrs(), per_run)
    assert stored.ckpt.steps == [0, 1, 2, 3, 4, 5]


def test_a_second_sink_of_the_same_result_is_refused(store: Path) -> None:
    with ResultSink.open(store, "toy", REQUEST) as sink:
        sink.append(_block([0]))
        with pytest.raises(StoreLockedError, match=r"analysis .toy. of .* is being computed by another process"):
            ResultSink.open(store, "toy", REQUEST)
        with pytest.raises(StoreLockedError), result_lock(store, "toy"):  # the old lock is the same lock
            pass
        with ResultSink.open(store, "other", REQUEST) as elsewhere:  # other results are not held up
            elsewhere.append(_block([0]))
    with ResultSink.open(store, "toy", REQUEST) as again:  # released on exit
        again.append(_block([0, 1]))


def test_steps_out_of_order_are_refused_and_the_store_is_unchanged(store: Path) -> None:
    with ResultSink.open(store, "toy", REQUEST) as sink:
        sink.append(_block([0, 1, 2]))
        before = tree_digest(store)
        for steps in ([2, 3], [1], [4, 3], [3, 3]):
            with pytest.raises(InvalidArgumentError, match="steps must increase, each once"):
                sink.append(_block(steps))
        with pytest.raises(InvalidArgumentError, match="appended along 'step'"):
            sink.append(_block([3]), dim="k")
        assert tree_digest(store) == before
        assert sink.steps == (0, 1, 2)
    with pytest.raises(InvalidArgumentError, match="give the sink a Provenance"):
        ResultSink(store, "toy").append(_block([0]))


def _failing_block(steps: list[int], fail: object) -> xr.Dataset:
    """A dask-backed block whose second chunk runs ``fail`` while it is written."""

    def chunk(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        if block_info is not None and block_info[None]["chunk-location"][0] == 1:
            fail()  # type: ignore[operator]
        return block * 2.0

    values = dask.array.from_array(np.asarray(steps, np.float64), chunks=2).map_blocks(chunk, dtype=np.float64)
    rows = dask.array.from_array(np.outer(steps, [1.0, -1.0]), chunks=(2, 2))
    return xr.Dataset({"value": (("step",), values), "row": (("step", "k"), rows)}, coords={"step": steps})


def test_an_append_that_fails_midway_leaves_the_old_result(store: Path) -> None:
    def fail() -> None:
        msg = "the computation failed"
        raise RuntimeError(msg)

    with ResultSink.open(store, "toy", REQUEST) as sink:
        first = sink.append(_block([0, 1]))
        with pytest.raises(RuntimeError, match="the computation failed"), dask.config.set(scheduler="synchronous"):
            sink.append(_failing_block([2, 3, 4], fail))
        assert sink.steps == (0, 1) and sink.provenance == first
        xr.testing.assert_identical(_stored(store).drop_attrs(), _block([0, 1]))
        sink.append(_block([2, 3]))  # and the next block follows the committed ones
    xr.testing.assert_identical(_stored(store).drop_attrs(), _block([0, 1, 2, 3]))


def test_a_process_killed_mid_append_leaves_the_old_result(store: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        import dask
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from tests.test_result_sink import REQUEST, _block, _failing_block
        from ckpt.store.results import ResultSink

        with ResultSink.open(sys.argv[1], "toy", REQUEST) as sink:
            sink.append(_block([0, 1]))
            print("committed", flush=True)
            with dask.config.set(scheduler="synchronous"):
                sink.append(_failing_block([2, 3, 4], lambda: os.kill(os.getpid(), signal.SIGKILL)))
        """
    )
    done = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.strip() == "committed"
    stored = ckptstore.open(store).analysis("toy")
    assert stored.ckpt.steps == [0, 1]
    xr.testing.assert_identical(stored.load().drop_attrs(), _block([0, 1]))
    with ResultSink.open(store, "toy", stored.ckpt.provenance_record) as sink:  # the killed holder's lock is free
        sink.append(_block([2]))
    xr.testing.assert_identical(_stored(store).drop_attrs(), _block([0, 1, 2]))


def test_a_journal_record_names_its_pieces(store: Path) -> None:
    def piece(keys: list[int]) -> Provenance:
        return Provenance(analyzer="toy", partial={"of": "toy", "identity": "digest", "keys": keys})

    with ResultSink.open(store, "toy.partial", blocking=True) as sink:
        sink.append(_block([0]), provenance=piece([7]))  # the first piece starts the journal
        recorded = sink.append(_block([1]), provenance=piece([7, 8]))
    stored = ckptstore.open(store).analysis("toy.partial")
    assert stored.ckpt.provenance_record == recorded and recorded.partial is not None
    assert list(recorded.partial["keys"]) == [7, 8] and recorded.steps is None
    xr.testing.assert_identical(stored.load().drop_attrs(), _block([0, 1]))


def test_write_analysis_is_a_thin_wrapper_over_the_sink(store: Path) -> None:
    attrs = {"ckpt": REQUEST.with_steps([0, 1]).to_attrs()}
    with result_lock(store, "toy"):
        write_analysis(store, "toy", _block([0, 1]), attrs=attrs)
        write_analysis(store, "toy", _block([2]), append_dim="step", attrs=attrs)
    xr.testing.assert_identical(_stored(store).drop_attrs(), _block([0, 1, 2]))
    assert os.path.isdir(store / "analyses" / "toy")
