"""ckpt.store._zarr.array_at / group_at: a node of the other kind is a corrupt record, named, not zarr's error."""

import numpy as np
import pytest
import zarr
import zarr.storage

from ckpt.errors import CorruptRecordError
from ckpt.store import _zarr


@pytest.fixture
def root() -> zarr.Group:
    group = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    group.create_group("checkpoints").create_array("step", shape=(2,), dtype="int64")[:] = [0, 5]
    return group


def test_array_at_returns_the_array(root):
    np.testing.assert_array_equal(_zarr.array_at(root, "checkpoints/step")[...], [0, 5])


def test_group_at_returns_the_group(root):
    assert [name for name, _ in _zarr.group_at(root, "checkpoints").members()] == ["step"]


def test_a_group_where_an_array_belongs_is_a_corrupt_record(root):
    with pytest.raises(CorruptRecordError, match=r"'checkpoints' in the commit record of run.zarr is a group"):
        _zarr.array_at(root, "checkpoints", "run.zarr")


def test_an_array_where_a_group_belongs_is_a_corrupt_record(root):
    with pytest.raises(CorruptRecordError, match=r"'checkpoints/step' .* is an array where a group belongs"):
        _zarr.group_at(root, "checkpoints/step")
