"""What every Ollama request does first, as /v1 requests do (pipeline/generation.prepare): parse,
find the model (Ollama's names: `<id>:latest` is `<id>`), merge a created model's
defaults, and run the field ledger — refusals before any engine is asked anything; unread
fields reported in X-miLLM-Ignored-Fields."""

from __future__ import annotations

import time

import attrs
from quart import request

from greenroom.engines.capabilities import Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.core import ledger
from greenroom.http.core.contracts import Shape
from greenroom.http.core.headers import STRICT_HEADER
from greenroom.http.ollama import ollama_defaults
from greenroom.http.openai import openai_params
from greenroom.supervisor.tree import Tree


@attrs.frozen
class Prepared:
    body: dict
    model: str  # as greenroom names it
    sent_model: str  # as the client did (echoed)
    caps: Capabilities
    unread: list[str]
    strict: bool
    started_ns: int

    def headers(self, also: list[str] = ()) -> dict[str, str]:
        return ledger.report_headers(self.unread + list(also), self.strict)


def model_named(body: dict):
    """The model a request with both fields names, as Ollama reads it: `model` when it is not
    empty, else the deprecated `name` — the `ollama` CLI fills only `name` and sends
    `{"model": "", "name": "X"}`."""
    model = body.get("model")
    return body.get("name") if model is None or model == "" else model


def served(tree: Tree, name) -> str:
    """greenroom's id for an Ollama model name (`<id>:latest` is `<id>`), or 404."""
    if name is None or name == "":
        raise GreenroomError("missing_parameter", "model is required", "model")
    if not isinstance(name, str):
        raise GreenroomError("invalid_parameter", "'model' must be a string", "model")
    for candidate in (name, name.removesuffix(":latest")):
        try:
            return tree.resolve(candidate)
        except GreenroomError as exc:
            if exc.code != "model_not_found":
                raise
    raise GreenroomError("model_not_found", f"model '{name}' not found", "model")  # Ollama's words


async def prepare(tree: Tree, shape: Shape, where: str, defaults: str | None = None) -> Prepared:
    """`defaults`: "generate" or "chat" — a model made by /api/create brings its defaults
    (ollama_defaults.py), merged before the ledger sees the body."""
    started = time.monotonic_ns()
    strict = ledger.strict_mode(request.headers.get(STRICT_HEADER))
    body = openai_params.parse_json(await request.get_data())
    sent_model = model_named(body) if "name" in shape.fields else body.get("model")
    model = served(tree, sent_model)
    if defaults is not None:
        _, placement = tree.placement(model)
        body = ollama_defaults.apply(body, placement, chat=defaults == "chat")
    engine, caps = tree.capabilities(model)
    unread = ledger.check(shape, body, caps, f"{where} with the {engine} engine")
    return Prepared(body, model, sent_model, caps, unread, strict, started)
