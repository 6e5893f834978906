"""``ckpt import hf://ORG/NAME``: one checkpoint per Hub revision, from a local Hub cache, offline.

Nothing downloads: each test lays out a Hugging Face cache as huggingface_hub does
(``models--org--name/refs/<branch>``, ``snapshots/<commit>/<file>`` symlinks into ``blobs/<sha256>``)
from tiny GPT-2s saved with ``save_pretrained``, one branch per step with different weights, and
``ckpt import`` resolves it through huggingface_hub's own listing and resolution with
``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import CKPT, eval_loss, invoke_ckpt, run_ckpt, tiny_gpt2

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

VOCAB, LENGTH = 64, 12


@contextlib.contextmanager
def offline_hub(home: Path) -> Iterator[Path]:
    """An empty Hub cache under ``home``, and the environment pointing huggingface_hub at it, offline.

    Set in this process, so that the ``ckpt`` commands share one fork server (tests/cli_forkserver.py).
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setenv("HF_HUB_CACHE", str(home / "hub"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        patch.delenv("HF_TOKEN", raising=False)
        (home / "hub").mkdir()
        yield home / "hub"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty Hub cache, and the environment pointing huggingface_hub at it, offline, for every ``ckpt``."""
    with offline_hub(tmp_path_factory.mktemp("hf-home")) as hub:
        yield hub


def revision_files(step: int, shard: str | None = None, vocab: int = VOCAB) -> dict[str, bytes]:
    """What ``save_pretrained`` writes for the tiny GPT-2 at ``step`` (weights moved by ``step``): name -> bytes."""
    import tempfile

    model = tiny_gpt2(vocab)
    generator = torch.Generator().manual_seed(step + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * step * torch.randn(parameter.shape, generator=generator))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
        return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def repo_folder(cache: Path, repo: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}"


def add_revision(cache: Path, repo: str, branch: str | None, files: dict[str, bytes], commit: str = "") -> str:
    """Lay out one commit of ``repo`` as huggingface_hub's cache does; point ``refs/<branch>`` at it."""
    folder = repo_folder(cache, repo)
    commit = commit or hashlib.sha1(repr((branch, sorted(files.items()))).encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, snapshot))
    if branch is not None:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / branch).write_text(commit)  # huggingface_hub writes the hash with no newline
    return commit


def cache_state(root: Path) -> dict[str, str]:
    """Relative path -> what it is (a folder, a link's target, a file's sha256), without opening links."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                state[key] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                state[key] = "dir"
            else:
                state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def import_events(store: Path) -> list[dict]:
    shown = invoke_ckpt("info", str(store), "--json", "--no-finite-check")
    assert shown.returncode == 0, shown.stderr
    return [e for e in json.loads(shown.stdout)["history"] if e["event"] == "import"]


def model_loss(snapshot: Path, ids: np.ndarray) -> float:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(snapshot).eval()
    with torch.no_grad():
        return float(model(torch.as_tensor(ids), labels=torch.as_tensor(ids)).loss)


@pytest.mark.slow
def test_a_suite_imports_one_checkpoint_per_step_branch_and_is_analyzed(cache: Path, tmp_path: Path) -> None:
    repo, commits = "org/tiny", {}
    for step in (0, 1, 2, 4):
        commits[step] = add_revision(cache, repo, f"step{step}", revision_files(step))
    add_revision(cache, repo, "main", revision_files(4), commit=commits[4])  # main is step4, as in Pythia
    add_revision(cache, repo, "dev", revision_files(9))
    before = cache_state(cache)
    store = tmp_path / "tiny.zarr"

    done = run_ckpt("import", f"hf://{repo}", str(store))
    assert done.returncode == 0, done.stderr
    assert "imported 4 revision(s) of hf://org/tiny (steps 0 .. 4" in done.stdout
    assert "main is the commit of step4: imported once, as step 4" in done.stdout
    assert "Warning: 1 branch(es) of hf://org/tiny state no step and are not imported: dev" in done.stderr
    opened = ckptstore.open(store)
    assert [int(s) for s in opened.steps] == [0, 1, 2, 4]
    assert opened.model is not None and opened.model.factory == "ckpt.plugins.huggingface:build_model"
    config = json.loads(revision_files(0)["config.json"])
    assert opened.model.config["n_embd"] == config["n_embd"] and "transformers_version" not in opened.model.config
    assert opened.objective == "causal-lm" and opened.attrs["imported_from"] == "hf://org/tiny"
    # ckpt info names each step's revision and commit; every step is imported once
    events = import_events(store)
    assert [(e["step"], e["revision"], e["commit"]) for e in events] == [(s, f"step{s}", commits[s]) for s in commits]
    assert all(e["source"] == "hf://org/tiny" and e["files"] == ["model.safetensors"] for e in events)
    plain = invoke_ckpt("info", str(store), "--no-finite-check")
    listed = "imported     from hf://org/tiny, 4 revision(s) (step0 .. step4; --json lists each one's commit)"
    assert listed in plain.stdout, plain.stdout
    source = json.loads(invoke_ckpt("info", str(store), "--json", "--no-finite-check").stdout)["source"]
    assert source["revisions"] == [{"step": s, "revision": f"step{s}", "commit": commits[s]} for s in commits]
    assert cache_state(cache) == before, "the cache holds what it held: nothing was downloaded, nothing removed"
    verified = invoke_ckpt("verify", str(store))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    ids = np.random.default_rng(1).integers(0, VOCAB, (6, LENGTH))
    loss = eval_loss(store, ids, tmp_path)
    for step, commit in commits.items():  # the model's own loss, from the revision's files
        expected = model_loss(repo_folder(cache, repo) / "snapshots" / commit, ids)
        np.testing.assert_allclose(float(loss["mean_loss"].sel(step=step)), expected, rtol=1e-5)


@pytest.mark.slow
def test_a_rerun_imports_only_new_revisions_and_a_sharded_one(cache: Path, tmp_path: Path) -> None:
    repo = "org/growing"
    for step in (0, 1):
        add_revision(cache, repo, f"step{step}", revision_files(step))
    store = tmp_path / "growing.zarr"
    first = run_ckpt("import", f"hf://{repo}", str(store), "--revisions", "step0")
    assert first.returncode == 0, first.stderr
    assert [int(s) for s in ckptstore.open(store).steps] == [0]

    # the run goes on: a new branch appears, sharded this time (an index and its shards)
    sharded = revision_files(2, shard="20KB")
    assert "model.safetensors.index.json" in sharded and len(sharded) > 3
    commit = add_revision(cache, repo, "step2", sharded)
    again = run_ckpt("import", f"hf://{repo}", str(store))
    assert again.returncode == 0, again.stderr
    assert (
        "importing 2 revision(s) of hf://org/growing from the Hub cache (HF_HUB_OFFLINE), 1 already in" in again.stdout
    )
    opened = ckptstore.open(store)
    assert [int(s) for s in opened.steps] == [0, 1, 2]
    from safetensors.torch import load_file

    snapshot = repo_folder(cache, repo) / "snapshots" / commit
    expected = {}
    for shard in sorted(snapshot.glob("model-*.safetensors")):
        expected.update(load_file(shard))
    stored = opened.tensors(2)
    assert stored.keys() <= expected.keys() and "transformer.wte.weight" in stored
    for name, value in stored.items():
        np.testing.assert_array_equal(value, expected[name].numpy())
    events = import_events(store)
    assert [e["step"] for e in events] == [0, 1, 2], "each step imported once"
    assert events[-1]["commit"] == commit
    assert events[-1]["files"] == sorted(n for n in sharded if n.startswith("model-")), "its shards, by the index"

    up_to_date = run_ckpt("import", f"hf://{repo}", str(store))
    assert up_to_date.returncode == 0, up_to_date.stderr
    assert "is up to date with hf://org/growing: it holds all 3 selected revisions" in up_to_date.stdout
    assert [e["step"] for e in import_events(store)] == [0, 1, 2]

    # a branch rewritten after the import (a re-uploaded checkpoint) is named, not silently kept or mixed
    moved = add_revision(cache, repo, "step1", revision_files(7))
    rerun = run_ckpt("import", f"hf://{repo}", str(store))
    assert rerun.returncode == 0, rerun.stderr
    stale = f"Warning: hf://org/growing: step 1 (step1) is now commit {moved[:10]}, the store holds commit"
    assert stale in rerun.stderr and "pass --overwrite to re-import" in rerun.stderr


def test_a_revision_of_another_model_is_refused_and_the_ones_before_it_stay(cache: Path, tmp_path: Path) -> None:
    repo = "org/mixed"
    add_revision(cache, repo, "step0", revision_files(0))
    add_revision(cache, repo, "step1", revision_files(1, vocab=VOCAB + 8))
    store = tmp_path / "mixed.zarr"
    done = run_ckpt("import", f"hf://{repo}", str(store))
    assert done.returncode == 1 and done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1
    assert "config.json of step1 describes another model than the store records (vocab_size: 72 here, 64" in done.stderr
    assert f"the 1 revision(s) before it are committed to {store}" in done.stderr
    assert [int(s) for s in ckptstore.open(store).steps] == [0]


def test_a_config_naming_code_is_refused_before_a_store_is_made(cache: Path, tmp_path: Path) -> None:
    files = revision_files(0)
    config = json.loads(files["config.json"]) | {"auto_map": {"AutoModelForCausalLM": "evil.Model"}}
    add_revision(cache, "org/coded", "step0", {**files, "config.json": json.dumps(config).encode()})
    done = run_ckpt("import", "hf://org/coded", str(tmp_path / "coded.zarr"))
    assert done.returncode == 1 and done.stderr.startswith("Error: revision step0 of hf://org/coded: cannot import")
    assert "'auto_map', which names code" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "coded.zarr").exists()


@pytest.mark.slow
def test_an_import_killed_between_revisions_is_completed_by_a_rerun(cache: Path, tmp_path: Path) -> None:
    repo = "org/killed"
    files = {step: revision_files(step) for step in (0, 1, 2)}
    config = json.loads(files[1]["config.json"]) | {"transformers_version": "1"}  # a blob of its own, same model
    files[1]["config.json"] = json.dumps(config).encode()
    for step, saved in files.items():
        add_revision(cache, repo, f"step{step}", saved)
    # step1's config.json made a FIFO: the import blocks there, after step0 is committed, until killed
    blob = repo_folder(cache, repo) / "blobs" / hashlib.sha256(files[1]["config.json"]).hexdigest()
    blob.unlink()
    os.mkfifo(blob)
    store = tmp_path / "killed.zarr"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ckpt = [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]  # as tests/helpers.py runs it
    command = [*ckpt, "import", f"hf://{repo}", str(store)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and process.poll() is None:
            if (store / "zarr.json").exists() and len(ckptstore.open(store).steps) == 1:
                break
            time.sleep(0.2)
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert [int(s) for s in ckptstore.open(store).steps] == [0]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    blob.unlink()
    blob.write_bytes(files[1]["config.json"])

    resumed = run_ckpt("import", f"hf://{repo}", str(store))
    assert resumed.returncode == 0, resumed.stderr
    assert "importing 2 revision(s)" in resumed.stdout and "1 already in" in resumed.stdout
    assert [int(s) for s in ckptstore.open(store).steps] == [0, 1, 2]
    assert [e["step"] for e in import_events(store)] == [0, 1, 2]
    verified = invoke_ckpt("verify", str(store))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def listing(steps: list[int], main: int | None = None) -> object:
    from ckpt.store.hub import HubListing, Revision

    revisions = tuple(Revision(f"step{s}", f"{s:040x}", s) for s in steps)
    main_commit = None if main is None else f"{main:040x}"
    return HubListing("org/x", revisions, ("dev",), None, True, main_commit)


PYTHIA = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *range(1000, 143001, 1000)]


@pytest.mark.parametrize(
    ("revisions", "every", "log_spaced", "expected"),
    [
        (None, None, None, PYTHIA),
        ("step0,step512", None, None, [0, 512]),
        ("1000-3000,143000", None, None, [1000, 2000, 3000, 143000]),
        ("140000-", None, None, [140000, 141000, 142000, 143000]),
        ("step*0000", None, None, [10000 * k for k in range(1, 15)]),
        ("main", None, None, [143000]),
        (None, 50000, None, [0, 50000, 100000]),
        ("0-512", None, 4, [0, 8, 64, 512]),  # nearest to log1p targets 0, 2.08, 4.16, 6.24
        (None, None, 3, [0, 512, 143000]),
    ],
)
def test_revisions_are_selected_by_name_glob_step_range_every_and_log_spacing(
    revisions: str | None, every: int | None, log_spaced: int | None, expected: list[int]
) -> None:
    from ckpt.store.hub import select

    chosen = select(listing(PYTHIA, main=143000), revisions, every, log_spaced)  # type: ignore[arg-type]
    assert [r.step for r in chosen] == expected


def test_a_selection_that_matches_nothing_is_an_error() -> None:
    from ckpt.errors import ImportFormatError
    from ckpt.store.hub import select

    with pytest.raises(
        ImportFormatError, match=r"'step3' matches no revision of hf://org/x; its revisions: step0 \.\."
    ):
        select(listing(PYTHIA), "step0,step3")  # type: ignore[arg-type]
    with pytest.raises(ImportFormatError, match="no revision of hf://org/x is left by the selection"):
        select(listing([1, 3]), every=2)  # type: ignore[arg-type]


def test_branch_names_give_steps_and_main_is_never_imported_twice(cache: Path, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from ckpt.errors import ImportFormatError
    from ckpt.store.hub import list_revisions

    repo, files = "org/names", revision_files(0)
    pythia = add_revision(cache, repo, "step1000", files)
    add_revision(cache, repo, "step2000-tokens4B", {**files, "README.md": b"2"})  # OLMo's names
    add_revision(cache, repo, "main", {**files, "README.md": b"final"})
    with pytest.MonkeyPatch.context() as patch:  # this process read the environment before the fixture set it
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        found = list_revisions(repo)
        assert [(r.name, r.step) for r in found.revisions] == [("step1000", 1000), ("step2000-tokens4B", 2000)]
        assert found.main is not None and "no step branch's commit" in found.main and "--main-step" in found.main
        with_main = list_revisions(repo, main_step=3000)
        assert [r.name for r in with_main.revisions] == ["step1000", "step2000-tokens4B", "main"]
        custom = list_revisions(repo, step_pattern=r"tokens(\d+)B")
        assert [(r.name, r.step) for r in custom.revisions] == [("step2000-tokens4B", 4)]
        (repo_folder(cache, repo) / "refs" / "main").write_text(pythia)
        assert "main is the commit of step1000" in str(list_revisions(repo).main)
        with pytest.raises(ImportFormatError, match="main of hf://org/names is the commit of step1000"):
            list_revisions(repo, main_step=3000)


def test_the_cache_guard_removes_what_the_import_downloaded_and_nothing_cached_before(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from ckpt.store.hub import CacheGuard

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    repo = "org/guarded"
    step0, step1 = revision_files(0), revision_files(1)
    add_revision(cache, repo, "step0", step0)
    commit = add_revision(cache, repo, "step1", {"config.json": step1["config.json"]})  # cached before, partly
    before = cache_state(repo_folder(cache, repo))
    guard = CacheGuard(repo)
    # what hf_hub_download leaves for the rest of step1: a blob, its snapshot link, a lock, a .no_exist marker
    add_revision(cache, repo, "step1", step1, commit=commit)
    (cache / ".locks" / repo_folder(cache, repo).name).mkdir(parents=True)
    sha = hashlib.sha256(step1["model.safetensors"]).hexdigest()
    (cache / ".locks" / repo_folder(cache, repo).name / f"{sha}.lock").touch()
    (repo_folder(cache, repo) / ".no_exist" / commit).mkdir(parents=True)
    (repo_folder(cache, repo) / ".no_exist" / commit / "model.safetensors.index.json").touch()
    assert cache_state(repo_folder(cache, repo)) != before

    freed = guard.release(commit)
    assert freed == len(step1["model.safetensors"])
    assert cache_state(repo_folder(cache, repo)) == before
    assert not (cache / ".locks" / repo_folder(cache, repo).name).exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["hf://org/absent", "{tmp}/a.zarr"], "hf://org/absent is not in the Hub cache at"),
        (["hf://gpt2", "{tmp}/a.zarr"], "Repository id must be 'namespace/name'"),
        (["hf://datasets/org/x", "{tmp}/a.zarr"], "names a dataset repository"),
        (["hf://org/tiny", "{tmp}/a.zarr", "--revisions", "step7"], "'step7' matches no revision of hf://org/tiny"),
        (["hf://org/tiny", "{tmp}/a.zarr", "--step-pattern", "step"], "must have exactly one capturing group"),
    ],
)
def test_bad_hub_sources_are_one_error_line_and_create_nothing(
    cache: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    if not repo_folder(cache, "org/tiny").exists():
        add_revision(cache, "org/tiny", "step0", revision_files(0))
    done = run_ckpt("import", *(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1 and expected in done.stderr
    assert not (tmp_path / "a.zarr").exists()


def test_hub_options_are_refused_for_a_folder_and_folder_options_for_the_hub(tmp_path: Path) -> None:
    folder = run_ckpt("import", str(tmp_path), str(tmp_path / "a.zarr"), "--every", "2")
    assert folder.returncode == 2 and "--every applies to a Hub repository SRC" in folder.stderr
    hub = run_ckpt("import", "hf://org/x", str(tmp_path / "a.zarr"), "--key", "model")
    assert hub.returncode == 2 and "--key does not apply to a Hub repository SRC" in hub.stderr


class FakeHub:
    """The few Hub endpoints huggingface_hub calls to list refs and files and to download, on 127.0.0.1.

    A test double of the remote service (as moto is of S3), so that the online path runs through
    huggingface_hub's real client, download and cache code with nothing leaving the machine.
    ``seen`` records, at each file request, the commits whose files are in the test's cache.
    """

    def __init__(self, cache: Path) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.branches: dict[str, dict[str, str]] = {}
        self.files: dict[str, dict[str, bytes]] = {}
        self.seen: list[set[str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:2] == ["api", "models"] and parts[4] == "refs":
                    branches = hub.branches.get(f"{parts[2]}/{parts[3]}")
                    if branches is None:  # what the Hub answers for a missing or private repository
                        return self.reply(404, headers={"X-Error-Code": "RepoNotFound"})
                    listed = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": c} for b, c in branches.items()]
                    body = {"branches": listed, "converts": [], "tags": []}
                    return self.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
                if parts[:2] == ["api", "models"] and parts[4] == "tree":
                    files = hub.files[parts[5]]
                    listed = [
                        {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                        for n, d in files.items()
                    ]
                    return self.reply(200, json.dumps(listed).encode(), {"Content-Type": "application/json"})
                if parts[2] == "resolve":
                    hub.seen.append({p.name for p in cache.glob("models--*/snapshots/*")})
                    data = hub.files.get(parts[3], {}).get("/".join(parts[4:]))
                    if data is None:
                        return self.reply(404, headers={"X-Error-Code": "EntryNotFound"})
                    etag = hashlib.sha256(data).hexdigest()
                    return self.reply(200, data, {"X-Repo-Commit": parts[3], "ETag": f'"{etag}"'})
                return self.reply(404)

            do_HEAD = do_GET  # noqa: N815 - the name http.server calls

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: str, branch: str, files: dict[str, bytes]) -> str:
        commit = hashlib.sha1(repr((repo, branch, sorted(files.items()))).encode()).hexdigest()
        self.branches.setdefault(repo, {})[branch] = commit
        self.files[commit] = files
        return commit


def bin_files(step: int) -> dict[str, bytes]:
    """A revision saved as ``pytorch_model.bin`` (older Hub uploads), weights only."""
    import io

    from safetensors.torch import load

    files = revision_files(step)
    buffer = io.BytesIO()
    torch.save(load(files.pop("model.safetensors")), buffer)
    return {**files, "pytorch_model.bin": buffer.getvalue()}


@pytest.mark.slow
def test_online_each_revision_is_downloaded_then_removed_and_the_cache_keeps_what_it_had(tmp_path: Path) -> None:
    online = tmp_path / "online-cache"
    hub = FakeHub(online)
    repo = "org/online"
    revisions = {0: revision_files(0), 1: revision_files(1, shard="20KB"), 2: bin_files(2)}
    commits = {step: hub.add(repo, f"step{step}", files) for step, files in revisions.items()}
    hub.branches[repo]["main"] = commits[2]
    add_revision(online, repo, "step0", revisions[0], commit=commits[0])  # downloaded before: kept
    before = cache_state(online)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(online)}
    env |= {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
    try:
        store = tmp_path / "online.zarr"
        done = run_ckpt("import", f"hf://{repo}", str(store), extra_env=env)
        assert done.returncode == 0, done.stderr
        assert "importing 3 revision(s) of hf://org/online from the Hub" in done.stdout
        assert "main is the commit of step2: imported once, as step 2" in done.stdout
        opened = ckptstore.open(store)
        assert [int(s) for s in opened.steps] == [0, 1, 2]
        events = import_events(store)
        assert [(e["step"], e["commit"]) for e in events] == sorted(commits.items())
        assert events[2]["files"] == ["pytorch_model.bin"]
        from safetensors.torch import load

        weights = load(revision_files(2)["model.safetensors"])
        for name, value in opened.tensors(2).items():  # the .bin revision, read with the safe unpickler
            np.testing.assert_array_equal(value, weights[name].numpy())
        assert cache_state(online) == before, "the downloads are gone, what was cached before is kept"
        # at every download, the cache held at most one revision besides those cached before
        assert max(len(s - {commits[0]}) for s in hub.seen) == 1

        kept = run_ckpt("import", f"hf://{repo}", str(tmp_path / "kept.zarr"), "--keep-cache", extra_env=env)
        assert kept.returncode == 0, kept.stderr
        snapshots = {p.name for p in online.glob("models--*/snapshots/*")}
        assert snapshots == set(commits.values())

    finally:
        hub.server.shutdown()
        hub.server.server_close()


def test_online_a_missing_repository_or_an_unreachable_hub_is_one_clear_error(tmp_path: Path) -> None:
    from huggingface_hub import constants

    from ckpt.errors import ImportFormatError
    from ckpt.store.hub import list_revisions

    hub = FakeHub(tmp_path)
    with pytest.MonkeyPatch.context() as patch:  # this process read the environment before the fixture set it
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        patch.setattr(constants, "ENDPOINT", hub.endpoint)
        try:
            with pytest.raises(ImportFormatError, match="hf://org/absent is not a model repository on the Hub, or it"):
                list_revisions("org/absent")
        finally:
            hub.server.shutdown()
            hub.server.server_close()
        down = r"cannot list the revisions of hf://org/x on the Hub \(ConnectError.*with HF_HUB_OFFLINE=1 ckpt imports"
        with pytest.raises(ImportFormatError, match=down):
            list_revisions("org/x")
