"""The HTTP server behind ``ckpt serve``: the live page's files, its state, and its sections drawn on request.

The stdlib's :class:`~http.server.ThreadingHTTPServer`, not a web framework: it needs no new
dependency, and a thread per request is what keeps the page's polls answered while a figure is
drawn. The server answers GET for the paths it generates and nothing else (404): the page, its
script and stylesheet (files beside :mod:`ckpt.analyzers.figures.live`), ``state.json``, one JSON
document per section and one PNG per image, each named by the store's position on the command line
and a digest (:func:`ckpt.analyzers.figures.live.token`), never by a path into a store. It never
writes to a store: drawn sections are kept in this process's memory, by version.

Requests whose ``Host`` is not the address served are refused (403), so that a web page in the
user's browser cannot reach the server through a DNS name it rebinds to 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page's Content-Security-Policy: its own script, stylesheet, images and JSON, from this server only."""
FILES = {
    "/": ("live.html", "text/html"),
    "/live.js": ("live.js", "text/javascript"),
    "/live.css": ("live.css", "text/css"),
}
_SECTION = re.compile(r"/section/(\d+)/([0-9a-f]{16}|overlay-[a-z-]+)")
_IMAGE = re.compile(r"/image/(\d+)/([0-9a-f]{16}|overlay-[a-z-]+)/([0-9a-f]{16})/(\d+)\.png")
FRESH_S = 0.25
"""A state this recent is answered again rather than read anew (pages polling the same server together)."""
KEPT = 2
"""Versions of a section kept drawn in memory: the latest, and the one a page may still be loading."""
OVERLAY = -1
"""The store index of the figures overlaying every store (their section ids start ``overlay-``)."""


class Live:
    """The stores served, their last state, and the sections drawn (by store, section and version)."""

    def __init__(self, paths: list[str], registry: Any) -> None:
        self.paths = paths
        self.registry = registry
        self._lock = threading.Lock()
        self._states: list[dict[str, Any] | None] = [None] * len(paths)
        self._drawn: dict[tuple[int, str], list[Any]] = {}  # the latest KEPT versions of each section
        self._drawing: dict[tuple[int, str], threading.Lock] = {}
        self._state_lock = threading.Lock()
        self._state: dict[str, Any] = {}
        self._state_time = -FRESH_S

    def state(self) -> dict[str, Any]:
        """Every store's state (:func:`~ckpt.analyzers.figures.live.state`) and the overlaid figures."""
        from ckpt.analyzers.figures.live import state

        with self._state_lock:  # one reading of the stores at a time: several pages share it
            if time.monotonic() - self._state_time < FRESH_S:
                return self._state
            states = [state(path, self.registry, self._states[i]) for i, path in enumerate(self.paths)]
            self._states = states
            self._state = self._public(states)
            self._state_time = time.monotonic()
            return self._state

    @staticmethod
    def _public(states: list[dict[str, Any]]) -> dict[str, Any]:
        from ckpt.analyzers.figures.live import OVERLAID, overlay_version

        overlays = []
        for analyzer in OVERLAID:
            found = overlay_version(states, analyzer)
            if found is not None:
                version, steps = found
                overlays.append(
                    {"id": f"overlay-{analyzer}", "title": analyzer, "analyzer": analyzer, "version": version}
                    | {"steps": steps, "problem": None}
                )
        public = [{k: v for k, v in s.items() if not k.startswith("_")} for s in states]
        return {"stores": public, "overlays": overlays}

    def section(self, index: int, section_id: str, version: str | None = None) -> Any:
        """The drawn section (:class:`~ckpt.analyzers.figures.live.Rendered`), or None when there is none.

        ``version`` is the one the page saw in the state: a section already drawn at it is not drawn
        again (several pages, or a page reloaded), and concurrent requests for one section wait for one
        drawing. Otherwise it is drawn from the store as it is now.
        """
        from ckpt.analyzers.figures.live import OVERLAID, render, render_overlay

        key = (index, section_id)
        with self._lock:
            lock = self._drawing.setdefault(key, threading.Lock())
        with lock:
            for drawn in self._drawn.get(key, []):
                if version is not None and drawn.payload["version"] == version:
                    return drawn
            if index == OVERLAY:
                analyzer = section_id.removeprefix("overlay-")
                if analyzer not in OVERLAID:
                    return None
                drawn = render_overlay(self.paths, analyzer)
            elif 0 <= index < len(self.paths) and not section_id.startswith("overlay-"):
                drawn = render(self.paths[index], section_id, self.registry)
            else:
                return None
            if drawn is not None:
                # the one before too: a page may still be loading its images while a newer one is drawn
                kept = [d for d in self._drawn.get(key, []) if d.payload["version"] != drawn.payload["version"]]
                self._drawn[key] = [*kept[-(KEPT - 1) :], drawn]
            return drawn

    def image(self, index: int, section_id: str, version: str, number: int) -> bytes | None:
        """PNG ``number`` of the section as drawn at ``version`` (None: not drawn, or drawn since at another)."""
        for drawn in self._drawn.get((index, section_id), []):
            if drawn.payload["version"] == version and 0 <= number < len(drawn.images):
                return drawn.images[number]
        return None


def handler(live: Live, hosts: set[str] | None) -> type[BaseHTTPRequestHandler]:
    """The request handler class of a server of ``live`` answering requests addressed to ``hosts`` (None: any)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "ckpt-serve"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: a poll a second would drown the terminal (the URL printed at start is what matters)."""

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", POLICY)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, value: Any) -> None:
            self._send(HTTPStatus.OK, json.dumps(value).encode(), "application/json")

        def _not_found(self) -> None:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain; charset=utf-8")

        def do_HEAD(self) -> None:
            """As GET, without the body."""
            self.do_GET()

        def do_GET(self) -> None:
            """The page's files, its state, a section or an image; 404 for anything else."""
            if hosts is not None and self.headers.get("Host") not in hosts:
                self._send(HTTPStatus.FORBIDDEN, b"wrong Host", "text/plain; charset=utf-8")
                return
            path, _, query = self.path.partition("?")
            try:
                self._route(path, query)
            except (BrokenPipeError, ConnectionResetError):  # the page went away mid-answer
                return

        def _route(self, path: str, query: str) -> None:
            from ckpt.errors import CkptError

            if path in FILES:
                name, kind = FILES[path]
                body = resources.files("ckpt.analyzers.figures").joinpath(name).read_bytes()
                self._send(HTTPStatus.OK, body, f"{kind}; charset=utf-8")
            elif path == "/favicon.ico":  # asked for by every browser: no icon, and no 404 in its console
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif path == "/state.json":
                self._json(live.state())
            elif (match := _SECTION.fullmatch(path)) is not None:
                index = OVERLAY if match[2].startswith("overlay-") else int(match[1])
                try:
                    drawn = live.section(index, match[2], _version(query))
                except CkptError as exc:  # the store changed or broke while served: shown in the page
                    self._json({"version": "", "steps": [], "problems": [str(exc)], "alts": []})
                    return
                if drawn is None:
                    self._not_found()
                else:
                    self._json(drawn.payload)
            elif (match := _IMAGE.fullmatch(path)) is not None:
                index = OVERLAY if match[2].startswith("overlay-") else int(match[1])
                png = live.image(index, match[2], match[3], int(match[4]))
                if png is None:
                    self._not_found()
                else:
                    self._send(HTTPStatus.OK, png, "image/png")
            else:
                self._not_found()

    return Handler


def _version(query: str) -> str | None:
    """The ``v=`` of a query string when it is a version (a 16-digit hex digest), else None."""
    value = query.removeprefix("v=")
    return value if query.startswith("v=") and re.fullmatch(r"[0-9a-f]{16}", value) else None


def make_server(live: Live, host: str, port: int) -> ThreadingHTTPServer:
    """A server of ``live`` bound to ``host``:``port`` (0: a free port), not yet serving."""
    import socket

    # bound to every interface, the server is reached by whatever names the machine has: any Host
    hosts: set[str] | None = None if host in ("0.0.0.0", "::", "") else set()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # daemon threads: Ctrl-C does not wait for a figure being drawn
    kind = type("LiveServer", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server = kind((host, port), handler(live, hosts))
    bound = server.server_address[1]
    if hosts is not None:
        names = {host, f"[{host}]"} | ({"localhost", "127.0.0.1", "[::1]"} if host in ("127.0.0.1", "::1") else set())
        hosts.update(f"{name}:{bound}" for name in names)
    return server


__all__ = ["FILES", "OVERLAY", "POLICY", "Live", "handler", "make_server"]
