"""The quart-trio application: the routes of every surface (routes.py's table), one error handler."""

from __future__ import annotations

import functools
import hmac
import logging

import trio
from quart import Quart, jsonify, request
from quart_trio import QuartTrio
from quart_trio.wrappers import TrioRequest
from werkzeug.exceptions import HTTPException

from greenroom import __version__, metrics
from greenroom.errors import RETRY_AFTER_S, RETRYABLE, GreenroomError, anthropic_status
from greenroom.http import console
from greenroom.http.anthropic import messages_api
from greenroom.http.core import cors, openapi, routes
from greenroom.http.core.headers import REQUEST_ID_HEADER
from greenroom.http.core.pacing import Pacer
from greenroom.http.core.request_ids import request_id
from greenroom.http.core.routes import Surface
from greenroom.http.core.shutdown import Shutdown
from greenroom.http.manage import clusters_api, features_api, manage_api, monitoring_api, steering_api
from greenroom.http.ollama import ollama_api, ollama_blobs, ollama_embed, ollama_models
from greenroom.http.openai import openai_api, responses_api, tokenize_api
from greenroom.store import blobs
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom.http")


def create_app(tree: Tree, shutdown: Shutdown) -> Quart:
    """The app; `shutdown` refuses requests once a shutdown drains, and ends the views still
    running when it ends (http/core/shutdown.py)."""
    app = QuartTrio("greenroom")
    app.request_class = _Request
    app.config["RESPONSE_TIMEOUT"] = None  # streams last as long as their generation
    app.config["BODY_TIMEOUT"] = 60
    app.extensions["greenroom.pacer"] = Pacer(tree.config.stream_chunks_per_s)

    @app.errorhandler(GreenroomError)
    async def typed_error(err: GreenroomError):
        if err.code == "queue_full" and request.path.startswith("/v1/needle/"):
            err = GreenroomError("engine_busy", err.message, err.param)  # Needle's 429
        headers = {"Retry-After": str(RETRY_AFTER_S)} if err.code in RETRYABLE else {}
        surface = _surface()
        if surface is Surface.OLLAMA:  # Ollama's flat envelope on its /api surface
            return jsonify(err.ollama_body(request_id())), err.status, headers
        if surface is Surface.ANTHROPIC:  # its envelope names the request, as its request-id header does
            body = {**err.anthropic_body(), "request_id": request_id()}
            return jsonify(body), anthropic_status(err.code), headers
        return jsonify(err.openai_body()), err.status, headers

    # orchestrators probe these without credentials; a browser opens the console's page (its files
    # hold no data) before it can ask for the key the page then sends
    open_paths = frozenset({"/", "/health"})
    key = tree.config.api_key.encode() if tree.config.api_key else None
    origins = cors.Origins(tree.config.cors_origins)

    @app.before_request
    async def admitted():
        """Refused while shutting down, and by its origin or API key: one hook, as each one is an
        await and a lookup per request in Quart."""
        shutdown.refuse()
        origin = request.headers.get("Origin")
        if origin is not None:
            origins.check(origin)
            if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
                return "", 204, cors.preflight_headers(origin, request.headers.get("Access-Control-Request-Headers"))
        if key is None or request.path in open_paths or request.path.startswith(console.PREFIX):
            return None
        # RFC 7235: the scheme is case-insensitive ("bearer" works); Anthropic's clients send the key
        # as x-api-key. Compared in constant time, so its timing is no oracle
        scheme, _, bearer = request.headers.get("Authorization", "").strip().partition(" ")
        sent = [bearer.strip()] if scheme.lower() == "bearer" else []
        sent += request.headers.getlist("x-api-key")
        if not any(hmac.compare_digest(k.encode(), key) for k in sent):
            raise GreenroomError(
                "invalid_api_key", "missing or wrong API key: send Authorization: Bearer <key> or x-api-key: <key>"
            )
        return None

    @app.after_request
    async def request_id_and_count(response):
        response.headers[REQUEST_ID_HEADER] = request_id()
        if _surface() is Surface.ANTHROPIC:  # where Anthropic's SDKs read it
            response.headers["request-id"] = request_id()
        origin = request.headers.get("Origin")
        if origin is not None and origins.allows(origin):
            response.headers.update(cors.response_headers(origin))
        if shutdown.draining:  # no next request on this connection
            response.headers["Connection"] = "close"
        rule = request.url_rule
        metrics.count_request(rule.rule if rule is not None else "unmatched", request.method, response.status_code)
        return response

    @app.errorhandler(HTTPException)
    async def http_error(err: HTTPException):
        if err.code in (404, 405):
            return await typed_error(_unrouted(getattr(err, "valid_methods", None) or ()))
        code = {408: "body_timeout", 413: "request_too_large"}.get(err.code, "invalid_parameter")
        if err.code >= 500:
            code = "internal_error"
        return await typed_error(GreenroomError(code, err.description or err.name))

    @app.errorhandler(Exception)
    async def unexpected(err: Exception):
        log.exception("unhandled error")
        return await typed_error(GreenroomError("internal_error", f"internal error: {type(err).__name__}"))

    @routes.view(app, "GET", "/")
    async def index():
        return {
            "name": "greenroom",
            "version": __version__,
            "api_key_required": key is not None,
            "endpoints": [{"method": r.method, "path": r.path, "description": r.description} for r in routes.TABLE],
        }

    @routes.view(app, "GET", "/health")
    async def health():
        engines = [s for s in tree.slots.values() if s.role == "engine"]
        listed = tree.models()
        models = [m["id"] for m in listed]
        return {
            "status": "loading" if tree.loading else "ok",
            "model": models[0] if models else None,  # Needle's fields: the default model, and its weights
            "weights": f"{models[0]} ({tree.state_of(models[0]).placement.source})" if models else None,
            "models": models,
            # a first load converting a GGUF file takes minutes: what a waiting request waits on
            "converting": [m["id"] for m in listed if m["state"] == "converting"],
            "queue_depth": sum(s.client.in_flight for s in engines if s.client is not None),
            "max_queue_depth": tree.config.max_queue * len(engines),
            "exact_token_counts": True,
        }  # usage comes from the model's own tokenizer

    @routes.view(app, "GET", "/api/actors")
    async def actors():
        return {"actors": await tree.actors(), "server": tree.server()}

    @routes.view(app, "GET", "/metrics")
    async def prometheus():
        for row in await tree.actors():
            if row["role"] == "engine":
                metrics.QUEUE_DEPTH.labels(row["name"]).set(row["queue_depth"])
        body, content_type = metrics.render()
        return body, 200, {"Content-Type": content_type}

    @routes.view(app, "GET", "/openapi.json")
    async def openapi_document():
        return openapi.document()

    openai_api.register(app, tree)
    responses_api.register(app, tree)
    messages_api.register(app, tree)
    tokenize_api.register(app, tree)
    ollama_api.register(app, tree)
    ollama_embed.register(app, tree)
    manage_api.register(app, tree)
    steering_api.register(app, tree)
    clusters_api.register(app, tree)
    monitoring_api.register(app, tree)
    console.register(app)
    features_api.register(app, tree)
    store = blobs.BlobStore(tree.config.cache_dir, tree.config.max_blob_bytes)  # one for uploads and creates
    ollama_models.register(app, tree, store)
    ollama_blobs.register(app, store)
    missing = routes.unregistered(app)
    if missing:
        raise RuntimeError(f"routes in the table without a view: {', '.join(r.endpoint for r in missing)}")
    for name, view in app.view_functions.items():
        # an upload cannot answer before its body is in, however long it is: its reads are bounded instead
        upload = name in routes.BY_ENDPOINT and routes.BY_ENDPOINT[name].upload
        if tree.config.request_timeout_s and not upload:
            view = _bounded(view, tree.config.request_timeout_s)
        app.view_functions[name] = shutdown.ending(view)
    return app


class _Request(TrioRequest):
    """Quart's request; an upload's (routes.streamed) is not held to Quart's whole-body limit
    (MAX_CONTENT_LENGTH, 16 MiB), which would refuse it by its Content-Length: its view
    streams it, under a limit of its own."""

    def __init__(self, method, scheme, path, *args, max_content_length=None, **kwargs):
        if routes.streamed(method, path):
            max_content_length = None
        super().__init__(method, scheme, path, *args, max_content_length=max_content_length, **kwargs)


def _surface() -> Surface:
    """The surface of the route that matched (its table entry), or of an unmatched path."""
    rule = request.url_rule
    return routes.BY_ENDPOINT[rule.endpoint].surface if rule is not None else routes.surface(request.path)


def _unrouted(methods) -> GreenroomError:
    """A method and path no route answers, as each surface's own server words it; a wrong method
    is an unknown URL to OpenAI and to Ollama (gin) alike, so it is one here too (404), and the
    message names the methods the path does answer (`methods`). An Ollama route greenroom does not
    serve (routes.NOT_SERVED) is refused with why."""
    method, path = request.method, request.path
    served = [m for m in ("GET", "POST", "PUT", "DELETE") if m in methods]
    hint = f" ({path} answers {', '.join(served)})" if served else ""
    surface = _surface()
    if surface is Surface.OLLAMA:
        refused = routes.NOT_SERVED.get(f"{method} {path}")
        if refused is not None:
            return GreenroomError("push_not_supported", refused)
        return GreenroomError("not_found", f"404 page not found{hint}")
    if surface is Surface.ANTHROPIC:
        return GreenroomError("not_found", f"Not found: {method} {path}{hint}")
    return GreenroomError(
        "unknown_url",
        f"Unknown request URL: {method} {path}. Please check the URL for typos, "
        f"or see GET / for the routes this server answers{hint}.",
    )


def _bounded(view, seconds: float):
    """A view that must start answering within `seconds` (a stream: start streaming); past
    that it is cancelled — its engine request with it — and answers 504."""

    @functools.wraps(view)
    async def bounded(*args, **kwargs):
        with trio.move_on_after(seconds):
            return await view(*args, **kwargs)
        raise GreenroomError("request_timeout", f"the request took longer than the server's {seconds:g} s timeout")

    return bounded
