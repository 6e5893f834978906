"""First-order JVPs through a language model's split head (``ckpt.numerics._head``) against brute force.

The split path computes ⟨∇ℓ(x), b⟩ of every token without the logits' tangents; here it is
checked against per-token gradients from an autograd loop, and against the ordinary JVP, on tiny
Hugging Face models: tied (GPT-2) and untied with a head bias (GPT-J), with the causal-LM and the
masked token objectives, and it must step aside for a model whose logits are not its head's.
"""

from __future__ import annotations

import pytest
import torch

from ckpt.numerics._head import _CHECKED, head_split, split_first_order
from ckpt.numerics.compiled import directional_derivatives
from ckpt.numerics.derivatives import BlockLoss, eager_directional_derivatives, forward_mode
from ckpt.plugins.objectives import CAUSAL_LM, CROSS_ENTROPY, TOKEN_CROSS_ENTROPY
from tests.helpers import tiny_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 61


def gpt2() -> torch.nn.Module:
    return tiny_gpt2(VOCAB, torch.float64)


def gptj() -> torch.nn.Module:
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(0)
    config = GPTJConfig(
        n_layer=1, n_head=2, n_embd=16, rotary_dim=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return GPTJForCausalLM(config).double().eval()


def block(model: torch.nn.Module, objective, mask: bool) -> tuple[BlockLoss, dict, dict]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 9), generator=generator)
    targets = ids.clone()
    targets[1, 4] = -100  # not a datapoint of the causal objective
    selected = (torch.rand(3, 9, generator=generator) > 0.3) if mask else None
    if objective is TOKEN_CROSS_ENTROPY:
        targets = torch.randint(0, VOCAB, (3, 9), generator=generator)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    batch = {"fixed": {}, "inputs": ids, "targets": targets, "mask": selected}
    f = BlockLoss(model, objective.losses, batch, objective.token_rows)
    directions = {name: torch.randn(3, *p.shape, generator=generator, dtype=p.dtype) for name, p in params.items()}
    return f, params, directions


def brute_force(f: BlockLoss, params: dict, directions: dict) -> torch.Tensor:
    """⟨∇ℓ_i, b_k⟩ from one backward pass per datapoint."""
    point = {name: p.clone().requires_grad_(True) for name, p in params.items()}
    losses = f(point)
    rows = []
    for i in range(len(losses)):
        grads = torch.autograd.grad(losses[i], list(point.values()), retain_graph=True, allow_unused=True)
        rows.append(
            torch.stack(
                [
                    sum((g * directions[name][k]).sum() for name, g in zip(point, grads, strict=True) if g is not None)
                    for k in range(3)
                ]
            )
        )
    return torch.stack(rows, 1)


@pytest.mark.parametrize(
    ("build", "objective", "mask"),
    [(gpt2, CAUSAL_LM, False), (gpt2, CAUSAL_LM, True), (gpt2, TOKEN_CROSS_ENTROPY, True), (gptj, CAUSAL_LM, True)],
)
def test_the_split_head_gives_each_tokens_projected_gradient(build, objective, mask) -> None:
    model = build()
    split = head_split(model)
    assert split is not None
    f, params, directions = block(model, objective, mask)
    loss, first, second = directional_derivatives(f, params, directions, order=1)
    assert second is None
    assert _CHECKED[model] is True, "the split passed its check against the model's own losses"
    expected = brute_force(f, params, directions)
    assert first.shape == expected.shape == (3, len(f(params)))
    torch.testing.assert_close(first, expected, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(loss, f(params).detach(), rtol=1e-12, atol=1e-12)
    with forward_mode(composite=False):
        _, ordinary, _ = eager_directional_derivatives(f, params, directions, 1)
    torch.testing.assert_close(first, ordinary, rtol=1e-9, atol=1e-10)


def test_tied_and_biased_heads_are_found_by_every_name() -> None:
    tied = head_split(gpt2())
    assert tied.prefix == "transformer"
    assert set(tied.weights) == {"transformer.wte.weight", "lm_head.weight"} and tied.biases == ()
    untied = head_split(gptj())
    assert untied.weights == ("lm_head.weight",) and untied.biases == ("lm_head.bias",)


def test_a_model_whose_logits_are_not_its_heads_runs_the_ordinary_jvp() -> None:
    model = gpt2()
    model.lm_head.register_forward_hook(lambda module, args, out: 2.0 * out)  # a logit scale the split cannot see
    f, params, directions = block(model, CAUSAL_LM, mask=False)
    _, first, _ = directional_derivatives(f, params, directions, order=1)
    assert _CHECKED[model] is False
    torch.testing.assert_close(first, brute_force(f, params, directions), rtol=1e-9, atol=1e-10)


def test_models_and_objectives_without_a_split_are_left_alone() -> None:
    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm_head = torch.nn.Linear(4, 3)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.lm_head

    assert head_split(Classifier()) is None, "only the listed transformers classes"
    model = gpt2()
    f, params, directions = block(model, CAUSAL_LM, mask=False)
    per_sequence = BlockLoss(model, CROSS_ENTROPY.losses, f.batch)  # no token rows: not a token objective
    assert split_first_order(per_sequence, params, directions) is None
    assert model not in _CHECKED, "nothing was checked: the split was never considered"


def test_compiled_first_order_passes_of_a_split_model_run_the_split() -> None:
    """``compiled=True`` traces no program for them: the plan measured the split pass, not the traced one."""
    from ckpt.numerics.compiled import _PROGRAMS

    model = gpt2()
    f, params, directions = block(model, CAUSAL_LM, mask=False)
    _, first, _ = directional_derivatives(f, params, directions, order=1, compiled=True)
    assert _CHECKED[model] is True
    assert not [key for key in _PROGRAMS if key[0] == id(model)], "no program was traced for this model"
    torch.testing.assert_close(first, brute_force(f, params, directions), rtol=1e-9, atol=1e-10)
