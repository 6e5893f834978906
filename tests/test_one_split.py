"""Built-in analyzers that read ``--split`` alone keep their results when another split changes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import ckpt
from ckpt.analyzers._one_split import OneSplit
from ckpt.plugins.examples import write_example_run
from ckpt.plugins.manager import load_registry


def test_the_analyzers_of_one_split() -> None:
    """Each analyzer whose result depends on ``--split`` alone says so through :class:`OneSplit`."""
    analyzers = load_registry(entry_points=False).analyzers
    one_split = sorted(name for name, analyzer in analyzers.items() if issubclass(analyzer, OneSplit))
    assert one_split == [
        "attention",
        "boundary-distance",
        "fisher",
        "lca",
        "loss",
        "normalization",
        "polca",
        "sparsity",
    ]
    for name in one_split:
        assert analyzers[name](split="train").data_splits(None) == ("train",)  # the store is not read


def test_a_split_added_leaves_a_result_of_another_split_as_it_is(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=8)
    first = ckpt.analyze("loss", path)
    writer = ckpt.open(path, mode="a")
    writer.add_data("other", inputs=np.zeros((3, 3), np.float32), targets=np.zeros(3, np.int64))
    writer.close()
    time.sleep(1.1)  # a recomputed result would be written with a later `created` (seconds)
    again = ckpt.analyze("loss", path)
    assert again.ckpt.created == first.ckpt.created
    np.testing.assert_array_equal(again["loss"].values, first["loss"].values)
