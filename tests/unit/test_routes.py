"""The route table (greenroom/http/core/routes.py): every route documented for people, and the
surface whose error envelope a path gets. No server needed."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from greenroom.http.core import routes
from greenroom.http.core.routes import Surface


def _markdown() -> list[str]:
    """Every line of the README and of docs/*.md, whichever of them exist now."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [line for f in files if f.is_file() for line in f.read_text(encoding="utf-8").splitlines()]


def _method(line: str) -> set[str]:
    """The methods a line names: the words, or what a curl command line sends (GET, or POST
    with data and no -X)."""
    named = set(re.findall(r"\b(GET|HEAD|POST|PUT|DELETE)\b", line))
    if re.search(r"\bcurl\b", line) and not re.search(r"(?:^|\s)(?:-X|--request)\b", line):
        named.add("POST" if re.search(r"(?:^|\s)(?:-d|--data\S*|-F)\b", line) else "GET")
    return named


def _mentions(route: routes.Route, line: str) -> bool:
    """The line names the route's method and its path: a path parameter written as {x}, <x>, :x
    or a concrete value (`/api/profiles/loud`), after a host or shell variable or not, and the
    path not the start of a longer one."""
    line = re.sub(r"\$\{?\w+\}?|https?://[^/\s]+", " ", line)
    path = re.sub(r"\\\{\w+\\\}", r"(?:\\{\\w+\\}|<\\w+>|:\\w+|[^/\\s`'\"()?]+)", re.escape(route.path))
    return route.method in _method(line) and re.search(rf"(?<![\w/.-]){path}(?![\w/-])", line) is not None


def test_every_route_is_documented():
    """Each route of the table is named, with its method, on one line of the README or of a
    docs/*.md page (whatever pages exist: the docs are being reorganised)."""
    lines = _markdown()
    undocumented = [r.endpoint for r in routes.TABLE if not any(_mentions(r, line) for line in lines)]
    assert not undocumented, f"routes no README.md or docs/*.md line names with its method: {undocumented}"


def test_one_surface_per_route_and_its_envelope_by_path():
    for route in routes.TABLE:
        assert routes.surface(route.path) is route.surface, route.endpoint
        concrete = re.sub(r"\{\w+\}", "x", route.path)
        assert routes.surface(concrete) is route.surface, route.endpoint


@pytest.mark.parametrize(
    "path,surface",
    [
        # an unmatched path keeps the rule from before the table
        ("/api/profiles/a/b/c", Surface.OPENAI),  # under a root of greenroom's parametrised /api routes
        ("/api/clusters/x/y", Surface.OPENAI),
        ("/api/circuits/active/x", Surface.OPENAI),
        ("/api/saes/x/y", Surface.OPENAI),
        ("/api/nothing/here", Surface.OLLAMA),  # anywhere else under /api/: Ollama's
        ("/api/saes/x/nothing", Surface.OPENAI),  # /api/saes/{sae_id}/… (features_api.py) made it one
        ("/api/steering/x", Surface.OLLAMA),  # anywhere else under /api/: Ollama's
        ("/api/nothing", Surface.OLLAMA),
        ("/api/models/known/x", Surface.OLLAMA),
        ("/v1/messages/batches", Surface.ANTHROPIC),  # under Anthropic's Messages routes: its envelope
        ("/v1/nothing", Surface.OPENAI),  # elsewhere: OpenAI's
        ("/nothing", Surface.OPENAI),
    ],
)
def test_an_unmatched_path_gets_the_envelope_of_before(path, surface):
    assert routes.surface(path) is surface
