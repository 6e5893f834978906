"""``ckpt info`` and ``ckpt verify``: inspecting a store."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ckpt.store.format import PARTIAL_SUFFIX


def _size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _duplicates_row(found: dict[str, Any] | None) -> str:
    if found is None or not found["checked"]:
        return "not checked (no digests: format v1)"
    if not found["groups"] and not found["partial"]:
        return "none (no checkpoint holds another step's tensors, by digest)"
    parts = [f"{len(found['groups'])} group(s) of identical checkpoints"] if found["groups"] else []
    if found["identical_to_final"]:
        parts.append(f"{len(found['identical_to_final'])} identical to the final one")
    if found["partial"]:
        parts.append(f"{len(found['partial'])} partly another step's")
    return "WARNING: " + ", ".join(parts) + " (see the Warning line)"


def _shown(value: Any) -> str:
    """A value read from the store, as printed: its repr when it is not plain printable text."""
    return value if isinstance(value, str) and value.isprintable() else repr(value)


def import_source(s: Any) -> dict[str, Any] | None:
    """Where the store was imported from, and each imported revision's step and commit (None: not imported)."""
    origin = s.attrs.get("imported_from")
    if not isinstance(origin, str):
        return None
    revisions = [
        {"step": e.get("step"), "revision": e.get("revision"), "commit": e.get("commit")}
        for e in s.history
        if isinstance(e, dict) and e.get("event") == "import" and e.get("source") == origin and "revision" in e
    ]
    return {"source": origin, "format": s.attrs.get("import_format"), "revisions": revisions}


def _run_state(finished: bool | None) -> str:
    """Whether the run is finished, as the commit record says (``Writer.close()`` marks it)."""
    if finished is None:
        return "unknown (written before ckpt recorded whether a run is finished)"
    if finished:
        return "finished (its writer closed it)"
    return "open (a writer has it open, or was stopped before closing it)"


def _format_info(info: dict[str, Any], show_tensors: int) -> str:
    lines = [f"{info['path']}  (ckpt store, format v{info['format_version']})"]

    def row(key: str, value: Any) -> None:
        lines.append(f"  {key:<12} {value}")

    row("framework", info["framework"] or "-")
    model = info["model"]
    row("model", "-" if model is None else f"{model['factory']}  {json.dumps(model['config'])}")
    if model is not None:
        untrusted = f"NOT trusted: analyzers that rebuild the model need --trust-factory {model['current']}"
        row("", f"factory: {model['trusted'] or untrusted}")
    row("objective", info["objective"] or "-")
    row("integrity", info["unverifiable"] or "every piece has a digest (ckpt verify checks them)")
    found = info.get("nonfinite")
    weights = "not checked (--no-finite-check)" if found is None else "all finite"
    if found:
        more = " ..." if len(found) > 5 else ""
        weights = f"NaN or inf at {len(found)} checkpoint(s): " + "; ".join(found[:5]) + more
    row("weights", weights)
    row("duplicates", _duplicates_row(info.get("duplicates")))
    row("created", info["created"])
    row("run", _run_state(info.get("finished")))
    source = info.get("source")
    if source is not None:
        revisions = source["revisions"]
        listed = (
            f", {len(revisions)} revision(s) ({_shown(revisions[0]['revision'])} .. "
            f"{_shown(revisions[-1]['revision'])}; --json lists each one's commit)"
            if revisions
            else ""
        )
        kind = "" if revisions else f" (format {_shown(source['format'])})"
        row("imported", f"from {_shown(source['source'])}{kind}{listed}")
    parent = info.get("parent")
    if parent is not None:
        digest = parent["digest"] or "none recorded"
        grown = f", grown: {', '.join(parent['grown'])}" if parent["grown"] else ""
        row("parent", f"{parent['path']} at step {parent['step']} (checkpoint digest {digest}{grown})")
        status = info.get("parent_status")
        if status is not None:
            row("", f"{'OK' if status['state'] == 'matches' else 'WARNING'}: {status['detail']}")
    ckpts = info["checkpoints"]
    span = f"steps {ckpts['first']} .. {ckpts['last']}" if ckpts["count"] else "none yet"
    row("checkpoints", f"{ckpts['count']} ({span})")
    tensors = info["tensors"]
    selection = info.get("selection")
    count = (
        f"{len(tensors)}"
        if selection is None
        else f"{len(tensors)} of {selection['of']} (selected by {selection['option']})"
    )
    row("tensors", f"{count}, {info['parameters']:,} parameters, {_size(info['bytes_per_checkpoint'])} per checkpoint")
    if tensors and show_tensors:
        width = max(len(t["name"]) for t in tensors[:show_tensors])
        for t in tensors[:show_tensors]:
            shape = str(tuple(t["shape"]))
            lines.append(f"      {t['name']:<{width}}  {shape:<16} {t['dtype']:<9} {_size(t['bytes']):>9}")
        if len(tensors) > show_tensors:
            lines.append(f"      ... {len(tensors) - show_tensors} more (--tensors all)")
    row("metrics", ", ".join(info["metrics"]) or "-")
    if info["splits"]:
        for i, (name, split) in enumerate(info["splits"].items()):
            labels = ", ".join(split["labels"]) or "none"
            text = f"{name}: {split['examples']} examples, {split['datapoints']} datapoints, labels: {labels}"
            row("data" if i == 0 else "", text)
    else:
        row("data", "-")
    named = info.get("analyzers", {})
    listed = [
        f"{n} (unfinished {named[n]}: rerun it to resume)"
        if n.endswith(PARTIAL_SUFFIX) and named.get(n) != n
        else n
        if named.get(n, n) == n
        else f"{n} ({named[n]})"
        for n in info["analyses"]
    ]
    row("analyses", ", ".join(listed) or "-")
    return "\n".join(lines)


@click.command()
@click.argument("store", metavar="STORE")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--tensors",
    "tensors",
    default="20",
    show_default=True,
    metavar="N|all",
    help="How many tensors to list (all: every tensor).",
)
@click.option(
    "--no-finite-check",
    is_flag=True,
    help="Do not read the weights to look for NaN or inf (fast on huge stores; bench/store.py measures the cost).",
)
def info(store: str, as_json: bool, tensors: str, no_finite_check: bool) -> None:
    """Show a store's metadata, checkpoints, tensors, data splits and analyses.

    Reads every checkpoint once to name the tensors holding NaN or inf (--no-finite-check skips it).
    Checkpoints identical to another step's, wholly or in some tensors, are named in a `Warning:`
    line, from the digests of the commit record (nothing read).
    """
    import ckpt.store as ckptstore
    from ckpt.cli.trajectory import warn_duplicates
    from ckpt.store.lineage import parent_status

    if tensors != "all" and not tensors.isdigit():
        raise click.BadParameter(f"expected a number or 'all', got {tensors!r}", param_hint="--tensors")
    opened = ckptstore.open(store)
    summary = opened.info()
    summary["duplicates"] = warn_duplicates(opened, store).to_json()  # the record's digests: nothing read
    summary["nonfinite"] = None if no_finite_check else nonfinite_in(opened)
    summary["selection"] = selection_summary(opened, store)
    summary["source"] = import_source(opened)
    if opened.parent is not None:  # opened again: whether it still holds what this run started from
        status = parent_status(opened.parent)
        summary["parent_status"] = {"state": status.state, "detail": status.detail}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(_format_info(summary, len(summary["tensors"]) if tensors == "all" else int(tensors)))


def selection_summary(s: Any, store: str) -> dict[str, Any] | None:
    """What ``ckpt info`` says of a store imported with ``--tensors``: the globs, N of M tensors; None otherwise."""
    from ckpt.store.selection import TensorSelection

    selection = TensorSelection.of_store(s.attrs, store)
    if selection is None:
        return None
    return selection.to_json() | {
        "tensors": len(s.tensor_names),
        "option": selection.option,
        "subset": True,  # the checkpoints hold these of the model's tensors, not all of them
    }


def _warn_nonfinite(store: str, found: list[str]) -> None:
    """One ``Warning:`` line naming every checkpoint tensor that holds NaN or inf."""
    if found:
        shown = "; ".join(found[:10]) + (f"; and {len(found) - 10} more" if len(found) > 10 else "")
        message = f"{store} holds non-finite weights: {shown}; results computed at those steps are NaN or inf"
        click.echo(f"Warning: {message}", err=True)


def nonfinite_in(s: Any) -> list[str]:
    """Every checkpoint tensor of store ``s`` holding NaN or inf, described (reads every checkpoint)."""
    from tqdm import tqdm

    from ckpt.store.reader import describe_nonfinite

    found = []
    with tqdm(s.steps, desc="checking for NaN/inf", unit="ckpt", leave=False, disable=None) as steps:
        for step in steps:
            counts = s.nonfinite(int(step))
            if counts:
                found.append(describe_nonfinite(int(step), counts))
    return found


def symbolic_links(store: str) -> list[str]:
    """One problem per symbolic link inside a local store: ckpt never writes through one, nor wrote one."""
    from ckpt.store.links import find_links
    from ckpt.store.publish import local_path

    local = local_path(store)
    return [
        f"symbolic link {link} (a link could point outside the store: replace it with what it stands for)"
        for link in (find_links(local) if local is not None else [])
    ]


def model_spec_problems(s: Any) -> tuple[list[str], str]:
    """The problem with store ``s``'s model spec, if any, and why it was not checked ("" when it was).

    The config is checked on ``meta``, allocating nothing (:meth:`ckpt.store.ModelSpec.check`). A
    factory that is not trusted is not imported to check it, nor one whose package is missing.
    """
    from ckpt.errors import ModelConfigError, StoreError

    spec = s.model
    if spec is None or not len(s.steps):
        return [], ""
    try:
        checked = spec.check()
    except ModelConfigError as exc:
        return [f"model spec: {exc}"], ""
    except StoreError:  # the factory's package is not installed here: nothing known of the store
        return [], f"{spec.factory} cannot be imported here"
    if not checked:
        return [], f"{spec.factory} is not trusted, or cannot be built on meta"
    return [], ""


@click.command()
@click.argument("store", metavar="STORE")
@click.option(
    "--allow-unverified",
    is_flag=True,
    help="Exit 0 although pieces without digests (format v1) could not be checked; they are still named.",
)
@click.option(
    "--no-finite-check",
    is_flag=True,
    help="Do not look for NaN or inf in the weights (they are read either way; the check adds a few percent).",
)
@click.option(
    "--trajectory",
    is_flag=True,
    help="Also print each checkpoint's distance to the previous one, the cosine of consecutive updates, and the "
    "checkpoints off their neighbours' path (possibly mislabeled), from the weights verify reads anyway.",
)
@click.option(
    "--outlier-ratio",
    type=click.FloatRange(min=1.0),
    default=2.0,
    show_default=True,
    metavar="K",
    help="--trajectory: flag a checkpoint farther than K x its neighbours' distance to each other from both.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was found as one JSON object (for scripts).")
def verify(
    store: str, allow_unverified: bool, no_finite_check: bool, trajectory: bool, outlier_ratio: float, as_json: bool
) -> None:
    """Check every checkpoint, data split, the metrics and every result against the commit record.

    A symbolic link inside a local store is a problem too (ckpt never writes a store holding one).

    Exit status: 0 when everything was checked and is intact; 1 naming what is corrupt; 3 when
    nothing was found corrupt but pieces without digests (a format v1 store, or pieces written by
    ckpt 0.1) could not be checked (`ckpt upgrade STORE` adds digests; --allow-unverified exits 0).
    Checkpoints holding NaN or inf are named in a `Warning:` line (they are what was written, not
    damage: the status does not change). The model spec is checked too, allocating nothing: the
    config against its factory's declared types and bounds, and the model built on torch's meta
    device against the stored tensors (a factory that is not trusted is not imported: the report
    says it was not checked).
    Checkpoints identical to another step's, wholly or in some tensors, are named in a `Warning:`
    line from the digests of the commit record; --trajectory adds the distances along the run and
    names the checkpoints that jump off it (docs/existing-runs.md, "Checking a trajectory").
    Neither changes the exit status.
    """
    from tqdm import tqdm

    import ckpt.store as ckptstore
    from ckpt.cli.trajectory import trajectory_table, warn_duplicates, warn_mislabeled
    from ckpt.errors import CorruptChunkError
    from ckpt.store.reader import describe_nonfinite, nonfinite_counts
    from ckpt.store.repair import analysis_problems
    from ckpt.store.trajectory import DistanceAccumulator, is_floating

    s = ckptstore.open(store)
    spec_problems, spec_unchecked = model_spec_problems(s)
    bad = symbolic_links(store) + spec_problems
    duplicates = warn_duplicates(s, store)
    floating = [name for name, t in s.schema.items() if is_floating(t.dtype)]
    distances = DistanceAccumulator(s.steps, floating, outlier_ratio) if trajectory else None
    nonfinite: list[str] = []
    # disable=None: a progress bar on a terminal, nothing when piped
    with tqdm(s.steps, desc="verifying", unit="ckpt", leave=False, disable=None) as steps:
        for index, step in enumerate(steps):
            for name in s.tensor_names:
                try:
                    value = s.tensors(int(step), [name])
                except CorruptChunkError:
                    bad.append(f"tensor {name!r} at step {int(step)}")
                    if distances is not None:
                        distances.lost(index, name)
                    continue
                if not no_finite_check and (counts := nonfinite_counts(value)):
                    nonfinite.append(describe_nonfinite(int(step), counts))
                if distances is not None:  # the weights read to check them: no second read
                    distances.add(index, name, value[name])
    _warn_nonfinite(store, nonfinite)
    path = distances.result() if distances is not None else None
    if path is not None:
        warn_mislabeled(path, store)
        if not as_json:
            for line in trajectory_table(path, duplicates):
                click.echo(line)
    for split in s.splits:
        try:
            s.data(split)
        except CorruptChunkError as exc:
            bad.append(str(exc).split(":")[0])
    try:
        s.metrics  # noqa: B018 - reading checks the metrics against the commit record
    except CorruptChunkError as exc:
        bad.append(str(exc).split(" (")[0])
    for name in s.analyses:
        bad += analysis_problems(s, name)
    unverifiable = None if bad else s.unverifiable_summary()
    if as_json:
        found = {"store": store, "checkpoints": len(s.steps), "tensors": len(s.tensor_names), "problems": bad}
        found["selection"] = selection_summary(s, store)
        found |= {"unverifiable": unverifiable, "nonfinite": nonfinite, "duplicates": duplicates.to_json()}
        click.echo(json.dumps(found | {"trajectory": None if path is None else path.to_json()}, indent=2))
    if bad:
        for problem in bad if not as_json else ():  # each on its own line (stdout); the error stays one line
            click.echo(f"  {problem}")
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        msg = f"{len(bad)} problem(s) in {store}: {shown}"
        raise CorruptChunkError(msg)
    if unverifiable is None:
        if as_json:
            return
        selection = selection_summary(s, store)
        subset = "" if selection is None else f" (of {selection['of']}, selected by {selection['option']})"
        click.echo(
            f"{store}: {len(s.steps)} checkpoints x {len(s.tensor_names)} tensors{subset}, {len(s.splits)} data "
            f"splits, the metrics and {len(s.analyses)} analyses OK"
            + (f" (the model spec was not checked: {spec_unchecked})" if spec_unchecked else "")
        )
        return
    if not as_json:
        click.echo(f"{store}: nothing found corrupt, but NOT verified: {unverifiable}")
    if not allow_unverified:
        from ckpt.cli.main import EXIT_UNVERIFIED

        sys.exit(EXIT_UNVERIFIED)


__all__ = ["info", "model_spec_problems", "nonfinite_in", "symbolic_links", "verify"]
