"""Any architecture transformers loads is analyzable: tiny models of each family, saved as the Hub has them.

Each model is built with random weights, saved with ``save_pretrained`` (a ``Trainer``-style
``checkpoint-N/`` folder) or as a plain safetensors file under the keys the Hub's checkpoints
have (GPTNeoX's ``embed_out.weight``: every Pythia checkpoint), imported with the real ``ckpt
import``, and analyzed with ``ckpt analyze loss``: the loss of every token is the model's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.errors import ImportFormatError, ModelConfigError
from ckpt.store.importers import HF_FACTORY, import_checkpoints
from tests.helpers import invoke_ckpt, run_ckpt

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from ckpt.store.hf_keys import hf_state_dict  # noqa: E402 - after the skip: it needs transformers

VOCAB, LENGTH, SEQUENCES = 64, 10, 3
SIZE = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
TOKENS = {"vocab_size": VOCAB, "max_position_embeddings": 32, "bos_token_id": 0, "eos_token_id": 0}
GQA = {"num_key_value_heads": 1}  # grouped-query attention, as the Llama family has it

# family -> (configuration class, its settings); every class transformers has is tested
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": VOCAB, "n_positions": 32}),
    "gpt_neox": ("GPTNeoXConfig", {**SIZE, **TOKENS}),  # Pythia
    "olmo": ("OlmoConfig", {**SIZE, **TOKENS}),
    "olmo2": ("Olmo2Config", {**SIZE, **TOKENS}),
    "olmoe": ("OlmoeConfig", {**SIZE, **TOKENS, "num_experts": 4, "num_experts_per_tok": 2}),  # experts merged
    "llama": ("LlamaConfig", {**SIZE, **TOKENS, **GQA}),
    "qwen2": ("Qwen2Config", {**SIZE, **TOKENS, **GQA}),
    "mistral": ("MistralConfig", {**SIZE, **TOKENS, **GQA, "sliding_window": 8}),
}
AVAILABLE = [name for name, (config, _) in FAMILIES.items() if hasattr(transformers, config)]
# (family, how it is saved, dtype): save_pretrained in a Trainer folder, or a file named by its step
# holding what the Hub's Pythia files hold (written here, not by transformers), imported with --model/--config
CASES = [
    *((name, "save_pretrained", "float32") for name in AVAILABLE),
    ("llama", "save_pretrained", "bfloat16"),
    ("gpt_neox", "pythia .safetensors", "float32"),
    ("gpt_neox", "pythia .bin", "float16"),
]


def tiny_model(family: str, dtype: str = "float32") -> Any:
    """A seeded random model of ``family`` (its causal-LM class) in ``dtype``, in eval mode."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_class, settings = FAMILIES[family]
    config = getattr(transformers, config_class)(**settings)
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])(config)
    return model.to(getattr(torch, dtype)).eval()


def save_as_pythia(model: Any, folder: Path, step: int, suffix: str = ".safetensors") -> Path:
    """``folder/step{step}{suffix}`` holding what the Hub's Pythia checkpoints hold, and their config.json.

    Their keys: ``embed_out.weight`` for the head, and the buffers older transformers saved (each
    layer's causal mask, ``masked_bias`` and rotary ``inv_freq``), which transformers now ignores.
    The step revisions of Pythia are float16 ``.bin`` files; later uploads are safetensors.
    """
    from safetensors.torch import save_file

    tensors = {"embed_out.weight" if k == "lm_head.weight" else k: v for k, v in model.state_dict().items()}
    assert "embed_out.weight" in tensors and "lm_head.weight" not in tensors
    for layer in range(model.config.num_hidden_layers):
        attention = f"gpt_neox.layers.{layer}.attention"
        tensors[f"{attention}.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.bool).tril()
        tensors[f"{attention}.masked_bias"] = torch.tensor(-1e9)
        tensors[f"{attention}.rotary_emb.inv_freq"] = model.gpt_neox.rotary_emb.inv_freq.clone()
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"step{step}{suffix}"
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in tensors.items()}, file)
    else:
        torch.save(tensors, file)
    model.config.to_json_file(folder.parent / "config.json")  # beside the folder: not a checkpoint
    return folder


def own_token_losses(model: Any, ids: np.ndarray) -> np.ndarray:
    """Cross-entropy of every token but each sequence's first, from the model's own forward (float32)."""
    reference = model.float()
    with torch.no_grad():
        logits = reference(torch.as_tensor(ids)).logits
    targets = torch.as_tensor(ids)[:, 1:]
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets, reduction="none")
    return losses.double().numpy().reshape(-1)  # example-major, as ckpt orders the datapoints


def ok(*args: str) -> str:
    done = invoke_ckpt(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


# four ckpt processes each: slow, but for the Pythia file, the case of the issue (quick suite included)
PARAMS = [
    pytest.param(*c, marks=() if c[1] == "pythia .safetensors" else pytest.mark.slow, id="-".join(c)) for c in CASES
]


@pytest.mark.parametrize(("family", "saved", "dtype"), PARAMS)
def test_the_loss_of_every_token_is_the_model_s_own(tmp_path: Path, family: str, saved: str, dtype: str) -> None:
    model = tiny_model(family, dtype)
    store = tmp_path / "run.zarr"
    if saved == "save_pretrained":
        model.save_pretrained(tmp_path / "out" / "checkpoint-7")
        ok("import", str(tmp_path / "out"), str(store))
    else:
        src = save_as_pythia(model, tmp_path / "hub" / "steps", 7, suffix=saved.split()[-1])
        config = (tmp_path / "hub" / "config.json").read_text()  # as saved: names its transformers version
        ok("import", str(src), str(store), "--model", HF_FACTORY, "--config", config, "--objective", "causal-lm")
    ids = np.random.default_rng(1).integers(0, VOCAB, (SEQUENCES, LENGTH))
    np.save(tmp_path / "ids.npy", ids)
    ok("data", "add", str(store), "eval", "--inputs", str(tmp_path / "ids.npy"))
    ok("analyze", "loss", str(store), "--no-progress")
    assert "OK" in ok("verify", str(store)), "the model spec is checked against the checkpoints too"

    opened = ckptstore.open(store)
    expected = {name for name, _ in model.named_parameters()}  # tied parameters once, under their first name
    assert set(opened.tensor_names) == expected
    stored = opened.tensors(7, framework="torch")
    for name, tensor in model.state_dict().items():
        if name in stored:
            assert stored[name].dtype == tensor.dtype and torch.equal(stored[name], tensor), name
    loss = opened.analysis("loss").load()
    assert loss["position"].values.tolist() == list(range(1, LENGTH)) * SEQUENCES
    tolerance = {"rtol": 1e-5, "atol": 1e-6}
    np.testing.assert_allclose(loss["loss"].sel(step=7).values, own_token_losses(model, ids), **tolerance)


# -- the conversion itself: ties, ignored keys, refusals (no process) -----------------------------------
def gpt2_checkpoint() -> tuple[dict[str, Any], dict[str, Any], Any]:
    model = tiny_model("gpt2")
    tensors = {k: v.clone() for k, v in model.state_dict().items()}  # lm_head.weight and wte both
    return model.config.to_dict(), tensors, model


def test_a_tied_weight_is_stored_once_under_its_first_name() -> None:
    config, tensors, model = gpt2_checkpoint()
    assert torch.equal(tensors["lm_head.weight"], tensors["transformer.wte.weight"])
    converted = hf_state_dict(config, tensors)
    assert "lm_head.weight" not in converted and set(converted) == {n for n, _ in model.named_parameters()}
    head_only = {k: v for k, v in tensors.items() if k != "transformer.wte.weight"}
    assert torch.equal(hf_state_dict(config, head_only)["transformer.wte.weight"], tensors["lm_head.weight"])


def test_a_broken_tie_is_refused() -> None:
    config, tensors, _ = gpt2_checkpoint()
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    with pytest.raises(ModelConfigError, match=r"different tensors for 'transformer\.wte\.weight' and 'lm_head"):
        hf_state_dict(config, tensors)


def test_what_transformers_ignores_is_dropped_and_a_base_model_s_keys_get_the_prefix() -> None:
    config, tensors, model = gpt2_checkpoint()
    # a GPT2Model's checkpoint (no "transformer." prefix, no head), with the causal mask old GPT-2 files hold
    base = {k.removeprefix("transformer."): v for k, v in tensors.items() if k != "lm_head.weight"}
    base["h.0.attn.bias"] = torch.ones(1, 1, 32, 32)
    converted = hf_state_dict(config, base)
    assert set(converted) == {n for n, _ in model.named_parameters()}
    assert all(torch.equal(converted[k], tensors[k]) for k in converted)


def test_the_dtype_is_kept() -> None:
    model = tiny_model("gpt_neox", "bfloat16")
    tensors = {"embed_out.weight" if k == "lm_head.weight" else k: v for k, v in model.state_dict().items()}
    converted = hf_state_dict(model.config.to_dict(), tensors)
    assert converted["lm_head.weight"].dtype == torch.bfloat16
    assert converted["lm_head.weight"] is tensors["embed_out.weight"], "renamed, not copied"


def test_keys_that_still_do_not_fit_are_named_on_both_sides() -> None:
    config, tensors, _ = gpt2_checkpoint()
    tensors["transformer.final_norm.weight"] = tensors.pop("transformer.ln_f.weight")
    tensors["transformer.h.0.mlp.c_fc.bias"] = torch.zeros(5)
    with pytest.raises(ModelConfigError) as raised:
        hf_state_dict(config, tensors)
    message = str(raised.value)
    assert "\n" not in message and "GPT2LMHeadModel" in message
    assert "the checkpoint lacks" in message and "'transformer.ln_f.weight'" in message, message
    assert "the model lacks" in message and "'transformer.final_norm.weight'" in message, message
    assert "transformer.h.0.mlp.c_fc.bias [5] (the model's [64])" in message, message


def test_a_config_naming_code_is_refused_before_any_model_is_built() -> None:
    config, tensors, _ = gpt2_checkpoint()
    with pytest.raises(ModelConfigError, match="'auto_map'"):
        hf_state_dict({**config, "auto_map": {"AutoModelForCausalLM": "evil.Evil"}}, tensors)


# -- through the importer: a mismatch is one Error line, an appended checkpoint is converted too ---------
def test_a_checkpoint_that_does_not_fit_its_config_is_one_error_line(tmp_path: Path) -> None:
    model = tiny_model("llama")
    folder = tmp_path / "out" / "checkpoint-1"
    model.save_pretrained(folder)
    from safetensors.torch import save_file

    save_file({k: v for k, v in model.state_dict().items() if "layers.0.mlp" not in k}, folder / "model.safetensors")
    done = run_ckpt("import", str(tmp_path / "out"), str(tmp_path / "run.zarr"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert "checkpoint-1" in lines[0] and "'model.layers.0.mlp.down_proj.weight'" in lines[0], lines[0]
    assert "was not created" in lines[0] and not (tmp_path / "run.zarr").exists()


def test_appending_to_a_pythia_run_converts_the_new_checkpoints(tmp_path: Path) -> None:
    model = tiny_model("gpt_neox")
    src = save_as_pythia(model, tmp_path / "hub" / "steps", 1)
    options = {"model": HF_FACTORY, "config": json.loads((tmp_path / "hub" / "config.json").read_text())}
    import_checkpoints(src, tmp_path / "run.zarr", **options)
    with torch.no_grad():
        model.gpt_neox.embed_in.weight.add_(1.0)
    save_as_pythia(model, src, 2)
    report = import_checkpoints(src, tmp_path / "run.zarr", **options)
    assert report.appended and report.steps == [2]
    store = ckptstore.open(tmp_path / "run.zarr")
    assert "lm_head.weight" in store.tensor_names and "embed_out.weight" not in store.tensor_names
    np.testing.assert_array_equal(
        store.tensors(2)["gpt_neox.embed_in.weight"], model.gpt_neox.embed_in.weight.detach().numpy()
    )
    bad = {**options, "config": {**options["config"], "auto_map": {"AutoModel": "evil.Evil"}}}
    with pytest.raises(ImportFormatError, match=r"step1\.safetensors.*'auto_map'"):
        import_checkpoints(src, tmp_path / "other.zarr", **bad)


@pytest.mark.skipif("olmoe" not in AVAILABLE, reason="this transformers has no OLMoE")
def test_experts_are_merged_as_transformers_merges_them_and_a_missing_one_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = tiny_model("olmoe")
    model.save_pretrained(tmp_path)
    config, tensors = model.config.to_dict(), load_file(tmp_path / "model.safetensors")
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in tensors, "the Hub's layout: one tensor per expert"
    converted = hf_state_dict(config, tensors)
    assert all(torch.equal(converted[k], v) for k, v in model.state_dict().items())
    lacking = {k: v for k, v in tensors.items() if ".experts.3." not in k}
    with pytest.raises(ModelConfigError, match=r"experts\.gate_up_proj \[3, 64, 16\] \(the model's \[4, 64, 16\]\)"):
        hf_state_dict(config, lacking)
