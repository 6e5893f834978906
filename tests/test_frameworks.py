"""Runs made by the frameworks' own code, analyzed with no wrapper: a Hugging Face ``Trainer`` and Lightning.

Both train a tiny model for real (a few steps), save checkpoints with the framework's own
checkpointing, and are imported with one ``ckpt import``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import eval_loss, invoke_ckpt, run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # installs packages or starts many ckpt processes

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB, LENGTH = 64, 12


def token_ids(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (count, LENGTH), dtype=np.int64)


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 trained 6 steps by the real ``Trainer``, saving every 2 steps (checkpoint-2, -4, -6)."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    out = tmp_path_factory.mktemp("hf") / "trainer-out"
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=LENGTH + 4)
    ids = torch.as_tensor(token_ids(32, seed=0))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, index: int) -> dict:
            return {"input_ids": ids[index], "labels": ids[index]}

    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=6,
        save_steps=2,
        logging_steps=1,
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    Trainer(model=GPT2LMHeadModel(config), args=arguments, train_dataset=Tokens()).train()
    return out


def test_a_trainer_run_is_imported_and_analyzed_with_no_code(trainer_run: Path, tmp_path: Path) -> None:
    store_path = tmp_path / "gpt2.zarr"
    imported = invoke_ckpt("import", str(trainer_run), str(store_path))
    assert imported.returncode == 0, imported.stderr
    store = ckptstore.open(store_path)
    assert [int(s) for s in store.steps] == [2, 4, 6]
    assert store.model is not None and store.model.factory == "ckpt.plugins.huggingface:build_model"
    assert store.model.config["model_type"] == "gpt2" and store.model.config["n_embd"] == 16
    assert store.objective == "causal-lm"
    # the Trainer's own log, at the checkpoints' steps
    state = json.loads((trainer_run / "checkpoint-6" / "trainer_state.json").read_text())
    logged = {entry["step"]: entry for entry in state["log_history"] if "loss" in entry}
    for name in ("loss", "grad_norm", "learning_rate"):
        np.testing.assert_allclose(store.metrics[name].values, [logged[s][name] for s in (2, 4, 6)])

    ids = token_ids(16, seed=1)
    loss = eval_loss(store_path, ids, tmp_path)
    assert loss.sizes["datapoint"] == 16 * (LENGTH - 1), "every token but the first is predicted"
    assert set(np.unique(loss["position"].values)) == set(range(1, LENGTH))
    from transformers import AutoModelForCausalLM

    for step in (2, 4, 6):
        reference = AutoModelForCausalLM.from_pretrained(trainer_run / f"checkpoint-{step}").eval()
        with torch.no_grad():
            expected = reference(torch.as_tensor(ids), labels=torch.as_tensor(ids)).loss.item()
        np.testing.assert_allclose(float(loss["mean_loss"].sel(step=step)), expected, rtol=1e-5)

    for analyzer, options in (
        ("grad-norms", ()),
        ("polca", ("--every", "2", "--samples", "8", "--second-order", "none")),
    ):
        result = invoke_ckpt("analyze", analyzer, str(store_path), *options, "--no-progress")
        assert result.returncode == 0, result.stderr
    grads = ckptstore.open(store_path).analysis("grad-norms")
    assert np.isfinite(grads["total_grad_norm"].values).all()
    polca = ckptstore.open(store_path).analysis("polca")
    assert np.isfinite(polca["projected_loss"].values).all()


def classifier() -> Any:
    """A LightningModule: a two-layer MLP classifier logging its training loss as ``train_loss``."""
    lightning = pytest.importorskip("lightning")
    from torch import nn

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

        def training_step(self, batch: tuple, index: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Classifier()


def lightning_run(folder: Path, steps: int = 20, every: int = 5) -> Path:
    """A Lightning ``ModelCheckpoint`` run whose file names hold the loss after the step (the trap)."""
    lightning = pytest.importorskip("lightning")
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16)
    saver = lightning.pytorch.callbacks.ModelCheckpoint(
        dirpath=folder, filename="model-{step:06d}-{train_loss:.2f}", every_n_train_steps=every, save_top_k=-1
    )
    trainer = lightning.Trainer(
        max_steps=steps,
        callbacks=[saver],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(classifier(), data)
    return folder


def test_lightning_checkpoints_are_imported_at_their_own_global_step(tmp_path: Path) -> None:
    folder = lightning_run(tmp_path / "lightning")
    names = sorted(p.name for p in folder.iterdir())
    assert names[0].startswith("model-step=000005-train_loss=") and names[0].endswith(".ckpt"), names
    store_path = tmp_path / "run.zarr"
    imported = invoke_ckpt("import", str(folder), str(store_path))
    assert imported.returncode == 0, imported.stderr
    store = ckptstore.open(store_path)
    assert [int(s) for s in store.steps] == [5, 10, 15, 20], "the global_step in each file, in order"
    for step in (5, 10, 15, 20):
        (path,) = folder.glob(f"model-step={step:06d}-*.ckpt")
        saved = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        for name, tensor in saved.items():
            np.testing.assert_array_equal(store.tensors(step, [name])[name], tensor.numpy())


def test_a_name_that_disagrees_with_the_recorded_step_or_two_files_of_one_step_are_errors(tmp_path: Path) -> None:
    import shutil

    folder = lightning_run(tmp_path / "lightning", steps=10, every=5)
    first = next(folder.glob("model-step=000005-*.ckpt"))
    renamed = folder / "model-step=000007-train_loss=0.50.ckpt"
    shutil.copy(first, renamed)
    result = run_ckpt("import", str(folder), str(tmp_path / "a.zarr"))
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ") and "000007" in result.stderr and "global_step 5" in result.stderr
    assert not (tmp_path / "a.zarr").exists()
    renamed.unlink()
    shutil.copy(first, folder / "copy.ckpt")
    result = run_ckpt("import", str(folder), str(tmp_path / "b.zarr"))
    assert result.returncode == 1
    assert "both have step 5" in result.stderr, result.stderr
    assert not (tmp_path / "b.zarr").exists()


def test_ambiguous_names_are_not_guessed_and_skipped_files_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    weights = {"w": torch.ones(2)}
    torch.save(weights, folder / "ckpt-3-of-run7_epoch12.pt")
    result = run_ckpt("import", str(folder), str(tmp_path / "a.zarr"))
    assert result.returncode == 1
    assert "3, 7, 12" in result.stderr and "--step-pattern" in result.stderr, result.stderr
    (folder / "ckpt-3-of-run7_epoch12.pt").unlink()
    torch.save(weights, folder / "step_100.pt")
    torch.save({"model": weights, "global_step": 200}, folder / "late.pt")
    (folder / "notes.txt").write_text("lr 0.1")
    (folder / "hparams.yaml").write_text("lr: 0.1")
    before = tree_digest(folder)
    result = invoke_ckpt("import", str(folder), str(tmp_path / "b.zarr"))
    assert result.returncode == 0, result.stderr
    assert [int(s) for s in ckptstore.open(tmp_path / "b.zarr").steps] == [100, 200]
    assert "Warning: skipped 2 files that are not torch checkpoints: hparams.yaml, notes.txt" in result.stderr
    assert tree_digest(folder) == before


def test_text_data_is_added_with_the_run_s_tokenizer(trainer_run: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "king", "said", "that", "a", "golden", "bird", "was", "gone", "and", "queen", "saw", "it"]
    vocab = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(tmp_path / "tokenizer")
    lines = ["the king said that the golden bird was gone", "", "a queen saw it"]
    (tmp_path / "text.txt").write_text("\n".join(lines))

    store_path = tmp_path / "gpt2.zarr"
    assert invoke_ckpt("import", str(trainer_run), str(store_path)).returncode == 0
    added = invoke_ckpt(
        "data", "add", str(store_path), "text", "--text", str(tmp_path / "text.txt"),
        "--tokenizer", str(tmp_path / "tokenizer"), "--length", "8",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    data = ckptstore.open(store_path).data("text")
    assert list(data["text"].values) == [lines[0], lines[2]], "one example per non-empty line"
    assert data["mask"].values.sum(axis=1).tolist() == [8, 4], "truncated to --length, padding masked out"
    analyzed = invoke_ckpt("analyze", "loss", str(store_path), "--split", "text", "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    loss = ckptstore.open(store_path).analysis("loss")
    assert loss.sizes["datapoint"] == (8 - 1) + (4 - 1), "every kept token but each line's first"
    assert "2 examples, 10 datapoints of objective 'causal-lm'" in added.stdout, "what loss then scores"
    ids = np.where(data["mask"].values, data["inputs"].values, 0)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(trainer_run / "checkpoint-6").eval()
    labels = np.where(data["mask"].values, ids, -100)
    with torch.no_grad():
        expected = reference(torch.as_tensor(ids), labels=torch.as_tensor(labels)).loss.item()
    np.testing.assert_allclose(float(loss["mean_loss"].sel(step=6)), expected, rtol=1e-5)


def test_the_trainer_callback_writes_a_store_while_training(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from ckpt.store.huggingface import CkptCallback

    torch.manual_seed(0)
    ids = token_ids(16, seed=0)
    eval_ids = token_ids(8, seed=1)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, index: int) -> dict:
            return {"input_ids": torch.as_tensor(ids[index]), "labels": torch.as_tensor(ids[index])}

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=LENGTH + 4))
    store_path = tmp_path / "live.zarr"
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=5, save_steps=2, logging_steps=1, per_device_train_batch_size=8,
        report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
    )  # fmt: skip
    callback = CkptCallback(str(store_path), every=2, data={"eval": {"inputs": eval_ids}})
    trainer = Trainer(model=model, args=arguments, train_dataset=Tokens(), callbacks=[callback])
    trainer.train()

    store = ckptstore.open(store_path)
    assert [int(s) for s in store.steps] == [0, 2, 4, 5], "initial weights, every 2 steps, and the end"
    assert store.objective == "causal-lm" and store.model.factory == "ckpt.plugins.huggingface:build_model"
    for step in (2, 4):  # the same weights the Trainer saved itself at those steps
        from safetensors.torch import load_file

        saved = load_file(tmp_path / "out" / f"checkpoint-{step}" / "model.safetensors")
        for name, tensor in saved.items():
            np.testing.assert_array_equal(store.tensors(step, [name])[name], tensor.numpy())
    logged = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    metrics = store.metrics
    for step in (1, 2, 3, 4, 5):
        np.testing.assert_allclose(float(metrics["loss"].sel(step=step)), logged[step]["loss"])
    analyzed = invoke_ckpt("analyze", "loss", str(store_path), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr
    final = ckptstore.open(store_path).analysis("loss")["mean_loss"].sel(step=5)
    with torch.no_grad():
        model.eval()
        expected = model(torch.as_tensor(eval_ids), labels=torch.as_tensor(eval_ids)).loss.item()
    np.testing.assert_allclose(float(final), expected, rtol=1e-5)


def test_the_lightning_callback_writes_a_store_while_training(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")

    from ckpt.store.lightning import CkptCallback

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    store_path = tmp_path / "live.zarr"
    callback = CkptCallback(
        str(store_path), every=5, objective="cross-entropy", data={"eval": {"inputs": x.numpy(), "targets": y.numpy()}}
    )
    saver = lightning.pytorch.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpts", filename="{step}", every_n_train_steps=5, save_top_k=-1
    )
    module = classifier()
    trainer = lightning.Trainer(
        max_steps=12, callbacks=[callback, saver], logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(module, data)
    store = ckptstore.open(store_path)
    assert [int(s) for s in store.steps] == [0, 5, 10, 12]
    for step in (5, 10):  # what Lightning's own ModelCheckpoint saved at the same steps
        saved = torch.load(tmp_path / "ckpts" / f"step={step}.ckpt", weights_only=True)["state_dict"]
        for name, tensor in saved.items():
            np.testing.assert_array_equal(store.tensors(step, [name])[name], tensor.numpy())
    final = store.tensors(12)
    for name, tensor in module.state_dict().items():
        np.testing.assert_array_equal(final[name], tensor.numpy())
    assert np.isfinite(store.metrics["train_loss"].sel(step=[5, 10, 12]).values).all()
    assert store.data("eval").attrs["examples"] == 64
