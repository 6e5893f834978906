"""Tests of ckpt.store.importers: real torch/safetensors files on disk, imported into real stores."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import ckpt.store as ckptstore
from ckpt.errors import ImportFormatError, StoreExistsError, StoreNotFoundError
from ckpt.store.importers import (
    FORMATS,
    CheckpointSource,
    ImportReport,
    detect_format,
    discover,
    import_checkpoints,
    load_checkpoint,
)
from tests.helpers import run_ckpt, state_dict


def assert_store_holds(dest: Path | str, expected: dict[int, dict[str, torch.Tensor]]) -> None:
    store = ckptstore.open(dest)
    assert store.steps.tolist() == sorted(expected)
    for step, tensors in expected.items():
        got = store.tensors(step, framework="torch")
        assert set(got) == set(tensors)
        for name, tensor in tensors.items():
            assert got[name].dtype == tensor.dtype, name
            assert torch.equal(got[name], tensor), name


def write_files(folder: Path, sds: dict[str, object], saver=torch.save) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, obj in sds.items():
        saver(obj, folder / name)
    return folder


def save_safetensors(obj: dict[str, torch.Tensor], path: Path) -> None:
    save_file(obj, path)


# -- each format round-trips bit-exact ---------------------------------------------------------------
def test_torch_folder_round_trips(tmp_path: Path) -> None:
    expected = {0: state_dict(0), 10: state_dict(1), 200: state_dict(2)}
    src = write_files(tmp_path / "src", {f"step_{s}.pt": sd for s, sd in expected.items()})
    report = import_checkpoints(src, tmp_path / "run.zarr", model="mypkg.models:build", config={"d": 4})
    assert isinstance(report, ImportReport)
    assert report.format == "torch"
    assert report.steps == [0, 10, 200]
    assert report.tensors == 4
    assert report.bytes_read == sum(p.stat().st_size for p in src.iterdir())
    assert report.dest == str(tmp_path / "run.zarr")
    assert_store_holds(tmp_path / "run.zarr", expected)
    store = ckptstore.open(tmp_path / "run.zarr")
    assert store.attrs == {"imported_from": str(src), "import_format": "torch"}
    assert store.framework == "torch"
    assert store.model.factory == "mypkg.models:build"


def test_pth_bin_and_legacy_non_zip_files(tmp_path: Path) -> None:
    expected = {1: state_dict(1), 2: state_dict(2), 3: state_dict(3)}
    src = tmp_path / "src"
    write_files(src, {"s1.pth": expected[1], "s2.bin": expected[2]})
    # the pre-1.6 pickle format cannot be memory-mapped: the importer must fall back
    torch.save(expected[3], src / "s3.pt", _use_new_zipfile_serialization=False)
    import_checkpoints(src, tmp_path / "run.zarr")
    assert_store_holds(tmp_path / "run.zarr", expected)


def test_safetensors_folder_round_trips(tmp_path: Path) -> None:
    expected = {5: state_dict(5), 7: state_dict(7)}
    src = write_files(tmp_path / "src", {f"model_{s}.safetensors": sd for s, sd in expected.items()}, save_safetensors)
    report = import_checkpoints(src, tmp_path / "run.zarr")
    assert report.format == "safetensors"
    assert_store_holds(tmp_path / "run.zarr", expected)


def make_hf_run(root: Path, expected: dict[int, dict[str, torch.Tensor]], weights: str) -> Path:
    """An HF Trainer output folder, with the clutter the Trainer leaves next to the weights."""
    for step, sd in expected.items():
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if weights == "safetensors":
            save_file(sd, folder / "model.safetensors")
        else:
            torch.save(sd, folder / "pytorch_model.bin")
        torch.save({"state": {}, "param_groups": []}, folder / "optimizer.pt")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (root / "runs").mkdir()
    (root / "runs" / "events.out.tfevents").write_text("")
    save_file(state_dict(99), root / "model.safetensors")  # the final model, next to the checkpoints
    return root


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_hf_folder_round_trips(tmp_path: Path, weights: str) -> None:
    expected = {500: state_dict(0), 1000: state_dict(1), 1500: state_dict(2)}
    src = make_hf_run(tmp_path / "out", expected, weights)
    assert detect_format(src) == "hf"
    report = import_checkpoints(src, tmp_path / "run.zarr")
    assert report.format == "hf"
    assert report.steps == [500, 1000, 1500]
    assert_store_holds(tmp_path / "run.zarr", expected)


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_hf_sharded_checkpoint_is_merged(tmp_path: Path, weights: str) -> None:
    expected = {10: state_dict(0), 20: state_dict(1)}
    src = tmp_path / "out"
    for step, sd in expected.items():
        folder = src / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        names = list(sd)
        shards = [names[:2], names[2:]]
        prefix, suffix = ("model", "safetensors") if weights == "safetensors" else ("pytorch_model", "bin")
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            file = f"{prefix}-{i:05d}-of-{len(shards):05d}.{suffix}"
            part = {n: sd[n] for n in shard}
            save_file(part, folder / file) if weights == "safetensors" else torch.save(part, folder / file)
            weight_map.update(dict.fromkeys(shard, file))
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (folder / f"{prefix}.{suffix}.index.json").write_text(json.dumps(index))
    sources = discover(src)
    assert [len(s.files) for s in sources] == [2, 2]
    import_checkpoints(src, tmp_path / "run.zarr")
    assert_store_holds(tmp_path / "run.zarr", expected)


def test_hf_shard_index_naming_a_missing_file_fails_before_creating(tmp_path: Path) -> None:
    folder = tmp_path / "out" / "checkpoint-1"
    folder.mkdir(parents=True)
    save_file(state_dict(0), folder / "model-00001-of-00002.safetensors")
    weight_map = {"fc.weight": "model-00001-of-00002.safetensors", "fc.bias": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ImportFormatError, match=r"model-00002-of-00002\.safetensors"):
        import_checkpoints(tmp_path / "out", tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


def test_hf_folders_with_other_names_need_a_step_pattern(tmp_path: Path) -> None:
    expected = {100: state_dict(0), 200: state_dict(1)}
    for step, sd in expected.items():
        (tmp_path / "out" / f"step_{step}").mkdir(parents=True)
        save_file(sd, tmp_path / "out" / f"step_{step}" / "model.safetensors")
    (tmp_path / "out" / "logs").mkdir()  # no weights: not a checkpoint
    with pytest.raises(ImportFormatError, match="no checkpoints found"):
        discover(tmp_path / "out", format="hf")
    report = import_checkpoints(tmp_path / "out", tmp_path / "run.zarr", format="hf", step_pattern=r"step_(\d+)")
    assert report.steps == [100, 200]
    assert_store_holds(tmp_path / "run.zarr", expected)


def test_hf_checkpoint_folder_without_weights(tmp_path: Path) -> None:
    (tmp_path / "out" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-1" / "adapter_config.json").write_text("{}")
    with pytest.raises(ImportFormatError, match=r"checkpoint-1 holds no model weights"):
        discover(tmp_path / "out")


# -- training-loop dicts and key= --------------------------------------------------------------------
def test_training_loop_dicts_are_unwrapped(tmp_path: Path) -> None:
    sd = torch.nn.Linear(3, 2).state_dict()
    # what Adam's state_dict() looks like (tensors, ints, floats, lists), without paying for an optimizer step
    moments = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2, 3), "exp_avg_sq": torch.zeros(2, 3)}
    optimizer = {"state": {0: moments}, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}]}
    src = write_files(
        tmp_path / "src",
        {
            "ckpt_1.pt": {"model": sd, "optimizer": optimizer, "step": 1, "loss": 0.5},
            "ckpt_2.pt": {"state_dict": sd, "epoch": 3},
            "ckpt_3.pt": {"model_state_dict": sd, "optimizer_state_dict": optimizer},
            "ckpt_4.pt": {"module": sd, "lr_scheduler": {"last_epoch": 4}},
        },
    )
    import_checkpoints(src, tmp_path / "run.zarr")
    assert_store_holds(tmp_path / "run.zarr", dict.fromkeys([1, 2, 3, 4], sd))


def test_key_picks_the_entry(tmp_path: Path) -> None:
    ema, raw = state_dict(1), state_dict(2)
    src = write_files(tmp_path / "src", {f"step_{s}.pt": {"model": raw, "ema": ema} for s in (1, 2)})
    import_checkpoints(src, tmp_path / "run.zarr", key="ema")
    assert_store_holds(tmp_path / "run.zarr", {1: ema, 2: ema})


def test_ambiguous_or_unknown_dict_asks_for_key(tmp_path: Path) -> None:
    sd = state_dict(0)
    src = write_files(tmp_path / "src", {"step_1.pt": {"model": sd, "state_dict": sd, "step": 1}})
    with pytest.raises(ImportFormatError, match=r"'model', 'state_dict', 'step'.*--key"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()
    with pytest.raises(ImportFormatError, match=r"no entry 'ema'.*'model', 'state_dict', 'step'"):
        import_checkpoints(src, tmp_path / "run.zarr", key="ema")
    with pytest.raises(ImportFormatError, match=r"entry 'step' .* is not a mapping name -> tensor"):
        import_checkpoints(src, tmp_path / "run.zarr", key="step")
    assert not (tmp_path / "run.zarr").exists()


def test_key_is_refused_for_safetensors(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"s1.safetensors": state_dict(0)}, save_safetensors)
    with pytest.raises(ImportFormatError, match="torch files"):
        import_checkpoints(src, tmp_path / "run.zarr", key="model")
    assert not (tmp_path / "run.zarr").exists()


def test_pickled_objects_are_refused_not_executed(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_1.pt": {"model": state_dict(0), "args": argparse.Namespace(lr=1)}})
    with pytest.raises(ImportFormatError, match=r"refusing to load .*step_1\.pt: its pickle calls argparse\.Namespace"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


class _Payload:
    """What an attacker pickles: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("layout", ["torch files", "hf folder"])
def test_a_pickle_with_a_payload_is_refused_with_safe_advice(tmp_path: Path, layout: str) -> None:
    """Issue 28 item 5: the refusal names the risk and a safe conversion, never weights_only=False."""
    marker = tmp_path / "RAN"
    hostile = {"model": state_dict(0), "extra": _Payload(marker)}
    if layout == "torch files":
        src = write_files(tmp_path / "src", {"step_1.pt": state_dict(0), "step_2.pt": hostile})
        bad = "step_2.pt"
    else:
        src = tmp_path / "src"
        (src / "checkpoint-5").mkdir(parents=True)
        torch.save(hostile, src / "checkpoint-5" / "pytorch_model.bin")
        bad = "pytorch_model.bin"
    result = run_ckpt("import", str(src), str(tmp_path / "run.zarr"))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1
    assert len(lines) == 1 and lines[0].startswith("Error: refusing to load "), result.stderr  # no torch warnings
    assert bad in lines[0] and "its pickle calls posix.system" in lines[0]
    assert "can run arbitrary code" in lines[0] and "safetensors" in lines[0]
    assert "weights_only" not in result.stdout + result.stderr
    assert not marker.exists() and not (tmp_path / "run.zarr").exists()


def test_load_checkpoint_returns_tensors(tmp_path: Path) -> None:
    sd = state_dict(3)
    src = write_files(tmp_path / "src", {"step_3.pt": {"model": sd, "step": 3}})
    (source,) = discover(src)
    assert source == CheckpointSource(3, src / "step_3.pt", (src / "step_3.pt",))
    loaded = load_checkpoint(source, "torch")
    assert all(torch.equal(loaded[n], sd[n]) for n in sd)
    with pytest.raises(ImportFormatError, match="format must be"):
        load_checkpoint(source, "jax")


# -- steps --------------------------------------------------------------------------------------------
def test_default_step_is_the_one_the_name_states_and_an_ambiguous_name_is_an_error(tmp_path: Path) -> None:
    src = write_files(
        tmp_path / "src",
        {"run7_step=12.pt": state_dict(0), "global_step_2.pt": state_dict(1), "9.pt": state_dict(2)},
    )
    assert [(s.step, s.path.name) for s in discover(src)] == [
        (2, "global_step_2.pt"),
        (9, "9.pt"),
        (12, "run7_step=12.pt"),
    ]
    ambiguous = write_files(tmp_path / "ambiguous", {"ckpt-3-of-run7_epoch12.pt": state_dict(0)})
    with pytest.raises(ImportFormatError, match=r"holds the integers 3, 7, 12; pass --step-pattern"):
        discover(ambiguous)
    assert [s.step for s in discover(ambiguous, step_pattern=r"epoch(\d+)")] == [12]


def test_step_pattern(tmp_path: Path) -> None:
    names = {"run5_step100_loss0.5.pt": state_dict(0), "run5_step20_loss0.9.pt": state_dict(1)}
    src = write_files(tmp_path / "src", names)
    # the name states its step after the word "step": the default reads it, not the loss's digits
    assert [s.step for s in discover(src)] == [20, 100]
    losses = write_files(tmp_path / "losses", {"run5_loss0.5.pt": state_dict(0), "run5_loss0.9.pt": state_dict(1)})
    with pytest.raises(ImportFormatError, match="holds the integers 5, 0;"):
        discover(losses)  # no step word and several integers: refused, not guessed
    assert [s.step for s in discover(src, step_pattern=r"step(\d+)")] == [20, 100]
    assert [s.step for s in discover(src, step_pattern=r"run(\d+)_step(?P<step>\d+)")] == [20, 100]
    report = import_checkpoints(src, tmp_path / "run.zarr", step_pattern=r"_step(\d+)_")
    assert report.steps == [20, 100]


def test_step_pattern_errors(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_1.pt": state_dict(0), "final.pt": state_dict(1)})
    with pytest.raises(ImportFormatError, match=r"final\.pt.*holds no integer"):
        discover(src)
    with pytest.raises(ImportFormatError, match=r"final\.pt.*does not match the step pattern 'step_\(\\d\+\)'"):
        import_checkpoints(src, tmp_path / "run.zarr", step_pattern=r"step_(\d+)")
    with pytest.raises(ImportFormatError, match=r"final\.pt.*gives 'al'"):
        discover(src, step_pattern=r"(?:step_|fin)(\w\w)")
    with pytest.raises(ImportFormatError, match="not a valid regular expression"):
        discover(src, step_pattern=r"step_(\d+")
    with pytest.raises(ImportFormatError, match="exactly one capturing group"):
        discover(src, step_pattern=r"(step)_(\d+)")
    with pytest.raises(ImportFormatError, match="exactly one capturing group"):
        discover(src, step_pattern=r"step_\d+")
    assert not (tmp_path / "run.zarr").exists()


def test_duplicate_steps_name_both_files(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"a_step5.pt": state_dict(0), "b_step5.pt": state_dict(1)})
    with pytest.raises(ImportFormatError, match=r"a_step5\.pt and .*b_step5\.pt both have step 5"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


# -- what the source folder holds ---------------------------------------------------------------------
def test_mixed_formats_need_format(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_1.pt": state_dict(1)})
    save_file(state_dict(2), src / "step_2.safetensors")
    with pytest.raises(ImportFormatError, match="--format"):
        detect_format(src)
    with pytest.raises(ImportFormatError, match="--format"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()
    assert import_checkpoints(src, tmp_path / "run.zarr", format="torch").steps == [1]
    assert_store_holds(tmp_path / "run.zarr", {1: state_dict(1)})
    assert import_checkpoints(src, tmp_path / "run2.zarr", format="safetensors").steps == [2]


def test_empty_folder_and_unknown_format(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "README.txt").write_text("no checkpoints here")
    (src / "._step_1.pt").write_bytes(b"macOS resource fork")
    with pytest.raises(ImportFormatError, match=r"no checkpoints found in .*src.*--format"):
        import_checkpoints(src, tmp_path / "run.zarr")
    with pytest.raises(ImportFormatError, match=r"no checkpoints found .*\*\.safetensors"):
        discover(src, format="safetensors")
    with pytest.raises(ImportFormatError, match="format must be"):
        discover(src, format="onnx")
    assert not (tmp_path / "run.zarr").exists()
    assert FORMATS == ("torch", "safetensors", "hf")


def test_missing_source_and_file_source(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="does not exist") as info:
        import_checkpoints(tmp_path / "nope", tmp_path / "run.zarr")
    assert isinstance(info.value, FileNotFoundError)
    torch.save(state_dict(0), tmp_path / "step_1.pt")
    with pytest.raises(ImportFormatError, match="is a file"):
        import_checkpoints(tmp_path / "step_1.pt", tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


# -- the destination ----------------------------------------------------------------------------------
def test_existing_destination_is_left_alone_unless_overwrite(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_1.pt": state_dict(1)})
    import_checkpoints(src, tmp_path / "run.zarr")
    other = write_files(tmp_path / "other", {"step_5.pt": state_dict(5)})
    with pytest.raises(StoreExistsError, match="is an import of"):
        import_checkpoints(other, tmp_path / "run.zarr")  # another run: refused, not appended
    assert_store_holds(tmp_path / "run.zarr", {1: state_dict(1)})
    report = import_checkpoints(src, tmp_path / "run.zarr")  # the same run, nothing new: up to date
    assert report.appended and report.steps == [] and report.kept == 1
    assert_store_holds(tmp_path / "run.zarr", {1: state_dict(1)})
    write_files(src, {"step_2.pt": state_dict(2)})
    import_checkpoints(other, tmp_path / "run.zarr", overwrite=True)
    assert_store_holds(tmp_path / "run.zarr", {5: state_dict(5)})


def test_destination_containing_the_source_is_refused(tmp_path: Path) -> None:
    src = write_files(tmp_path / "run" / "src", {"step_1.pt": state_dict(1)})
    with pytest.raises(ImportFormatError, match="contains, the source"):
        import_checkpoints(src, tmp_path / "run", overwrite=True)
    assert (src / "step_1.pt").exists()


def test_schema_mismatch_in_a_later_file_leaves_no_destination(tmp_path: Path) -> None:
    bad = state_dict(2)
    bad["fc.weight"] = torch.zeros(3, 5)
    src = write_files(tmp_path / "src", {"step_0.pt": state_dict(0), "step_1.pt": state_dict(1), "step_2.pt": bad})
    with pytest.raises(ImportFormatError, match=r"step_2\.pt.*shape.*the destination .* was not created") as info:
        import_checkpoints(src, tmp_path / "run.zarr")
    assert isinstance(info.value.__cause__, ckptstore.SchemaMismatchError)
    assert not (tmp_path / "run.zarr").exists()


def test_truncated_file_leaves_no_destination(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_0.pt": state_dict(0), "step_1.pt": state_dict(1)})
    data = (src / "step_1.pt").read_bytes()
    (src / "step_1.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImportFormatError, match=r"cannot load .*step_1\.pt.*was not created"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


def test_garbage_and_non_state_dict_files_are_named(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_0.pt": state_dict(0)})
    (src / "step_1.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ImportFormatError, match=r"cannot load .*step_1\.pt: it is corrupt or not a torch checkpoint"):
        import_checkpoints(src, tmp_path / "run.zarr")
    torch.save([torch.zeros(2)], src / "step_1.pt")
    with pytest.raises(ImportFormatError, match=r"step_1\.pt holds a list, not a state_dict"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_any_writer_error_becomes_import_error_and_leaves_no_destination(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_0.pt": {"a/b": torch.zeros(2)}})
    with pytest.raises(ImportFormatError, match=r"step_0\.pt: tensor name 'a/b'"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()
    write_files(src, {"step_0.pt": {"a": torch.zeros(2, dtype=torch.complex32)}})
    with pytest.raises(ImportFormatError, match=r"step_0\.pt"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


def test_corrupt_safetensors_leaves_no_destination(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"s0.safetensors": state_dict(0)}, save_safetensors)
    (src / "s1.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ImportFormatError, match=r"cannot load .*s1\.safetensors"):
        import_checkpoints(src, tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


def test_failed_import_to_fsspec_url_removes_it(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {"step_0.pt": state_dict(0), "step_1.pt": {"fc.weight": torch.zeros(1)}})
    dest = f"memory://importers-{tmp_path.name}.zarr"
    with pytest.raises(ImportFormatError, match=r"step_1\.pt"):
        import_checkpoints(src, dest)
    fs, path = fsspec.core.url_to_fs(dest)
    assert not fs.exists(path)


def test_overwriting_a_url_store_keeps_the_old_one_until_the_new_one_is_complete(tmp_path: Path) -> None:
    old_src = write_files(tmp_path / "old", {f"step_{s}.pt": state_dict(s) for s in (0, 1)})
    new_src = write_files(tmp_path / "new", {f"step_{s}.pt": state_dict(s + 10) for s in (0, 1, 2)})
    bad_src = write_files(tmp_path / "bad", {"step_0.pt": state_dict(5), "step_1.pt": {"fc.weight": torch.zeros(1)}})
    dest = f"memory://overwrite-{tmp_path.name}/run.zarr"
    import_checkpoints(old_src, dest)
    with pytest.raises(StoreExistsError, match="pass --overwrite"):
        import_checkpoints(new_src, dest)
    with pytest.raises(ImportFormatError, match=r"step_1\.pt"):
        import_checkpoints(bad_src, dest, overwrite=True)
    kept = ckptstore.open(dest)  # the failed replacement was built aside: the old store is untouched
    assert kept.steps.tolist() == [0, 1]
    np.testing.assert_array_equal(kept.tensors(1)["fc.weight"], state_dict(1)["fc.weight"].numpy())
    import_checkpoints(new_src, dest, overwrite=True)
    replaced = ckptstore.open(dest)
    assert replaced.steps.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(replaced.tensors(2)["fc.weight"], state_dict(12)["fc.weight"].numpy())
    fs, path = fsspec.core.url_to_fs(dest)
    assert fs.ls(path.rsplit("/", 1)[0], detail=False) == [path], "no staging prefix is left behind"


def test_progress_is_called_once_per_checkpoint_in_step_order(tmp_path: Path) -> None:
    # names that sort differently as text and as numbers
    src = write_files(tmp_path / "src", {f"step_{s}.pt": state_dict(s) for s in (100, 9, 10)})
    calls: list[tuple[int, int, int]] = []
    import_checkpoints(src, tmp_path / "run.zarr", progress=lambda *args: calls.append(args))
    assert calls == [(1, 3, 9), (2, 3, 10), (3, 3, 100)]


def test_interrupt_removes_the_destination_and_propagates(tmp_path: Path) -> None:
    src = write_files(tmp_path / "src", {f"step_{s}.pt": state_dict(s) for s in (1, 2, 3)})

    def interrupt(done: int, total: int, step: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_checkpoints(src, tmp_path / "run.zarr", progress=interrupt)
    assert not (tmp_path / "run.zarr").exists()
