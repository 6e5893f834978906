"""``ckpt demo`` end to end on a short real run: the analyses it runs and the tables it prints."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # repro, bench and demo scripts end to end at small sizes

SMALL = ("--steps", "400", "--every", "100", "--samples", "128")
"""A smaller run than the default preset's (2,000 steps, a checkpoint every 40, 640 Hessian samples)."""


def _row(out: str, method: str) -> list[str]:
    """The cells after ``method`` on its Table-3 line."""
    table = out[out.index("carry homogeneity of the best clusters") :]
    lines = [line for line in table.splitlines() if re.match(re.escape(method) + r"\s+[-0-9]", line.strip())]
    assert len(lines) == 1, out
    return lines[0].strip()[len(method) :].split()


def test_demo_prints_table_3_of_its_own_clusters(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    # 400 steps: 5 checkpoints, basis vectors found at steps 0 and 400 from 128 problems, 4 POLCA transitions
    result = run_ckpt("demo", str(folder), *SMALL, "--device", "cpu", timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    store = ckptstore.open(folder / "addition.zarr")
    assert [int(s) for s in store.steps] == list(range(0, 401, 100))
    assert {"loss", "hessian-basis", "polca", "fisher", "clusters"} <= set(store.analyses)
    # the three clusterings of Table 3 are kept side by side
    for name, on in (("clusters-loss", "loss"), ("clusters-fisher", "fisher"), ("clusters", "polca")):
        assert store.analysis(name).ckpt.option("on") == on, name
    polca = store.analysis("polca")
    assert polca.attrs["ckpt"]["options"]["second_order"] == "none"
    assert store.analysis("hessian-basis").ckpt.option("samples") == 128
    assert polca.sizes["basis"] == 2

    # the stored clusters are the POLCA ones; recompute their carry homogeneities from the labels
    clusters = store.analysis("clusters").load()
    assert clusters.attrs["ckpt"]["options"]["on"] == "polca"
    data = store.data("eval")
    example, position = clusters["example"].values, clusters["position"].values
    carry = data["carry"].values[example, position]
    place = data["place"].values[example, position]
    found = []
    for b in range(clusters.sizes["basis"]):
        labels = clusters["cluster_label"].values[b]
        for c in range(int(clusters["clusters"].values[b])):
            members = labels == c
            found.append(carry[members].mean())
            shares = [np.mean(place[members] == k) for k in range(4)]
            np.testing.assert_allclose(clusters["place_share"].values[b, c], shares)
    assert found, "the POLCA clusters of this run are what the table reports"
    expected = sorted(found, reverse=True)[:3]
    cells = _row(out, "POLCA (first order)")
    printed = [float(v) for v in cells[:3] if v != "-"]
    np.testing.assert_allclose(printed, np.round(expected, 3), atol=5e-4)
    for method in ("exact loss", "Fisher"):
        assert _row(out, method), method
    assert "0.973 0.946 0.903" in out, "the paper's figures are printed next to ours"
    assert "final answer-token accuracy" in out
    # trained on pinned kernels, recorded in the store
    assert "CPU kernels: DEFAULT (pinned" in out and store.attrs["cpu_kernels"] == "DEFAULT/2 threads"
    # the verdict says what this run shows, from its own numbers
    rows = {m: _row(out, m) for m in ("exact loss", "Fisher", "POLCA (first order)")}
    for column, what in ((3, "restricted to the 10s/100s"), (0, "over all clusters")):
        best = [float(c[column]) if len(c) > column and c[column] != "-" else 0.0 for c in rows.values()]
        holds = "holds" if best[2] > best[1] > best[0] else "does not hold"
        assert f"this run, {what}: POLCA > Fisher > exact loss {holds} " in out, (what, best)
    tokens = store.analysis("loss")
    receives = np.isin(data["place"].values[tokens["example"].values, tokens["position"].values], (1, 2))
    base_rate = data["carry"].values[tokens["example"].values, tokens["position"].values][receives].mean()
    assert f"{base_rate:.3f} of the 10s/100s tokens receive a carry" in out
    assert "no configuration searched at CPU scale made it hold" in out

    # the demo ends with its report: every figure loads in a real browser, and the slider moves
    from tests.browser import open_report

    page_path = folder / "report.html"
    assert f"report with every figure: {page_path}" in out
    page = open_report(page_path, tmp_path / "demo-report.png")
    assert page.console_errors == []
    assert [image["alt"] for image in page.images if not image["loaded"]] == []
    alts = {image["alt"] for image in page.images}
    for name in store.analyses:
        assert any(alt.startswith(f"{name} ") for alt in alts), name
    assert "clusters homogeneity" in alts, "the three clusterings compared side by side"
    assert page.slider_steps == ["step 0", "step 400"]
    assert page.slider_frames[0] != page.slider_frames[1]

    # --seeds: one demo per seed in DIR/seed-S, then the spread; the seed-0 run is reused from above
    seeds = tmp_path / "seeds"
    shutil.copytree(folder, seeds / "seed-0")
    spread = run_ckpt("demo", str(seeds), "--seeds", "0-0", *SMALL, "--device", "cpu", timeout=600)
    assert spread.returncode == 0, spread.stderr
    assert "== seed 0 ==" in spread.stdout and "using the run already in" in spread.stdout
    best = {method: _row(spread.stdout, method) for method in ("exact loss", "Fisher", "POLCA (first order)")}
    table = spread.stdout[spread.stdout.index("best carry homogeneity per seed") :]
    line = next(x for x in table.splitlines() if x.strip().startswith("0  "))
    for method, cells in best.items():  # the per-seed line holds each method's best, all / restricted
        restricted_best = cells[3] if len(cells) > 3 and cells[3] != "-" else "-"
        assert f"{cells[0] if cells[0] != '-' else '-'} / " in line, (method, line)
        assert restricted_best in line
    values = [float(c[0]) if c[0] != "-" else 0.0 for c in best.values()]
    holds = int(values[2] > values[1] > values[0])
    assert f"POLCA > Fisher > exact loss on {holds} of 1 seeds" in spread.stdout

    # the run in DIR is reused only for the same preset and seed; another seed is refused, untouched
    before = tree_digest(folder)
    refused = run_ckpt("demo", str(folder), "--seed", "1")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("Error: ") and "holds a run with seed 0" in refused.stderr
    assert tree_digest(folder) == before
    # nor with other kernels: a run on this CPU's own kernels trains other weights
    refused = run_ckpt("demo", str(folder), "--fast-kernels")
    assert refused.returncode == 1 and "holds a run with cpu_kernels DEFAULT/2 threads" in refused.stderr
    assert tree_digest(folder) == before


def test_demo_refuses_a_file_as_its_folder(tmp_path: Path) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("keep me")
    result = run_ckpt("demo", str(taken))
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: cannot use") and result.stderr.count("\n") == 1, result.stderr
    assert taken.read_text() == "keep me"
