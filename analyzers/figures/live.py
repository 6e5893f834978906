"""What ``ckpt serve``'s live page shows of its stores, as data: a cheap state to poll, and sections to render.

The page polls :func:`state` (one JSON document: each store's run table, its table of
checkpoints, and the sections it has, each with a *version*) and asks for a section again only
when its version changed. A version is a digest of what the section is drawn from: the
checkpoint steps of the commit record for the metrics, a result's provenance (its steps, its
options, when it was computed) for an analysis. Computing the state opens each store and reads
its commit record and the provenance of its results, never a tensor or a result's arrays, so a
poll costs milliseconds; rendering a section (:func:`render`) draws it with the report's own
figure code (:mod:`ckpt.analyzers.figures.report`), so the page and ``ckpt report`` show the
same figures and tables.

Every name here that comes from a store (the store's path, a result's or a metric's name, a
setting) is data: it travels as JSON strings that the page's script puts in the page as text.
Sections are named by a digest of their name, so no store text ever becomes part of a URL.
Nothing here writes to a store.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt.analyzers.figures import COLORS, displayable, new_figure, png_bytes, step_axis

CHECKPOINT_ROWS = 50
"""Rows of the table of checkpoints: the latest ones (the run table gives the count and range of all)."""
METRICS = "metrics"
"""The name of the section of the metrics recorded during training (its kind is ``metrics``, a result's ``result``)."""
OVERLAID = {"loss": ("mean_loss", "mean loss"), "grad-norms": ("total_grad_norm", "total gradient norm")}
"""Analyzer -> (variable, label) drawn for every store in one figure when the page shows several stores."""


CHECKED_KEPT = 4096
"""Result sections kept between polls (one per store, result and version) before the cache starts over."""
_CHECKED: dict[tuple[str, str, str], Section] = {}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def token(kind: str, name: str) -> str:
    """The URL-safe name of the section ``name`` of ``kind``: a digest, so that no store text enters a URL."""
    return hashlib.sha256(f"{kind}\0{name}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _text(value: Any) -> str:
    return displayable(str(value))


@dataclass
class Section:
    """One section of a store's page: a result's figures and tables, or the recorded metrics."""

    name: str
    """The result's name in the store (data), or :data:`METRICS`."""
    analyzer: str
    """The analyzer that computed it ('' for the metrics)."""
    version: str
    """Digest of what it is drawn from: it changes exactly when the section must be drawn again."""
    steps: list[int] = field(default_factory=list)
    """The steps it covers."""
    problem: str | None = None
    """Why it cannot be drawn (its provenance is invalid, its files are gone), shown instead."""
    kind: str = "result"
    """``result``, ``metrics``, or ``together``: the results of one analyzer compared (``names``)."""
    names: list[str] = field(default_factory=list)
    """The results a ``together`` section compares."""

    @property
    def id(self) -> str:
        """Its :func:`token`."""
        return token(self.kind, self.name)

    def as_json(self) -> dict[str, Any]:
        """The section as the page's state lists it."""
        return {
            "id": self.id,
            "title": _text(self.name),
            "analyzer": _text(self.analyzer),
            "version": self.version,
            "steps": self.steps,
            "problem": None if self.problem is None else _text(self.problem),
        }


def sections(store: Any, registry: Any) -> list[Section]:
    """The sections of ``store``: its metrics (when any were recorded), then each stored result, by name."""
    steps = [int(s) for s in store.steps]
    recorded = bool(steps) and bool(list(store.metrics.data_vars))
    # metrics are written with the checkpoints: the steps of the commit record are their version
    found = [Section(METRICS, "", _digest(["metrics", steps]), steps, kind="metrics")] if recorded else []
    for name in store.analyses:
        # the page polls every second: a result is opened and checked once per version of its record
        key = (store.path, name, _digest(store.recorded_provenance(name)))
        if key not in _CHECKED:
            if len(_CHECKED) >= CHECKED_KEPT:
                _CHECKED.clear()
            _CHECKED[key] = _result_section(store, name, registry)
        found.append(_CHECKED[key])
    return found + _together(found, registry)


def _result_section(store: Any, name: str, registry: Any) -> Section:
    """The section of result ``name``, or one naming why it is not shown."""
    from ckpt.errors import CkptError

    try:
        result = store.analysis(name)  # lazy: only its provenance is read here
        result.ckpt.validate(name, store.path, registry.analyzers)
    except CkptError as exc:
        return Section(name, "", _digest(["refused", str(exc)]), [], f"{name}: not shown ({exc})")
    record = result.ckpt
    return Section(name, record.analyzer or name, _digest(record.provenance), [int(s) for s in record.steps])


def _together(listed: list[Section], registry: Any) -> list[Section]:
    """A section per installed analyzer with several results: their comparison, as the report's side by side."""
    by_analyzer: dict[str, list[Section]] = {}
    for s in listed:
        if s.kind == "result" and s.problem is None:
            by_analyzer.setdefault(s.analyzer, []).append(s)
    return [
        Section(
            f"{analyzer}: {len(held)} results side by side",
            analyzer,
            _digest([s.version for s in held]),
            sorted({step for s in held for step in s.steps}),
            kind="together",
            names=[s.name for s in held],
        )
        for analyzer, held in by_analyzer.items()
        if len(held) > 1 and analyzer in registry.analyzers
    ]


def _checkpoints(store: Any, listed: list[Section]) -> dict[str, Any]:
    """The table of checkpoints: the latest :data:`CHECKPOINT_ROWS` steps, the metrics and results at each."""
    steps = [int(s) for s in store.steps]
    shown = steps[-CHECKPOINT_ROWS:]
    metrics = store.metrics
    names = sorted(str(n) for n in metrics.data_vars)
    values: dict[str, dict[int, float]] = {}
    if names and shown:
        held = {int(x) for x in metrics["step"].values}
        recorded = metrics.sel(step=[s for s in shown if s in held])
        for name in names:
            series = recorded[name]
            values[name] = {int(s): float(v) for s, v in zip(series["step"].values, series.values, strict=True)}
    results = [s for s in listed if s.kind == "result" and s.problem is None]
    rows = []
    for step in reversed(shown):
        cells = [str(step)]
        for name in names:
            value = values.get(name, {}).get(step)
            cells.append("" if value is None or value != value else f"{value:.6g}")
        cells.append(", ".join(_text(s.name) for s in results if step in s.steps))
        rows.append(cells)
    columns = ["step", *[_text(n) for n in names], "results computed"]
    return {"columns": columns, "rows": rows, "earlier": len(steps) - len(shown)}


def state(path: str, registry: Any, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The live state of the store at ``path``: its tables and its sections with their versions.

    ``known`` is the state returned for this store before: its tables are reused when the store's
    checkpoints did not change (the metrics are read only when a checkpoint lands). A store that
    cannot be read now (moved, damaged while served) has a ``problem`` and no sections.
    """
    import ckpt.store as ckptstore
    from ckpt.analyzers.figures.report import metadata
    from ckpt.errors import CkptError

    try:
        store = ckptstore.open(path)
        steps = [int(s) for s in store.steps]
        listed = sections(store, registry)
        tables_version = _digest([steps, [s.version for s in listed]])
        if known is not None and known.get("tables_version") == tables_version:
            run, checkpoints = known["run"], known["checkpoints"]
        else:
            run = [[_text(k), _text(v)] for k, v in metadata(store)]
            checkpoints = _checkpoints(store, listed)
    except CkptError as exc:
        return {"name": _text(path), "problem": _text(f"cannot read {path}: {exc}"), "version": _digest(str(exc))}
    return {
        "name": _text(Path(path).name or path),
        "path": _text(path),
        "problem": None,
        "tables_version": tables_version,
        "version": _digest([tables_version, [s.version for s in listed]]),
        "run": run,
        "checkpoints": checkpoints,
        "sections": [s.as_json() for s in listed],
        "_overlay": _overlaid(listed),
    }


def _overlaid(listed: list[Section]) -> dict[str, tuple[str, str, list[int]]]:
    """Analyzer -> (name, version, steps) of the result each overlaid figure draws (see :func:`render_overlay`)."""
    chosen: dict[str, tuple[str, str, list[int]]] = {}
    for s in listed:
        wanted = s.kind == "result" and s.analyzer in OVERLAID and s.problem is None
        if wanted and (s.analyzer not in chosen or s.name == s.analyzer):
            chosen[s.analyzer] = (s.name, s.version, s.steps)
    return chosen


@dataclass
class Rendered:
    """A section drawn: what the page shows beside its images, and the images as PNG bytes."""

    payload: dict[str, Any]
    """JSON for the page: version, steps, alt texts, tables, summary, stale mark, problems."""
    images: list[bytes]


def render(path: str, section_id: str, registry: Any) -> Rendered | None:
    """Draw the section whose :func:`token` is ``section_id`` of the store at ``path`` (None: it has none).

    The store is opened afresh, so the section is drawn from what is committed now, and the
    payload carries the version it was drawn at (which may be newer than the one the page asked for).
    """
    import ckpt.store as ckptstore
    from ckpt.analyzers.figures.report import analysis_parts, metrics_figure
    from ckpt.engine.pipeline import data_hash, model_hash

    store = ckptstore.open(path)
    found = {s.id: s for s in sections(store, registry)}
    section = found.get(section_id)
    if section is None:
        return None
    payload: dict[str, Any] = {"version": section.version, "steps": section.steps, "rows": [], "summary": None}
    payload.update({"stale": False, "problems": [], "alts": [], "rerun": _text(section.analyzer)})
    images: list[bytes] = []
    if section.problem is not None:
        payload["problems"] = [_text(section.problem)]
    elif section.kind == "metrics":
        png = metrics_figure(store)
        if png is not None:
            images.append(png)
            payload["alts"].append("metrics recorded during training")
    elif section.kind == "together":
        payload.update(_draw_together(store, section, registry, images))
    else:
        current = (data_hash(store), model_hash(store))
        parts = analysis_parts(store, section.name, store.analysis(section.name), registry, current)
        payload.update(
            rows=[[_text(k), _text(v)] for k, v in parts.rows],
            summary=None if parts.summary is None else _text(parts.summary),
            stale=parts.stale,
            problems=[_text(p) for p in parts.problems],
        )
        for key, figure in parts.figures.items():
            images.append(png_bytes(figure))
            payload["alts"].append(_text(f"{section.name} {key}"))
    return Rendered(payload, images)


def _draw_together(store: Any, section: Section, registry: Any, images: list[bytes]) -> dict[str, Any]:
    """The report's side-by-side comparison of ``section.names``: the options that differ, and its figures."""
    results = {name: store.analysis(name) for name in section.names}
    options = {name: r.ckpt.options for name, r in results.items()}
    keys = sorted({k for o in options.values() for k in o})
    differing = [k for k in keys if len({json.dumps(o.get(k)) for o in options.values()}) > 1]
    rows = [[_text(n), _text(", ".join(f"{k}={json.dumps(options[n].get(k))}" for k in differing))] for n in results]
    alts, problems = [], []
    try:
        figures = registry.analyzers[section.analyzer]().plot_together(results, store)
    except Exception as exc:  # a plugin's comparison must not cost the page: shown, as in the report
        figures, problems = {}, [_text(f"{section.analyzer}: comparison failed ({type(exc).__name__}: {exc})")]
    for key, figure in figures.items():
        images.append(png_bytes(figure))
        alts.append(_text(f"{section.analyzer} {key}"))
    return {"rows": rows, "alts": alts, "problems": problems}


def overlay_version(states: list[dict[str, Any]], analyzer: str) -> tuple[str, list[int]] | None:
    """Version and steps of the figure overlaying ``analyzer``'s result of every store (None: under two have one)."""
    held = [(i, s["_overlay"][analyzer]) for i, s in enumerate(states) if analyzer in s.get("_overlay", {})]
    if len(held) < 2:
        return None
    steps = sorted({step for _, (_, _, steps) in held for step in steps})
    return _digest([[i, version] for i, (_, version, _) in held]), steps


def render_overlay(paths: list[str], analyzer: str) -> Rendered:
    """One figure of ``analyzer``'s result (its :data:`OVERLAID` variable) over steps, a line per store.

    Each store's result is the one named like its analyzer when there is one, else the first of its
    results computed by it; the legend names the store, as the page's sections do.
    """
    import ckpt.store as ckptstore
    from ckpt.store.results import load_result

    variable, label = OVERLAID[analyzer]
    figure = new_figure(1, width=7.0, height=3.6)
    axes = figure.axes[0]
    all_steps: set[int] = set()
    versions = []
    for index, path in enumerate(paths):
        store = ckptstore.open(path)
        names = [n for n in store.analyses if (store.analysis(n).ckpt.analyzer or n) == analyzer]
        if not names:
            continue
        name = analyzer if analyzer in names else names[0]
        result = store.analysis(name)
        versions.append([index, _digest(result.ckpt.provenance)])
        series = load_result(result[[variable]])[variable]
        steps = [int(s) for s in series["step"].values]
        all_steps.update(steps)
        axes.plot(steps, series.values, color=COLORS[index % len(COLORS)], label=_text(Path(path).name or path))
    step_axis(axes, sorted(all_steps))
    axes.set_ylabel(label)
    axes.legend(fontsize="small")
    figure.suptitle(f"{label} ({analyzer}), one line per store")
    payload = {"version": _digest(versions), "steps": sorted(all_steps), "rows": [], "summary": None}
    payload.update({"stale": False, "problems": [], "alts": [f"{label} of every store"], "rerun": analyzer})
    return Rendered(payload, [png_bytes(figure)])


__all__ = [
    "CHECKPOINT_ROWS",
    "METRICS",
    "OVERLAID",
    "Rendered",
    "Section",
    "overlay_version",
    "render",
    "render_overlay",
    "sections",
    "state",
    "token",
]
