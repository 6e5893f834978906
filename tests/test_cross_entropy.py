"""The cross-entropy of Hessian-vector products (ckpt.numerics.cross_entropy) against torch's own and brute force."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ckpt.numerics.cross_entropy import TokenCrossEntropy, differentiated_twice, use_twice_differentiable
from ckpt.numerics.derivatives import MeanLossHessian
from ckpt.plugins.objectives import IGNORE_INDEX, _causal_lm


def test_values_gradients_and_second_derivatives_equal_torch_and_finite_differences() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    labels = torch.tensor([0, 6, 3, 3, 1])
    torch.testing.assert_close(
        TokenCrossEntropy.apply(logits, labels), F.cross_entropy(logits, labels, reduction="none"), rtol=0, atol=1e-15
    )
    # first and second derivatives against central finite differences (torch.autograd's checks)
    assert torch.autograd.gradcheck(lambda z: TokenCrossEntropy.apply(z, labels), (logits,))
    assert torch.autograd.gradgradcheck(lambda z: TokenCrossEntropy.apply(z, labels), (logits,))
    # and against torch's own double backward, with a weight per row as the objectives give
    weights = torch.rand(5, dtype=torch.float64, generator=generator)
    direction = torch.randn(5, 7, dtype=torch.float64, generator=generator)

    def hvp(function) -> torch.Tensor:
        (gradient,) = torch.autograd.grad((function(logits, labels) * weights).sum(), logits, create_graph=True)
        (product,) = torch.autograd.grad(gradient, logits, grad_outputs=direction)
        return product

    ours = hvp(TokenCrossEntropy.apply)
    torch.testing.assert_close(ours, hvp(lambda z, y: F.cross_entropy(z, y, reduction="none")), rtol=1e-12, atol=1e-15)
    assert float(ours.abs().max()) > 1e-3  # not a vanishing product


def test_the_twice_differentiable_path_is_scoped_to_its_context() -> None:
    assert not use_twice_differentiable()
    with differentiated_twice():
        assert use_twice_differentiable()
    assert not use_twice_differentiable()


def test_hessian_vector_products_of_a_causal_lm_equal_its_explicit_hessian() -> None:
    """A 1-layer GPT-2 (float64) through ckpt's causal-LM objective, with masked and ignored tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=1, n_embd=4, vocab_size=9, n_positions=6, attn_implementation="eager")
    model = GPT2LMHeadModel(config).double().eval()
    inputs = torch.randint(0, 9, (3, 6))
    targets = inputs.clone()
    targets[1, 4] = IGNORE_INDEX
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 1] = False
    # a share of the parameters keeps the explicit Hessian small: the last block and the final norm
    names = [n for n, _ in model.named_parameters() if n.startswith(("transformer.h.0.mlp", "transformer.ln_f"))]
    fixed = {n: p.detach() for n, p in model.named_parameters() if n not in names}
    primal = {n: dict(model.named_parameters())[n].detach() for n in names}

    def losses(params):
        outputs = torch.func.functional_call(model, {**fixed, **params}, (inputs,))
        return _causal_lm(outputs, targets, mask)

    sizes = [p.numel() for p in primal.values()]
    flat = torch.cat([p.reshape(-1) for p in primal.values()])

    def unflatten(vector):
        parts = torch.split(vector, sizes)
        return {name: part.view(p.shape) for (name, p), part in zip(primal.items(), parts, strict=True)}

    count = len(losses(primal))
    assert count == 3 * 5 - 2  # two of the 15 predictions are left out
    # brute force, with torch's own cross-entropy: the context is not active here
    hessian = torch.autograd.functional.hessian(lambda v: losses(unflatten(v)).mean(), flat)
    direction = torch.randn(len(flat), dtype=torch.float64)
    product = MeanLossHessian([(losses, 1.0 / count)], primal)(unflatten(direction))
    flat_product = torch.cat([product[n].reshape(-1) for n in primal])
    np.testing.assert_allclose(flat_product.numpy(), (hessian @ direction).numpy(), rtol=1e-9, atol=1e-13)
