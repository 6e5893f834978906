"""The conformance kit of objectives, :class:`ObjectiveTests`: import it from :mod:`ckpt.plugins.testing`.

This module imports pytest, so import it from tests only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ckpt.plugins._kit_checks import RegisteredTests, check_description
from ckpt.plugins.objectives import Objective

__all__ = ["ObjectiveTests"]


class ObjectiveTests(RegisteredTests):
    """Base class of an objective's conformance tests (collected only through a ``Test*`` subclass).

    Subclasses implement :meth:`make_batch`; :meth:`reference_loss`
    adds the check that the per-datapoint losses average to the loss training minimises.

    Set :attr:`name` (the objective's registered name) and, while the package is not
    installed, :attr:`plugin`; see :class:`RegisteredTests`.
    """

    kind = "objectives"

    def make_batch(self) -> tuple[Any, Any, Any]:
        """Model outputs, targets and mask (or None) of a batch of at least two examples, as torch tensors.

        Called with torch seeded. Use the shapes the objective is for (``[N, classes]`` logits
        and ``[N]`` targets, ``[N, T, vocab]`` logits and ``[N, T]`` targets ...); a mask, where
        the objective reads one, should leave out some datapoints, so that the checks cover it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement make_batch(self)")

    def reference_loss(self, outputs: Any, targets: Any, mask: Any) -> Any:
        """The scalar loss training minimises on this batch, computed independently (None: not checked).

        For example ``torch.nn.functional.cross_entropy(outputs, targets)``, or a Hugging Face
        model's ``model(ids, labels=ids).loss``.
        """
        return None

    # -- fixtures and helpers ---------------------------------------------------------------
    @pytest.fixture
    def objective(self) -> Objective:
        """The registered objective (its plugin registered when it is not installed)."""
        return self.registered()

    @pytest.fixture
    def batch(self) -> tuple[Any, Any, Any]:
        """:meth:`make_batch`'s outputs, targets and mask, with torch seeded."""
        import torch

        torch.manual_seed(0)
        return self.make_batch()

    @staticmethod
    def datapoints(objective: Objective, targets: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
        """``objective.datapoints`` of torch targets and mask, as numpy arrays."""
        example, position = objective.datapoints(targets.numpy(), None if mask is None else mask.numpy())
        return np.asarray(example), np.asarray(position)

    # -- the tests ------------------------------------------------------------------------------
    def test_metadata(self, objective: Objective) -> None:
        """An :class:`ckpt.plugins.Objective` with callable parts and a one-line description."""
        assert isinstance(objective, Objective), f"{self.name!r} is a {type(objective).__name__}, not an Objective"
        assert callable(objective.losses), "`losses` must be callable"
        assert callable(objective.datapoints), "`datapoints` must be callable"
        check_description(objective.description, f"objective {self.name!r}")

    def test_one_loss_per_datapoint(self, objective: Objective, batch: tuple[Any, Any, Any]) -> None:
        """A finite 1-D loss per datapoint; datapoints are (example, position) pairs in row-major order."""
        import torch

        outputs, targets, mask = batch
        losses = objective.losses(outputs, targets, mask)
        example, position = self.datapoints(objective, targets, mask)
        assert isinstance(losses, torch.Tensor), f"losses must be a tensor, got {type(losses).__name__}"
        assert losses.ndim == 1, f"losses must be 1-D (one per datapoint), got shape {tuple(losses.shape)}"
        assert len(example) == len(position), f"{len(example)} examples but {len(position)} positions"
        assert len(losses) == len(example) > 0, f"{len(losses)} losses for {len(example)} datapoints"
        assert np.issubdtype(example.dtype, np.integer), f"examples must be integers, got {example.dtype}"
        assert np.issubdtype(position.dtype, np.integer), f"positions must be integers, got {position.dtype}"
        assert ((example >= 0) & (example < len(targets))).all(), f"examples outside 0..{len(targets) - 1}"
        positions = targets.shape[1] if targets.ndim > 1 else 0
        assert ((position == -1) | ((position >= 0) & (position < max(positions, 1)))).all(), (
            "positions must be -1 (the whole example) or a position of the targets"
        )
        order = np.lexsort((position, example))
        assert (order == np.arange(len(order))).all(), "datapoints are not in row-major (example, position) order"
        assert torch.isfinite(losses).all(), "losses hold NaN or inf"

    def test_a_block_of_examples_has_its_rows_of_the_losses(
        self, objective: Objective, batch: tuple[Any, Any, Any]
    ) -> None:
        """The engine evaluates examples in blocks: a block's losses and datapoints are the batch's for its examples."""
        import torch

        outputs, targets, mask = batch
        whole = objective.losses(outputs, targets, mask)
        example, position = self.datapoints(objective, targets, mask)
        half = len(targets) // 2
        for start, stop in ((0, half), (half, len(targets))):
            rows = slice(start, stop)
            part_mask = None if mask is None else mask[rows]
            part = objective.losses(outputs[rows], targets[rows], part_mask)
            part_example, part_position = self.datapoints(objective, targets[rows], part_mask)
            selected = (example >= start) & (example < stop)
            where = f"examples {start}..{stop - 1}"
            np.testing.assert_array_equal(part_example + start, example[selected], err_msg=f"{where}: datapoints")
            np.testing.assert_array_equal(part_position, position[selected], err_msg=f"{where}: positions")
            torch.testing.assert_close(part, whole[torch.from_numpy(selected)], msg=f"{where}: losses differ")

    def test_losses_are_deterministic(self, objective: Objective, batch: tuple[Any, Any, Any]) -> None:
        """The same batch gives the same losses, bit for bit (results are cached and compared)."""
        import torch

        first = objective.losses(*batch)
        second = objective.losses(*batch)
        assert torch.equal(first, second), "two calls on the same batch gave different losses"

    def test_each_loss_depends_on_its_example_only_in_float64(
        self, objective: Objective, batch: tuple[Any, Any, Any]
    ) -> None:
        """Gradients flow to the outputs of a datapoint's own example only, and float64 outputs stay float64."""
        import torch

        outputs, targets, mask = batch
        outputs = outputs.detach().double().requires_grad_(True)
        losses = objective.losses(outputs, targets, mask)
        # analyzers run in double precision (--dtype float64): a float32 loss would lose it
        assert losses.dtype == torch.float64, f"float64 outputs gave {losses.dtype} losses"
        example, _ = self.datapoints(objective, targets, mask)
        for index in (0, len(losses) - 1):
            (gradient,) = torch.autograd.grad(losses[index], outputs, retain_graph=True)
            assert torch.isfinite(gradient).all(), f"the gradient of loss {index} is not finite"
            assert gradient[int(example[index])].abs().sum() > 0, f"loss {index} does not depend on its example"
            others = torch.ones(len(outputs), dtype=torch.bool)
            others[int(example[index])] = False
            assert not gradient[others].any(), f"loss {index} depends on other examples than its own"

    def test_mean_is_the_training_loss(self, objective: Objective, batch: tuple[Any, Any, Any]) -> None:
        """The mean of the per-datapoint losses is :meth:`reference_loss`."""
        import torch

        reference = self.reference_loss(*batch)
        if reference is None:
            pytest.skip(f"{type(self).__name__} gives no reference_loss")
        mean = objective.losses(*batch).mean()
        torch.testing.assert_close(mean, torch.as_tensor(reference, dtype=mean.dtype), msg="mean loss differs")
