"""``ckpt report``: one self-contained HTML file of a store's metadata, analyses, figures and provenance.

Self-contained means the figures are PNGs inlined as data URIs and the only script is a few lines
of plain JavaScript: the file opens offline, from an e-mail or a cluster's scratch disk, with no
server. The interactive layer is that script, not a plotting library: the step slider swaps
pre-rendered frames drawn by the same matplotlib code as ``ckpt animate``, so what a user scrubs
through is exactly what the static figures show. (plotly would add hover values but also ~3.5 MB
of JavaScript to every report, and a second rendering of each figure to keep in step.)

Nothing in the page is trusted: a store is data, and so is the text of an exception about it.
Every text is escaped (:func:`_text`), and the page's Content-Security-Policy runs only the
script and stylesheet written here (by their SHA-256) and loads nothing but ``data:`` images, so
that an escape missed one day still cannot run script or fetch anything.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckpt.analyzers.figures import COLORS, displayable, new_figure, png_bytes, positive_log, step_axis

SLIDER_FRAMES = 40
"""Checkpoints in the report's step slider (evenly spread; ``ckpt animate`` draws them all)."""
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { padding: 2px 10px; text-align: left; }
tr:nth-child(even) { background: #f5f5f5; } pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; }
img { max-width: 100%; display: block; margin: 0.5em 0; } .stale { color: #b00; font-weight: bold; }
.error { color: #b00; } #slider { width: 60%; } figure { margin: 0; } .missing { color: #b60; font-weight: bold; }
"""
SLIDER_SCRIPT = """
const frames = JSON.parse(document.getElementById('frames').textContent);
const slider = document.getElementById('slider');
function show(i) {
  document.getElementById('frame').src = 'data:image/png;base64,' + frames[i].png;
  document.getElementById('frame-step').textContent = 'step ' + frames[i].step;
}
slider.addEventListener('input', () => show(Number(slider.value)));
show(Number(slider.value));
"""


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


POLICY = (
    f"default-src 'none'; script-src {_sha256(SLIDER_SCRIPT)}; style-src {_sha256(STYLE)}; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)
"""The page's Content-Security-Policy: its own slider script and stylesheet, inlined images, nothing else."""


def _text(value: Any) -> str:
    """``value`` as HTML text (also safe in a quoted attribute), undecodable characters replaced."""
    return html.escape(displayable(str(value)), quote=True)


def _image(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode()
    return f'<img alt="{_text(alt)}" src="data:image/png;base64,{data}">'


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f"<tr><th>{_text(k)}</th><td>{_text(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def metadata(store: Any) -> list[tuple[str, Any]]:
    """The run's table: path, checkpoints, tensors, parameters, model spec, data splits and recorded settings."""
    steps = [int(s) for s in store.steps]
    attrs = store.attrs
    rows: list[tuple[str, Any]] = [
        ("store", store.path),
        ("checkpoints", f"{len(steps)} ({steps[0]} .. {steps[-1]})" if steps else "none"),
        ("tensors", len(store.tensor_names)),
        ("parameters", sum(int(np.prod(info.shape)) for info in store.schema.values())),
        ("framework", store.framework or "-"),
        ("objective", store.objective or "-"),
        ("created", store.created),
        ("data splits", ", ".join(store.splits) or "none"),
    ]
    rows += [(k, v) for k, v in attrs.items() if isinstance(v, str | int | float | bool)]
    config = attrs.get("config")
    if isinstance(config, dict):
        rows += [(f"config.{k}", json.dumps(v)) for k, v in config.items()]
    return rows


def metrics_figure(store: Any) -> bytes | None:
    """PNG of the metrics recorded during training (losses, others, learning rate), or None when there are none."""
    metrics = store.metrics
    names = list(metrics.data_vars)
    if not names:
        return None
    losses = [n for n in names if "loss" in n]
    rates = [n for n in names if n in ("lr", "learning_rate")]  # ~1e-3: flat at 0 beside accuracies
    others = [n for n in names if n not in losses and n not in rates]
    groups = [g for g in (losses, others, rates) if g]
    figure = new_figure(len(groups), columns=2, width=5.5)
    for axes, group in zip(figure.axes, groups, strict=True):
        for index, name in enumerate(group):
            series = metrics[name].dropna("step")
            axes.plot(series["step"].values, series.values, color=COLORS[index % len(COLORS)], label=name)
        if group is losses:
            positive_log(axes, np.concatenate([metrics[n].values for n in group]))
        step_axis(axes, metrics["step"].values)
        axes.legend(fontsize="small")
    figure.suptitle("metrics recorded during training")
    return png_bytes(figure)


def _slider(store: Any) -> tuple[str, list[str]]:
    """The embeddings-over-training section, and the problem met drawing it (also shown in the page).

    A store without a token embedding has no slider, and says nothing. Any other failure (a damaged
    checkpoint or ``embedding-geometry`` result) is named in the page and printed, never dropped.
    """
    from ckpt.analyzers.figures.animation import Frames
    from ckpt.analyzers.figures.geometry import default_view
    from ckpt.errors import CkptError

    try:
        view = default_view(store)
        if view is None:
            return "", []
        frames = Frames(store, view)
        figure = frames.figure()
        steps = frames.steps(SLIDER_FRAMES)
        rendered = [
            {"step": step, "png": base64.b64encode(png_bytes(figure, dpi=72)).decode()}
            for step in frames.frames(figure, steps)
        ]
    except CkptError as exc:
        problem = f"embeddings over training: not drawn ({exc})"
        return f'<h2>Embeddings over training</h2><p class="error">{_text(problem)}</p>', [problem]
    payload = json.dumps(rendered).replace("<", "\\u003c")  # data, never the end of its element
    section = (
        "<h2>Embeddings over training</h2>"
        f"<p>{_text(frames.view.title)}: drag the slider through {len(steps)} checkpoints "
        "(<code>ckpt animate</code> writes every checkpoint as a GIF or MP4).</p>"
        f'<input type="range" id="slider" min="0" max="{len(steps) - 1}" value="{len(steps) - 1}" step="1"> '
        '<span id="frame-step"></span>'
        '<figure><img id="frame" alt="embeddings at the chosen step"></figure>'
        f'<script type="application/json" id="frames">{payload}</script>'
        f"<script>{SLIDER_SCRIPT}</script>"
    )
    return section, []


TRAJECTORY_ROWS = 40
"""Flagged steps listed under the trajectory figure before "and N more" (``ckpt verify --trajectory`` lists all)."""


def _trajectory(store: Any, distances: bool) -> tuple[str, list[str]]:
    """The trajectory section (docs/figures.md, "The report"), and the problems met drawing it (also in the page).

    Duplicates come from the commit record (no tensor read); with ``distances``, every floating
    tensor of every checkpoint is read once for the figure and the possibly mislabeled steps.
    """
    from ckpt.analyzers.figures.trajectory import figure, findings, read_trajectory
    from ckpt.errors import CkptError
    from ckpt.store.trajectory import duplicate_steps, is_floating

    heading = '<h2 id="trajectory">Trajectory</h2>'
    steps = [int(s) for s in store.steps]
    if len(steps) < 2:
        held = f"one checkpoint (step {steps[0]})" if steps else "no checkpoints"
        return f"{heading}<p>The store holds {_text(held)}: no trajectory to draw.</p>", []
    duplicates = duplicate_steps(store)
    body, problems, path = [heading], [], None
    floating = sum(1 for info in store.schema.values() if is_floating(info.dtype))
    if distances:
        lost: list[str] = []
        try:
            path, lost = read_trajectory(store)
        except CkptError as exc:  # a damaged tensor is a gap (read_trajectory); anything else ends the pass
            problems.append(f"trajectory: distances not drawn ({exc})")
        if lost:
            shown = "; ".join(lost[:3]) + (f"; and {len(lost) - 3} more" if len(lost) > 3 else "")
            problems.append(f"trajectory: {len(lost)} unreadable tensor(s), their distances not drawn: {shown}")
        body.append(
            f"<p>L2 distances between consecutive checkpoints: {len(steps)} checkpoints x {floating} "
            "floating-point tensors, each read once (<code>ckpt report --no-trajectory</code> skips this "
            "pass). Duplicates come from the digests of the commit record.</p>"
        )
        if path is not None:
            body.append(_image(png_bytes(figure(path, duplicates)), "trajectory distances"))
    else:
        body.append(
            f"<p>Distances not computed (<code>--no-trajectory</code>: they read {len(steps)} checkpoints x "
            f"{floating} floating-point tensors); duplicates come from the digests of the commit record, "
            "which costs no read.</p>"
        )
    if not duplicates.checked:
        body.append(
            "<p>Duplicates not checked: the store has no digests (format v1; <code>ckpt upgrade</code> adds them).</p>"
        )
    rows = findings(duplicates, path)
    if rows:
        more = len(rows) - TRAJECTORY_ROWS
        body.append(_table([(f"step {step}", text) for step, text in rows[:TRAJECTORY_ROWS]]))
        if more > 0:
            body.append(f"<p>and {more} more steps (<code>ckpt verify --trajectory</code> lists every step)</p>")
    elif duplicates.checked:
        off = "" if path is None else ", and none jumps off the path its neighbours draw"
        body.append(f"<p>No checkpoint duplicates another step's weights{off}.</p>")
    body += [f'<p class="error">{_text(p)}</p>' for p in problems]
    return "\n".join(body), problems


def _readable(store: Any, registry: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The stored results whose provenance may be read, by name; and why each other one may not.

    A result that cannot be opened (its files gone) or whose provenance is invalid (wrong types,
    another analyzer's result under an analyzer's name) is named in the page, not drawn.
    """
    from ckpt.errors import CkptError

    results, refused = {}, {}
    for name in store.analyses:
        try:
            result = store.analysis(name)  # lazy: each summary and figure reads what it draws
            result.ckpt.validate(name, store.path, registry.analyzers)
        except CkptError as exc:
            refused[name] = f"{name}: not shown ({exc})"
            continue
        results[name] = result
    return results, refused


@dataclass
class AnalysisParts:
    """What the report (and ``ckpt serve``'s live page) shows of one stored result, as data, not HTML."""

    rows: list[tuple[str, Any]]
    """Its provenance table: analyzer, options, steps, when and by what it was computed."""
    stale: bool
    """The store's data or model changed after it was computed."""
    analyzer: str
    """The analyzer that computed it (what to rerun)."""
    summary: str | None
    """Its analyzer's text summary (None when the summary failed: see ``problems``)."""
    figures: dict[str, Any]
    """Its analyzer's figures by key (matplotlib Figures)."""
    problems: list[str]
    """What could not be drawn, and why (also printed by ``ckpt report``)."""


def is_stale(store: Any, result: Any, registry: Any, current_data: tuple[str, str]) -> bool:
    """Whether ``result`` was computed on other data or another model than the store holds now.

    ``current_data`` is the store's (data hash, model hash) now. The data compared are the splits
    its analyzer reads (``data_splits``, as ``ckpt analyze`` decides reuse): a result of one split
    stays current when another split is added; every split when its analyzer is not installed.
    """
    from ckpt.engine.pipeline import data_hash, stored_identity
    from ckpt.errors import CkptError

    record = result.ckpt
    identity = stored_identity(record.provenance, store, current_data[1])
    data = current_data[0]
    cls = registry.analyzers.get(record.analyzer or "")
    if cls is not None:
        # options the installed analyzer refuses are named in its section; the data are compared whole here
        with contextlib.suppress(CkptError):
            data = data_hash(store, cls(**record.options).data_splits(store))
    return identity["data_sha256"] not in (None, data) or identity["model_sha256"] != current_data[1]


def analysis_parts(store: Any, name: str, result: Any, registry: Any, current_data: tuple[str, str]) -> AnalysisParts:
    """The table, summary and figures of one stored result, and the problems met drawing them.

    ``current_data`` is the store's (data hash, model hash) now: a result computed on other data
    or another model is marked stale.
    """
    from ckpt.errors import CkptError
    from ckpt.plugins import Analyzer

    problems: list[str] = []
    record = result.ckpt
    analyzer_name = record.analyzer or name
    steps = record.steps
    stale = is_stale(store, result, registry, current_data)
    rows: list[tuple[str, Any]] = [
        ("analyzer", f"{analyzer_name} v{record.version or '?'}"),
        ("options", json.dumps(record.options)),
        ("steps", f"{len(steps)} ({steps[0]} .. {steps[-1]})" if steps else "-"),
        ("computed", f"{record.created or '?'} by {record.computed_by or 'ckpt ?'}"),
        ("data sha256", (record.checked.get("data_sha256") or "-")[:16]),
    ]
    if record.requires:
        rows.append(("requires", ", ".join(record.requires)))
    cls = registry.analyzers.get(analyzer_name)
    analyzer = Analyzer()
    if cls is not None:
        try:
            analyzer = cls(**record.options)
        except CkptError as exc:
            problems.append(f"{name}: its options do not fit the installed {analyzer_name} ({exc})")
    # lazy: each summary and figure reads what it draws (a paper-size POLCA result is gigabytes)
    summary = None
    try:
        summary = analyzer.summarize(result)
    except Exception as exc:  # a plugin's summary must not cost the whole report: shown, not hidden
        problems.append(f"{name}: its summary failed ({type(exc).__name__}: {exc})")
    try:
        figures = analyzer.plot(result, store)
    except Exception as exc:  # likewise: the failure is written in the report and printed
        problems.append(f"{name}: its figures failed ({type(exc).__name__}: {exc})")
        figures = {}
    if cls is None:
        problems.append(f"{name}: analyzer {analyzer_name!r} is not installed: no summary or figures of its own")
    return AnalysisParts(rows, stale, analyzer_name, summary, dict(figures), problems)


def _analysis_section(
    store: Any, name: str, result: Any, registry: Any, current_data: tuple[str, str]
) -> tuple[str, list[str]]:
    """The section of one stored result, and the problems met drawing it (also shown in the page)."""
    parts = analysis_parts(store, name, result, registry, current_data)
    heading = f'<h2 id="{_text(name)}">{_text(name)}</h2>'
    if parts.stale:
        heading += (
            '<p class="stale">stale: the store\'s data or model changed after this result was computed; rerun '
            f"<code>ckpt analyze {_text(parts.analyzer)}</code></p>"
        )
    body = [heading, _table(parts.rows)]
    if parts.summary is not None:
        body.append(f"<pre>{_text(parts.summary)}</pre>")
    for key, figure in parts.figures.items():
        body.append(_image(png_bytes(figure), f"{name} {key}"))
    body += [f'<p class="error">{_text(p)}</p>' for p in parts.problems]
    return "\n".join(body), parts.problems


def _side_by_side(store: Any, readable: dict[str, Any], registry: Any) -> tuple[str, list[str]]:
    """A section per analyzer with several stored results: what differs in their options, and its comparison.

    Also the comparisons that failed (shown in the page and printed, as a failing figure of one result is).
    """
    by_analyzer: dict[str, list[str]] = {}
    for name, result in readable.items():
        by_analyzer.setdefault(result.ckpt.analyzer or name, []).append(name)
    parts, problems = [], []
    for analyzer_name, names in by_analyzer.items():
        cls = registry.analyzers.get(analyzer_name)
        if len(names) < 2 or cls is None:
            continue
        results = {name: readable[name] for name in names}
        options = {name: r.ckpt.options for name, r in results.items()}
        keys = sorted({k for o in options.values() for k in o})
        differing = [k for k in keys if len({json.dumps(o.get(k)) for o in options.values()}) > 1]
        rows = [(name, ", ".join(f"{k}={json.dumps(options[name].get(k))}" for k in differing)) for name in names]
        parts.append(f"<h3>{_text(analyzer_name)}: {len(names)} results</h3>{_table(rows)}")
        try:
            figures = cls().plot_together(results, store)
        except Exception as exc:  # a plugin's comparison, or a result it reads, must not cost the whole report
            problems.append(f"{analyzer_name}: comparison failed ({type(exc).__name__}: {exc})")
            parts.append(f'<p class="error">{_text(problems[-1])}</p>')
            continue
        parts += [_image(png_bytes(f), f"{analyzer_name} {key}") for key, f in figures.items()]
    return ("<h2>Side by side</h2>" + "".join(parts) if parts else ""), problems


def _development(
    store: Any, where: str, readable: dict[str, Any], registry: Any, current: tuple[str, str]
) -> tuple[str, list[str]]:
    """The development page (docs/development.md): its figure, what each panel is drawn from or how to make it."""
    import shlex

    from ckpt.analyzers.figures.development import WHAT, figure, gather

    found = gather(store, readable, lambda result: is_stale(store, result, registry, current))
    items = []
    for source in found.sources:
        command = f"<code>ckpt analyze {_text(source.analyzer)} {_text(shlex.quote(where))}</code>"
        item = f"{_text(WHAT[source.analyzer])}: "
        if source.result is not None:
            item += f"result <code>{_text(source.result)}</code>, {source.steps} checkpoints"
            if source.stale:
                item += f' <span class="stale">stale: the store\'s data or model changed since; rerun {command}</span>'
        elif source.metrics:
            names = ", ".join(f"<code>{_text(metric)}</code>" for metric in source.metrics)
            item += f"training metrics {names} (no <code>loss</code> result: {command} computes the exact loss)"
        else:
            item += f'<span class="missing">missing</span>: {command} computes it'
        if source.analyzer == "essential-dynamics" and source.result is not None and not source.notes:
            count = len(found.boundaries)
            at = f" at steps {', '.join(str(int(s)) for s in found.boundaries[:12])}" if count else ""
            more = f" and {count - 12} more" if count > 12 else ""
            item += f"; {count} turning point(s){at}{more}: {count + 1} stage(s)"
        item += "".join(f' <span class="error">{_text(note)}</span>' for note in source.notes)
        items.append(f"<li>{item}</li>")
    drawn = figure(found)
    body = [
        '<h2 id="development">Development</h2>',
        "<p>The run's loss, local learning coefficient, Hessian trace and essential-dynamics path on one step "
        "axis; dashed red lines are the stage boundaries of the essential dynamics (docs/development.md).</p>",
        f"<ul>{''.join(items)}</ul>",
        _image(png_bytes(drawn), "development") if drawn is not None else "<p>Nothing to draw yet.</p>",
    ]
    body += [f'<p class="error">{_text(p)}</p>' for p in found.problems]
    return "\n".join(body), found.problems


def write_report(where: str, out: str, registry: Any, *, trajectory: bool = True) -> list[str]:
    """Write the HTML report of the store at ``where`` to ``out``; return the problems met (also in the page).

    Parameters
    ----------
    where
        Path of the store.
    out
        Path of the HTML file (its folder must exist).
    registry
        The plugin registry whose analyzers draw the figures.
    trajectory
        Draw the distances between consecutive checkpoints (reads every floating tensor of every
        checkpoint once); False keeps only the duplicates, which come from the commit record.
    """
    import ckpt.store as ckptstore
    from ckpt.engine.pipeline import data_hash, model_hash

    store = ckptstore.open(where)
    current = (data_hash(store), model_hash(store))
    readable, refused = _readable(store, registry)
    sections, problems = [], []
    for name in store.analyses:
        if name in refused:
            problems.append(refused[name])
            sections.append(f'<h2 id="{_text(name)}">{_text(name)}</h2><p class="error">{_text(refused[name])}</p>')
            continue
        section, found = _analysis_section(store, name, readable[name], registry, current)
        sections.append(section)
        problems += found
    together, found = _side_by_side(store, readable, registry)
    problems += found
    metrics = metrics_figure(store)
    development, found = _development(store, where, readable, registry, current)
    problems += found
    slider, found = _slider(store)
    path, drawn = _trajectory(store, trajectory)
    problems = found + drawn + problems
    contents = "".join(f'<li><a href="#{_text(n)}">{_text(n)}</a></li>' for n in store.analyses)
    page = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        # first in the head, before any text read from the store
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">',
        f"<title>ckpt report: {_text(Path(where).name)}</title><style>{STYLE}</style></head><body>",
        f"<h1>ckpt report: {_text(Path(where).name)}</h1>",
        _table(metadata(store)),
        _image(metrics, "metrics") if metrics else "<p>No metrics were recorded during training.</p>",
        development,
        slider,
        path,
        f"<h2>Analyses</h2><ul>{contents}</ul>" if store.analyses else "<h2>Analyses</h2><p>None stored yet.</p>",
        together,
        *sections,
        f"<hr><p>Written by ckpt {_text(ckptstore.__version__)}.</p></body></html>",
    ]
    Path(out).write_text("\n".join(page), encoding="utf-8")
    return problems


__all__ = [
    "POLICY",
    "SLIDER_FRAMES",
    "SLIDER_SCRIPT",
    "STYLE",
    "TRAJECTORY_ROWS",
    "AnalysisParts",
    "analysis_parts",
    "is_stale",
    "metadata",
    "metrics_figure",
    "write_report",
]
