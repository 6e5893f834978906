"""A store is data: a hostile commit record is one ``Error:`` line, never a traceback or a memory bomb.

The reproductions of issue 28 (item 3): each edits the root ``zarr.json`` of a real store
as an attacker would, and every command that reads it must name the problem in one line,
exit 1, touch nothing outside the store and leave the store unchanged.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import ckpt.store as ckptstore
from ckpt.errors import CorruptRecordError
from ckpt.store.record import MAX_JSON_DEPTH, parse_record
from tests.helpers import run_ckpt, tree_digest, write_analyzed_run

pytestmark = pytest.mark.slow  # one ckpt process per bad input: every command, every mistake


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_analyzed_run(tmp_path_factory.mktemp("base") / "run.zarr")


def _rename(metadata: dict, old: str, new: str) -> None:
    for key in [k for k in metadata if k == old or k.startswith(f"{old}/")]:
        metadata[new + key[len(old) :]] = metadata.pop(key)


def _huge_shape(metadata: dict) -> None:
    node = metadata["checkpoints/0.weight"]
    node["shape"] = [3, 10**6, 10**6]  # 4 TB a checkpoint, backed by 100 bytes
    node["chunk_grid"]["configuration"]["chunk_shape"] = [1, 10**6, 10**6]


def _deep(attrs: dict) -> None:
    attrs["attrs"] = {"deep": "DEEP"}  # replaced by 5,000 nested lists in the file (json.dumps would recurse)


MUTATIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    "tensor name ../": (
        lambda d: _rename(d["consolidated_metadata"]["metadata"], "checkpoints/0.weight", "checkpoints/../../x"),
        "node name '..' is a path, not a name",
    ),
    "split name ../": (
        lambda d: _rename(d["consolidated_metadata"]["metadata"], "data/eval", "data/../../etc"),
        "node name '..' is a path, not a name",
    ),
    "analysis name ../": (
        lambda d: _rename(d["consolidated_metadata"]["metadata"], "analyses/loss", "analyses/../../loss"),
        "node name '..' is a path, not a name",
    ),
    "shape of 10^12 elements": (
        lambda d: _huge_shape(d["consolidated_metadata"]["metadata"]),
        "tensor '0.weight' at step",
    ),
    "chunk smaller than a row": (  # found by the fuzzer: 10^12 chunk keys listed before any read
        lambda d: d["consolidated_metadata"]["metadata"]["checkpoints/0.weight"]["shape"].__setitem__(2, 10**12),
        "expected one whole checkpoint per chunk [1, 8, 1000000000000]",
    ),
    "shape beyond 64 bits": (  # found by the fuzzer: an OverflowError counting its bytes
        lambda d: d["consolidated_metadata"]["metadata"]["checkpoints/0.weight"]["shape"].__setitem__(2, 2**70),
        "elements (a 64-bit count of bytes)",
    ),
    "fill value beyond its data type": (  # found by the fuzzer: zarr's OverflowError traceback
        lambda d: d["consolidated_metadata"]["metadata"]["analyses/loss/example"].update(fill_value=2**70),
        "zarr cannot read the commit record",
    ),
    "result _FillValue of another type": (  # found by the fuzzer: xarray's TypeError decoding it
        lambda d: d["consolidated_metadata"]["metadata"]["analyses/loss/mean_loss"]["attributes"].update(_FillValue=7),
        "Failed to decode fill_value",
    ),
    "result without dimension_names": (  # found by the fuzzer: an xarray KeyError traceback
        lambda d: d["consolidated_metadata"]["metadata"]["analyses/loss/loss"].pop("dimension_names"),
        "dimension_names of 'analyses/loss/loss' is None, expected 2 names",
    ),
    "result chunk digests a list": (  # found by the fuzzer: an AttributeError traceback
        lambda d: d["consolidated_metadata"]["metadata"]["analyses/loss/step"]["attributes"].update(
            ckpt_chunk_digests=[1, "a"]
        ),
        "expected an object of chunk -> digest strings",
    ),
    "deeply nested attrs": (lambda d: _deep(d["attributes"]["ckpt"]), f"nested deeper than the {MAX_JSON_DEPTH}"),
    "digest key not a step": (
        lambda d: d["attributes"]["ckpt"]["digests"].update({"abc": d["attributes"]["ckpt"]["digests"]["0"]}),
        "a key of digests is 'abc', expected a step",
    ),
    "split labels not names": (  # found by the fuzzer: `ckpt info` joined them as strings
        lambda d: d["consolidated_metadata"]["metadata"]["data/eval"]["attributes"]["ckpt"].update(labels=[7]),
        "the labels of split 'data/eval'",
    ),
    "format_version true": (
        lambda d: d["attributes"]["ckpt"].update(format_version=True),
        "format_version is True, expected an integer",
    ),
}


def _mutant(base: Path, tmp_path: Path, mutation: Callable[[dict], None]) -> Path:
    store = tmp_path / "hostile" / "run.zarr"
    shutil.copytree(base, store)
    record = store / "zarr.json"
    document = json.loads(record.read_text())
    mutation(document)
    record.write_text(json.dumps(document).replace('"DEEP"', "[" * 5000 + "]" * 5000))
    return store


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_hostile_record_is_one_error_line_from_every_command(base: Path, tmp_path: Path, name: str) -> None:
    mutation, expected = MUTATIONS[name]
    store = _mutant(base, tmp_path, mutation)
    before, around = tree_digest(store), sorted(p.name for p in tmp_path.iterdir())
    commands = [["info"], ["verify"], ["show", "@", "loss"], ["analyze", "loss", "@", "--no-progress"], ["repair"]]
    if name == "shape of 10^12 elements":
        commands = [["verify"], ["analyze", "loss", "@", "--no-progress", "--force"]]  # info reads no weights
    if name == "result _FillValue of another type":  # info and repair list results, they do not decode one
        commands = [["verify"], ["show", "@", "loss"], ["analyze", "loss", "@", "--no-progress"]]
    for command in commands:
        args = [str(store) if a == "@" else a for a in command] + ([] if "@" in command else [str(store)])
        result = run_ckpt(*args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("Error: "), (command, result.stderr)
        assert expected in lines[0], (command, lines[0])
        assert "Traceback" not in result.stdout + result.stderr
    assert tree_digest(store) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == around


def test_json_depth_and_size_are_bounded_before_anything_recurses() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # json.loads would raise RecursionError
    with pytest.raises(CorruptRecordError, match="nested deeper"):
        parse_record(b'{"a": ' + deep + b"}", "run.zarr")
    with pytest.raises(CorruptRecordError, match="nested deeper"):
        parse_record(b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}", "run.zarr")
    with pytest.raises(CorruptRecordError, match="not valid JSON"):
        parse_record(b"\xff\xfe{", "run.zarr")
    assert parse_record(b'{"a": [[1]]}', "run.zarr") == {"a": [[1]]}


def test_a_name_that_readers_refuse_is_refused_by_the_writer_too(tmp_path: Path) -> None:
    with ckptstore.create(tmp_path / "run.zarr") as writer:
        for bad in ("..", "a\\b", "a\nb", "x" * 256):
            with pytest.raises(ckptstore.InvalidNameError):
                writer.write(0, {bad: [1.0]})
        writer.write(0, {"layers.0.attn-q+k weight": [1.0]})  # dots, dashes, spaces are names
    assert ckptstore.open(tmp_path / "run.zarr").tensor_names == ["layers.0.attn-q+k weight"]
