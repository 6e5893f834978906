"""Killing a real ``ckpt analyze`` mid-run, for the tests of resumed per-run results."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import ckpt.store as ckptstore

ROOT = Path(__file__).resolve().parents[1]


def journal_keys(path: Path, analyzer: str) -> list[list]:
    """Keys of the pieces ``analyses/<analyzer>.partial`` holds now ([] when there is none)."""
    store = ckptstore.open(path)
    journal = f"{analyzer}.partial"
    if journal not in store.analyses:
        return []
    return store.analysis(journal).attrs["ckpt"]["partial"]["keys"]


def killed_mid_run(path: Path, analyzer: str, options: tuple[str, ...], total: int, pieces: int = 3) -> list[int]:
    """Run ``ckpt analyze ANALYZER`` and SIGKILL it once its journal holds ``pieces`` of ``total`` pieces.

    Returns the steps (first items of the keys) of the pieces committed when it died.
    """
    command = [sys.executable, "-m", "ckpt.cli", "analyze", analyzer, str(path), "--scheduler", "sync", *options]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None and len(journal_keys(path, analyzer)) < pieces:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate()
    saved = [key[0] for key in journal_keys(path, analyzer)]
    assert pieces <= len(saved) < total, f"the kill should land mid-run ({len(saved)} of {total}): {stderr[-500:]!r}"
    assert analyzer not in ckptstore.open(path).analyses, "the whole result was never committed"
    return saved


def assert_cli_reports_resumed(path: Path, analyzer: str, options: tuple[str, ...], saved: list[int]) -> None:
    """Rerunning the killed command succeeds and says how many pieces it resumed."""
    from tests.helpers import run_ckpt

    done = run_ckpt("analyze", analyzer, str(path), "--scheduler", "sync", *options)
    assert done.returncode == 0, done.stderr
    assert f"resumed {len(saved)} step(s) of an interrupted run" in done.stdout
