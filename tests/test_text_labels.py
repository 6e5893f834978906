"""Text labels of clusters on a real ``tiny-lm`` run, tagged by a real spaCy pipeline trained here.

No fake tagger: the pipeline is ``spacy.blank("en")`` with a morphologizer
trained for a few epochs on a sample of the UD English Web Treebank bundled in
``tests/data`` (CC BY-SA 4.0; see its header), saved with ``nlp.to_disk`` and
passed as ``--spacy-model PATH``. The labels are checked against a count made
here with the same pipeline and spaCy's own character alignment.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.analyzers.clusters import Clusters
from ckpt.engine.pipeline import run
from ckpt.engine.worker import clear_cache
from ckpt.plugins import AnalysisError
from ckpt.plugins.testing import AnalyzerTests, write_example_run
from tests.helpers import run_ckpt, tree_digest

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

SAMPLE = Path(__file__).with_name("data") / "ud_english_ewt_sample.txt"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TINY = ("--layers", "1", "--d-model", "32", "--heads", "2", "--d-mlp", "64", "--vocab", "256", "--context", "16")
CLUSTERING = {"on": "loss", "min_cluster_size": 15, "delta": 5.0, "tau": 10.0}
MISSING = "xx_ckpt_no_such_pipeline"


def treebank() -> list[tuple[list[str], list[str]]]:
    """(words, UPOS tags) of every sentence of the bundled sample."""
    sentences = []
    for line in SAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pairs = [token.rpartition("_") for token in line.split(" ")]
            sentences.append(([w for w, _, _ in pairs], [t for _, _, t in pairs]))
    return sentences


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A blank English pipeline with a morphologizer trained on the treebank sample, saved to disk."""
    import spacy
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("morphologizer")
    examples = [Example.from_dict(Doc(nlp.vocab, words=w), {"pos": t}) for w, t in treebank()]
    optimizer = nlp.initialize(lambda: examples)
    rng = random.Random(0)
    for _ in range(8):
        rng.shuffle(examples)
        for start in range(0, len(examples), 8):
            nlp.update(examples[start : start + 8], sgd=optimizer)
    path = tmp_path_factory.mktemp("spacy") / "pipeline"
    nlp.to_disk(path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short ``tiny-lm`` run trained by the real CLI: 13 checkpoints, 16 eval windows of 16 tokens."""
    path = tmp_path_factory.mktemp("tiny-lm") / "run.zarr"
    command = ("train", "tiny-lm", str(path), "--steps", "60", "--every", "5", "--eval-sequences", "16", *TINY)
    result = run_ckpt(*command, "--no-progress", extra_env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    return path


def fresh(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run that a test may write into."""
    clear_cache()
    return Path(shutil.copytree(trained, tmp_path / "run.zarr"))


def recount(nlp: Any, data: Any, members: np.ndarray, example: np.ndarray, position: np.ndarray) -> tuple:
    """Tokens and 2-tag POS sequences of ``members``, from the pipeline run here (spaCy's own char alignment)."""
    docs: dict[int, Any] = {}
    tokens, sequences = Counter(), Counter()
    for i in members:
        e, p = int(example[i]), int(position[i])
        text = str(data["text"].values[e])
        doc = docs.setdefault(e, nlp(text))

        def tag(q: int, doc: Any = doc, e: int = e) -> str:
            start, end = int(data["char_start"].values[e, q]), int(data["char_end"].values[e, q])
            return doc.char_span(start, end, alignment_mode="expand")[0].pos_

        start, end = int(data["char_start"].values[e, p]), int(data["char_end"].values[e, p])
        tokens[text[start:end]] += 1
        sequences[" ".join(tag(q) for q in range(max(0, p - 1), p + 1))] += 1
    return tokens, sequences


def top(counter: Counter, k: int) -> list[tuple[str, int]]:
    return sorted(counter.items(), key=lambda item: (-item[1], item[0]))[:k]


def test_the_tagger_learned_the_treebank(pipeline: Path) -> None:
    import spacy

    nlp = spacy.load(pipeline)
    assert nlp.pipe_names == ["morphologizer"]
    right = total = 0
    for words, tags in treebank():
        doc = nlp(" ".join(words))
        if [t.text for t in doc] == words:
            right += sum(t.pos_ == gold for t, gold in zip(doc, tags, strict=True))
            total += len(words)
    assert total > 500 and right / total > 0.9
    doc = nlp("The king said that the golden bird was gone.")
    assert doc[0].pos_ == "DET" and doc[1].pos_ == "NOUN"


def test_clusters_of_a_tiny_lm_run_get_spacy_pos_labels_through_the_cli(
    trained: Path, pipeline: Path, tmp_path: Path
) -> None:
    import spacy

    path = fresh(trained, tmp_path)
    options = f"--on loss --min-cluster-size 15 --delta 5 --tau 10 --spacy-model {pipeline} --scheduler sync"
    analyzed = run_ckpt("analyze", "clusters", str(path), *options.split(), "--no-progress", extra_env=ONE_THREAD)
    assert analyzed.returncode == 0, analyzed.stderr
    shown = run_ckpt("show", str(path), "clusters", extra_env=ONE_THREAD)
    assert shown.returncode == 0, shown.stderr

    result = ckptstore.open(path).analysis("clusters").load()
    found = int(result["clusters"].values[0])
    assert found >= 1, shown.stdout
    assert shown.stdout.count("POS: ") == found and shown.stdout.count("tokens: ") == found
    assert result.sizes["text_rank"] == 5
    for c in range(found):
        size = int(result["size"].values[0, c])
        assert result["top_pos"].values[0, c, 0] and result["top_pos_count"].values[0, c, 0] > 0
        assert result["top_token_count"].values[0, c].sum() <= size
        assert all(len(str(s).split()) in (1, 2) for s in result["top_pos"].values[0, c] if s)

    # the labels of cluster 0, recounted with the same pipeline and spaCy's own alignment
    data = ckptstore.open(path).data("eval")
    example, position = result["example"].values, result["position"].values
    members = np.flatnonzero(result["cluster_label"].values[0] == 0)
    tokens, sequences = recount(spacy.load(pipeline), data, members, example, position)
    stored_pos = list(zip(result["top_pos"].values[0, 0], result["top_pos_count"].values[0, 0], strict=True))
    stored_tokens = list(zip(result["top_token"].values[0, 0], result["top_token_count"].values[0, 0], strict=True))
    assert [(str(s), int(n)) for s, n in stored_pos if s] == top(sequences, 5)
    assert [(str(s), int(n)) for s, n in stored_tokens if s] == top(tokens, 5)
    assert f"POS: {top(sequences, 1)[0][0]!r} {top(sequences, 1)[0][1]}" in shown.stdout
    # the first context is the medoid's own: it ends with its target token in brackets
    medoid = int(result["medoid"].values[0, 0])
    e, p = int(example[medoid]), int(position[medoid])
    word = str(data["text"].values[e])[int(data["char_start"].values[e, p]) : int(data["char_end"].values[e, p])]
    assert str(result["medoid_context"].values[0, 0, 0]).endswith(f"[{word}]")

    # the figure shows each cluster's medoid context, its target token drawn apart (in red)
    from ckpt.plugins.testing import check_figure

    figure = Clusters(**result.ckpt.options).plot(result, ckptstore.open(path))["basis-0"]
    check_figure(figure, panels=2)  # the curves and the exact loss; the contexts panel has no axes
    texts = [t.get_text() for t in figure.axes[2].texts]
    assert texts[0].startswith("0: ") and f"[{word}]" in texts, texts
    highlighted = [t for t in figure.axes[2].texts if t.get_text() == f"[{word}]"]
    assert highlighted[0].get_color() == "red"


def test_a_missing_spacy_model_is_one_error_line_and_the_store_is_unchanged(trained: Path, tmp_path: Path) -> None:
    assert Clusters.option_spec()["spacy_model"].default == "en_core_web_sm"
    path = fresh(trained, tmp_path)
    # the dependency (loss) is not stored: the check comes before it would be computed
    assert "loss" not in ckptstore.open(path).analyses
    before = tree_digest(path)
    options = f"--on loss --spacy-model {MISSING} --no-progress".split()
    result = run_ckpt("analyze", "clusters", str(path), *options, extra_env=ONE_THREAD)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert f"python -m spacy download {MISSING}" in lines[0] and "--spacy-model none" in lines[0]
    assert tree_digest(path) == before
    assert "clusters" not in ckptstore.open(path).analyses
    # so does a label the data lacks, on POLCA (whose basis would take the longest)
    result = run_ckpt("analyze", "clusters", str(path), "--on", "polca", "--label", "nope", extra_env=ONE_THREAD)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("Error: ") and "has no label 'nope'" in result.stderr
    assert tree_digest(path) == before


def test_no_text_labels_with_none_or_without_text(trained: Path, tmp_path: Path) -> None:
    path = fresh(trained, tmp_path)
    result = run("clusters", path, scheduler="sync", spacy_model="none", **CLUSTERING).dataset
    assert "top_pos" not in result and "text_rank" not in result.dims
    # a split without text never needs spaCy, even when the default model is not installed
    mlp = write_example_run(tmp_path / "mlp.zarr", steps=6)
    result = run("clusters", mlp, scheduler="sync", on="loss", min_cluster_size=5).dataset
    assert "top_pos" not in result and result.attrs["ckpt"]["options"]["spacy_model"] == "en_core_web_sm"


def test_bad_text_label_options_are_refused() -> None:
    with pytest.raises(AnalysisError, match="option 'pos_window' of analyzer 'clusters' must be at least 1, got 0"):
        Clusters(pos_window=0)
    with pytest.raises(AnalysisError, match="option 'text_top' of analyzer 'clusters' must be at least 1, got 0"):
        Clusters(text_top=0)


def test_per_token_polca_clusters_get_text_labels(trained: Path, pipeline: Path, tmp_path: Path) -> None:
    path = fresh(trained, tmp_path)
    polca = run("polca", path, scheduler="sync", every=30).dataset
    assert polca.sizes["datapoint"] == 256 and polca.sizes["basis"] == 3
    settings = {**CLUSTERING, "on": "polca", "spacy_model": str(pipeline), "pos_window": 1, "text_top": 3}
    result = run("clusters", path, scheduler="sync", **settings).dataset.load()
    assert result["top_pos"].shape == (3, result.sizes["cluster"], 3)
    assert int(result["clusters"].sum()) >= 1
    for b in range(3):
        for c in range(int(result["clusters"].values[b])):
            assert " " not in str(result["top_pos"].values[b, c, 0]) and result["top_pos"].values[b, c, 0]


class TestClustersOnText(AnalyzerTests):
    """The conformance kit on a text store: the text labels keep the graph lazy and are saved as computed."""

    analyzer_class = Clusters

    @pytest.fixture(autouse=True)
    def _text_run(self, trained: Path, pipeline: Path) -> None:
        self.trained = trained
        self.options = {**CLUSTERING, "spacy_model": str(pipeline)}

    def make_store(self, tmp_path: Path) -> Path:
        return fresh(self.trained, tmp_path)
