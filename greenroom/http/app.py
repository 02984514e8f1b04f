"""The quart-trio application: routes of every surface, one error handler."""

from __future__ import annotations

import functools
import hmac
import logging

import trio
from quart import Quart, jsonify, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from greenroom import __version__, metrics
from greenroom.errors import RETRY_AFTER_S, RETRYABLE, GreenroomError
from greenroom.http import (
    clusters_api, cors, manage_api, monitoring_api, ollama_api, ollama_embed, ollama_envelope, ollama_models, openai_api,
    openapi, steering_api,
)
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom.http")

ENDPOINTS = [
    ("GET", "/", "this index"),
    ("GET", "/health", "readiness: ok once the tree is up, loading before"),
    ("GET", "/api/actors", "the live actor tree: name, pid, state, models, queue depth, RSS"),
    ("GET", "/api/health/inference", "the inference backend of each engine actor: serial or continuous_batching"),
    ("GET", "/metrics", "Prometheus metrics"),
    ("GET", "/api/models", "every model with its state (loaded, unloaded, loading, unloading)"),
    ("POST", "/api/models/load", "load a model: {\"model\": id}"),
    ("POST", "/api/models/unload", "unload a model gracefully: {\"model\": id}"),
    ("GET", "/api/saes", "the SAEs attached to each steerable model (width, layer, hook point) and the demo SAEs"),
    ("POST", "/api/saes/attach", "attach an SAE: {\"model\", \"sae\": a directory, demo:<size>[:<layer>] or "
     "random:<d_in>:<layer>}"),
    ("POST", "/api/saes/detach", "detach an SAE: {\"model\", \"sae_id\"}"),
    ("GET", "/api/steering", "each steerable model's steering: strengths, enabled, version, live"),
    ("PUT", "/api/steering", "set steering: {\"model\", \"enabled\"?, \"strengths\"?: {sae_id: {feature: ±200}}}"),
    ("GET", "/api/profiles", "steering profiles: named strengths for one model's SAEs"),
    ("POST", "/api/profiles", "create a profile: {\"name\", \"model\", \"description\"?, \"strengths\"?}"),
    ("GET", "/api/profiles/{name}", "one steering profile"),
    ("PUT", "/api/profiles/{name}", "update a profile: {\"description\"?, \"strengths\"?}"),
    ("POST", "/api/profiles/{name}/activate", "a profile's strengths as its model's live steering"),
    ("GET", "/api/profiles/{name}/export", "a profile as a self-contained document (with its SAEs' identities)"),
    ("POST", "/api/profiles/import", "import an exported profile (its SAEs must be attached to the model)"),
    ("DELETE", "/api/profiles/{name}", "delete a steering profile"),
    ("GET", "/api/clusters", "clusters: a profile's members with an intensity_range and a persistent dial"),
    ("POST", "/api/clusters/import", "import a cluster document (greenroom.cluster.v1)"),
    ("GET", "/api/clusters/{name}", "one cluster"),
    ("GET", "/api/clusters/{name}/export", "a cluster as the document import takes"),
    ("PUT", "/api/clusters/{name}/intensity", "a cluster's persistent dial: {\"intensity\": 0 to its cap}"),
    ("POST", "/api/clusters/{name}/activate", "a cluster's dialled strengths as its model's live steering"),
    ("DELETE", "/api/clusters/{name}", "delete a cluster"),
    ("GET", "/api/circuits", "circuits: members per layer, evidence rung, range, dial, backing cluster"),
    ("POST", "/api/circuits/import", "import a circuit document (greenroom.circuit.v1)"),
    ("GET", "/api/circuits/active", "per steerable model (?model=: one), its active circuit, serving mode and "
     "whether it genuinely steers"),
    ("GET", "/api/circuits/{name}", "one circuit"),
    ("GET", "/api/circuits/{name}/export", "a circuit as the document import takes"),
    ("PUT", "/api/circuits/{name}/intensity", "a circuit's persistent dial: {\"intensity\": 0–2}"),
    ("POST", "/api/circuits/{name}/activate", "a circuit's dialled members as its model's live steering"),
    ("DELETE", "/api/circuits/{name}", "delete a circuit"),
    ("GET", "/api/steering/lock", "the model locked for steering (/v1/models then lists it alone)"),
    ("PUT", "/api/steering/lock", "lock steering to a model: {\"model\"}"),
    ("DELETE", "/api/steering/lock", "lift the steering lock"),
    ("GET", "/api/monitoring", "each steerable model's SAE monitoring: enabled, sae_id, top_k"),
    ("PUT", "/api/monitoring", "set monitoring: {\"model\", \"enabled\", \"sae_id\"?, \"top_k\"?: 1–64}"),
    ("GET", "/api/monitoring/records", "monitoring records, oldest first: ?model=&since=<id>&limit="),
    ("GET", "/api/monitoring/stream", "monitoring records as they come (SSE): ?model="),
    ("GET", "/v1/models", "models served"),
    ("GET", "/v1/models/{id}", "one model card"),
    ("POST", "/v1/chat/completions", "chat completion, streaming (SSE) or not"),
    ("POST", "/v1/completions", "text completion, streaming (SSE) or not"),
    ("POST", "/v1/embeddings", "mean-pooled embeddings, float or base64"),
    ("POST", "/v1/needle/extract", "text + JSON schema → an extracted object (constrained decoding)"),
    ("POST", "/v1/needle/complete", "a query or messages, with tools, → the engine's own result"),
    ("GET", "/openapi.json", "the OpenAPI document of the /v1 routes"),
    ("POST", "/api/generate", "Ollama: generate, NDJSON streaming or not"),
    ("POST", "/api/chat", "Ollama: chat, NDJSON streaming or not"),
    ("POST", "/api/embed", "Ollama: embeddings (current format)"),
    ("POST", "/api/embeddings", "Ollama: embeddings (legacy format)"),
    ("GET", "/api/tags", "Ollama: models available"),
    ("GET", "/api/ps", "Ollama: models loaded"),
    ("POST", "/api/show", "Ollama: a model's metadata"),
    ("GET", "/api/version", "Ollama: server version"),
    ("POST", "/api/pull", "Ollama: pull a Hugging Face repository (NDJSON progress)"),
    ("DELETE", "/api/delete", "Ollama: delete a pulled, copied or created model"),
    ("POST", "/api/copy", "Ollama: another name for a model"),
    ("POST", "/api/create", "Ollama: a model with its own system prompt, template, parameters, messages"),
    ("GET", "/api/models/known", "the aliases /api/pull understands (NPU proxy extension)"),
    ("GET", "/api/search", "search the known-model catalogue (NPU proxy extension)"),
]


def create_app(tree: Tree) -> Quart:
    app = QuartTrio("greenroom")
    app.config["RESPONSE_TIMEOUT"] = None  # streams last as long as their generation
    app.config["BODY_TIMEOUT"] = 60

    @app.errorhandler(GreenroomError)
    async def typed_error(err: GreenroomError):
        if err.code == "queue_full" and request.path.startswith("/v1/needle/"):
            err = GreenroomError("engine_busy", err.message, err.param)  # Needle's 429
        headers = {"Retry-After": str(RETRY_AFTER_S)} if err.code in RETRYABLE else {}
        if ollama_envelope.owns(request.path):  # Ollama's flat envelope on its /api surface
            return jsonify(ollama_envelope.error_body(err)), err.status, headers
        return jsonify(err.openai_body()), err.status, headers

    open_paths = frozenset({"/", "/health"})  # orchestrators probe these without credentials
    key = tree.config.api_key.encode() if tree.config.api_key else None
    origins = cors.Origins(tree.config.cors_origins)

    @app.before_request
    async def origin_and_api_key():
        origin = request.headers.get("Origin")
        if origin is not None:
            origins.check(origin)
            if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
                return "", 204, cors.preflight_headers(origin, request.headers.get("Access-Control-Request-Headers"))
        if key is None or request.path in open_paths:
            return None
        # RFC 7235: the scheme is case-insensitive ("bearer" works); the key compared in
        # constant time, so its timing is no oracle
        scheme, _, sent = request.headers.get("Authorization", "").strip().partition(" ")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), key)):
            raise GreenroomError("invalid_api_key", "missing or wrong API key: send Authorization: Bearer <key>")
        return None

    @app.after_request
    async def request_id_and_count(response):
        response.headers[ollama_envelope.REQUEST_ID_HEADER] = ollama_envelope.request_id()
        origin = request.headers.get("Origin")
        if origin is not None and origins.allows(origin):
            response.headers.update(cors.response_headers(origin))
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        metrics.REQUESTS.labels(rule, request.method, str(response.status_code)).inc()
        return response

    @app.errorhandler(HTTPException)
    async def http_error(err: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 408: "body_timeout",
                413: "request_too_large"}.get(err.code, "invalid_parameter")
        if err.code >= 500:
            code = "internal_error"
        return await typed_error(GreenroomError(code, err.description or err.name))

    @app.errorhandler(Exception)
    async def unexpected(err: Exception):
        log.exception("unhandled error")
        return await typed_error(GreenroomError("internal_error", f"internal error: {type(err).__name__}"))

    @app.get("/")
    async def index():
        return {"name": "greenroom", "version": __version__,
                "endpoints": [{"method": m, "path": p, "description": d} for m, p, d in ENDPOINTS]}

    @app.get("/health")
    async def health():
        engines = [s for s in tree.slots.values() if s.role == "engine"]
        models = [m["id"] for m in tree.models()]
        return {"status": "loading" if tree.loading else "ok",
                "model": models[0] if models else None,  # Needle's field: the default model
                "models": models,
                "queue_depth": sum(s.client.in_flight for s in engines if s.client is not None),
                "max_queue_depth": tree.config.max_queue * len(engines),
                "exact_token_counts": True}  # usage comes from the model's own tokenizer

    @app.get("/api/actors")
    async def actors():
        return {"actors": await tree.actors()}

    @app.get("/metrics")
    async def prometheus():
        for row in await tree.actors():
            if row["role"] == "engine":
                metrics.QUEUE_DEPTH.labels(row["name"]).set(row["queue_depth"])
        body, content_type = metrics.render()
        return body, 200, {"Content-Type": content_type}

    @app.get("/openapi.json")
    async def openapi_document():
        return openapi.document()

    openai_api.register(app, tree)
    ollama_api.register(app, tree)
    ollama_embed.register(app, tree)
    manage_api.register(app, tree)
    steering_api.register(app, tree)
    clusters_api.register(app, tree)
    monitoring_api.register(app, tree)
    ollama_models.register(app, tree)
    if tree.config.request_timeout_s:
        for name, view in app.view_functions.items():
            app.view_functions[name] = _bounded(view, tree.config.request_timeout_s)
    return app


def _bounded(view, seconds: float):
    """A view that must start answering within `seconds` (a stream: start streaming); past
    that it is cancelled — its engine request with it — and answers 504."""

    @functools.wraps(view)
    async def bounded(*args, **kwargs):
        with trio.move_on_after(seconds):
            return await view(*args, **kwargs)
        raise GreenroomError("request_timeout", f"the request took longer than the server's {seconds:g} s timeout")

    return bounded
