"""``repro/development.py``'s stages of an LLC curve: rises, plateaus and falls of known curves, noise ignored."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

REPRO = Path(__file__).resolve().parents[1] / "repro"


@pytest.fixture
def development(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.syspath_prepend(str(REPRO))
    return importlib.import_module("development")


def test_rise_plateau_fall_are_three_stages(development: object) -> None:
    """A rise to 10 over checkpoints 0-10, a plateau to 20, a fall to 5 by 30, with noise of a tenth of the SE."""
    steps = np.arange(31) * 100
    curve = np.concatenate([np.linspace(0, 10, 11), np.full(9, 10.0), np.linspace(10, 5, 11)])
    noisy = curve + np.random.default_rng(0).normal(0, 0.02, len(curve))
    stages = development.llc_stages(steps, noisy, np.full(len(curve), 0.2), sigma=0)
    assert [s["kind"] for s in stages] == ["rising", "plateau", "falling"]
    assert [s["start"] for s in stages] == [0, pytest.approx(1000, abs=100), pytest.approx(1900, abs=100)]
    assert stages[-1]["end"] == 3000
    assert stages[0]["change"] == pytest.approx(10, abs=0.5)
    assert stages[2]["change"] == pytest.approx(-5, abs=0.5)


def test_wiggles_within_the_noise_are_one_plateau(development: object) -> None:
    """A curve that only moves within twice its standard error has no stage boundary."""
    steps = np.arange(20)
    wiggle = 3 + 0.1 * np.sin(np.arange(20))
    stages = development.llc_stages(steps, wiggle, np.full(20, 0.1))
    assert [(s["start"], s["end"], s["kind"]) for s in stages] == [(0, 19, "plateau")]


def test_a_monotone_rise_is_one_stage(development: object) -> None:
    steps = np.arange(12) * 10
    stages = development.llc_stages(steps, np.log1p(np.arange(12.0)), np.full(12, 0.01), sigma=0)
    assert [(s["start"], s["end"], s["kind"]) for s in stages] == [(0, 110, "rising")]
