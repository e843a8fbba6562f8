"""smg's HTTP route table at the version the router runs, read from the real thing: the path literals of its
Rust router (the `smg_rs` extension module in the installed wheel holds every route's path as a string
constant), each confirmed against a running smg of that version, which answers a path it does not route
"Invalid URL" with 404 and a route's other methods 405 (axum's fallback and method router:
model_gateway/src/server.rs build_app, `.fallback(sink_handler)`).

Candidates: every route in the table committed for the version (tests/unit/fixtures/smg-<version>-routes.txt,
written from model_gateway/src/server.rs build_app and from this discovery) and every route-shaped string in
the module: a '/'-led run of [a-z0-9_{}*/-] cut before each '/', after each '}' and at its end, each
segment a word or a `{param}` / `{*rest}`. A literal glued in the binary to lower-case text after it is not
found this way unless the committed table names it; the gate does not depend on it (it admits one path
without the key, whatever smg routes)."""
from __future__ import annotations

import http.client
import re
from pathlib import Path

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
FIXTURES = Path(__file__).resolve().parent / "unit" / "fixtures"
_RUN = re.compile(rb"/[a-z0-9_{}*/-]+")
_SEGMENT = r"([a-z0-9_-]+|\{\*?[a-z_]+\})"
_ROUTE = re.compile(rf"(/{_SEGMENT})+")


def table_path(version: str) -> Path:
    return FIXTURES / f"smg-{version}-routes.txt"


def read_table(version: str) -> list[tuple[str, str, str]]:
    """(method, path, plane) of the committed table: `METHOD /path plane` lines, '#' comments."""
    rows = []
    for line in table_path(version).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            method, path, plane = line.split()
            rows.append((method, path, plane))
    return rows


def binary_candidates(module: Path) -> set[str]:
    """Every route-shaped string of smg's compiled router (see the module's docstring)."""
    found = set()
    for run in _RUN.findall(module.read_bytes()):
        text = run.decode()
        starts = [i for i, c in enumerate(text) if c == "/"]
        ends = sorted(set(starts[1:] + [i + 1 for i, c in enumerate(text) if c == "}"] + [len(text)]))
        for i in starts:
            for j in ends:
                if j > i + 1 and _ROUTE.fullmatch(text[i:j]) and text[i:j].count("/") <= 6:
                    found.add(text[i:j])
    return found


def concrete(path: str) -> str:
    """A request path for a route: each parameter `x`."""
    return re.sub(r"\{[^}]+\}", "x", path)


class Prober:
    """Requests to smg on 127.0.0.1:port over one kept-alive connection: (status, body)."""

    def __init__(self, port: int):
        self.port, self.conn = port, None

    def ask(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None) -> tuple[int, bytes]:
        """`body` for a method that carries one: `{}` unless given."""
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
            try:
                data = (body or b"{}") if method in ("POST", "PUT", "PATCH") else None
                self.conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


def unrouted(status: int, body: bytes) -> bool:
    """smg's answer to a path it does not route: 404 'Invalid URL (...)' (its OpenAI-style error, code
    unknown_url; under /v1/messages its Anthropic-style not_found_error)."""
    return status == 404 and b"Invalid URL (" in body


def discover(port: int, candidates) -> dict[str, tuple[str, ...]]:
    """path -> the methods smg routes there, of every candidate path a running smg on `port` routes: asked
    without any key (a path smg does not route is 'Invalid URL' before any key check; a routed path's other
    methods 405)."""
    prober, routes = Prober(port), {}
    for path in sorted(set(candidates)):
        status, body = prober.ask("GET", concrete(path))
        if unrouted(status, body):
            continue
        methods = tuple(m for m in METHODS if prober.ask(m, concrete(path))[0] != 405)
        if methods:
            routes[path] = methods
    return routes


def _pattern(template: str) -> re.Pattern:
    parts = []
    for segment in template.strip("/").split("/"):
        parts.append(".+" if segment.startswith("{*") else "[^/]+" if segment.startswith("{") else re.escape(segment))
    return re.compile("/" + "/".join(parts))


def _shape(path: str) -> str:
    return re.sub(r"\{(\*?)[^}]*\}", r"{\1}", path)


def canonical(routes: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Each route once, as its template: without the concrete spellings of a parameter route found as well
    (`/wasm/src` of `/wasm/{module_uuid}`, same methods), and one name per parameter (the first)."""
    by_shape = {}
    for path in sorted(routes):
        by_shape.setdefault(_shape(path), path)
    routes = {path: routes[path] for path in by_shape.values()}
    templates = [p for p in routes if "{" in p]
    out = {}
    for path, methods in routes.items():
        shadowed = any(path.count("{") < t.count("{") and _pattern(t).fullmatch(concrete(path))
                       and set(methods) <= set(routes[t]) for t in templates)
        if not shadowed:
            out[path] = methods
    return out
