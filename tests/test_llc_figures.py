"""``llc``'s figures through the real analyzer on a tiny store: flagged checkpoints marked and named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import ckpt
from ckpt import store as ckptstore
from ckpt.analyzers.figures.llc import chosen_steps, llc_figures, problems_by_step
from ckpt.analyzers.llc import LLC
from ckpt.errors import LLCWarning
from tests.test_llc import mse, write_store  # noqa: F401  (mse: the fixture registering the objective)

pytestmark = pytest.mark.usefixtures("one_thread", "mse")


def llc_run(path: Path) -> Path:
    """y = x·w + b at four checkpoints: far from the fit at step 0, then closer, at the fit from step 20 on."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1))
    y = 2.0 * x[:, 0] - 1.0 + 0.3 * rng.standard_normal(64)
    fit = np.linalg.lstsq(np.c_[x, np.ones(64)], y, rcond=None)[0]
    write_store(path, "linear", {"inputs": 1}, {"weight": [[0.0]], "bias": [0.0]}, x, y)
    with ckptstore.open(path, mode="a") as writer:
        for step, share in ((10, 0.9), (20, 1.0), (30, 1.0)):
            writer.write(step, {"weight": np.array([[share * fit[0]]]), "bias": np.array([share * fit[1]])})
    return path


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory, mse: None) -> tuple[Path, xr.Dataset]:  # noqa: F811
    """The store and its llc result: step 0's chains slide far below init_loss (γ is weak), the rest are sound."""
    path = llc_run(tmp_path_factory.mktemp("llc-figures") / "run.zarr")
    options = {"epsilon": 2e-2, "nbeta": 20.0, "gamma": 1.0, "chains": 3, "draws": 300, "burn_in": 40, "batch_size": 64}
    with pytest.warns(LLCWarning, match=r"step 0: chains \[0, 1, 2\] of 3 diverged"):
        result = ckpt.analyze("llc", path, force=True, dtype="float64", **options).load()
    return path, result


def test_llc_figures_mark_and_name_the_flagged_checkpoints(analyzed: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    path, result = analyzed
    figures = LLC().plot(result, ckptstore.open(path))
    for name, figure in figures.items():
        figure.savefig(tmp_path / f"llc-{name}.png", dpi=80)
    assert sorted(figures) == ["llc", "traces"]
    problems = problems_by_step(result)
    assert list(problems) == [0]  # far from the fit the chains slide down; near it they do not
    legend = [t.get_text() for t in figures["llc"].axes[0].get_legend().get_texts()]
    assert any(text.startswith("step 0: ") for text in legend)
    titles = [axes.get_title() for axes in figures["traces"].axes]
    assert titles[0].startswith("step 0: chains [0, 1, 2] of 3 diverged") and titles[-1] == "step 30"


def test_one_checkpoint_and_nan_estimates_still_draw(analyzed: tuple[Path, xr.Dataset], tmp_path: Path) -> None:
    _, result = analyzed
    one = result.isel(step=[0])
    assert len(llc_figures(one)["traces"].axes) == 1
    broken = result.copy(deep=True)
    broken["llc"][1:] = np.nan
    broken["llc_std"][1:] = np.nan
    broken["llc_chain"][1, 0] = np.nan
    broken["diverged"][1, 0] = True
    broken["loss_trace"][1, 0, 60:] = np.inf
    figures = llc_figures(broken)
    assert any("diverged" in axes.get_title() for axes in figures["traces"].axes)
    for name, figure in figures.items():
        figure.savefig(tmp_path / f"broken-{name}.png", dpi=80)
    assert chosen_steps(result["step"].values, {10: ["x"], 20: ["y"], 30: ["z"]}) == [0, 1, 2, 3]
    assert chosen_steps(np.arange(9), {3: ["x"], 5: ["y"], 7: ["z"]}) == [0, 3, 5, 8]
