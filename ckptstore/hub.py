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

Needs huggingface_hub and transformers: the ``hf`` extra (``pip install 'ckpt-dynamics[hf]'``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt.errors import ImportFormatError, StoreExistsError
from ckpt.store import _zarr
from ckpt.store.format import ROOT_ATTR, history_entry
from ckpt.store.importers import (
    HF_CAUSAL_LM,
    HF_FACTORY,
    HF_WEIGHTS,
    CheckpointSource,
    checkpoint_loader,
    compile_step_pattern,
    hf_model_config,
)
from ckpt.store.publish import occupied
from ckpt.store.selection import (
    SELECTION_ATTR,
    TensorSelection,
    check_same_selection,
    parse_globs,
    select_steps,
    step_bounds,
)

SCHEME = "hf://"
"""The prefix of a Hub source: ``hf://ORG/NAME`` (``hf://ORG/NAME@REVISION`` for one revision)."""
IMPORT_FORMAT = "hub"
"""The ``import_format`` a Hub import records in the store's attrs."""
STEP_BRANCH = re.compile(r"step(\d+)(?:-tokens\d+[A-Za-z]*)?")
"""Branch names with a step, by default: Pythia's ``step1000``, OLMo's ``step1000-tokens4B``."""
MAIN = "main"
_CONFIG = "config.json"
_SHOWN = 5


@dataclass(frozen=True)
class Revision:
    """One revision of a Hub repository that is a checkpoint: its name, its commit, its step."""

    name: str
    commit: str
    step: int


@dataclass(frozen=True)
class HubListing:
    """The revisions of a repository, as huggingface_hub lists them (online, or from the cache offline)."""

    repo: str
    revisions: tuple[Revision, ...]
    """Revisions with a step, by step."""
    skipped: tuple[str, ...]
    """Branches whose name states no step (named by the import, never silently dropped)."""
    main: str | None
    """What became of ``main``: the step branch it is the commit of, imported, or why not (None: no main)."""
    offline: bool
    main_commit: str | None = None


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


def parse_source(src: str) -> tuple[str, str | None]:
    """The repository id and the revision of ``hf://ORG/NAME[@REVISION]`` (huggingface_hub's own URI parser)."""
    try:
        from huggingface_hub import parse_hf_uri
        from huggingface_hub.errors import HfUriError
    except ImportError:
        msg = f"importing {src} needs huggingface_hub and transformers: pip install 'ckpt-dynamics[hf]'"
        raise ImportFormatError(msg) from None
    try:
        uri = parse_hf_uri(src)
    except HfUriError as exc:
        raise ImportFormatError(f"{exc}".strip().rstrip(".") + "; expected hf://ORG/NAME") from None
    if uri.type != "model" or uri.path_in_repo:
        what = f"a {uri.type} repository" if uri.type != "model" else f"a path inside {uri.id}"
        raise ImportFormatError(f"{src} names {what}; ckpt imports model repositories: hf://ORG/NAME")
    return uri.id, uri.revision


def _step_of_name(name: str, compiled: tuple[re.Pattern[str], int | str] | None) -> int | None:
    if compiled is None:
        match = STEP_BRANCH.fullmatch(name)
        return int(match.group(1)) if match else None
    pattern, group = compiled
    match = pattern.search(name)
    value = match.group(group) if match else None
    return int(value) if value is not None and value.isdecimal() else None


def _online_branches(repo: str) -> dict[str, str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HTTPError, RepositoryNotFoundError

    try:
        refs = HfApi().list_repo_refs(repo)
    except GatedRepoError:
        msg = f"hf://{repo} is gated: accept its terms on the Hub, then log in (hf auth login) or set HF_TOKEN"
        raise ImportFormatError(msg) from None
    except RepositoryNotFoundError:
        msg = f"hf://{repo} is not a model repository on the Hub, or it is private: check the name, or log in"
        raise ImportFormatError(f"{msg} (hf auth login) or set HF_TOKEN") from None
    except (HTTPError, OSError) as exc:  # HTTPError: httpx's, the base of the Hub's errors and connection errors
        msg = f"cannot list the revisions of hf://{repo} on the Hub ({type(exc).__name__}: {exc})"
        raise ImportFormatError(f"{msg}; with HF_HUB_OFFLINE=1 ckpt imports the revisions in the local cache") from None
    return {branch.name: branch.target_commit for branch in refs.branches}


def _cached_repo(repo: str) -> Any:
    """huggingface_hub's scan of ``repo`` in the cache (``CachedRepoInfo``); an error when it is not there."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    cache = constants.HF_HUB_CACHE
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        info = None
    found = [r for r in (info.repos if info else ()) if r.repo_id == repo and r.repo_type == "model"]
    if found:
        return found[0]
    broken = [str(w) for w in (info.warnings if info else ()) if f"models--{repo.replace('/', '--')}" in str(w)]
    if broken:
        raise ImportFormatError(f"the Hub cache's copy of hf://{repo} is damaged: {broken[0]}")
    msg = f"hf://{repo} is not in the Hub cache at {cache} and HF_HUB_OFFLINE is set"
    raise ImportFormatError(f"{msg}: unset it to download, or point HF_HUB_CACHE at the cache that holds it")


def _cached_branches(repo: str) -> dict[str, str]:
    cached = _cached_repo(repo)
    # refs/pr/N are pull requests, not branches of the run
    return {ref: rev.commit_hash for ref, rev in cached.refs.items() if not ref.startswith("refs/")}


def list_revisions(repo: str, step_pattern: str | None = None, main_step: int | None = None) -> HubListing:
    """The revisions of Hub repository ``repo`` that are checkpoints, and their steps.

    Parameters
    ----------
    repo
        ``ORG/NAME``.
    step_pattern
        Regular expression searched in each branch name, whose one capturing group (or group
        named ``step``) is the step; by default a name is ``stepN`` or ``stepN-tokens...``
        (:data:`STEP_BRANCH`). Branches without a step are listed in ``skipped``.
    main_step
        The step of ``main`` when no step branch is its commit (by default it is then not
        imported: its step is unknown). When ``main`` is a step branch's commit it is that
        checkpoint, imported once.

    Returns
    -------
    HubListing
        Online, the Hub's branches (``HfApi.list_repo_refs``); with ``HF_HUB_OFFLINE=1``, the
        refs in the local cache.

    Raises
    ------
    ImportFormatError
        The repository cannot be listed, no branch has a step, two branches have one step, or
        ``main_step`` is taken.

    """
    from huggingface_hub import is_offline_mode

    offline = is_offline_mode()
    branches = _cached_branches(repo) if offline else _online_branches(repo)
    compiled = None if step_pattern is None else compile_step_pattern(step_pattern)
    by_step: dict[int, Revision] = {}
    skipped = []
    for name in sorted(branches):
        step = None if name == MAIN else _step_of_name(name, compiled)
        if step is None:
            if name != MAIN:
                skipped.append(name)
            continue
        if step in by_step:
            msg = f"branches {by_step[step].name} and {name} of hf://{repo} both have step {step}"
            raise ImportFormatError(f"{msg}; select one with --revisions, or pass --step-pattern")
        by_step[step] = Revision(name, branches[name], step)
    main_note = None
    if MAIN in branches:
        same = [r for r in by_step.values() if r.commit == branches[MAIN]]
        if same:
            if main_step is not None:
                msg = f"main of hf://{repo} is the commit of {same[0].name} (step {same[0].step}): drop --main-step"
                raise ImportFormatError(msg)
            main_note = f"main is the commit of {same[0].name}: imported once, as step {same[0].step}"
        elif main_step is not None:
            if main_step in by_step:
                raise ImportFormatError(f"--main-step {main_step} is the step of branch {by_step[main_step].name}")
            by_step[main_step] = Revision(MAIN, branches[MAIN], main_step)
            main_note = f"main (commit {branches[MAIN][:10]}) imported as step {main_step} (--main-step)"
        else:
            main_note = (
                f"main (commit {branches[MAIN][:10]}) is no step branch's commit, so its step is unknown: "
                "not imported; pass --main-step N to import it as step N"
            )
    elif main_step is not None:
        raise ImportFormatError(f"hf://{repo} has no branch main for --main-step")
    if not by_step:
        names = ", ".join(sorted(branches)[:_SHOWN]) or "none"
        msg = f"no revision of hf://{repo} states a step (its branches: {names})"
        raise ImportFormatError(f"{msg}; pass --step-pattern REGEX for its names, or --main-step N to import main")
    revisions = tuple(by_step[s] for s in sorted(by_step))
    return HubListing(repo, revisions, tuple(skipped), main_note, offline, branches.get(MAIN))


def _span(revisions: Sequence[Revision]) -> str:
    if not revisions:
        return "none"
    return f"{revisions[0].name} .. {revisions[-1].name}, {len(revisions)} in all"


def _matches(item: str, revisions: Sequence[Revision], listing: HubListing) -> list[Revision]:
    """The revisions one ``--revisions`` item names: a step, a step range (``A-B``, ``A-``), main, a name or glob."""
    bounds = step_bounds(item)  # the parser of --steps too (ckpt.store.selection)
    if bounds is not None:
        low, high = bounds
        return [r for r in revisions if low <= r.step and (high is None or r.step <= high)]
    if item == MAIN:  # the step branch of main's commit, or main itself with --main-step
        return [r for r in revisions if r.commit == listing.main_commit]
    return [r for r in revisions if fnmatch.fnmatchcase(r.name, item)]


def select(
    listing: HubListing,
    revisions: str | None = None,
    every: int | None = None,
    log_spaced: int | None = None,
    steps: str | None = None,
) -> tuple[Revision, ...]:
    """The revisions of ``listing`` that an import takes.

    Parameters
    ----------
    listing
        From :func:`list_revisions`.
    revisions
        Comma-separated items, each a branch name (``step1000``, ``main``), a glob
        (``step*000``), a step (``1000``) or an inclusive step range (``1000-5000``, ``100000-``);
        an item that matches no revision is an error. Default: every revision with a step.
    steps
        Then only these steps: comma-separated steps and step ranges, as for a local folder's
        ``--steps`` (:func:`ckpt.store.selection.select_steps`); an item matching none is an error.
    every
        Then only steps that are multiples of ``every``.
    log_spaced
        Then at most this many revisions, spaced evenly in log(step + 1) between the first and
        the last (each the revision nearest a log-spaced target; the first and last included).

    Raises
    ------
    ImportFormatError
        An item matches nothing, or nothing is left.

    """
    import numpy as np

    chosen = list(listing.revisions)
    if revisions is not None:
        picked: dict[int, Revision] = {}
        for item in (part.strip() for part in revisions.split(",")):
            if not item:
                continue
            found = _matches(item, listing.revisions, listing)
            if not found:
                why = f" ({listing.main})" if item == MAIN and listing.main else ""
                skipped = f"; branches without a step: {', '.join(listing.skipped[:_SHOWN])}" if listing.skipped else ""
                msg = f"--revisions: {item!r} matches no revision of hf://{listing.repo}{why}"
                raise ImportFormatError(f"{msg}; its revisions: {_span(listing.revisions)}{skipped}")
            picked.update((r.step, r) for r in found)
        chosen = [picked[s] for s in sorted(picked)]
    if steps is not None:
        kept = set(select_steps(steps, [r.step for r in chosen], f"revision of hf://{listing.repo}"))
        chosen = [r for r in chosen if r.step in kept]
    if every is not None:
        chosen = [r for r in chosen if r.step % every == 0]
    if log_spaced is not None and len(chosen) > log_spaced:
        logs = np.log1p(np.asarray([r.step for r in chosen], dtype=np.float64))
        targets = np.linspace(logs[0], logs[-1], log_spaced)
        nearest = sorted({int(np.argmin(np.abs(logs - t))) for t in targets})
        chosen = [chosen[i] for i in nearest]
    if not chosen:
        raise ImportFormatError(
            f"no revision of hf://{listing.repo} is left by the selection ({_span(listing.revisions)})"
        )
    return tuple(chosen)


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
    for revision in _cached_repo(repo).revisions:
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
