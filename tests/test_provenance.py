"""One ``Provenance`` type: a stored result's ``attrs["ckpt"]`` read, checked and written back (issue 70, item 3).

A record is data: every hostile field is one :class:`CorruptRecordError` naming it, never a
crash or a silent default. Records of ckpt 0.1 (``tests/data``) and 0.2 stores still read.
Real stores on disk, written through the store layer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import ckpt.store as ckptstore
from ckpt.errors import CorruptRecordError
from ckpt.store.provenance import IDENTITY, JOURNAL_FIELDS, KNOWN, Provenance, provenance_problem
from ckpt.store.results import write_analysis

LEGACY_STORE = Path(__file__).resolve().parent / "data" / "v0.1.0-modular-addition.zarr"

RECORD: dict[str, Any] = {
    "analyzer": "loss",
    "version": "1",
    "options": {"split": "eval", "batch_size": 7, "objective": None},
    "data_sha256": "a" * 64,
    "model_sha256": "b" * 64,
    "requires": {"basis": {"analyzer": "basis", "version": "2", "options": {"k": 3}}},
    "steps": [0, 10, 20],
    "created": "2026-01-01T00:00:00Z",
    "ckpt_version": "0.2.0",
}


def _store(path: Path) -> Path:
    writer = ckptstore.create(path)
    for step in (0, 10, 20):
        writer.write(step, {"w": np.full(3, step, np.float32)})
    writer.close()
    return path


def _result(steps: list[int]) -> xr.Dataset:
    return xr.Dataset({"value": (("step",), np.asarray(steps, np.float64))}, coords={"step": steps})


def test_a_record_round_trips_through_the_type_and_a_store(tmp_path: Path) -> None:
    record = Provenance.from_attrs(RECORD)
    assert record.to_attrs() == RECORD
    assert record.steps == (0, 10, 20) and record.options["batch_size"] == 7
    assert record.computed_by == "ckpt 0.2.0"
    assert record.identity() == {key: RECORD[key] for key in IDENTITY}
    path = _store(tmp_path / "run.zarr")
    write_analysis(path, "loss", _result([0, 10, 20]), attrs={"ckpt": record.to_attrs()})
    stored = ckptstore.open(path).analysis("loss")
    assert stored.ckpt.provenance_record == record
    assert stored.ckpt.provenance == RECORD  # the mapping existing callers read, unchanged


def test_the_record_is_immutable_and_its_copies_are_its_own() -> None:
    source = json.loads(json.dumps(RECORD))
    record = Provenance.from_attrs(source)
    source["options"]["batch_size"] = 99  # what was read from must not change the record
    assert record.options["batch_size"] == 7
    with pytest.raises(TypeError):
        record.options["batch_size"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        record.analyzer = "polca"  # type: ignore[misc]
    attrs = record.to_attrs()
    attrs["options"]["batch_size"] = 5
    assert record.to_attrs()["options"]["batch_size"] == 7


def test_with_steps_stamps_the_time_and_ckpt() -> None:
    record = Provenance.from_attrs(RECORD).with_steps([0, 10, 20, 30])
    assert record.steps == (0, 10, 20, 30)
    assert record.ckpt_version == str(ckptstore.__version__)
    assert record.created is not None and record.created.endswith("Z") and record.created != RECORD["created"]


def test_unknown_fields_are_kept_as_plain_json() -> None:
    record = Provenance.from_attrs({**RECORD, "seed_of_plugin": {"a": [1, 2]}})
    assert record.extra == {"seed_of_plugin": {"a": (1, 2)}}
    assert record.to_attrs()["seed_of_plugin"] == {"a": [1, 2]}
    assert "seed_of_plugin" not in record.identity()


HOSTILE = {
    "the record a list": (["loss"], "the record is ['loss'], expected an object"),
    "analyzer missing": ({k: v for k, v in RECORD.items() if k != "analyzer"}, "analyzer is not recorded"),
    "steps missing": ({k: v for k, v in RECORD.items() if k != "steps"}, "steps is not recorded"),
    "analyzer a list": ({**RECORD, "analyzer": ["x"]}, "analyzer is ['x'], expected a name"),
    "analyzer empty": ({**RECORD, "analyzer": ""}, "analyzer is '', expected a name"),
    "version a number": ({**RECORD, "version": 7}, "version is 7, expected a string"),
    "options a number": ({**RECORD, "options": 5}, "options is 5, expected an object"),
    "option names not identifiers": ({**RECORD, "options": {"": 1}}, "expected an object of option names"),
    "data hash a number": ({**RECORD, "data_sha256": 1}, "data_sha256 is 1, expected a string"),
    "model hash a list": ({**RECORD, "model_sha256": []}, "model_sha256 is [], expected a string"),
    "requires a string": ({**RECORD, "requires": "polca"}, "requires is 'polca', expected an object"),
    "requires of a string": ({**RECORD, "requires": {"a": "b"}}, "requires is {'a': 'b'}, expected an object"),
    "steps of booleans": ({**RECORD, "steps": [True]}, "steps is [True], expected a list of steps"),
    "steps of floats": ({**RECORD, "steps": [0.5]}, "steps is [0.5], expected a list of steps"),
    "steps a string": ({**RECORD, "steps": "0,1"}, "steps is '0,1', expected a list of steps"),
    "created an object": ({**RECORD, "created": {"at": 1}}, "created is {'at': 1}, expected a string"),
    "ckpt version a number": ({**RECORD, "ckpt_version": 2}, "ckpt_version is 2, expected a string"),
    "partial a list": ({**RECORD, "partial": [1]}, "partial is [1], expected an object"),
    "partial without keys": ({**RECORD, "partial": {"of": "x", "identity": "y"}}, "partial is {'of'"),
    "an option not json": ({**RECORD, "options": {"f": object()}}, "options is not plain JSON"),
    "an option infinite": ({**RECORD, "options": {"f": float("inf")}}, "inf is not a finite number"),
    "an unknown field not json": ({**RECORD, "code": {1, 2}}, "code is not plain JSON"),
    "a key not a string": ({**RECORD, 5: "x"}, "the key 5 is not a string"),
    "nested too deep": ({**RECORD, "deep": json.loads("[" * 40 + "]" * 40)}, "nested deeper than 32"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_each_hostile_record_is_one_named_error(case: str) -> None:
    attrs, expected = HOSTILE[case]
    with pytest.raises(CorruptRecordError, match=r"provenance .* is invalid") as raised:
        Provenance.from_attrs(attrs, name="loss", where="run.zarr")
    assert expected in str(raised.value)
    assert "ckpt rm run.zarr loss" in str(raised.value)  # and what to do


def test_a_record_built_by_hand_is_checked_like_a_stored_one() -> None:
    with pytest.raises(CorruptRecordError, match="steps is"):
        Provenance(analyzer="loss", steps=("0",))  # type: ignore[arg-type]
    with pytest.raises(CorruptRecordError, match="steps is a field of the record itself"):
        Provenance(analyzer="loss", extra={"steps": [0]})


def test_what_is_required_is_the_callers_choice() -> None:
    journal = {"analyzer": "basis", "partial": {"of": "basis", "identity": "d", "keys": [0]}, "created": "x"}
    assert Provenance.from_attrs(journal, required=JOURNAL_FIELDS).partial == {
        "of": "basis",
        "identity": "d",
        "keys": (0,),
    }
    with pytest.raises(CorruptRecordError, match="version is not recorded"):
        Provenance.from_attrs(journal)
    assert Provenance.from_attrs({}, required=()).to_attrs() == {}
    assert provenance_problem(RECORD) is None
    assert set(RECORD) <= set(KNOWN)


def test_a_hostile_record_in_a_store_is_one_error_from_the_accessor(tmp_path: Path) -> None:
    path = _store(tmp_path / "run.zarr")
    write_analysis(path, "loss", _result([0, 10, 20]), attrs={"ckpt": {**RECORD, "steps": [0, 10, 20]}})
    root = json.loads((path / "zarr.json").read_text())
    node = root["consolidated_metadata"]["metadata"]["analyses/loss"]["attributes"]["ckpt"]
    node["version"] = 7
    (path / "zarr.json").write_text(json.dumps(root))
    (path / "analyses" / "loss" / "zarr.json").write_text(
        json.dumps({**json.loads((path / "analyses" / "loss" / "zarr.json").read_text()), "attributes": {"ckpt": node}})
    )
    stored = ckptstore.open(path).analysis("loss")
    for read in (lambda: stored.ckpt.provenance_record, lambda: stored.ckpt.version, lambda: stored.ckpt.steps):
        with pytest.raises(CorruptRecordError, match="version is 7, expected a string"):
            read()
    assert stored.ckpt.provenance["version"] == 7  # the record as stored, for the engine to replace


def test_a_ckpt_0_1_store_still_reads(tmp_path: Path) -> None:
    store = tmp_path / "legacy.zarr"
    shutil.copytree(LEGACY_STORE, store)
    stored = ckptstore.open(store).analysis("loss")
    record = stored.ckpt.provenance_record
    assert record == Provenance.from_attrs(stored.attrs["ckpt"])
    assert record.analyzer == "loss" and record.version == "1" and record.steps == (0, 20, 40)
    assert record.model_sha256 is None  # not recorded before 0.2
    assert record.ckpt_version == "0.1.0"
    assert record.to_attrs() == stored.ckpt.provenance


def test_a_ckpt_0_2_record_without_optional_fields_still_reads(tmp_path: Path) -> None:
    path = _store(tmp_path / "run.zarr")
    old = {"analyzer": "toy", "version": "1", "steps": [0, 10, 20]}  # what tests/test_repair.py writes
    write_analysis(path, "toy", _result([0, 10, 20]), attrs={"ckpt": old})
    record = ckptstore.open(path).analysis("toy").ckpt.provenance_record
    assert record.options is None and record.requires is None and record.created is None
    assert record.to_attrs() == old
