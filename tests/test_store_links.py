"""ckpt writes only inside a store and never through a symbolic link (issue 68, finding 1).

A store is data, and tar and rsync keep symbolic links: a store can arrive with ``.locks``, a
folder below it, a result's folder or a chunk file that is a link to somewhere else. Every
command that writes to the store must either refuse it (one ``Error:`` line naming the link)
or succeed without touching what the link points to; ``ckpt verify`` names the links. Real
stores (``write_example_run`` and a stored ``loss``), the real ``ckpt`` command.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import ckpt
import ckpt.store as ckptstore
from ckpt.errors import StoreLinkError
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

MUTATING = (
    ("analyze", "loss", "@", "--no-progress", "--force"),
    ("rm", "@", "loss"),
    ("repair", "@"),
    ("upgrade", "@"),
    ("set-model", "@", "--objective", "cross-entropy"),
    ("data", "add", "@", "extra", "--inputs", "@inputs"),
)
"""Every command that writes to a store ("@": the store, "@inputs": a .npy file beside it)."""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A six-checkpoint run with a stored ``loss`` result, copied by each test."""
    path = write_example_run(tmp_path_factory.mktemp("links") / "run.zarr")
    ckpt.analyze("loss", path)
    return path


def _copy(base: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(base, tmp_path / "run.zarr", symlinks=True))


def _outside(tmp_path: Path) -> Path:
    """A user's folder beside the store, holding what the lock paths would name: ``store``, ``analyses/loss``."""
    outside = tmp_path / "outside"
    (outside / "analyses" / "loss").mkdir(parents=True)
    (outside / "store").write_text("precious\n")
    (outside / "loss").write_text("precious too\n")
    return outside


def _state(folder: Path) -> tuple[list[str], dict[str, str]]:
    """Every entry below ``folder`` (empty folders included) and every file's digest."""
    entries = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    return entries, tree_digest(folder)


def _run(command: tuple[str, ...], store: Path) -> tuple[int, list[str]]:
    inputs = store.parent / "inputs.npy"
    if not inputs.exists():
        np.save(inputs, np.zeros((4, 3), np.float32))
    done = run_ckpt(*({"@": str(store), "@inputs": str(inputs)}.get(part, part) for part in command))
    return done.returncode, done.stderr.strip().splitlines()


def _assert_refused_or_harmless(store: Path, outside: Path, link: str) -> None:
    """Every mutating command leaves ``outside`` as it was, and refuses with one Error: line naming ``link``."""
    before = _state(outside)
    for command in MUTATING:
        code, stderr = _run(command, store)
        assert _state(outside) == before, f"{command} changed {outside}"
        assert code != 0, (command, stderr)
        assert len(stderr) == 1 and stderr[0].startswith("Error:"), (command, stderr)
        assert link in stderr[0] and "symbolic link" in stderr[0], (command, stderr)
    assert outside.is_dir()


@pytest.mark.slow
def test_a_locks_folder_that_is_a_link_is_refused_and_nothing_outside_is_removed(base: Path, tmp_path: Path) -> None:
    store, outside = _copy(base, tmp_path), _outside(tmp_path)
    (store / ".locks").symlink_to(outside, target_is_directory=True)
    _assert_refused_or_harmless(store, outside, ".locks")


@pytest.mark.slow
def test_a_link_inside_a_real_locks_folder_is_refused(base: Path, tmp_path: Path) -> None:
    store, outside = _copy(base, tmp_path), _outside(tmp_path)
    (store / ".locks").mkdir()
    (store / ".locks" / "analyses").symlink_to(outside, target_is_directory=True)
    _assert_refused_or_harmless(store, outside, ".locks/analyses")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["analyses/evil", "checkpoints/step/c/99", "analyses/loss/loss"])
def test_a_link_below_the_store_is_refused_by_writers_and_named_by_verify(
    base: Path, tmp_path: Path, where: str
) -> None:
    store, outside = _copy(base, tmp_path), _outside(tmp_path)
    link = store / where
    if link.exists():  # a real piece of the store, replaced by a link (a folder: the result's variable)
        import shutil

        shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / "store" if where.startswith("checkpoints") else outside)
    _assert_refused_or_harmless(store, outside, where)
    done = run_ckpt("verify", str(store))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"symbolic link {where}" in done.stdout, done.stdout
    assert done.stderr.startswith("Error:") and where in done.stderr, done.stderr


def test_the_python_api_refuses_to_append_to_a_store_with_a_link(base: Path, tmp_path: Path) -> None:
    store, outside = _copy(base, tmp_path), _outside(tmp_path)
    (store / "checkpoints" / "step" / "c" / "99").symlink_to(outside / "store")
    before = _state(outside)
    with pytest.raises(StoreLinkError, match="symbolic link checkpoints/step/c/99"):
        ckptstore.open(store, mode="a")
    assert _state(outside) == before


def test_the_users_own_path_to_the_store_may_be_a_link(base: Path, tmp_path: Path) -> None:
    from ckpt.store.results import delete_analysis

    store = _copy(base, tmp_path)
    alias = tmp_path / "alias.zarr"
    alias.symlink_to(store, target_is_directory=True)
    ckpt.analyze("loss", alias, force=True)
    delete_analysis(alias, "loss")
    with ckptstore.open(alias, mode="a"):
        pass
    assert "loss" not in ckptstore.open(alias).analyses
    assert not (store / ".locks").exists() and os.path.islink(alias)


@pytest.mark.parametrize("link", [".locks", ".locks/analyses", ".locks/analyses/loss", ".locks/store"])
def test_the_lock_code_refuses_a_link_on_its_path_and_leaves_its_target(base: Path, tmp_path: Path, link: str) -> None:
    from ckpt.store.results import result_lock, store_lock

    store, outside = _copy(base, tmp_path), _outside(tmp_path)
    (store / link).parent.mkdir(parents=True, exist_ok=True)
    (store / link).symlink_to(
        outside / ("loss" if link.endswith("loss") else "store" if link.endswith("store") else "")
    )
    before = _state(outside)
    with pytest.raises(StoreLinkError, match=re.escape(f"symbolic link {link},")), result_lock(store, "loss"):
        pass
    if link in (".locks", ".locks/store"):  # the store-wide lock's own path
        with pytest.raises(StoreLinkError, match=re.escape(f"symbolic link {link},")):
            store_lock(store, exclusive=True)
    assert _state(outside) == before
    assert (store / link).is_symlink()


def test_a_store_replaced_through_the_users_link_is_replaced_where_the_link_points(base: Path, tmp_path: Path) -> None:
    """A repair that drops a checkpoint swaps in a copy: through a link, the link's target is swapped, not the link."""
    from ckpt.store.repair import repair

    store = _copy(base, tmp_path)
    alias = tmp_path / "alias.zarr"
    alias.symlink_to(store, target_is_directory=True)
    chunk = sorted((store / "checkpoints" / "0.weight").glob("c*"))[2]
    chunk.write_bytes(bytes(b ^ 0xFF for b in chunk.read_bytes()))  # fails its crc32c: step 2 is dropped
    report = repair(alias)
    assert report.dropped_steps == [2]
    assert os.path.islink(alias) and os.path.realpath(alias) == str(store.resolve())
    assert list(ckptstore.open(store).steps) == [0, 1, 3, 4, 5]
    assert invoke_ckpt("verify", str(store)).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [], "no staging copy left"
