"""Inputs are bounded and normalised before they are used: ``.npy`` files, byte orders, codecs, zstd frames.

Issue 68, findings 4, 5 and 13: a big-endian ``.npy`` was hashed as given and written little-endian
(a committed split that failed its own hash); a zstd frame of a few hundred KB in a 136-byte tensor's
chunk inflated to gigabytes in ``ckpt verify``; a ``.npy`` of 40 dimensions, or whose header claims
more rows than the file holds, ended in a traceback. Each test builds the attack on a real store and
runs the real ``ckpt`` command.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.errors import CorruptChunkError
from ckpt.plugins.testing import write_example_run
from tests.helpers import CKPT, invoke_ckpt, run_ckpt, tree_digest

MEMORY = 2 * 2**30
"""The data segment of a ``ckpt`` child reading a bomb: a decoded frame beyond it is a crash, not a machine's swap."""


def _one_error(done: subprocess.CompletedProcess[str], *expected: str, code: int = 1) -> str:
    """The one ``Error:`` line of a refused command (exit ``code``: 2 for a bad argument), holding ``expected``."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1, (done.returncode, done.stderr[-3000:])
    assert lines[0].startswith("Error: "), lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _limited_ckpt(*args: str) -> subprocess.CompletedProcess[str]:
    """``ckpt ARGS`` in a child whose data segment is :data:`MEMORY` (Rust and numpy allocations count)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))

    command = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120, check=False
    )


def _rle_frame(size: int, declared: int | None) -> bytes:
    """A zstd frame of ``size`` zero bytes as RLE blocks (4 bytes per 128 KiB), declaring ``declared`` bytes.

    Built by hand from RFC 8878 so the test allocates nothing: magic, a frame header with an 8-byte
    Frame_Content_Size (or none) and a 128 KiB window, then RLE blocks, the last one flagged.
    """
    frame = bytearray((0xFD2FB528).to_bytes(4, "little"))
    frame += bytes([0x00, 7 << 3]) if declared is None else bytes([0xC0, 7 << 3]) + declared.to_bytes(8, "little")
    left = size
    while left:
        block = min(left, 128 * 1024)
        left -= block
        frame += (int(left == 0) | (1 << 1) | (block << 3)).to_bytes(3, "little") + b"\0"
    return bytes(frame)


def _with_crc32c(data: bytes) -> bytes:
    return data + google_crc32c.value(data).to_bytes(4, "little")


def _zstd_store(path: Path) -> Path:
    with ckptstore.create(path, compressor="zstd") as writer:
        for step in range(2):
            writer.write(step, {"w": np.full(34, step, np.float32), "b": np.zeros(3, np.float32)})  # w: 136 bytes
    return path


# -- finding 4: writes hash what they write ---------------------------------------------------------------
def test_a_big_endian_npy_is_stored_with_its_values_and_verifies(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=6)
    inputs = np.arange(12, dtype=">i8").reshape(6, 2)
    targets = np.arange(6, dtype=">i8") % 4
    label = np.asfortranarray(np.arange(12, dtype=">f4").reshape(6, 2))  # byte order and layout at once
    for name, array in (("x", inputs), ("y", targets), ("lab", label)):
        np.save(tmp_path / f"{name}.npy", array)
    added = invoke_ckpt(
        "data", "add", str(path), "be", "--inputs", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
        "--labels", f"lab={tmp_path / 'lab.npy'}",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    split = ckptstore.open(path).data("be")
    assert split["inputs"].values.tolist() == inputs.tolist()
    assert split["targets"].values.tolist() == targets.tolist()
    assert split["lab"].values.tolist() == label.tolist()
    verified = invoke_ckpt("verify", str(path))
    assert verified.returncode == 0, verified.stderr


def test_a_big_endian_or_strided_checkpoint_is_stored_native_and_verifies(tmp_path: Path) -> None:
    """A guard: Writer.write held already (tensor digests are of little-endian bytes); it must stay so."""
    path = tmp_path / "run.zarr"
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    strided = np.asfortranarray(np.arange(6, dtype=">i8").reshape(3, 2))
    with ckptstore.create(path) as writer:
        writer.write(0, {"big": big, "strided": strided})
        writer.write(1, {"big": big.astype("<f4") + 1, "strided": strided + 1})
    node = json.loads((path / "checkpoints" / "big" / "zarr.json").read_text())
    assert node["codecs"][0]["configuration"]["endian"] == sys.byteorder
    store = ckptstore.open(path)
    assert store.tensors(0)["big"].tolist() == big.tolist()
    assert store.tensors(1)["strided"].tolist() == (strided + 1).tolist()
    assert invoke_ckpt("verify", str(path)).returncode == 0


# -- finding 5 and "what to build" 6: bounded decoding, an allow-list of codecs ---------------------------
BOMBS = {
    "declared": (_rle_frame(4 * 2**30, 4 * 2**30), "declares 4,294,967,296 bytes"),  # 128 KB of frame
    "undeclared": (_rle_frame(4 * 2**30, None), "declares no content size"),  # streamed: unbounded
    "lying": (_rle_frame(4 * 2**30, 136), "blocks that hold more"),  # declares the chunk's size, holds 4 GiB
    "second frame": (_rle_frame(136, 136) + _rle_frame(4 * 2**30, None), "more than one frame"),
}


@pytest.mark.slow  # a plain ckpt process per bomb (the fork server cannot take a memory limit)
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_zstd_bomb_in_a_checkpoint_chunk_is_refused_before_it_is_decoded(tmp_path: Path, bomb: str) -> None:
    path = _zstd_store(tmp_path / "run.zarr")
    frame, why = BOMBS[bomb]
    (path / "checkpoints" / "w" / "c.1.0").write_bytes(_with_crc32c(frame))
    before = tree_digest(path)
    done = _limited_ckpt("verify", str(path))
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert done.stderr.startswith("Error: ") and "tensor 'w' at step 1" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert tree_digest(path) == before
    with pytest.raises(CorruptChunkError, match=f"tensor 'w' at step 1.*{why}"):
        ckptstore.open(path).tensors(1)
    assert ckptstore.open(path).tensors(0)["w"].tolist() == [0.0] * 34  # the intact step still reads


def test_a_zstd_bomb_in_a_result_chunk_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=6)
    assert invoke_ckpt("analyze", "loss", str(path), "--no-progress").returncode == 0
    (chunk,) = (path / "analyses" / "loss" / "loss").glob("c/0/0")  # [step, datapoint]: zstd, crc32c
    chunk.write_bytes(_with_crc32c(_rle_frame(4 * 2**30, 4 * 2**30)))
    done = _limited_ckpt("verify", str(path))
    error = _one_error(done, "analysis 'loss'")
    assert "declares 4,294,967,296 bytes" in done.stdout + error


def _set_codecs(store: Path, array: str, codecs: list[dict]) -> None:
    """Give ``array`` another codec pipeline in its own ``zarr.json`` and in the commit record."""
    own = store / array / "zarr.json"
    node = json.loads(own.read_text())
    node["codecs"] = codecs
    own.write_text(json.dumps(node))
    root = json.loads((store / "zarr.json").read_text())
    root["consolidated_metadata"]["metadata"][array]["codecs"] = codecs
    (store / "zarr.json").write_text(json.dumps(root))


def test_an_array_with_a_codec_ckpt_does_not_write_is_refused(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=6)
    # gzip holds the right bytes: zarr would read the tensor, its digest would match, verify would say OK
    for chunk in (path / "checkpoints" / "0.bias").glob("c.*"):
        chunk.write_bytes(_with_crc32c(gzip.compress(chunk.read_bytes()[:-4])))
    little = {"name": "bytes", "configuration": {"endian": "little"}}
    _set_codecs(
        path, "checkpoints/0.bias", [little, {"name": "gzip", "configuration": {"level": 5}}, {"name": "crc32c"}]
    )
    before = tree_digest(path)
    for args in (("verify", str(path)), ("info", str(path)), ("analyze", "loss", str(path), "--no-progress")):
        _one_error(run_ckpt(*args), "codecs of 'checkpoints/0.bias'", "gzip")
    assert tree_digest(path) == before


# -- finding 13: .npy headers are checked before anything is loaded ---------------------------------------
def test_a_npy_of_more_than_32_dimensions_is_refused(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=6)
    np.save(tmp_path / "deep.npy", np.zeros((1,) * 40, np.float32))
    before = tree_digest(path)
    _one_error(
        run_ckpt("data", "add", str(path), "deep", "--inputs", str(tmp_path / "deep.npy")), "40 dimensions", code=2
    )
    assert tree_digest(path) == before


def test_a_npy_whose_header_claims_more_than_the_file_holds_is_refused(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=6)
    claimed = tmp_path / "claims.npy"
    with claimed.open("wb") as file:
        header = {"descr": "<i8", "fortran_order": False, "shape": (10**11, 2)}
        np.lib.format.write_array_header_1_0(file, header)
        file.write(np.arange(4, dtype="<i8").tobytes())
    before = tree_digest(path)
    for option in ("--inputs", "--labels"):
        value = str(claimed) if option == "--inputs" else f"big={claimed}"
        args = ("--inputs", str(tmp_path / "x.npy")) if option == "--labels" else ()
        np.save(tmp_path / "x.npy", np.zeros((6, 2), np.int64))
        done = run_ckpt("data", "add", str(path), "big", *args, option, value)
        _one_error(done, "1,600,000,000,000 bytes", "32 bytes", code=2)
    assert tree_digest(path) == before
