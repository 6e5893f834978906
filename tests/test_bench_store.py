"""bench/store.py's Hub parts end to end at a tiny shape: the import, the disk breakdown, the reference prototype."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # repro, bench and demo scripts end to end at small sizes

pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parents[1]


def test_the_hub_parts_measure_an_offline_import_and_what_references_would_lose(tmp_path: Path) -> None:
    """Its own process (huggingface_hub reads HF_HUB_CACHE when imported); the user's cache is never used."""
    home = tmp_path / "home-cache"
    env = os.environ | {"HF_HUB_CACHE": str(home), "HF_HOME": str(home), "HF_HUB_OFFLINE": "0"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "store.py"), "--hub-only", "--hub-size", "tiny", "--repeat", "1",
         "--hub-revisions", "3", "--dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for row in ("hub import one revision s", "disk per imported checkpoint (du, marginal)", "references: disk per"):
        assert row in out
    assert "3 revisions (0, 66000, 143000) of a tiny-shaped GPTNeoX, 28 tensors" in out
    assert "same values as the store: True" in out and "xr.open_zarr on the copy: True" in out
    assert "verify (blob sha256 = name, range digests)" in out and "found: nothing" in out
    # each way a reference loses its bytes is named by the reader, and verify names the changed blob
    lines = {line.split(":")[0].strip(): line for line in out.splitlines()}
    assert "are not the recorded ones" in lines["a changed byte"]
    assert "does not hash to its name" in lines["... verify"]
    for case in ("the store copied to a cluster (no cache there)", "the revision deleted from the cache"):
        assert "read refused" in lines[case] and "is not in the Hub cache" in lines[case]
    # everything under one temporary folder, removed; the environment's own cache untouched
    assert list(tmp_path.iterdir()) == []
