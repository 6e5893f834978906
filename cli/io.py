"""``ckpt import`` and ``ckpt repair``: bringing runs into a store and mending one after a crash."""

from __future__ import annotations

import json
from typing import Any

import click


def parse_config(text: str | None) -> dict | None:
    """The JSON object of a ``--config`` option (None when not given); a usage error otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc.msg} at character {exc.pos})", param_hint="--config") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object such as '{\"d_model\": 128}'", param_hint="--config")
    return value


@click.command("import")
@click.argument("src", metavar="SRC")
@click.argument("dest", metavar="DEST")
@click.option(
    "--format",
    "fmt",
    default="auto",
    show_default=True,
    metavar="auto|torch|safetensors|hf|...",
    help="Layout of SRC: a folder of .pt/.bin state_dicts, of .safetensors files, of HF checkpoint-N folders, "
    "or a format a plugin registers (ckpt plugins).",
)
@click.option("--model", metavar="ENTRYPOINT", help="Model factory 'package.module:function' to record.")
@click.option("--config", metavar="JSON", help="JSON object of keyword arguments for the model factory.")
@click.option("--objective", metavar="NAME", help="Per-datapoint loss the run was trained with.")
@click.option(
    "--step-pattern",
    metavar="REGEX",
    help="Regex with one group capturing the step in each file/folder name (default: the step each checkpoint "
    "records, else the one its name states; an ambiguous name is an error).",
)
@click.option("--key", metavar="KEY", help="Entry of each saved dict that holds the state_dict (e.g. 'model').")
@click.option("--overwrite", is_flag=True, help="Replace DEST if it exists.")
@click.option(
    "--tensors",
    "tensor_globs",
    multiple=True,
    metavar="GLOB",
    help="Import only the tensors whose names (after transformers' key conversion, as the model has them) match "
    "GLOB, e.g. 'gpt_neox.embed_in.*' or '*embed*'; repeatable or comma-separated. The store records the "
    "selection; analyzers that need more name what it lacks.",
)
@click.option(
    "--steps",
    "step_spec",
    metavar="SPEC",
    help="Import only these steps: comma-separated steps and inclusive ranges, e.g. 0,1000-5000,100000- "
    "(a folder or hf://).",
)
@click.option(
    "--revisions",
    metavar="SPEC",
    help="hf:// only: comma-separated branch names, globs (step*000), steps or step ranges (1000-5000, "
    "100000-) to import (default: every branch with a step).",
)
@click.option(
    "--every", type=click.IntRange(min=1), metavar="N", help="hf:// only: only steps that are multiples of N."
)
@click.option(
    "--log-spaced",
    type=click.IntRange(min=1),
    metavar="K",
    help="hf:// only: at most K revisions, evenly spaced in log(step + 1), first and last included.",
)
@click.option(
    "--main-step",
    type=click.IntRange(min=0),
    metavar="N",
    help="hf:// only: import branch main as step N when no step branch is its commit (default: not imported).",
)
@click.option(
    "--keep-cache",
    is_flag=True,
    help="hf:// only: keep the downloaded files in the Hub cache (default: each revision's downloads are "
    "removed once written; files cached before are never removed).",
)
def import_command(
    src: str,
    dest: str,
    fmt: str,
    model: str | None,
    config: str | None,
    objective: str | None,
    step_pattern: str | None,
    key: str | None,
    overwrite: bool,
    tensor_globs: tuple[str, ...],
    step_spec: str | None,
    **hub_options: Any,
) -> None:
    """Import existing checkpoints SRC (a folder, or a Hub repository hf://ORG/NAME) into a store DEST.

    One checkpoint at a time. When DEST is an earlier import of SRC (a run that is still training),
    the checkpoints newer than its last one are appended, after checking that the newest checkpoint
    both hold is the same.

    hf://ORG/NAME imports one checkpoint per branch whose name states a step (Pythia's stepN,
    OLMo's stepN-tokens...; --step-pattern for others) through huggingface_hub: its login and
    download cache, and with HF_HUB_OFFLINE=1 the revisions in the local cache. Each revision is
    committed as it completes: a rerun imports only the selected revisions DEST lacks (after a
    kill, or when new branches appear). `ckpt info --json` lists each step's revision and commit.
    Checkpoints identical to another step's, wholly or in some tensors, are named in a `Warning:`
    line (from the digests recorded while importing).

    --tensors and --steps import a subset, from a folder or the Hub: `ckpt info` shows the selection,
    `ckpt verify` compares the stored tensors with the model, and a rerun must ask for the same tensors.
    """
    from tqdm import tqdm

    import ckpt.store as ckptstore
    from ckpt.cli.analyze import registry
    from ckpt.cli.trajectory import warn_duplicates
    from ckpt.store.importers import FORMATS, discover, import_checkpoints
    from ckpt.store.selection import parse_globs, select_steps

    tensors = parse_globs(tensor_globs or None)
    if src.startswith("hf://"):
        options = {"fmt": fmt, "model": model, "config": config, "key": key}
        given = [f"--{name}" for name, value in options.items() if value not in (None, "auto")]
        if given:
            raise click.UsageError(f"{given[0].replace('fmt', 'format')} does not apply to a Hub repository SRC")
        options = {"objective": objective, "step_pattern": step_pattern, "overwrite": overwrite}
        import_hub(src, dest, **options, steps=step_spec, tensors=tensors, **hub_options)
        return
    given = [f"--{name.replace('_', '-')}" for name, value in hub_options.items() if value not in (None, False)]
    if given:
        raise click.UsageError(f"{given[0]} applies to a Hub repository SRC (hf://ORG/NAME), not to a folder")
    importers = registry().importers
    if fmt != "auto" and fmt not in importers:
        choices = ", ".join(["auto", *sorted(importers)])
        raise click.BadParameter(f"unknown format {fmt!r}; choose from {choices}", param_hint="--format")
    parsed_config = parse_config(config)
    options = {"model": model, "config": parsed_config, "objective": objective, "step_pattern": step_pattern}
    options.update(key=key, overwrite=overwrite)
    if fmt != "auto" and fmt not in FORMATS:  # a plugin's importer
        if tensors or step_spec is not None:
            raise click.UsageError(f"--{'tensors' if tensors else 'steps'} applies to the built-in formats, not {fmt}")
        report = importers[fmt].run(src, dest, **options)
        click.echo(f"imported {src} into {dest} ({fmt})")
        warn_duplicates(ckptstore.open(dest), dest)
        return
    total = len(discover(src, fmt, step_pattern))
    if step_spec is not None:  # the bar counts what is imported
        total = len(select_steps(step_spec, [c.step for c in discover(src, fmt, step_pattern)], f"checkpoint of {src}"))
    options.update(tensors=tensors, steps=step_spec)
    with tqdm(total=total, unit="ckpt", desc="importing", leave=False, disable=None) as bar:
        report = import_checkpoints(src, dest, format=fmt, progress=lambda done, total, step: bar.update(1), **options)
    steps = report.steps
    warn_duplicates(ckptstore.open(str(report.dest)), str(report.dest))  # the whole store: appended steps too
    if report.skipped:
        names = ", ".join(report.skipped)
        click.echo(
            f"Warning: skipped {len(report.skipped)} files that are not {report.format} checkpoints: {names}", err=True
        )
    if report.appended:
        if steps:
            click.echo(
                f"appended {len(steps)} new {report.format} checkpoints (steps {steps[0]} .. {steps[-1]}) to "
                f"{report.dest}, which held {report.kept}"
            )
        else:
            click.echo(f"{report.dest} is up to date with {src}: it holds all {report.kept} checkpoints")
        return
    click.echo(
        f"imported {len(steps)} {report.format} checkpoints (steps {steps[0]} .. {steps[-1]}), "
        f"{report.tensors} tensors each{_selected(report.dest)}, into {report.dest}"
    )


def _selected(dest: str) -> str:
    """`` (of M, selected by --tensors ...)`` for a store imported with ``--tensors``, else nothing."""
    import ckpt.store as ckptstore
    from ckpt.store.selection import TensorSelection

    selection = TensorSelection.of_store(ckptstore.open(dest).attrs, dest)
    return "" if selection is None else f" (of {selection.of}, selected by {selection.option})"


def import_hub(src: str, dest: str, **options: Any) -> None:
    """``ckpt import hf://ORG/NAME DEST``: plan, say what is skipped, import with a bar per revision."""
    from tqdm import tqdm

    import ckpt.store as ckptstore
    from ckpt.cli.trajectory import warn_duplicates
    from ckpt.store.hub import plan_import, run_import

    plan = plan_import(src, dest, **options)
    listing = plan.listing
    if listing.skipped and not plan.picked:
        names = ", ".join(listing.skipped[:10]) + (" ..." if len(listing.skipped) > 10 else "")
        click.echo(
            f"Warning: {len(listing.skipped)} branch(es) of {plan.source} state no step and are not imported: "
            f"{names} (--step-pattern REGEX reads steps from other names)",
            err=True,
        )
    if listing.main is not None and not plan.picked:
        main_is_a_step = any(r.commit == listing.main_commit for r in listing.revisions)
        click.echo(listing.main if main_is_a_step else f"Warning: {listing.main}", err=not main_is_a_step)
    for line in plan.rewritten:
        click.echo(f"Warning: {plan.source}: {line}; pass --overwrite to re-import", err=True)
    where = "the Hub cache (HF_HUB_OFFLINE)" if listing.offline else "the Hub"
    if not plan.new:
        click.echo(f"{dest} is up to date with {plan.source}: it holds all {len(plan.selected)} selected revisions")
        return
    held = f", {plan.held} already in {dest}" if plan.held else ""
    click.echo(f"importing {len(plan.new)} revision(s) of {plan.source} from {where}{held}")
    with tqdm(total=len(plan.new), unit="rev", desc="importing", leave=False, disable=None) as bar:

        def progress(done: int, revision: Any, nbytes: int) -> None:
            bar.set_postfix_str(f"{revision.name}: {_bytes(nbytes)}")
            bar.update(1)

        report = run_import(plan, progress)
    warn_duplicates(ckptstore.open(dest), dest)  # the whole store: a Hub suite's revisions are checked, not trusted
    steps = [r.step for r in report.imported]
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} .. {steps[-1]}"
    click.echo(
        f"imported {len(steps)} revision(s) of {plan.source} ({span}, "
        f"{_bytes(report.bytes_read)} read), {report.tensors} tensors each{_selected(dest)}, into {dest}"
    )


def _bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


@click.command()
@click.argument("store", metavar="STORE")
def repair(store: str) -> None:
    """Make a damaged store consistent: rebuild what the commit record allows, drop what cannot be trusted.

    Removes what a crashed writer left beyond the last commit; rewrites a lost chunk of the step
    array from the commit record; drops checkpoints with a missing or damaged tensor, data splits
    and metrics that fail their hashes, and analyses that are damaged or hold a dropped checkpoint.
    Prints one line per thing dropped; the store's history records them. Run `ckpt verify` first
    to see what is wrong without changing anything.
    """
    from ckpt.store.repair import repair as repair_store

    report = repair_store(store)
    for line in report.lines():
        click.echo(f"  {line}")
    detail = "nothing damaged or uncommitted found" if not report.lines() else f"{len(report.lines())} repair(s)"
    click.echo(f"{store}: {report.checkpoints} committed checkpoints; {detail}")
    if report.dropped_anything:
        click.echo("what was dropped is gone from the store; recompute dropped analyses with `ckpt analyze`")


@click.command()
@click.argument("store", metavar="STORE")
def upgrade(store: str) -> None:
    """Add the digests a store lacks (format v1, or pieces written by ckpt 0.1) so that it can be verified.

    Reads every checkpoint, metric column, data split and result that has no digest, as it is now,
    and records their digests in one atomic commit (format v2), with a history entry saying they
    were taken on trust at first use: damage done before the upgrade stays undetected, damage after
    it is caught. Run `ckpt verify STORE --allow-unverified` first to check what can be checked.
    A store that needs nothing is left unchanged.
    """
    from ckpt.store.upgrading import upgrade as upgrade_store

    report = upgrade_store(store)
    if not report.changed:
        click.echo(f"{store}: every checkpoint, metric, data split and result already has a digest; nothing to do")
        return
    parts = [f"{report.checkpoints} checkpoint(s)", f"{report.metrics} metric column(s)"]
    parts += [f"{len(report.splits)} data split(s)", f"{len(report.results)} result(s)"]
    click.echo(
        f"{store}: format v{report.from_version} -> v2; recorded digests of {', '.join(parts)} "
        "(trust on first use: taken from the bytes as they are now)"
    )


__all__ = ["import_command", "parse_config", "repair", "upgrade"]
