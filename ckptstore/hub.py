"""Importing a Hugging Face Hub model repository into a store: one checkpoint per revision (``stepN`` branches).

Checkpoint suites on the Hub publish one branch per training step (Pythia's ``step0`` ..
``step143000``, OLMo's ``step1000-tokens4B``). Everything here goes through huggingface_hub: the
revision listing (``HfApi.list_repo_refs``, or the local cache's refs with ``HF_HUB_OFFLINE=1``),
its download cache, its resolution of a revision's files (``hf_hub_download``, which works offline
from the cache) and its authentication (``HF_TOKEN``, ``hf auth login``). A revision's files become a
checkpoint through the same loader as a Trainer ``checkpoint-N`` folder
(:func:`ckpt.store.importers.load_checkpoint`, then transformers' own key conversion,
:func:`ckpt.store.hf_keys.hf_state_dict`).

The import is incremental and resumable: each revision is committed, with a history event naming
its revision and commit, as soon as it is written, so a rerun (after new branches appear, or after a
kill) imports only the revisions the store lacks. By default each revision's downloaded files are
removed from the cache once written (files cached before the import are never touched), so the disk
holds the store plus one revision's files.

Listing and selecting revisions is :mod:`ckpt.store.hub_revisions` (re-exported here). Needs
huggingface_hub and transformers: the ``hf`` extra (``pip install 'ckpt-dynamics[hf]'``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt.errors import ImportFormatError, StoreExistsError
from ckpt.store import _zarr
from ckpt.store.format import ROOT_ATTR, history_entry
from ckpt.store.hub_revisions import (
    MAIN,
    STEP_BRANCH,
    HubListing,
    Revision,
    cached_repo,
    list_revisions,
    parse_source,
    select,
)
from ckpt.store.importers import (
    HF_CAUSAL_LM,
    HF_FACTORY,
    HF_WEIGHTS,
    CheckpointSource,
    checkpoint_loader,
    hf_model_config,
)
from ckpt.store.publish import occupied
from ckpt.store.selection import (
    SELECTION_ATTR,
    TensorSelection,
    check_same_selection,
    parse_globs,
)

SCHEME = "hf://"
"""The prefix of a Hub source: ``hf://ORG/NAME`` (``hf://ORG/NAME@REVISION`` for one revision)."""
IMPORT_FORMAT = "hub"
"""The ``import_format`` a Hub import records in the store's attrs."""
_CONFIG = "config.json"


@dataclass(frozen=True)
class HubPlan:
    """What an import of a Hub repository into ``dest`` will do, before it downloads a byte."""

    source: str
    dest: str
    listing: HubListing
    selected: tuple[Revision, ...]
    new: tuple[Revision, ...]
    """The selected revisions the store lacks, in step order: what the import writes."""
    held: int
    """Checkpoints the store already holds (0 for a new store)."""
    exists: bool
    overwrite: bool
    keep_cache: bool
    objective: str | None
    rewritten: tuple[str, ...] = ()
    """Steps the store holds from a commit their branch no longer points at (a re-uploaded checkpoint)."""
    picked: bool = False
    """The revisions were named (``--revisions``, ``--steps`` or ``@REVISION``): branches left out on purpose."""
    selection: TensorSelection | None = None
    """The tensors to import (``--tensors``); None: every tensor."""


@dataclass
class HubReport:
    """What :func:`run_import` wrote: the revisions, their bytes read, and what a user should be told."""

    plan: HubPlan
    imported: list[Revision] = field(default_factory=list)
    bytes_read: int = 0
    tensors: int = 0


def _held(dest: str, source: str) -> tuple[list[int], dict[int, str], str | None, TensorSelection | None]:
    """The steps an earlier import of ``source`` into ``dest`` holds, their commits, the objective, the selection."""
    from ckpt.store import open as open_store

    store = open_store(dest)
    attrs = store.attrs
    if attrs.get("imported_from") != source or attrs.get("import_format") != IMPORT_FORMAT:
        origin = attrs.get("imported_from")
        what = f"an import of {origin}" if origin else "not an import"
        msg = f"{dest} already exists and is {what}, not of {source}; pass --overwrite to replace it"
        raise StoreExistsError(f"{msg}, or choose another destination")
    steps = [int(s) for s in store.steps]
    commits = {}
    for entry in store.history:  # the last event of a step names the commit its checkpoint came from
        if entry.get("event") == "import" and entry.get("source") == source and isinstance(entry.get("step"), int):
            commits[entry["step"]] = str(entry.get("commit"))
    return steps, commits, store.objective, TensorSelection.of_store(attrs, dest)


def plan_import(
    src: str,
    dest: str | os.PathLike[str],
    *,
    revisions: str | None = None,
    every: int | None = None,
    log_spaced: int | None = None,
    step_pattern: str | None = None,
    main_step: int | None = None,
    objective: str | None = None,
    keep_cache: bool = False,
    overwrite: bool = False,
    steps: str | None = None,
    tensors: str | Sequence[str] | None = None,
) -> HubPlan:
    """List and select the revisions of ``src`` and compare them with ``dest``, before any download.

    See :func:`list_revisions` and :func:`select` for the options; ``src`` may name one revision
    (``hf://ORG/NAME@step1000``), which is ``revisions``. An existing ``dest`` must be an earlier
    import of ``src`` (its steps are kept and only the selected revisions it lacks are new), unless
    ``overwrite``, with the same ``tensors``: ``fnmatch`` globs over the names after the key
    conversion (``--tensors``), the only tensors imported (:mod:`ckpt.store.selection`).

    Raises
    ------
    ImportFormatError, StoreExistsError
        Nothing is written.

    """
    repo, pinned = parse_source(src)
    if pinned is not None:
        if revisions is not None:
            raise ImportFormatError(f"{src} names a revision: drop --revisions, or the @{pinned}")
        revisions = pinned
    source = f"{SCHEME}{repo}"
    listing = list_revisions(repo, step_pattern, main_step)
    chosen = select(listing, revisions, every, log_spaced, steps)
    globs = parse_globs(tensors)
    where, local = str(dest), _zarr.local_path(dest)
    exists = occupied(where, local, None)
    held: list[int] = []
    commits: dict[int, str] = {}
    if exists and not overwrite:
        held, commits, stored_objective, stored_selection = _held(where, source)
        check_same_selection(stored_selection, globs, where)
        objective = objective or stored_objective
    last = held[-1] if held else -1
    new = tuple(r for r in chosen if r.step not in set(held))
    earlier = [r.name for r in new if r.step < last]
    if earlier:
        msg = (
            f"{where} holds steps up to {last}, and the selection adds earlier ones it lacks ({', '.join(earlier[:5])})"
        )
        raise ImportFormatError(f"{msg}: a store's steps only grow; pass --overwrite to re-import them all")
    rewritten = tuple(
        f"step {r.step} ({r.name}) is now commit {r.commit[:10]}, the store holds commit {commits[r.step][:10]}"
        for r in chosen
        if r.step in commits and commits[r.step] != r.commit
    )
    return HubPlan(
        source,
        where,
        listing,
        chosen,
        new,
        len(held),
        exists,
        overwrite,
        keep_cache,
        objective,
        rewritten,
        picked=revisions is not None or steps is not None,
        selection=TensorSelection(globs) if globs else None,
    )


def _cached_files(repo: str, commit: str) -> dict[str, int]:
    """Name -> size of the files of ``commit`` in the cache, as huggingface_hub's scan lists them."""
    for revision in cached_repo(repo).revisions:
        if revision.commit_hash == commit:
            return {f.file_path.relative_to(revision.snapshot_path).as_posix(): f.size_on_disk for f in revision.files}
    return {}


def _remote_files(repo: str, commit: str) -> dict[str, int]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HTTPError
    from huggingface_hub.hf_api import RepoFile

    try:
        return {f.path: f.size for f in HfApi().list_repo_tree(repo, revision=commit) if isinstance(f, RepoFile)}
    except (HTTPError, OSError) as exc:  # HTTPError: httpx's, the base of the Hub's errors and connection errors
        msg = f"cannot list the files of commit {commit[:10]} of hf://{repo} ({type(exc).__name__}: {exc})"
        raise ImportFormatError(f"{msg}; rerun the import to resume") from None


def _download(repo: str, revision: Revision, name: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HTTPError, LocalEntryNotFoundError

    try:  # pinned to the listed commit: a branch moved since the listing is not mixed in
        return Path(hf_hub_download(repo, name, revision=revision.commit))
    except LocalEntryNotFoundError:
        msg = f"{name} of {revision.name} (commit {revision.commit[:10]}) of hf://{repo} is not in the Hub cache"
        raise ImportFormatError(f"{msg}; unset HF_HUB_OFFLINE to download it") from None
    except EntryNotFoundError:
        msg = f"{revision.name} (commit {revision.commit[:10]}) of hf://{repo} has no file {name}"
        raise ImportFormatError(msg) from None
    except (HTTPError, OSError) as exc:
        msg = f"cannot download {name} of {revision.name} of hf://{repo} ({type(exc).__name__}: {exc})"
        raise ImportFormatError(f"{msg}; rerun the import to resume") from None


def _shards(index: Path, revision: Revision) -> list[str]:
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ImportFormatError(f"cannot read the shard index {index.name} of {revision.name}: {exc!r}") from None
    # the index is data from the repo: its names are files beside it, never paths elsewhere
    bad = [s for s in shards if not isinstance(s, str) or not s or "/" in s or "\\" in s or s.startswith(".")]
    if bad:
        raise ImportFormatError(f"the shard index of {revision.name} names {bad[0]!r}, not a file beside it")
    return shards


def fetch(repo: str, revision: Revision, offline: bool) -> tuple[CheckpointSource, dict[str, Any], int]:
    """Resolve one revision's ``config.json`` and weights through huggingface_hub (downloading what is missing).

    Safetensors are preferred to ``pytorch_model.bin``; a sharded checkpoint is read through its
    ``*.index.json``. Returns the checkpoint (its snapshot folder and weight files), its config and
    the bytes of its files.
    """
    names = _cached_files(repo, revision.commit) if offline else _remote_files(repo, revision.commit)
    weights = next((n for n in HF_WEIGHTS if n in names), None)
    if _CONFIG not in names or weights is None:
        where = "in the Hub cache" if offline else "on the Hub"
        lacks = _CONFIG if _CONFIG not in names else f"model weights ({', '.join(HF_WEIGHTS)})"
        raise ImportFormatError(
            f"{revision.name} (commit {revision.commit[:10]}) of hf://{repo} has no {lacks} {where}"
        )
    config_path = _download(repo, revision, _CONFIG)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ImportFormatError(f"cannot read config.json of {revision.name} of hf://{repo}: {exc!r}") from None
    if not isinstance(config, dict):
        raise ImportFormatError(f"config.json of {revision.name} of hf://{repo} is not a JSON object")
    files = [_download(repo, revision, weights)]
    if weights.endswith(".index.json"):
        files += [_download(repo, revision, shard) for shard in _shards(files[0], revision)]
    folder = config_path.parent  # the snapshot of the commit: every file of the revision is beside config.json
    weight_files = tuple(files[1:] if weights.endswith(".index.json") else files)
    return (
        CheckpointSource(revision.step, folder, weight_files),
        config,
        sum(f.stat().st_size for f in (config_path, *files)),
    )


class CacheGuard:
    """Removes from the Hub cache what an import downloaded, never what was cached before it.

    Records the repository's cache folder (and its download locks) at creation; :meth:`release`
    then deletes one revision's files that were not there, through huggingface_hub's
    ``delete_files`` (which keeps a blob another cached file references, and sweeps the shared
    blob store), then the refs, markers and folders the download made for that commit, which
    ``delete_files`` leaves.
    """

    def __init__(self, repo: str) -> None:
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        self.repo = repo
        self.cache = Path(constants.HF_HUB_CACHE).expanduser().resolve()
        name = repo_folder_name(repo_id=repo, repo_type="model")
        self.roots = (self.cache / name, self.cache / ".locks" / name)
        # what a first download makes at the cache's top: the locks folder, the CACHEDIR.TAG marker
        self.markers = tuple(p for p in (self.cache / ".locks", self.cache / "CACHEDIR.TAG") if not p.exists())
        self.before = self._paths()

    def _paths(self) -> set[Path]:
        found: set[Path] = set()
        for root in self.roots:
            for folder, dirs, files in os.walk(root):
                found.update(Path(folder, n) for n in (*dirs, *files))
            if root.exists():
                found.add(root)
        return found

    def release(self, commit: str) -> int:
        """Delete what the import added to the cache for ``commit``; returns the bytes freed (as scanned)."""
        from huggingface_hub import scan_cache_dir

        freed = 0
        info = scan_cache_dir(self.cache)
        revisions = [r for repo in info.repos if repo.repo_id == self.repo for r in repo.revisions]
        added = [f for r in revisions if r.commit_hash == commit for f in r.files if f.file_path not in self.before]
        if added:
            strategy = info.delete_files(*added)
            kept = frozenset(b for b in strategy.blobs if b in self.before)
            if kept:  # a blob cached before the import stays, even if only this revision links it now
                strategy = dataclasses.replace(strategy, blobs=strategy.blobs - kept)
            freed = strategy.expected_freed_size
            strategy.execute()
        gone = {f.blob_path.name for f in added}
        new = sorted(self._paths() - self.before, key=lambda p: len(p.parts), reverse=True)
        for path in new:  # deepest first: a folder is removed after what it held
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif commit in path.parts or path.name.removesuffix(".lock") in gone or _ref_to(path, commit):
                path.unlink(missing_ok=True)
        for marker in self.markers:
            if marker.is_dir() and not any(marker.iterdir()):
                marker.rmdir()
            elif marker.is_file():
                marker.unlink()
        return freed


def _ref_to(path: Path, commit: str) -> bool:
    """Whether ``path`` is a ref file of the cache naming ``commit``."""
    if "refs" not in path.parts or not path.is_file():
        return False
    try:
        return path.read_text().strip() == commit
    except OSError:
        return False


def _check_config(revision: Revision, model_config: Mapping[str, Any], recorded: Mapping[str, Any] | None) -> None:
    """Every revision must describe the model the store records: the analyzers build that one for every step."""
    if recorded is None:
        return
    keys = sorted(set(model_config) | set(recorded), key=str)
    differ = [k for k in keys if model_config.get(k) != recorded.get(k)]
    if differ:
        shown = "; ".join(f"{k}: {model_config.get(k)!r} here, {recorded.get(k)!r} in the store" for k in differ[:3])
        msg = f"config.json of {revision.name} describes another model than the store records ({shown})"
        raise ImportFormatError(f"{msg}; import the revisions of each model into its own store (--revisions)")


def _write(writer: Any, revision: Revision, tensors: Mapping[str, Any], entry: dict[str, Any]) -> None:
    """Write one checkpoint with its history event in the same commit.

    The event rides in the checkpoint's commit (the writer commits its attrs with each
    checkpoint), so a kill never leaves a store whose history names a revision it lacks.
    """
    history = writer._attrs[ROOT_ATTR]["history"]
    history.append(entry)
    try:
        writer.write(revision.step, tensors)
    except BaseException:
        if history and history[-1] is entry:  # not committed: the next commit must not record it
            history.pop()
        raise


def run_import(plan: HubPlan, progress: Callable[[int, Revision, int], None] | None = None) -> HubReport:
    """Import the new revisions of ``plan``, one at a time, each committed as it completes.

    Parameters
    ----------
    plan
        From :func:`plan_import`.
    progress
        Called as ``progress(done, revision, nbytes)`` after each revision is committed.

    Returns
    -------
    HubReport

    Raises
    ------
    ImportFormatError
        Naming the revision; what was committed before it stays (a rerun resumes).

    """
    report = HubReport(plan)
    if not plan.new:
        return report
    # offline, huggingface_hub only reads the cache: there is nothing of the import's to remove
    guard = None if plan.keep_cache or plan.listing.offline else CacheGuard(plan.listing.repo)
    writer = None
    recorded = _recorded_config(plan)
    try:
        for done, revision in enumerate(plan.new, 1):
            try:
                source, config, nbytes = fetch(plan.listing.repo, revision, plan.listing.offline)
                model_config = json.loads(json.dumps(hf_model_config(config)))  # as the store holds it
                if recorded is None and not (plan.exists and not plan.overwrite):
                    recorded = model_config  # a new store: its model is the first revision's
                _check_config(revision, model_config, recorded)
                tensors = _load(plan, revision, source, recorded)
                measured = None
                if plan.selection is not None:
                    tensors, measured = plan.selection.apply(tensors, f"revision {revision.name} of {plan.source}")
                # created once the first revision has loaded: a refused one leaves no store behind
                writer = writer or _open_writer(plan, config, model_config, measured)
                entry = history_entry(
                    "import", source=plan.source, revision=revision.name, commit=revision.commit, step=revision.step
                )
                _write(writer, revision, tensors, entry | {"files": [f.name for f in source.files], "bytes": nbytes})
            except BaseException:
                if guard is not None:  # the failed revision's downloads go too; the original error is what matters
                    with contextlib.suppress(Exception):
                        guard.release(revision.commit)
                raise
            report.tensors = len(tensors)
            del tensors  # before the next revision: memory holds one checkpoint
            report.imported.append(revision)
            report.bytes_read += nbytes
            if guard is not None:
                guard.release(revision.commit)
            if progress is not None:
                progress(done, revision, nbytes)
    except ImportFormatError as exc:
        if not report.imported:
            raise
        kept = f"the {len(report.imported)} revision(s) before it are committed to {plan.dest}"
        raise ImportFormatError(f"{exc}; {kept}") from exc
    finally:
        if writer is not None:
            writer.close()
    return report


def _recorded_config(plan: HubPlan) -> dict[str, Any] | None:
    """The HF config an existing store records (None for a new store, or a store with another factory)."""
    import ckpt.store as ckptstore

    if not plan.exists or plan.overwrite:
        return None
    model = ckptstore.open(plan.dest).model
    return dict(model.config) if model is not None and model.factory == HF_FACTORY else None


def _load(plan: HubPlan, revision: Revision, source: CheckpointSource, config: dict[str, Any] | None) -> Any:
    """The Trainer-folder import's loader: the files' keys converted to the names of the model ``config`` builds."""
    load = checkpoint_loader("hf", None, HF_FACTORY if config is not None else None, config)
    try:
        return load(source)
    except ImportFormatError as exc:
        raise ImportFormatError(f"revision {revision.name} of {plan.source}: {exc}") from None


def _open_writer(
    plan: HubPlan, config: Mapping[str, Any], model_config: dict[str, Any], selection: TensorSelection | None
) -> Any:
    """The writer of ``plan.dest``: the existing store opened to append, or a new one recording the HF model.

    A new store records ``selection`` (measured on its first revision), when the import selects tensors.
    """
    import ckpt.store as ckptstore
    from ckpt.store.writer import create

    if plan.exists and not plan.overwrite:
        return ckptstore.open(plan.dest, mode="a")
    named = config.get("architectures")
    architecture = str(named[0]) if isinstance(named, list) and named else ""
    objective = plan.objective or ("causal-lm" if architecture.endswith(HF_CAUSAL_LM) else None)
    attrs: dict[str, Any] = {"imported_from": plan.source, "import_format": IMPORT_FORMAT}
    if selection is not None:
        attrs[SELECTION_ATTR] = selection.to_json()
    return create(
        plan.dest,
        model=HF_FACTORY,
        config=model_config,
        objective=objective,
        framework="torch",
        attrs=attrs,
        overwrite=plan.exists,
    )


def import_hub(
    src: str,
    dest: str | os.PathLike[str],
    progress: Callable[[int, Revision, int], None] | None = None,
    **options: Any,
) -> HubReport:
    """Import the revisions of Hub repository ``src`` (``hf://ORG/NAME``) into the store ``dest``.

    :func:`plan_import` with ``options``, then :func:`run_import`. An existing ``dest`` that is
    an earlier import of ``src`` gets only the selected revisions it lacks.

    >>> report = import_hub("hf://EleutherAI/pythia-70m", "pythia-70m.zarr", every=1000)  # doctest: +SKIP
    """
    return run_import(plan_import(src, dest, **options), progress)


__all__ = [
    "IMPORT_FORMAT",
    "MAIN",
    "SCHEME",
    "STEP_BRANCH",
    "CacheGuard",
    "HubListing",
    "HubPlan",
    "HubReport",
    "Revision",
    "fetch",
    "import_hub",
    "list_revisions",
    "parse_source",
    "plan_import",
    "run_import",
    "select",
]
