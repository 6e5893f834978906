"""Figures of every built-in analyzer, ``ckpt plot``, ``ckpt animate`` and ``--as``, on real small runs.

Each figure is rendered and checked as an image (not blank, its panels, labelled axes) and, where
a number is drawn, against the stored result it claims to show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.plugins.manager import registry as shared_registry
from ckpt.plugins.testing import check_figure
from ckpt.sandboxes.addition import Addition
from ckpt.sandboxes.base import train
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition
from tests.helpers import invoke_ckpt, run_ckpt

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

TINY = {"layers": 1, "d_model": 16, "heads": 2, "d_mlp": 32}
BASIS = {"every": 30, "samples": 64}  # basis vectors found at steps 0 and 30
CLUSTERING = {"label": "carry", "min_cluster_size": 40, "delta": 10.0, "tau": 20.0}


@pytest.fixture(scope="module")
def addition(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny addition run (7 checkpoints) with every addition analyzer's result stored."""
    path = tmp_path_factory.mktemp("figures") / "addition.zarr"
    train(Addition(), path, steps=60, every=10, batch_size=32, **TINY)
    run("polca", path, second_order="none", **BASIS)
    run("fisher", path, **BASIS)
    run("clusters", path, on="polca", **CLUSTERING)
    run("clusters", path, on="loss", save_as="clusters-loss", **CLUSTERING)
    run("random-basis", path, vectors=3)
    run("lca", path, parameters=4)
    run("loss-spikes", path, window=5)
    return path


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short sparse modular addition run (d = 2) with sparsity and sequence-embedding geometry."""
    path = tmp_path_factory.mktemp("figures") / "sparse.zarr"
    train(SparseModularAddition(), path, steps=16, every=4, seed=0)
    run("sparsity", path, modules="mlp.fc2", capture="input", eps_count=12)
    run("embedding-geometry", path)
    return path


def figures_of(path: Path, name: str) -> dict[str, Any]:
    store = ckptstore.open(path)
    result = store.analysis(name)
    analyzer = shared_registry().analyzers[result.ckpt.analyzer or name]
    return analyzer(**result.ckpt.options).plot(result, store)


def test_loss_curves_draw_the_median_of_each_place_and_carry_group(addition: Path) -> None:
    figures = figures_of(addition, "loss")
    assert list(figures) == ["curves"]
    figure = figures["curves"]
    check_figure(figure, panels=5)  # all datapoints, then places 0..3
    assert figure.axes[0].get_xscale() == "linear", "checkpoints every 10 steps"
    store = ckptstore.open(addition)
    loss = store.analysis("loss").load()
    overall = figure.axes[0]
    median = next(line for line in overall.lines if line.get_label().startswith("median"))
    np.testing.assert_allclose(median.get_ydata(), np.median(loss["loss"].values, axis=1))
    data = store.data("eval")
    example, position = loss["example"].values, loss["position"].values
    place, carry = data["place"].values[example, position], data["carry"].values[example, position]
    tens = figure.axes[1 + 1]  # place 1
    assert tens.get_title().startswith("place = 1")
    for line in tens.lines:
        value = int(line.get_label().rsplit("= ", 1)[1])
        members = (place == 1) & (carry == value)
        np.testing.assert_allclose(line.get_ydata(), np.median(loss["loss"].values[:, members], axis=1))


def test_hessian_basis_figure_places_each_eigenvalue_at_its_step(addition: Path) -> None:
    figure = figures_of(addition, "hessian-basis")["eigenvalues"]
    check_figure(figure, panels=2)
    basis = ckptstore.open(addition).analysis("hessian-basis")
    points = figure.axes[0].collections[0].get_offsets()
    np.testing.assert_allclose(points[:, 0], basis["found_at_step"].values)
    np.testing.assert_allclose(points[:, 1], basis["eigenvalue"].values)
    residuals = figure.axes[1].collections[0].get_offsets()
    np.testing.assert_allclose(residuals[:, 1], basis["residual"].values)


def test_random_basis_figure_counts_its_vectors(addition: Path) -> None:
    figure = figures_of(addition, "random-basis")["vectors"]
    check_figure(figure, panels=1)
    assert sum(bar.get_height() for bar in figure.axes[0].patches) == 3


def test_polca_trajectories_start_at_zero_and_end_at_the_stored_projected_loss(addition: Path) -> None:
    figures = figures_of(addition, "polca")
    assert set(figures) == {"trajectories", "explained"}
    polca = ckptstore.open(addition).analysis("polca").load()
    check_figure(figures["trajectories"], panels=polca.sizes["basis"])
    check_figure(figures["explained"], panels=1)
    for basis, axes in enumerate(figures["trajectories"].axes):
        median = next(line for line in axes.lines if line.get_label().startswith("median"))
        x, y = median.get_xdata(), median.get_ydata()
        assert x[0] == 0 and y[0] == 0, "eq. 10: L_b(x, θ_0) = 0 at the first checkpoint"
        assert x[-1] == 60, "the last row is L_b at the last checkpoint"
        final = polca["projected_loss"].isel(basis=basis).values[-1]
        np.testing.assert_allclose(y[-1], np.median(final))
        found = [line for line in axes.lines if line.get_label() == "found at"]
        assert found[0].get_xdata()[0] == polca["found_at_step"].values[basis]


def test_fisher_and_lca_draw_a_panel_per_vector_or_parameter(addition: Path) -> None:
    fisher = figures_of(addition, "fisher")["trajectories"]
    check_figure(fisher, panels=ckptstore.open(addition).analysis("fisher").sizes["basis"])
    lca = figures_of(addition, "lca")["trajectories"]
    check_figure(lca, panels=4)
    stored = ckptstore.open(addition).analysis("lca").load()
    mean = next(line for line in lca.axes[0].lines if line.get_label() == "mean")
    total = stored["lca"].isel(parameter=0).sum("step").mean("datapoint")
    np.testing.assert_allclose(mean.get_ydata()[-1], total)
    assert mean.get_ydata()[0] == 0


def test_clusters_figures_draw_fig_4_for_every_basis_vector_with_clusters(addition: Path) -> None:
    figures = figures_of(addition, "clusters")
    clusters = ckptstore.open(addition).analysis("clusters").load()
    counts = clusters["clusters"].values
    assert counts.sum() > 0, "this run's POLCA trajectories form clusters: the figure has something to show"
    with_clusters = [f"basis-{b}" for b in range(len(counts)) if counts[b] > 0]
    assert list(figures) == ["overview", *with_clusters]
    check_figure(figures["overview"], panels=2)
    basis = int(with_clusters[0].split("-")[1])
    figure = figures[with_clusters[0]]
    check_figure(figure, panels=3)
    curves, losses, makeup = figure.axes
    medians = [line for line in curves.lines if line.get_label().startswith("cluster ")]
    assert len(medians) == min(int(counts[basis]), 10)
    for line in medians:
        cluster = int(line.get_label().split()[1])
        np.testing.assert_allclose(line.get_ydata(), clusters["median"].values[basis, cluster])
    assert any(line.get_label().startswith("vector found") for line in curves.lines)
    exact = ckptstore.open(addition).analysis("loss")["loss"].values
    per_cluster = [line for line in losses.lines if line.get_label().startswith("cluster ")]
    assert len(per_cluster) == len(medians), "one exact-loss median per cluster"
    for line in per_cluster:
        members = clusters["cluster_label"].values[basis] == int(line.get_label().split()[1])
        np.testing.assert_allclose(line.get_ydata(), np.median(exact[:, members], axis=1))
    shares = clusters["place_share"].values[basis]
    heights = [bar.get_height() for bar in makeup.patches]
    np.testing.assert_allclose(sorted(heights), sorted(shares[: len(medians)].T.ravel()), atol=1e-12)


def test_clusters_kept_under_another_name_are_compared_side_by_side(addition: Path) -> None:
    store = ckptstore.open(addition)
    assert {"clusters", "clusters-loss"} <= set(store.analyses)
    assert store.analysis("clusters-loss").ckpt.analyzer == "clusters"
    assert store.analysis("clusters").ckpt.option("on") == "polca", "--as left the default result alone"
    results = {name: store.analysis(name).load() for name in ("clusters-loss", "clusters")}
    figure = shared_registry().analyzers["clusters"]().plot_together(results, store)["homogeneity"]
    check_figure(figure, panels=1)
    heights = [bar.get_height() for bar in figure.axes[0].patches]
    expected = [float(np.nan_to_num(r["top_homogeneity"].values[rank])) for rank in range(3) for r in results.values()]
    np.testing.assert_allclose(heights, expected)
    info = invoke_ckpt("info", str(addition))
    assert "clusters-loss (clusters)" in info.stdout
    # reused by provenance like any other result
    again = run("clusters", addition, on="loss", save_as="clusters-loss", **CLUSTERING)
    assert again.computed_steps == [] and again.reused_steps


def test_as_refuses_names_that_others_read(addition: Path) -> None:
    from tests.helpers import tree_digest

    before = tree_digest(addition)
    taken = run_ckpt("analyze", "clusters", str(addition), "--on", "loss", "--as", "loss", "--no-progress")
    assert taken.returncode == 1
    assert taken.stderr.startswith("Error: --as 'loss' is the name of the analyzer 'loss'"), taken.stderr
    other = run_ckpt("analyze", "loss", str(addition), "--as", "clusters-loss", "--no-progress")
    assert other.returncode == 1
    assert "holds a result of analyzer 'clusters', not 'loss'" in other.stderr
    assert tree_digest(addition) == before


def test_grad_norms_and_loss_spikes_mark_what_they_found(addition: Path) -> None:
    norms = figures_of(addition, "grad-norms")["norms"]
    check_figure(norms, panels=2)
    stored = ckptstore.open(addition).analysis("grad-norms").load()
    twin = norms.axes[2]
    np.testing.assert_allclose(twin.lines[0].get_ydata(), stored["total_grad_norm"].values)
    spikes = figures_of(addition, "loss-spikes")["spikes"]
    check_figure(spikes, panels=2)
    result = ckptstore.open(addition).analysis("loss-spikes").load()
    for axes, name in zip(spikes.axes, ("loss", "grad_norm"), strict=True):
        marked = next(line for line in axes.lines if line.get_label().endswith("spikes"))
        flags = result[f"{name}_spike"].values.astype(bool)
        np.testing.assert_array_equal(marked.get_xdata(), result["step"].values[flags])


def test_sparsity_epsilon_curves(sparse: Path) -> None:
    figures = figures_of(sparse, "sparsity")
    check_figure(figures["epsilon"], panels=1)
    check_figure(figures["nonpositive"], panels=1)
    result = ckptstore.open(sparse).analysis("sparsity").load()
    last = figures["epsilon"].axes[0].lines[-1]
    assert last.get_label() == f"step {int(result['step'].values[-1])}"
    np.testing.assert_allclose(last.get_ydata(), result["sparsity"].isel(step=-1, module=0).values)


def test_embedding_geometry_shows_embeddings_pair_sums_and_sequence_embeddings(sparse: Path) -> None:
    figures = figures_of(sparse, "embedding-geometry")
    check_figure(figures["embeddings"], panels=3 * 4)  # table, pair sums, ξ at 4 checkpoints
    check_figure(figures["geometry"], panels=3)
    store = ckptstore.open(sparse)
    embed = store.read_tensor("embed.weight", [16])[0]
    p = store.attrs["config"]["p"]
    last_table = figures["embeddings"].axes[3]  # first row, last column: step 16
    assert last_table.get_title().startswith("step 16")
    np.testing.assert_allclose(last_table.collections[0].get_offsets(), embed[:p, :2])
    sums = figures["embeddings"].axes[4 + 3].collections[0].get_offsets()
    assert len(sums) == p * (p + 1) // 2


def test_curvature_and_normalization_draw_their_learning_rate_lines(sparse: Path, tmp_path: Path) -> None:
    lr = 3e-3
    run("curvature", sparse, samples=32, lr=lr)
    run("normalization", sparse, lr=lr, batch_size=512)
    store = ckptstore.open(sparse)
    curvature = store.analysis("curvature").load()
    sharpness = figures_of(sparse, "curvature")["sharpness"]
    check_figure(sharpness, panels=1)
    lines = {line.get_label(): line for line in sharpness.axes[0].lines}
    np.testing.assert_allclose(lines["2/η (GD stability)"].get_ydata(), 2 / lr)
    np.testing.assert_allclose(lines["whole model"].get_ydata(), curvature["model_eigenvalue"].values)
    np.testing.assert_allclose(lines["mlp"].get_ydata(), curvature["eigenvalue"].sel(module="mlp").values)

    normalization = store.analysis("normalization").load()
    figures = figures_of(sparse, "normalization")
    assert list(figures) == ["norms", "below-lr"]
    check_figure(figures["norms"], panels=2)  # the sandbox's two GainlessRMSNorm layers
    check_figure(figures["below-lr"], panels=1)
    for axes, module in zip(figures["norms"].axes, ("norm", "mlp.norm"), strict=True):
        assert axes.get_title() == module
        lines = {line.get_label(): line for line in axes.lines}
        np.testing.assert_allclose(lines["η (learning rate)"].get_ydata(), lr)
        quantiles = normalization["norm_quantile"].sel(module=module)
        np.testing.assert_allclose(lines["median"].get_ydata(), quantiles.sel(quantile=0.5).values)
        np.testing.assert_allclose(lines["minimum"].get_ydata(), quantiles.sel(quantile=0.0).values)
    for name in ("curvature", "normalization"):
        done = invoke_ckpt("plot", str(sparse), name, "--out", str(tmp_path / f"{name}.png"))
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "curvature.png",
        "normalization-below-lr.png",
        "normalization-norms.png",
    ]


def test_boundary_distance_draws_its_bands_and_the_xi_plane(sparse: Path) -> None:
    # 8 directions (angles at d = 2), not the default 128: the figure draws whatever was found, and
    # every part of it (the bands, both planes, their points and contours) is drawn from 8 as from 128
    run("boundary-distance", sparse, directions=8)
    result = ckptstore.open(sparse).analysis("boundary-distance").load()
    figures = figures_of(sparse, "boundary-distance")
    assert list(figures) == ["distances", "boundaries"]
    check_figure(figures["distances"], panels=2)
    lines = {line.get_label(): line for line in figures["distances"].axes[0].lines}
    np.testing.assert_allclose(lines["median"].get_ydata(), result["distance_quantile"].sel(quantile=0.5).values)
    planes = figures["boundaries"]
    check_figure(planes, panels=2)  # first and last checkpoints (their colour bar is not a panel)
    for axes, step in zip(planes.axes[:2], (0, 16), strict=True):
        assert axes.get_title().startswith(f"step {step}:")
        points = axes.collections[-1]  # the ξ coloured by distance, drawn last
        found = result["distance"].sel(step=step).values
        assert (found > 0).sum() >= len(found) // 2, "most ξ find a boundary, even along 8 directions"
        np.testing.assert_allclose(points.get_offsets(), result["xi"].sel(step=step).values[found > 0])
        np.testing.assert_allclose(points.get_array(), found[found > 0])
        assert any(c.get_linestyle() for c in axes.collections[:-2]), "no boundary contour drawn"


def test_attention_draws_the_first_and_last_maps_with_their_correlation(sparse: Path) -> None:
    run("attention", sparse, examples=48)
    result = ckptstore.open(sparse).analysis("attention").load()
    maps = figures_of(sparse, "attention")["maps"]
    check_figure(maps, panels=2)  # start and end (their colour bar is not a panel)
    rho = float(result["start_end_correlation"].sel(step=16)[0, 0])
    for axes, step in zip(maps.axes[:2], (0, 16), strict=True):
        assert f"(step {step}), ρ = {rho:.4f}" in axes.get_title()
        np.testing.assert_allclose(axes.images[0].get_array(), result["weights"].sel(step=step).values[0, 0, :, 0])


def test_ckpt_plot_writes_each_format_and_refuses_bad_input(addition: Path, tmp_path: Path) -> None:
    png = invoke_ckpt("plot", str(addition), "hessian-basis", "--out", str(tmp_path / "basis.png"))
    assert png.returncode == 0, png.stderr
    assert (tmp_path / "basis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    several = invoke_ckpt("plot", str(addition), "polca", "--out", str(tmp_path / "polca.svg"))
    assert several.returncode == 0, several.stderr
    assert (tmp_path / "polca-trajectories.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "polca-explained.svg").exists()
    pdf = invoke_ckpt("plot", str(addition), "loss", "--out", str(tmp_path / "loss.pdf"))
    assert pdf.returncode == 0, pdf.stderr
    assert (tmp_path / "loss.pdf").read_bytes()[:5] == b"%PDF-"
    for args, message in (
        (("nope",), "Error: no analysis 'nope'"),
        (("loss", "--out", str(tmp_path / "x.docx")), "Error: cannot write a figure to"),
        (("loss", "--out", str(tmp_path / "missing" / "x.png")), "Error: cannot write"),
    ):
        bad = run_ckpt("plot", str(addition), *args)
        assert bad.returncode != 0, args
        assert bad.stderr.startswith(message), bad.stderr
        assert "Traceback" not in bad.stderr


def test_ckpt_animate_writes_one_gif_frame_per_checkpoint(sparse: Path, tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "sparse.gif"
    result = invoke_ckpt("animate", str(sparse), "--out", str(out), "--fps", "10")
    assert result.returncode == 0, result.stderr
    with Image.open(out) as gif:
        assert gif.n_frames == len(ckptstore.open(sparse).steps)
        assert gif.info["duration"] == 100
        first = np.asarray(gif.convert("RGB"))
        gif.seek(gif.n_frames - 1)
        last = np.asarray(gif.convert("RGB"))
    assert (first != last).any(), "frames differ as the embeddings move"
    bad = run_ckpt("animate", str(sparse), "--out", str(tmp_path / "x.avi"))
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: cannot write an animation to"), bad.stderr


def test_commands_that_do_not_plot_do_not_import_matplotlib(addition: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from ckpt.cli.main import cli\n"
        f"try: cli.main(['analyze', 'loss', {str(addition)!r}, '--no-progress'], prog_name='ckpt')\n"
        "except SystemExit: pass\n"
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False"), out.stdout + out.stderr


def test_report_opens_in_a_real_browser_with_every_figure(addition: Path, tmp_path: Path) -> None:
    from tests.browser import open_report

    out = tmp_path / "report.html"
    result = invoke_ckpt("report", str(addition), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "no figure failed"
    page = open_report(out, tmp_path / "report.png")
    assert page.console_errors == []
    broken = [image["alt"] for image in page.images if not image["loaded"]]
    assert broken == []
    store = ckptstore.open(addition)
    alts = {image["alt"] for image in page.images}
    for name in store.analyses:  # every stored result has its figures in the page
        assert any(alt.startswith(f"{name} ") for alt in alts), name
    assert {"metrics", "clusters homogeneity", "embeddings at the chosen step"} <= alts
    # the slider moves through the checkpoints: first and last step, two different frames
    assert page.slider_steps == ["step 0", "step 60"]
    assert page.slider_frames[0] != page.slider_frames[1]
    assert page.screenshot is not None and page.screenshot.std() > 10, "the page shows something"
    assert out.read_text().count("<script") == 2, "self-contained: the frames' data and the slider's few lines"
    assert "http://" not in out.read_text() and "https://" not in out.read_text(), "nothing is fetched"


def test_output_regions_are_the_class_the_mlp_gives_each_point_of_the_plane(sparse: Path) -> None:
    import torch

    from ckpt.analyzers.figures.animation import REGION_GRID, Frames

    store = ckptstore.open(sparse)
    frames = Frames(store)
    assert frames.model is not None, "the sparse modular addition model decodes sequence embeddings"
    step, xlim, ylim = 16, (-1.5, 1.5), (-1.0, 2.0)
    regions = frames.regions(step, xlim, ylim)
    # by hand, from the stored tensors: h = y + W2 gelu(W1 rms(y) + b1) + b2, logits = h E^T
    t = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in store.tensors(step).items()}
    xs, ys = np.linspace(*xlim, REGION_GRID), np.linspace(*ylim, REGION_GRID)
    y = torch.as_tensor(np.stack(np.meshgrid(xs, ys), axis=-1).reshape(-1, 2))
    normed = y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-12)
    hidden = torch.nn.functional.gelu(normed @ t["mlp.fc1.weight"].T + t["mlp.fc1.bias"])
    h = y + hidden @ t["mlp.fc2.weight"].T + t["mlp.fc2.bias"]
    logits = h @ t["embed.weight"].T
    expected = logits.argmax(-1).numpy().reshape(REGION_GRID, REGION_GRID)
    margin = (logits.max(-1).values - logits.min(-1).values).numpy().reshape(REGION_GRID, REGION_GRID)
    clear = margin > 1e-4  # float32 against float64 may differ only where two classes tie
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(regions[clear], expected[clear])


def test_runs_compared_grid_imperfection_against_accuracy_and_sparsity_overlaid(tmp_path: Path) -> None:
    from ckpt import analyze_runs
    from ckpt.sandboxes.modular_addition import ModularAddition

    runs = []
    for decay in (0.0, 1.0):
        path = tmp_path / f"wd{decay}.zarr"
        train(ModularAddition(), path, steps=20, every=10, seed=0, weight_decay=decay)
        run("embedding-geometry", path)
        runs.append(path)
    out = tmp_path / "grids.png"
    result = invoke_ckpt("plot", *map(str, runs), "embedding-geometry", "--out", str(out))
    assert result.returncode == 0, result.stderr
    from ckpt.analyzers.figures.geometry import runs_figure

    figure = runs_figure([str(r) for r in runs])
    check_figure(figure, panels=1)
    points = np.concatenate([c.get_offsets() for c in figure.axes[0].collections])
    for path in runs:
        store = ckptstore.open(path)
        expected = [
            float(store.metrics["test_accuracy"].values[-1]),
            float(store.analysis("embedding-geometry")["grid_imperfection"].values[-1]),
        ]
        assert any(np.allclose(point, expected) for point in points), (path, points)
    refused = run_ckpt("plot", *map(str, runs), "loss", "--out", str(out))
    assert refused.returncode == 2
    assert "compared for embedding-geometry only" in refused.stderr

    sparse_runs = []
    for seed in (0, 1):
        path = tmp_path / f"sparse{seed}.zarr"
        train(SparseModularAddition(), path, steps=8, every=4, seed=seed)
        sparse_runs.append(path)
    combined = analyze_runs("sparsity", sparse_runs, modules="mlp.fc2", capture="input", eps_count=8)
    analyzer = shared_registry().analyzers["sparsity"](modules="mlp.fc2", capture="input", eps_count=8)
    epsilon = analyzer.plot(combined.load(), ckptstore.open(sparse_runs[0]))["epsilon"]
    check_figure(epsilon, panels=1)
    lines = epsilon.axes[0].lines
    assert [line.get_label() for line in lines] == ["seed 0 (step 8)", "seed 1 (step 8)"]
    for line, path in zip(lines, sparse_runs, strict=True):
        stored = ckptstore.open(path).analysis("sparsity")["sparsity"].isel(step=-1, module=0).values
        np.testing.assert_allclose(line.get_ydata(), stored)


def test_log_spaced_runs_get_a_log_step_axis(tmp_path: Path) -> None:
    from ckpt.analyzers.figures import log_spaced

    assert log_spaced([0, 1, 2, 4, 8, 16, 32, 64])
    assert not log_spaced(list(range(0, 200, 10)))
    path = tmp_path / "log.zarr"
    store = train(Addition(), path, steps=64, every=None, log_spaced=True, batch_size=32, **TINY)
    assert log_spaced([int(s) for s in store.steps]), store.steps
    run("loss", path)
    figure = figures_of(path, "loss")["curves"]
    assert all(axes.get_xscale() == "symlog" for axes in figure.axes)


def test_a_damaged_checkpoint_is_named_in_the_report_not_dropped_with_the_slider(sparse: Path, tmp_path: Path) -> None:
    """The report's slider reads every checkpoint: one that cannot be read is a warning and a note in the page."""
    import shutil

    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(sparse, damaged)
    (chunk,) = (damaged / "checkpoints" / "embed.weight").glob("c.2.*")
    chunk.unlink()
    out = tmp_path / "report.html"
    result = invoke_ckpt("report", str(damaged), "--out", str(out))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "embeddings over training" in line]
    assert len(warnings) == 1 and warnings[0].startswith("Warning: embeddings over training: not drawn"), result.stderr
    assert "embed.weight" in warnings[0] and "step 8" in warnings[0], warnings[0]
    page = out.read_text()
    assert "embeddings over training: not drawn" in page and 'id="slider"' not in page
