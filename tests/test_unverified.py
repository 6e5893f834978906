"""No silent downgrade: a store without digests is never reported as verified; ``ckpt upgrade`` adds them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # installs packages or starts many ckpt processes

ROOT_DIR = Path(__file__).resolve().parents[1]
V1_STORE = ROOT_DIR / "tests" / "data" / "v0.1.0-modular-addition.zarr"
EXIT_UNVERIFIED = 3


def _downgrade(store: Path) -> None:
    """What an attacker does to hide damage: the record says v1 and forgets its digests."""
    record = store / "zarr.json"
    document = json.loads(record.read_text())
    meta = document["attributes"]["ckpt"]
    meta["format_version"] = 1
    del meta["digests"], meta["metric_digests"]
    record.write_text(json.dumps(document))


def _chunk(store: Path, tensor: str, row: int) -> Path:
    (chunk,) = (store / "checkpoints" / tensor).glob(f"c.{row}.*")
    return chunk


def test_a_downgraded_store_with_damage_is_never_reported_verified(tmp_path: Path) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=4, examples=12)
    _downgrade(store)
    _chunk(store, "0.weight", 1).unlink()  # read as zeros
    shutil.copy(_chunk(store, "2.weight", 0), _chunk(store, "2.weight", 3))  # step 0's weights at step 3
    before = tree_digest(store)
    verified = run_ckpt("verify", str(store))
    assert verified.returncode == EXIT_UNVERIFIED, verified.stdout + verified.stderr
    assert "OK" not in verified.stdout
    assert "NOT verified" in verified.stdout and "4 checkpoint(s) have no digest" in verified.stdout
    assert f"ckpt upgrade {store}" in verified.stdout
    analyzed = invoke_ckpt("analyze", "loss", str(store), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    warnings = [line for line in analyzed.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith(f"Warning: {store} cannot be verified"), analyzed.stderr
    untouched = [k for k in before if k.startswith(("checkpoints", "metrics", "data"))]
    assert {k: tree_digest(store)[k] for k in untouched} == {k: before[k] for k in untouched}


def test_a_genuine_v1_store_says_so_and_upgrade_makes_it_verifiable(tmp_path: Path) -> None:
    store = tmp_path / "v1.zarr"
    shutil.copytree(V1_STORE, store)
    before = tree_digest(store)
    verified = run_ckpt("verify", str(store))
    assert verified.returncode == EXIT_UNVERIFIED
    assert "3 checkpoint(s), 5 metric column(s), 1 result(s) have no digest" in verified.stdout, verified.stdout
    allowed = invoke_ckpt("verify", str(store), "--allow-unverified")
    assert allowed.returncode == 0 and "NOT verified" in allowed.stdout
    shown = invoke_ckpt("info", str(store))
    assert "integrity    " in shown.stdout and "cannot be verified" in shown.stdout
    assert tree_digest(store) == before  # verify and info change nothing

    upgraded = invoke_ckpt("upgrade", str(store))
    assert upgraded.returncode == 0, upgraded.stderr
    assert "format v1 -> v2" in upgraded.stdout and "3 checkpoint(s), 5 metric column(s)" in upgraded.stdout
    assert "1 result(s)" in upgraded.stdout
    opened = ckptstore.open(store)
    assert opened.format_version == 2 and opened.unverifiable_summary() is None
    assert opened.history[-1]["event"] == "upgrade" and "trust on first use" in opened.history[-1]["trust"]
    assert invoke_ckpt("verify", str(store)).returncode == 0
    again = invoke_ckpt("upgrade", str(store))
    assert again.returncode == 0 and "nothing to do" in again.stdout

    # damage after the upgrade is caught, on every path
    _chunk(store, "hidden.weight", 1).unlink()
    damaged = run_ckpt("verify", str(store))
    assert damaged.returncode == 1 and "tensor 'hidden.weight' at step 20" in damaged.stderr


def test_an_upgraded_store_is_appended_to_as_v2(tmp_path: Path) -> None:
    store = tmp_path / "v1.zarr"
    shutil.copytree(V1_STORE, store)
    ckptstore.upgrade(store)
    last = int(ckptstore.open(store).steps[-1])
    tensors = ckptstore.open(store).tensors(last)
    with ckptstore.open(store, mode="a") as writer:
        writer.write(last + 10, {name: np.asarray(value) + 1 for name, value in tensors.items()}, metrics={"x": 1.0})
    assert invoke_ckpt("verify", str(store)).returncode == 0


def test_a_v2_record_that_lost_its_digests_is_an_error(tmp_path: Path) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=8)
    record = store / "zarr.json"
    document = json.loads(record.read_text())
    del document["attributes"]["ckpt"]["digests"]
    record.write_text(json.dumps(document))
    for command in ("info", "verify", "upgrade"):
        result = run_ckpt(command, str(store))
        assert result.returncode == 1, result.stdout
        assert result.stderr.startswith("Error: the commit record of") and "digests is None" in result.stderr


def test_upgrade_of_a_v2_store_changes_nothing_and_waits_for_no_writer(tmp_path: Path) -> None:
    store = write_example_run(tmp_path / "run.zarr", steps=2, examples=8)
    before = tree_digest(store)
    result = invoke_ckpt("upgrade", str(store))
    assert result.returncode == 0 and "nothing to do" in result.stdout
    assert tree_digest(store) == before
    v1 = tmp_path / "v1.zarr"
    shutil.copytree(V1_STORE, v1)
    with ckptstore.open(v1, mode="a"):  # a writer holds the store
        held = tree_digest(v1)
        refused = run_ckpt("upgrade", str(v1))
        assert refused.returncode == 1 and refused.stderr.startswith("Error: another process is writing")
        assert tree_digest(v1) == held


@pytest.mark.parametrize("allow", [False, True])
def test_the_python_api_warns_about_an_unverifiable_store(tmp_path: Path, allow: bool) -> None:
    import warnings

    from ckpt.errors import UnverifiedStoreWarning

    store = tmp_path / "v1.zarr"
    shutil.copytree(V1_STORE, store)
    if allow:
        ckptstore.upgrade(store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt_result = __import__("ckpt").analyze("loss", str(store), scheduler="sync", progress=False)
    unverified = [w for w in caught if issubclass(w.category, UnverifiedStoreWarning)]
    assert len(unverified) == (0 if allow else 1)
    assert ckpt_result["loss"].sizes["step"] == 3
