"""``repro/pythia_suite.py`` at tiny shape: the suite it builds, and the planted faults are the ones named.

The script builds a Hub cache of a Pythia-like suite with planted faults, imports it with the real
``ckpt import hf://...`` offline, and runs ``ckpt verify --trajectory`` and ``ckpt info``. Here 16
branches of a tiny GPTNeoX (seconds), so that the script docs/existing-runs.md quotes cannot rot.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPRO = Path(__file__).resolve().parents[1] / "repro"
COUNT = 16
ARGS = ["--shape", "tiny", "--checkpoints", str(COUNT), "--loss-examples", "4", "--loss-length", "16"]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    sys.path.insert(0, str(REPRO))
    try:
        return importlib.import_module("pythia_suite")
    finally:
        sys.path.remove(str(REPRO))


@pytest.fixture(scope="module")
def results(script: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("pythia-suite")
    return script.main([*ARGS, "--out", str(out)]), out


def test_pythia_steps_are_the_154_of_the_suite(script: ModuleType) -> None:
    steps = script.pythia_steps()
    assert len(steps) == 154 and steps[:12] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    assert steps[-1] == 143000 and all(b - a == 1000 for a, b in itertools.pairwise(steps[11:]))
    chosen = script.chosen_steps(COUNT)
    assert len(chosen) == COUNT and chosen[0] == 0 and chosen[-1] == 143000


def test_the_cache_is_what_huggingface_hub_lists(script: ModuleType, tmp_path: Path) -> None:
    """huggingface_hub's own scan sees one branch per step, main at the final one, the faults' shared blobs."""
    from huggingface_hub import scan_cache_dir

    suite = script.build_suite(tmp_path, "tiny", COUNT, "org/suite")
    (repo,) = scan_cache_dir(tmp_path).repos
    refs = {ref: rev.commit_hash for ref, rev in repo.refs.items()}
    steps = suite.steps
    assert refs == suite.commits | {"main": suite.commits[f"step{steps[-1]}"]}
    assert set(refs) == {f"step{s}" for s in steps} | {"main"}
    files = {rev.commit_hash: {f.file_name: f.blob_path for f in rev.files} for rev in repo.revisions}
    final = files[refs[f"step{steps[-1]}"]]
    for i in suite.faults.final:  # the final checkpoint's files, served under an earlier branch
        assert files[refs[f"step{steps[i]}"]] == final
    shard = files[refs[f"step{steps[suite.faults.shard]}"]]
    assert shard[script.SHARDS[0]] == final[script.SHARDS[0]] and shard[script.SHARDS[1]] != final[script.SHARDS[1]]
    copy = files[refs[f"step{steps[suite.faults.copy]}"]]
    assert copy == files[refs[f"step{steps[suite.faults.copy_source]}"]]
    config = json.loads((final["config.json"]).read_text())
    assert config["architectures"] == ["GPTNeoXForCausalLM"] and config["tie_word_embeddings"] is False


@pytest.mark.slow  # four ckpt processes: about 20 s
def test_the_planted_faults_are_the_ones_named(results: tuple[dict[str, Any], Path]) -> None:
    found, out = results
    comparison = found["comparison"]
    assert comparison["found"] == {"final": True, "shard": True, "copy": True, "outlier": True}
    assert comparison["groups_exact"] and comparison["partial_exact"]
    assert comparison["false_positives"] == [], "nothing named that was not planted"
    planted = comparison["planted"]
    steps_touched = {*planted["final"], planted["shard"], *planted["copy"], planted["outlier"]}
    assert planted["outlier"] in comparison["mislabeled"] and set(comparison["mislabeled"]) <= steps_touched
    # import, verify and info each name the duplicates in one Warning line
    for where in ("import", "verify", "info"):
        duplicates = [w for w in found["warnings"][where] if "duplicate other steps' weights" in w]
        assert len(duplicates) == 1, found["warnings"][where]
    assert [s["step"] for s in found["trajectory"]["steps"]] == sorted(int(s[4:]) for s in found["commits"])
    figures = found["figures"]
    assert figures["checkpoints"] == COUNT and figures["verify_returncode"] == 0
    assert figures["store_bytes"] > 0 and figures["import_s"] > 0 and figures["loss_s"] > 0
    assert json.loads((out / "pythia-suite.json").read_text())["comparison"] == comparison
    assert not list(out.glob("pythia-suite-*")), "the cache and the store are deleted without --keep"
