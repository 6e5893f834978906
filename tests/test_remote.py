"""Stores in an object store: ``ckpt import``, ``data add``, ``set-model``, ``analyze`` and ``report`` on ``s3://``.

The S3 server is moto's, started by the test on 127.0.0.1 (no network beyond the loopback); the
commands reach it through the standard AWS settings (``AWS_ENDPOINT_URL`` ...), as they would reach
a real bucket.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import invoke_ckpt, run_ckpt, s3_server

pytestmark = pytest.mark.slow  # installs packages or starts many ckpt processes

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """A local S3 server with the bucket ``runs``, and the environment that points the AWS clients at it."""
    with s3_server() as env:
        yield {**env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1])])}


def test_a_run_in_s3_is_imported_completed_and_analyzed(s3_env: dict[str, str], tmp_path: Path) -> None:
    from tests.models import mlp

    torch.manual_seed(0)
    model = mlp()
    folder = tmp_path / "weights"
    folder.mkdir()
    for step in (0, 10, 20):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        torch.save(model.state_dict(), folder / f"step_{step}.pt")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((12, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 4, 12))
    url, local = "s3://runs/mlp.zarr", tmp_path / "mlp.zarr"
    trust = ("--trust-factory", "tests.models")
    for where in (url, str(local)):  # the same commands on S3 and on disk
        for args in (
            ("import", str(folder), where),
            ("data", "add", where, "eval", "--inputs", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy")),
            ("set-model", where, "--model", "tests.models:mlp", "--objective", "cross-entropy"),
            ("analyze", "loss", where, "--no-progress", *trust),
        ):
            result = invoke_ckpt(*args, extra_env=s3_env)
            assert result.returncode == 0, (args, result.stderr)
    remote = ckptstore.open(url, storage_options={"endpoint_url": s3_env["AWS_ENDPOINT_URL"], "key": "test",
                                                  "secret": "test"})  # fmt: skip
    assert [int(s) for s in remote.steps] == [0, 10, 20]
    np.testing.assert_array_equal(
        remote.analysis("loss")["loss"].values, ckptstore.open(local).analysis("loss")["loss"].values
    )
    # a new checkpoint: appended to the S3 store, and only it is computed
    torch.save(model.state_dict(), folder / "step_30.pt")
    appended = invoke_ckpt("import", str(folder), url, extra_env=s3_env)
    assert appended.returncode == 0, appended.stderr
    assert "appended 1 new torch checkpoints (steps 30 .. 30)" in appended.stdout
    rerun = invoke_ckpt("analyze", "loss", url, "--no-progress", *trust, extra_env=s3_env)
    assert "computed 1 step(s), reused 3 stored" in rerun.stdout, rerun.stdout
    verified = invoke_ckpt("verify", url, extra_env=s3_env)
    assert verified.returncode == 0, verified.stderr
    page = tmp_path / "report.html"
    reported = invoke_ckpt("report", url, "--out", str(page), extra_env=s3_env)
    assert reported.returncode == 0, reported.stderr
    assert 'alt="loss curves"' in page.read_text()


def test_a_missing_bucket_is_one_error_line(s3_env: dict[str, str], tmp_path: Path) -> None:
    result = run_ckpt("info", "s3://no-such-bucket/run.zarr", extra_env=s3_env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
