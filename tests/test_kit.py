"""The kit itself: its checks catch broken plugins, and an opt-out needs a real check name and a reason."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import dask.array as da
import pytest

from ckpt.plugins.testing import ObjectiveTests, raise_if_dask_computes

BROKEN_PLUGINS = '''
import sys

import numpy as np
import torch
import torch.nn.functional as F

from ckpt.plugins import CROSS_ENTROPY, Analyzer, Importer, Objective, hookimpl
from ckpt.plugins.testing import AnalyzerTests, ImporterTests, ObjectiveTests, write_example_run
from ckpt.store.importers import import_checkpoints


def centred(outputs, targets, mask):
    """Each loss minus the batch mean: a loss that depends on the other examples of the batch."""
    losses = F.cross_entropy(outputs.float() if outputs.dtype != torch.float64 else outputs, targets, reduction="none")
    return losses - losses.mean()


@hookimpl
def ckpt_register_objectives(register):
    register("centred", Objective(centred, CROSS_ENTROPY.datapoints, "cross-entropy minus its batch mean"))


def drop_bias(src, dest, **options):
    """Imports, then writes a store without the bias: an importer that loses a tensor."""
    import ckpt.store as ckptstore

    import_checkpoints(src, str(dest) + ".full", **{**options, "overwrite": True})
    full = ckptstore.open(str(dest) + ".full")
    with ckptstore.create(dest, overwrite=options["overwrite"]) as writer:
        for step in full.steps:
            tensors = full.tensors(int(step))
            tensors.pop("fc.bias")
            writer.write(int(step), tensors)


@hookimpl
def ckpt_register_importers(register):
    register("lossy", Importer("drops fc.bias", drop_bias))


def to_final(worker, step, *, final):
    """Distance of ``step``'s weights to the final checkpoint's: a value every new checkpoint changes."""
    here, there = worker.tensors(step), worker.tensors(final)
    return {"distance": np.array(sum(float(np.sum((here[k] - there[k]) ** 2)) for k in here) ** 0.5)}


class ToFinal(Analyzer):
    """Declared per checkpoint, but measured against a moving reference (it must be per="run")."""

    name = "to-final"
    version = "1"
    description = "Distance of each checkpoint to the final one."

    def compute(self, ctx):
        return ctx.map_checkpoints(to_final, {"distance": ((), np.float64)}, final=int(ctx.store.steps[-1]))


@hookimpl
def ckpt_register_analyzers(register):
    register(ToFinal)


class TestToFinal(AnalyzerTests):
    analyzer_class = ToFinal
    plugin = sys.modules[__name__]

    def make_store(self, tmp_path):
        return write_example_run(tmp_path / "run.zarr", steps=3)


class TestCentred(ObjectiveTests):
    name = "centred"
    plugin = sys.modules[__name__]
    expected_failures = {"test_losses_are_deterministic": "opted out, but it passes"}

    def make_batch(self):
        return torch.randn(6, 4), torch.randint(0, 4, (6,)), None


class TestLossy(ImporterTests):
    name = "lossy"
    plugin = sys.modules[__name__]

    def make_source(self, folder):
        expected = {}
        for step in (0, 1):
            tensors = {"fc.weight": torch.randn(2, 3), "fc.bias": torch.randn(2)}
            torch.save(tensors, folder / f"step_{step}.pt")
            expected[step] = {name: value.numpy() for name, value in tensors.items()}
        return expected
'''


@pytest.mark.slow  # several seconds on its own: CI runs it, the quick suite does not
def test_the_checks_fail_on_broken_plugins_and_a_passing_opt_out_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text(textwrap.dedent(BROKEN_PLUGINS))
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_broken.py"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    outcomes = {
        line.split(" ", 1)[1].split(" ", 1)[0].rsplit("::", 1)[-1]: line.split(" ", 1)[0]
        for line in done.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "XFAIL ", "XPASS ", "SKIPPED ", "ERROR ")) and "::" in line
    }
    assert outcomes == {
        # a loss that depends on the batch: the blocks and the gradients give it away
        "test_a_block_of_examples_has_its_rows_of_the_losses": "FAILED",
        "test_each_loss_depends_on_its_example_only_in_float64": "FAILED",
        "test_losses_are_deterministic": "FAILED",  # XPASS(strict): the opt-out has outlived its reason
        "test_metadata": "PASSED",  # every class
        # an analyzer measured against the final checkpoint, declared per checkpoint
        "test_a_new_checkpoint_computes_only_itself": "FAILED",
        "test_compute_builds_a_lazy_graph": "PASSED",
        "test_run_saves_the_graph_values": "PASSED",
        "test_second_run_reuses_everything": "PASSED",
        "test_result_has_a_step_dim": "PASSED",
        "test_one_loss_per_datapoint": "PASSED",
        # an importer that loses a tensor
        "test_import_holds_the_source_weights": "FAILED",
        "test_the_source_is_left_as_it_was": "PASSED",
        "test_another_runs_store_is_kept_without_overwrite": "PASSED",
    }, done.stdout[-4000:]
    assert "[XPASS(strict)] opted out, but it passes" in done.stdout, done.stdout[-4000:]
    assert "TestCentred gives no reference_loss" in done.stdout, done.stdout[-4000:]  # skipped
    assert "tensors ['fc.weight'], not ['fc.bias', 'fc.weight']" in done.stdout, done.stdout[-4000:]
    assert "'distance' after appending step 3 differs from a full recompute" in done.stdout, done.stdout[-4000:]


def test_an_opt_out_names_a_check_and_gives_a_reason() -> None:
    with pytest.raises(TypeError, match=r"names \['test_one_loss_per_datapiont'\], which are not checks"):
        type("TestTypo", (ObjectiveTests,), {"expected_failures": {"test_one_loss_per_datapiont": "typo"}})
    with pytest.raises(TypeError, match=r"expected_failures\['test_metadata'\] must give the reason"):
        type("TestNoReason", (ObjectiveTests,), {"expected_failures": {"test_metadata": " "}})


def test_raise_if_dask_computes_fails_the_computation_past_its_allowance() -> None:
    ones = da.ones(4, chunks=2)
    with raise_if_dask_computes(allowed=1) as counter:
        assert float(ones.sum().compute()) == 4.0
        with pytest.raises(AssertionError, match="2 Dask computations started where at most 1 were expected"):
            ones.sum().compute()
    assert counter.count == 2
