"""Text labels of clusters: their most common tokens and part-of-speech sequences, and example contexts.

Used by the ``clusters`` analyzer when the clustered split has text: a
``text`` per example and the per-token labels ``char_start`` / ``char_end``,
the character span of each target token in its example's text (what the
``tiny-lm`` sandbox stores). Datapoint i = (example e, position p) is then the
token ``text[e][char_start[e, p]:char_end[e, p]]``.

A real spaCy pipeline (``--spacy-model``: an installed package such as
``en_core_web_sm``, or the path of a pipeline saved with ``nlp.to_disk``) tags
each example's text once. A store token gets the tag of the spaCy token that
holds its first character (``token.pos_``, the universal POS tag; ``token.tag_``
for pipelines that set no ``pos_``), so the two tokenizations need not agree.
Per cluster:

- ``top_token``: the most common target tokens, as written;
- ``top_pos``: the most common POS sequences: the tags of the target token and
  the ``--pos-window - 1`` tokens before it, oldest first, space-separated
  (shorter at the start of an example);
- ``medoid_context``: the contexts of the datapoints nearest the cluster's
  medoid (Euclidean distance between trajectories, the medoid first): up to
  :data:`CONTEXT_TOKENS` tokens of text before the target token, then the
  target in brackets.

Counts are ranked by decreasing count, ties by the string. Tagging is one Dask
task over the split (shared by every basis vector), and the labels one task
per basis vector over its cluster labels; nothing runs while the graph is built.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.plugins import AnalysisError

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

SPAN_LABELS = ("char_start", "char_end")
"""Per-token labels giving each target token's character span in its example's ``text``."""
NO_MODEL = "none"
"""``--spacy-model none``: no text labels."""
CONTEXT_TOKENS = 8
"""Tokens of text shown before the target token in ``medoid_context``."""
RANK_DIM = "text_rank"
"""The dim of the ranked text labels (``rank`` holds the top homogeneities)."""
UNUSED_PIPES = ("parser", "ner", "lemmatizer", "textcat", "senter")
"""Components the labels never read, skipped for speed (``en_core_web_sm`` needs its tagger and attribute_ruler)."""

DESCRIPTIONS = {
    "top_token": "most common target tokens of the cluster (as written); '': fewer distinct tokens or unused slot",
    "top_token_count": "datapoints of the cluster with top_token; 0 where top_token is ''",
    "top_pos": "most common part-of-speech sequences (tags of the tokens up to the target, oldest first)",
    "top_pos_count": "datapoints of the cluster with top_pos; 0 where top_pos is ''",
    "medoid_context": "text before the target token, and the target in brackets, of the datapoints nearest the medoid",
}


def has_text(data: xr.Dataset) -> bool:
    """Whether a data split carries what text labels need: ``text`` and the per-token :data:`SPAN_LABELS`."""
    labels = data.attrs.get("labels", [])
    return "text" in data and all(name in labels and data[name].ndim == 2 for name in SPAN_LABELS)


def check_pipeline(model: str) -> None:
    """Raise AnalysisError, saying how to get it, unless ``model`` is an installed package or a directory.

    Cheap (no pipeline is loaded), so that a missing model fails before any work.
    """
    if Path(model).is_dir():
        return
    import spacy.util

    if spacy.util.is_package(model):
        return
    msg = (
        f"spaCy pipeline {model!r} is not installed: install it with `python -m spacy download {model}`, "
        "or pass --spacy-model PATH (a pipeline saved with nlp.to_disk), or --spacy-model none to skip text labels"
    )
    raise AnalysisError(msg)


@functools.lru_cache(maxsize=4)
def load_pipeline(model: str) -> Any:
    """``spacy.load(model)`` without the components text labels do not read (cached per process)."""
    import spacy

    try:
        nlp = spacy.load(model)
    except OSError as exc:  # spaCy's E050 (no such package or path) and unreadable pipelines
        check_pipeline(model)
        msg = f"spaCy pipeline {model!r} could not be loaded: {' '.join(str(exc).split())}"
        raise AnalysisError(msg) from None
    nlp.select_pipes(disable=[name for name in UNUSED_PIPES if name in nlp.pipe_names])
    return nlp


def token_tags(doc: Any, starts: np.ndarray) -> list[str]:
    """The tag of the spaCy token of ``doc`` holding each character offset in ``starts``.

    ``token.pos_``, or ``token.tag_`` when the pipeline sets no universal tag;
    ``"X"`` (UD's "other") for an offset no token holds (whitespace).
    """
    owner = np.full(len(doc.text) + 1, -1, dtype=np.int64)
    for token in doc:
        owner[token.idx : token.idx + len(token.text)] = token.i
    tags = []
    for start in starts:
        index = owner[int(start)]
        tags.append((doc[int(index)].pos_ or doc[int(index)].tag_ or "X") if index >= 0 else "X")
    return tags


def tag_datapoints(
    model: str,
    texts: Sequence[str],
    char_start: np.ndarray,
    char_end: np.ndarray,
    example: np.ndarray,
    position: np.ndarray,
    *,
    window: int,
) -> dict[str, np.ndarray]:
    """Token, POS sequence and context of every datapoint (a Dask task: spaCy runs once per example).

    Parameters
    ----------
    model
        The spaCy pipeline (package name or path).
    texts
        ``[example]`` strings.
    char_start, char_end
        ``[example, position]`` spans of the target tokens.
    example, position
        The datapoints.
    window
        Tags per POS sequence (the target's and the ``window - 1`` before it).

    Returns
    -------
    dict
        ``token``, ``pos`` and ``context``: object arrays ``[datapoint]`` of str.
    """
    nlp = load_pipeline(model)
    starts = np.asarray(char_start, dtype=np.int64)
    ends = np.asarray(char_end, dtype=np.int64)
    tags = [token_tags(doc, row) for doc, row in zip(nlp.pipe([str(t) for t in texts]), starts, strict=True)]
    count = len(example)
    result = {name: np.empty(count, dtype=object) for name in ("token", "pos", "context")}
    for i, (e, p) in enumerate(zip(np.asarray(example).tolist(), np.asarray(position).tolist(), strict=True)):
        text = str(texts[e])
        token = text[starts[e, p] : ends[e, p]]
        first = starts[e, p - CONTEXT_TOKENS] if p >= CONTEXT_TOKENS else 0
        result["token"][i] = token
        result["pos"][i] = " ".join(tags[e][max(0, p - window + 1) : p + 1])
        result["context"][i] = " ".join(f"{text[first : starts[e, p]]}[{token}]".split())
    return result


def ranked(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``top`` most common values and their counts (by count, then value), padded with '' and 0."""
    names = np.full(top, "", dtype=object)
    counts = np.zeros(top, dtype=np.int64)
    best = sorted(Counter(values.tolist()).items(), key=lambda item: (-item[1], item[0]))[:top]
    for r, (name, count) in enumerate(best):
        names[r], counts[r] = name, count
    return names, counts


def nearest_to_medoid(rows: np.ndarray, members: np.ndarray, medoid: int, top: int) -> np.ndarray:
    """The ``top`` members nearest the medoid (Euclidean distance of their rows; ties by index), medoid first."""
    distance = np.linalg.norm(rows[members] - rows[medoid], axis=1)
    return members[np.argsort(distance, kind="stable")][:top]


def cluster_text(
    trajectories: np.ndarray,
    clustered: dict[str, np.ndarray],
    tagged: dict[str, np.ndarray],
    *,
    prepare: Callable[[np.ndarray], np.ndarray],
    slots: int,
    top: int,
) -> dict[str, np.ndarray]:
    """The text labels of one basis vector's clusters (a Dask task).

    Parameters
    ----------
    trajectories
        ``[step, datapoint]`` as stored; ``prepare`` turns them into what was clustered.
    clustered
        The basis vector's clustering (``cluster_label``, ``medoid``).
    tagged
        :func:`tag_datapoints` of the split.
    slots, top
        Lengths of the cluster and rank axes.
    """
    rows = prepare(trajectories).T
    labels = np.asarray(clustered["cluster_label"])
    medoids = np.asarray(clustered["medoid"])
    result = {
        "top_token": np.full((slots, top), "", dtype=object),
        "top_token_count": np.zeros((slots, top), dtype=np.int64),
        "top_pos": np.full((slots, top), "", dtype=object),
        "top_pos_count": np.zeros((slots, top), dtype=np.int64),
        "medoid_context": np.full((slots, top), "", dtype=object),
    }
    for c in range(slots):
        members = np.flatnonzero(labels == c)
        if not members.size:
            continue
        result["top_token"][c], result["top_token_count"][c] = ranked(tagged["token"][members], top)
        result["top_pos"][c], result["top_pos_count"][c] = ranked(tagged["pos"][members], top)
        nearest = nearest_to_medoid(rows, members, int(medoids[c]), top)
        result["medoid_context"][c, : len(nearest)] = tagged["context"][nearest]
    return result


def text_variables(
    data: xr.Dataset,
    example: np.ndarray,
    position: np.ndarray,
    bases: Sequence[tuple[Any, Any]],
    *,
    model: str,
    window: int,
    top: int,
    prepare: Callable[[np.ndarray], np.ndarray],
    slots: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The lazy text-label variables of a clustering, and their coordinates (both empty without text).

    Parameters
    ----------
    data
        The clustered data split.
    example, position
        Its datapoints.
    bases
        Per basis vector: its ``[step, datapoint]`` trajectories (dask) and its
        delayed clustering (the dict of ``cluster_basis``).
    model, window, top
        ``--spacy-model``, ``--pos-window``, ``--text-top``.
    prepare, slots
        What ``cluster_basis`` applied to the trajectories; the cluster axis length.

    Raises
    ------
    AnalysisError
        When the split has text and the spaCy pipeline is not installed.
    """
    import dask
    import dask.array as da

    if model == NO_MODEL or not has_text(data):
        return {}, {}
    check_pipeline(model)
    tagged = dask.delayed(tag_datapoints, pure=True)(
        model,
        data["text"].values,
        data[SPAN_LABELS[0]].values,
        data[SPAN_LABELS[1]].values,
        example,
        position,
        window=window,
    )
    columns: dict[str, list[Any]] = {name: [] for name in DESCRIPTIONS}
    for trajectories, clustered in bases:
        task = dask.delayed(cluster_text, pure=True)(
            trajectories, clustered, tagged, prepare=prepare, slots=slots, top=top
        )
        for name in DESCRIPTIONS:
            dtype = np.int64 if name.endswith("_count") else object
            columns[name].append(da.from_delayed(task[name], shape=(slots, top), dtype=dtype))
    variables = {
        name: (("basis", "cluster", RANK_DIM), da.stack(column), {"description": DESCRIPTIONS[name]})
        for name, column in columns.items()
    }
    return variables, {RANK_DIM: (RANK_DIM, np.arange(top))}


def summary_lines(result: xr.Dataset, basis: int, cluster: int, indent: str = "            ") -> list[str]:
    """Lines of ``ckpt show`` for one cluster's text labels (none when the result has none)."""
    if "top_token" not in result:
        return []

    def counted(name: str) -> str:
        names = result[name].values[basis, cluster]
        counts = result[f"{name}_count"].values[basis, cluster]
        return ", ".join(f"{n!r} {int(k)}" for n, k in zip(names, counts, strict=True) if n) or "-"

    contexts = [str(c) for c in result["medoid_context"].values[basis, cluster] if c]
    lines = [f"{indent}tokens: {counted('top_token')}", f"{indent}POS: {counted('top_pos')}"]
    lines += [f"{indent}near medoid: {context}" for context in contexts[:3]]
    return lines


__all__ = [
    "CONTEXT_TOKENS",
    "DESCRIPTIONS",
    "NO_MODEL",
    "RANK_DIM",
    "SPAN_LABELS",
    "UNUSED_PIPES",
    "check_pipeline",
    "cluster_text",
    "has_text",
    "load_pipeline",
    "nearest_to_medoid",
    "ranked",
    "summary_lines",
    "tag_datapoints",
    "text_variables",
    "token_tags",
]
