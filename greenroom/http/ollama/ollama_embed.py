"""Ollama's embeddings: /api/embed (current: normalised vectors, `dimensions`) and
/api/embeddings (legacy: the raw vector), validated by the spec's table before any engine
is asked anything. `dimensions` is read as Ollama reads it: a length from 1 to below the
vector's cuts it, anything else (0, negative, the width or more) keeps the whole vector; the
length answered is said in X-Greenroom-Dimensions."""

from __future__ import annotations

import time

from quart import Quart

from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, objects, routes
from greenroom.http.core.contracts import ListOf
from greenroom.http.core.headers import DIMENSIONS_HEADER
from greenroom.http.core.objects import COUNT, FLOAT, Object
from greenroom.http.ollama import ollama_api, ollama_params
from greenroom.http.ollama.keep_alive import parse as parse_keep_alive
from greenroom.http.ollama.ollama_request import Prepared, prepare
from greenroom.http.openai import openai_params
from greenroom.http.pipeline.answering import cut, single, unit, vectors, vectors_answer
from greenroom.protocol import Embed, Embedded
from greenroom.supervisor.tree import Tree

MAX_ITEMS = 128
MAX_TEXT_CHARS = 8192
MAX_REQUEST_CHARS = 65536

# --- request shapes (contracts.py): `texts` checks them, in the spec's order ------------------

TEXT = contracts.Text(
    max_length=MAX_TEXT_CHARS,
    pattern=r"[\s\S]*\S[\s\S]*",
    description="Not only whitespace (400 empty_input); longer: 413 embedding_input_too_large",
)
_TOTAL = (
    f"At most {MAX_ITEMS} texts (413 embedding_batch_too_large), {MAX_REQUEST_CHARS:,} characters in all "
    "(413 embedding_request_too_large)"
)
EMBED_REQUEST = contracts.Shape(
    fields={
        "model": ollama_api.MODEL,
        "input": contracts.AnyOf(
            options=(TEXT, contracts.ListOf(items=TEXT, min_items=1, max_items=MAX_ITEMS)), description=_TOTAL
        ),
        "truncate": contracts.Boolean(
            default=True,
            description="Never honoured as Ollama's truncation: a long input is refused (true is reported)",
        ),
        "dimensions": contracts.Number(
            lo=ollama_params.GO_INT[0],
            hi=ollama_params.GO_INT[1],
            integer=True,
            description="From 1 to below the model's width: the first this many of each vector, normalised again; "
            "otherwise (0, negative, the width or more) the whole vector, as Ollama answers. The length "
            f"answered is in {DIMENSIONS_HEADER}",
        ),
        "keep_alive": ollama_params.KEEP_ALIVE,
        "options": contracts.reported(),
    },
    required=("model", "input"),
    ledger=True,
)
EMBEDDINGS_REQUEST = contracts.Shape(
    fields={
        "model": ollama_api.MODEL,
        "prompt": TEXT,
        "keep_alive": ollama_params.KEEP_ALIVE,
        "options": contracts.reported(),
    },
    required=("model", "prompt"),
    ledger=True,
)


def texts(value, param: str) -> list[str]:
    """The validation table, in order."""
    if value is None:
        raise GreenroomError("missing_parameter", f"'{param}' is a required property", param)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
        raise GreenroomError("invalid_parameter", f"'{param}' must be a string or an array of strings", param)
    if not items:
        raise GreenroomError("empty_input", "Embedding input must contain at least one item", param)
    if len(items) > MAX_ITEMS:
        raise GreenroomError("embedding_batch_too_large", "Embedding input batch is too large", param)
    for text in items:
        if not text.strip():
            raise GreenroomError("empty_input", "Embedding input text must not be empty", param)
    for text in items:
        if len(text) > MAX_TEXT_CHARS:
            raise GreenroomError("embedding_input_too_large", "Embedding input text is too large", param)
    if sum(len(t) for t in items) > MAX_REQUEST_CHARS:
        raise GreenroomError("embedding_request_too_large", "Embedding request is too large", param)
    return items


async def _embed(tree: Tree, req: Prepared, inputs: list[str], headers: dict) -> tuple[Embedded, int]:
    """The vectors and the load's nanoseconds; `headers` gain the routing headers (where it ran,
    the inputs' token count), as a generation's do."""
    if not req.caps.embeddings:
        raise GreenroomError("field_not_honoured", "this model's engine serves no embeddings", "model")
    load_started = time.monotonic_ns()
    client, serving = await tree.client_for(req.model, wait_unload=True)
    load_ns = time.monotonic_ns() - load_started
    embedded = await single(client, Embed(openai_params.new_rid("embd"), req.model, texts=inputs))
    headers.update(ollama_api.routing_headers(serving, embedded.prompt_tokens))
    return embedded, load_ns


EMBEDDED = Object(
    name="OllamaEmbedded",
    fields={
        "model": objects.TEXT,
        "embeddings": ListOf(items=ListOf(items=FLOAT)),
        **dict.fromkeys(("total_duration", "load_duration", "prompt_eval_count"), COUNT),
    },
)
EMBEDDING = Object(name="OllamaEmbedding", fields={"embedding": ListOf(items=FLOAT)})
OBJECTS = (EMBEDDED, EMBEDDING)


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/api/embed")
    async def ollama_embed():
        req = await prepare(tree, EMBED_REQUEST, "on /api/embed")
        body = req.body
        inputs = texts(body.get("input"), "input")
        openai_params.boolean(body, "truncate", True)  # validated; never honoured as Ollama's truncation (see below)
        dimensions = body.get("dimensions")
        if dimensions is not None and not EMBED_REQUEST.fields["dimensions"].holds(dimensions):
            raise GreenroomError("invalid_parameter", "'dimensions' must be an integer", "dimensions")
        keep_alive = parse_keep_alive(body)
        also = ["truncate"] if body.get("truncate") is True else []  # never truncated: a long input is refused
        headers = req.headers(also)
        embedded, load_ns = await _embed(tree, req, inputs, headers)
        if keep_alive is not None:
            tree.keep_alive(req.model, keep_alive)
        # Ollama's EmbedHandler: every vector at unit length, then a `dimensions` below the width cut
        floats = unit(vectors(embedded))
        if dimensions is not None:
            floats = cut(floats, dimensions)
        headers[DIMENSIONS_HEADER] = str(floats.shape[1])
        body = EMBEDDED.build(
            model=req.sent_model,
            embeddings=floats,
            total_duration=time.monotonic_ns() - req.started_ns,
            load_duration=load_ns,
            prompt_eval_count=embedded.prompt_tokens,
        )
        return vectors_answer(body, headers)

    @routes.view(app, "POST", "/api/embeddings")
    async def ollama_embeddings():
        req = await prepare(tree, EMBEDDINGS_REQUEST, "on /api/embeddings")
        openai_params.string(req.body, "prompt")
        inputs = texts(req.body.get("prompt"), "prompt")
        keep_alive = parse_keep_alive(req.body)
        headers = req.headers()
        embedded, _ = await _embed(tree, req, inputs, headers)
        if keep_alive is not None:
            tree.keep_alive(req.model, keep_alive)
        return vectors_answer(EMBEDDING.build(embedding=vectors(embedded)[0].tolist()), headers)
