"""Embedding figures of a language model's store: GPT-2's 50,257-token vocabulary, bounded time and memory.

The store is a real GPT-2 (``transformers``) of GPT-2's vocabulary and a tiny width, written with
the public writer: what ``ckpt report`` meets in a GPT-2 run, at a size a test can build. Drawing
all pair sums of that table needs 75 GiB a frame; the report must draw its most frequent tokens.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import CKPT

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB = 50_257
"""GPT-2's vocabulary."""
LENGTH, PADDED = 64, 16
"""Tokens per eval sequence, the last ``PADDED`` of them padding (masked out)."""
PAD = VOCAB - 1
STEPS = (0, 10, 20)
MEMORY = 2 * 1024**3
"""The report's budget at GPT-2 small (issue 29): peak RSS, and the data-segment limit of the child."""


def _eval_tokens(seed: int = 0, examples: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Zipf-distributed ids over a shuffled vocabulary (the frequent ones are not the first ids), padded.

    The padding id is the commonest id of the array but masked out: it must not be shown.
    """
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, VOCAB + 1)
    ranked = rng.permutation(VOCAB)
    ids = ranked[rng.choice(VOCAB, size=(examples, LENGTH), p=weights / weights.sum())]
    mask = np.ones_like(ids, dtype=bool)
    mask[:, -PADDED:] = False
    ids[~mask] = PAD
    return ids.astype(np.int64), mask


def _gpt2_store(path: Path, *, data: bool = True) -> Path:
    """A GPT-2 with GPT-2's vocabulary, 1 layer of width 32, at ``STEPS`` (weights nudged between them)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from ckpt.store.huggingface import untied_state
    from ckpt.store.importers import HF_FACTORY, hf_model_config
    from ckpt.store.writer import create

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=LENGTH)
    model = GPT2LMHeadModel(config)
    spec = {**config.to_dict(), "architectures": ["GPT2LMHeadModel"]}
    writer = create(path, model=HF_FACTORY, config=hf_model_config(spec), objective="causal-lm", framework="torch")
    if data:
        ids, mask = _eval_tokens()
        writer.add_data("eval", inputs=ids, mask=mask)
    for step in STEPS:
        writer.write(step, untied_state(model))
        writer.log(step, {"loss": 11.0 - step / 10})
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
    writer.close()
    return path


@pytest.fixture(scope="module")
def gpt2_vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _gpt2_store(tmp_path_factory.mktemp("scale") / "gpt2-vocab.zarr")


def _expected_tokens(count: int) -> tuple[np.ndarray, float]:
    """The ``count`` commonest unmasked ids (ties by id) and the share of unmasked tokens they are."""
    ids, mask = _eval_tokens()
    values, counts = np.unique(ids[mask], return_counts=True)
    order = np.lexsort((values, -counts))[:count]
    return values[order], counts[order].sum() / counts.sum()


def _run_report(store: Path, out: Path, logs: Path) -> tuple[int, int, str]:
    """``ckpt report`` in a child whose data segment is limited to ``MEMORY``: (exit code, peak RSS bytes, stderr).

    The limit turns an O(vocabulary²) allocation into a quick MemoryError instead of many GiB of a
    shared machine; ``wait4`` gives this child's own peak RSS (``RUSAGE_CHILDREN`` would mix in
    every earlier child of the test process).
    """

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))

    command = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]
    # one BLAS/OpenMP thread: the limit is on what the report allocates, not on per-core thread pools
    threads = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **threads}
    with (logs / "stdout").open("w") as stdout, (logs / "stderr").open("w") as stderr:
        child = subprocess.Popen(
            [*command, "report", str(store), "--out", str(out)], stdout=stdout, stderr=stderr, env=env, preexec_fn=limit
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return child.returncode, usage.ru_maxrss * 1024, (logs / "stderr").read_text()


def test_report_of_a_gpt2_vocabulary_draws_its_frequent_tokens_in_bounded_memory(
    gpt2_vocabulary: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    code, peak, stderr = _run_report(gpt2_vocabulary, out, tmp_path)
    assert code == 0, stderr
    assert peak < MEMORY, f"peak RSS {peak / 2**30:.2f} GiB"
    page = out.read_text()
    _, share = _expected_tokens(1000)
    said = f"transformer.wte.weight: the 1,000 most frequent tokens in split 'eval' ({share:.0%} of its tokens)"
    assert html.escape(said) in page, "the slider says what it draws"
    payload = re.search(r'<script type="application/json" id="frames">(.*?)</script>', page, re.S)
    frames = json.loads(payload.group(1).replace("<\\/", "</"))
    assert [frame["step"] for frame in frames] == list(STEPS), "a frame per checkpoint"
    from io import BytesIO

    from PIL import Image

    pixels = [np.asarray(Image.open(BytesIO(base64.b64decode(f["png"]))).convert("RGB")) for f in frames]
    assert all(p.std() > 10 for p in pixels), "each frame shows something"
    assert (pixels[0] != pixels[-1]).any(), "the tokens move between checkpoints"


def test_the_view_of_a_large_vocabulary_is_its_most_frequent_tokens_on_their_principal_plane(
    gpt2_vocabulary: Path,
) -> None:
    from ckpt.analyzers.figures.animation import Frames
    from ckpt.analyzers.figures.tokens import FrequentTokensView

    store = ckptstore.open(gpt2_vocabulary)
    frames = Frames(store)
    view = frames.view
    assert isinstance(view, FrequentTokensView)
    expected, _ = _expected_tokens(1000)
    np.testing.assert_array_equal(view.ids, expected)
    assert PAD not in view.ids and not (view.ids < 1000).all(), "frequent, unmasked ids: not the first ids"
    figure = frames.figure()
    drawn = list(frames.frames(figure, [STEPS[-1]]))
    assert drawn == [STEPS[-1]]
    tokens_axes = figure.axes[0]
    assert tokens_axes.get_title().startswith("1,000 tokens")
    rows = store.tensors(STEPS[-1], ["transformer.wte.weight"])["transformer.wte.weight"][expected].astype(np.float64)
    _, _, right = np.linalg.svd(rows - rows.mean(axis=0), full_matrices=False)
    np.testing.assert_allclose(tokens_axes.collections[0].get_offsets(), rows @ right[:2].T, rtol=1e-6, atol=1e-9)
    labels = [text.get_text() for text in tokens_axes.texts]
    assert labels == [str(i) for i in expected[:10]], "the ten commonest tokens are labelled with their ids"


def test_pair_sums_up_to_the_bound_and_frequent_tokens_above_it(gpt2_vocabulary: Path) -> None:
    from ckpt.analyzers.figures import new_figure
    from ckpt.analyzers.figures.geometry import EmbeddingView, embedding_view
    from ckpt.analyzers.figures.tokens import PAIR_SUM_MAX_TOKENS, FrequentTokensView

    store = ckptstore.open(gpt2_vocabulary)
    name = "transformer.wte.weight"
    at_bound = embedding_view(store, name, PAIR_SUM_MAX_TOKENS)
    assert isinstance(at_bound, EmbeddingView)
    figure = new_figure(2)
    points = at_bound.points([STEPS[-1]])
    at_bound.draw(figure.axes, points[0], at_bound.limits(points))
    n = PAIR_SUM_MAX_TOKENS
    assert len(figure.axes[1].collections[0].get_offsets()) == n * (n + 1) // 2
    above = embedding_view(store, name, PAIR_SUM_MAX_TOKENS + 1)
    assert isinstance(above, FrequentTokensView)
    assert (above.ids <= PAIR_SUM_MAX_TOKENS).all(), "--modulus N: only ids below N"
    assert f"most frequent of ids 0..{PAIR_SUM_MAX_TOKENS} in split 'eval'" in above.title
    ids, mask = _eval_tokens()
    seen = ids[mask]
    assert set(above.ids.tolist()) == set(seen[seen <= PAIR_SUM_MAX_TOKENS].tolist()), "every such id in the data"


def test_without_token_data_the_first_ids_are_shown_and_said_to_be(tmp_path: Path) -> None:
    from ckpt.analyzers.figures.geometry import default_view

    view: Any = default_view(ckptstore.open(_gpt2_store(tmp_path / "no-data.zarr", data=False)))
    np.testing.assert_array_equal(view.ids, np.arange(1000))
    assert view.title == "transformer.wte.weight: token ids 0..999 (no token data in the store to rank tokens by)"
