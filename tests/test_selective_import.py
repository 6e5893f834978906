"""``ckpt import --tensors GLOB --steps SPEC``: a subset of a run, from a folder or the Hub, checked and explained.

A tiny GPTNeoX (Pythia's architecture) is saved by transformers, as ``Trainer`` ``checkpoint-N``
folders and as ``stepN`` branches of a local Hub cache laid out as huggingface_hub lays it out
(nothing downloads: ``HF_HUB_OFFLINE=1``). The real ``ckpt`` command imports only the embeddings
and some steps; ``ckpt info`` says so, ``ckpt verify`` compares the stored subset with the model,
an analyzer reading only the embeddings runs, and one needing the whole model names what is missing.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.store.importers import HF_FACTORY
from tests.helpers import assert_refused, run_ckpt, tree_digest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tests.test_hub_import import add_revision, offline_hub  # noqa: E402 - after the skips: it needs torch

VOCAB = 64
CONFIG = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 32,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
EMBED = "gpt_neox.embed_in.weight"


def neox(step: int) -> Any:
    """The tiny GPTNeoX at ``step``: seeded, its weights moved by ``step``."""
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**CONFIG)).eval()
    generator = torch.Generator().manual_seed(step + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * step * torch.randn(parameter.shape, generator=generator))
    return model


def saved(step: int) -> dict[str, bytes]:
    """What ``save_pretrained`` writes for the model at ``step``: name -> bytes."""
    with tempfile.TemporaryDirectory() as folder:
        neox(step).save_pretrained(folder)
        return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Trainer output folder: ``checkpoint-{1,2,3}/`` saved by transformers."""
    folder = tmp_path_factory.mktemp("trainer") / "run"
    for step in (1, 2, 3):
        neox(step).save_pretrained(folder / f"checkpoint-{step}")
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``hf://org/neox`` in a local Hub cache (branches step0, step1, step2, step4), offline for every ``ckpt``."""
    with offline_hub(tmp_path_factory.mktemp("hf-home")) as cache:
        for step in (0, 1, 2, 4):
            add_revision(cache, "org/neox", f"step{step}", saved(step))
        yield "hf://org/neox"


def ok(*args: str) -> str:
    done = run_ckpt(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(*args: str) -> str:
    """``ckpt ARGS`` fails with exactly one ``Error:`` line, which is returned."""
    done = run_ckpt(*args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


def all_tensors() -> int:
    return len(neox(0).state_dict())


@pytest.mark.slow
def test_a_folder_imports_the_selected_tensors_and_steps_and_verifies(run: Path, tmp_path: Path) -> None:
    store = tmp_path / "embed.zarr"
    out = ok("import", str(run), str(store), "--tensors", "gpt_neox.embed_in.*", "--steps", "1,3-")
    assert f"imported 2 hf checkpoints (steps 1 .. 3), 1 tensors each (of {all_tensors()}" in out

    opened = ckptstore.open(store)
    assert [int(s) for s in opened.steps] == [1, 3] and opened.tensor_names == [EMBED]
    for step in (1, 3):
        stored = opened.tensors(step, framework="torch")[EMBED]
        assert torch.equal(stored, neox(step).state_dict()[EMBED])

    shown = ok("info", str(store), "--no-finite-check")
    assert f"tensors      1 of {all_tensors()} (selected by --tensors 'gpt_neox.embed_in.*')" in shown
    summary = json.loads(ok("info", str(store), "--json", "--no-finite-check"))
    assert summary["selection"]["globs"] == ["gpt_neox.embed_in.*"] and summary["selection"]["subset"] is True
    assert summary["selection"]["tensors"] == 1 and summary["selection"]["of"] == all_tensors()
    # verify compares the stored subset with the model built on meta: OK, and it says it is a subset
    verified = ok("verify", str(store))
    assert "1 tensors (of" in verified and "OK" in verified and "not checked" not in verified

    # the embedding table alone is what embedding-geometry reads; its default finds it in the model on meta
    ok("analyze", "embedding-geometry", str(store), "--no-progress")
    result = ckptstore.open(store).analysis("embedding-geometry").load()
    assert result["step"].values.tolist() == [1, 3] and np.isfinite(result["circularity"].values).all()

    # the loss needs the whole model: one line naming what the selection left out, and the fix
    np.save(tmp_path / "ids.npy", np.random.default_rng(1).integers(0, VOCAB, (2, 8)))
    ok("data", "add", str(store), "eval", "--inputs", str(tmp_path / "ids.npy"))
    expected = "parameter(s) its checkpoints do not hold: 'gpt_neox.layers.0"
    assert_refused(store, "loss", [], expected)
    line = refused("analyze", "loss", str(store), "--no-progress")
    assert "(and " in line and " more)" in line
    assert "the store was imported with --tensors 'gpt_neox.embed_in.*'" in line
    assert "re-import without --tensors, or with globs covering these tensors" in line


@pytest.mark.slow
def test_a_hub_repository_imports_the_selected_tensors_and_steps(hub: str, tmp_path: Path) -> None:
    store = tmp_path / "hub.zarr"
    out = ok("import", hub, str(store), "--tensors", "*embed*", "--steps", "0,2-")
    assert "imported 3 revision(s) of hf://org/neox (steps 0 .. 4" in out and "1 tensors each (of" in out
    opened = ckptstore.open(store)
    assert [int(s) for s in opened.steps] == [0, 2, 4] and opened.tensor_names == [EMBED]
    assert torch.equal(opened.tensors(4, framework="torch")[EMBED], neox(4).state_dict()[EMBED])
    assert opened.attrs["tensor_selection"]["globs"] == ["*embed*"]
    assert "OK" in ok("verify", str(store))

    # a rerun with the same selection has nothing to do; another selection is refused, the store unchanged
    assert "is up to date with hf://org/neox" in ok(
        "import", hub, str(store), "--tensors", "*embed*", "--steps", "0,2-"
    )
    before = tree_digest(store)
    line = refused("import", hub, str(store), "--tensors", "*embed*,*layernorm*")
    assert "was imported with --tensors '*embed*', and this import asks for --tensors '*embed*' --tensors" in line
    assert "a store holds one selection; rerun with --tensors '*embed*', or pass --overwrite" in line
    assert "holds every tensor" not in line
    line = refused("import", hub, str(store))
    assert "and this import asks for every tensor" in line
    assert tree_digest(store) == before


def test_hub_steps_select_revisions_and_a_step_that_matches_none_is_an_error() -> None:
    from ckpt.errors import ImportFormatError
    from ckpt.store.hub import HubListing, Revision, select

    revisions = tuple(Revision(f"step{s}", f"{s:040d}", s) for s in (0, 1, 2, 4))
    listing = HubListing("org/neox", revisions, (), None, offline=True)
    assert [r.step for r in select(listing, steps="1-2")] == [1, 2]
    assert [r.step for r in select(listing, "step*", steps="-1,4")] == [0, 1, 4]
    with pytest.raises(ImportFormatError, match=r"--steps: '3' matches no revision of hf://org/neox; its steps: 0"):
        select(listing, steps="0,3")
    with pytest.raises(ImportFormatError, match="'step1' is not a step or a step range"):
        select(listing, steps="step1")


@pytest.mark.parametrize("where", ["folder", "hub"])
def test_a_glob_that_matches_no_tensor_is_one_error_and_creates_nothing(
    where: str, run: Path, hub: str, tmp_path: Path
) -> None:
    store = tmp_path / "none.zarr"
    src = str(run) if where == "folder" else hub
    line = refused("import", src, str(store), "--tensors", "*embed*,transformer.wte.*")
    assert "--tensors: 'transformer.wte.*' matches no tensor of" in line
    assert f"its tensors: {EMBED}, " in line and "more)" in line
    assert not store.exists()


@pytest.mark.slow
def test_a_folder_rerun_with_another_selection_or_steps_that_match_nothing(run: Path, tmp_path: Path) -> None:
    store = tmp_path / "embed.zarr"
    ok("import", str(run), str(store), "--tensors", "gpt_neox.embed_in.*", "--steps", "1-2")
    before = tree_digest(store)
    line = refused("import", str(run), str(store), "--tensors", "*")
    assert "was imported with --tensors 'gpt_neox.embed_in.*', and this import asks for --tensors '*'" in line
    line = refused("import", str(run), str(store))
    assert "this import asks for every tensor" in line
    line = refused("import", str(run), str(tmp_path / "other.zarr"), "--steps", "7-9")
    assert "--steps: '7-9' matches no checkpoint of" in line and "its steps: 1 .. 3, 3 in all" in line
    assert tree_digest(store) == before and not (tmp_path / "other.zarr").exists()
    # the same selection appends the steps it lacks
    out = ok("import", str(run), str(store), "--tensors", "gpt_neox.embed_in.*")
    assert "appended 1 new hf checkpoints (steps 3 .. 3)" in out
    assert ckptstore.open(store).tensor_names == [EMBED]


@pytest.mark.slow
def test_verify_still_fails_a_selective_store_the_model_does_not_fit(run: Path, tmp_path: Path) -> None:
    store = tmp_path / "embed.zarr"
    ok("import", str(run), str(store), "--tensors", "gpt_neox.embed_in.*,gpt_neox.final_layer_norm.*")
    config = dict(ckptstore.open(store).model.config)
    for other, expected in [
        (config | {"vocab_size": VOCAB + 8}, f"'{EMBED}' of shape [72, 16] (stored [64, 16])"),
        (
            {
                **transformers.GPT2Config(
                    n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0
                ).to_dict()
            },
            "a model without 3 of the tensors",
        ),
    ]:
        writer = ckptstore.open(store, mode="a")
        writer.set_model(HF_FACTORY, {k: v for k, v in other.items() if k not in ("transformers_version", "dtype")})
        writer.close()
        line = refused("verify", str(store))
        assert expected in line, line


def test_the_model_check_of_a_subset_compares_names_shapes_and_kinds_of_dtype() -> None:
    from ckpt.errors import ModelConfigError
    from ckpt.store.reader import ModelSpec
    from ckpt.store.selection import TensorSelection

    config = {**transformers.GPTNeoXConfig(**CONFIG).to_dict()}
    config = {k: v for k, v in config.items() if k not in ("transformers_version", "dtype")}
    selection = TensorSelection(("gpt_neox.embed_in.*",), 20, 10_000, 40_000)
    good = {EMBED: ((VOCAB, 16), VOCAB * 16 * 2, "bfloat16")}  # another width of float: fine
    assert ModelSpec(HF_FACTORY, config, "s", good, selection).check()
    with pytest.raises(ModelConfigError, match=re.escape("parameter(s) its checkpoints do not hold")):
        ModelSpec(HF_FACTORY, config, "s", good).check()  # the same checkpoint, not a selection
    bad = [
        ({EMBED: ((VOCAB, 16), VOCAB * 16 * 8, "int64")}, f"'{EMBED}' is int64 (the model's is float32)"),
        ({EMBED: ((VOCAB + 1, 16), 0, "float32")}, "of shape [64, 16] (stored [65, 16])"),
        ({"extra.weight": ((2,), 8, "float32")}, "a model without 1 of the tensors s holds"),
    ]
    for checkpoint, expected in bad:
        with pytest.raises(ModelConfigError, match=re.escape(expected)):
            ModelSpec(HF_FACTORY, config, "s", checkpoint, selection).check()
    # built to evaluate, a subset names what it lacks and how the store came to lack it
    with pytest.raises(
        ModelConfigError, match=re.escape("the store was imported with --tensors 'gpt_neox.embed_in.*'")
    ):
        ModelSpec(HF_FACTORY, config, "s", good, selection).build()


def test_step_items_and_globs_parse_once_for_every_import() -> None:
    from ckpt.errors import ImportFormatError
    from ckpt.store.selection import parse_globs, select_steps

    assert select_steps("0,1000-5000,100000-", [0, 1, 1000, 3000, 6000, 100000, 143000], "x") == [
        0,
        1000,
        3000,
        100000,
        143000,
    ]
    assert parse_globs(["a.*,b", "a.*"]) == ("a.*", "b") and parse_globs(None) is None
    for spec, expected in [("5-2", "runs backwards"), (",", "names no step"), ("x", "is not a step")]:
        with pytest.raises(ImportFormatError, match=expected):
            select_steps(spec, [1], "x")


def test_the_engine_names_what_a_selection_left_out_when_it_builds_the_model() -> None:
    from ckpt.errors import AnalysisError
    from ckpt.numerics.weightless import weightless_model
    from ckpt.store.selection import TensorSelection

    def build() -> Any:
        return torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))

    selection = TensorSelection(("0.*",), 3)
    with pytest.raises(AnalysisError) as caught:
        weightless_model(build, {"0.weight"}, "cpu", source="s.zarr", selection=selection)
    assert "the model of s.zarr has 2 parameter(s) its checkpoints do not hold: '1.weight', '1.bias'" in str(
        caught.value
    )
    assert "the store was imported with --tensors '0.*'" in str(caught.value)
    with pytest.raises(AnalysisError, match=re.escape("write checkpoints with every parameter")):
        weightless_model(build, {"0.weight"}, "cpu", source="s.zarr")
