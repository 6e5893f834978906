"""The revisions of a Hugging Face Hub repository that are checkpoints, and which of them to import.

:func:`list_revisions` lists a repository's branches through huggingface_hub (online, or from the
local cache's refs with ``HF_HUB_OFFLINE=1``) and reads a step from each name (``step1000``,
``step1000-tokens4B``, or a ``--step-pattern``); :func:`select` keeps those named by
``--revisions``/``--steps``, every n-th or log-spaced ones. Re-exported by :mod:`ckpt.store.hub`,
where they were first defined; needs huggingface_hub (the ``hf`` extra).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckpt.errors import ImportFormatError
from ckpt.store.importers import compile_step_pattern
from ckpt.store.selection import select_steps, step_bounds

STEP_BRANCH = re.compile(r"step(\d+)(?:-tokens\d+[A-Za-z]*)?")
"""Branch names with a step, by default: Pythia's ``step1000``, OLMo's ``step1000-tokens4B``."""
MAIN = "main"
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


def cached_repo(repo: str) -> Any:
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
    cached = cached_repo(repo)
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


__all__ = ["MAIN", "STEP_BRANCH", "HubListing", "Revision", "cached_repo", "list_revisions", "parse_source", "select"]
