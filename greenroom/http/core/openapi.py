"""The OpenAPI 3.1 description of every route greenroom serves: the table of routes/routes.py,
each operation built from its entry.

- Requests are rendered from the declarations the parsers and the field ledger read
  (contracts.py; `_REQUESTS` names each route's), so a bound, an enum, a field list or a
  field's ledger rule is written once: a field the ledger refuses is documented as the values
  it lets through, a field it reports as accepted and unread, a field an engine capability
  honours with the capability named.
- Responses are closed objects (`additionalProperties: false`). The generation answers
  (chat and text completions and their chunks, Needle's, Responses', Anthropic's and Ollama's
  answers and stream events), embeddings and the models list are rendered from the
  declarations their formatters build them with (objects.py; `_OBJECTS` lists them), so a field
  the server starts sending is declared first or its build fails. The rest (management,
  steering, documents, errors) are still written here: a field the server starts sending must
  be described here first, or tests/live/test_openapi.py fails.
- Errors: each route's surface (routes.Surface) says its envelope, OpenAI's `{"error":
  {message, type, param, code}}`, Ollama's flat `{"error", "code"}` or Anthropic's `{"type":
  "error", "error": {type, message, code, param}}` (with its statuses: backpressure is 529); the
  codes each status may carry are read from the one error table (greenroom/errors.py).

`document()` is served at `GET /openapi.json`, and tests/live/test_openapi.py fuzzes the live
server against it both ways. No torch and no third-party schema tooling: this module is part
of the front end.
"""

from __future__ import annotations

import copy

from greenroom import __version__
from greenroom.errors import TABLE, anthropic_status, anthropic_type
from greenroom.http import console
from greenroom.http.anthropic import messages_api, messages_format
from greenroom.http.core import contracts, headers
from greenroom.http.core.routes import TABLE as ROUTES
from greenroom.http.core.routes import Framing, Route, Surface
from greenroom.http.manage import clusters_api, features_api, manage_api, monitoring_api, steering_api
from greenroom.http.ollama import format as ollama_format
from greenroom.http.ollama import model_facts, ollama_api, ollama_blobs, ollama_embed, ollama_models
from greenroom.http.openai import (
    chat_format,
    needle,
    needle_format,
    openai_api,
    openai_params,
    responses_api,
    responses_format,
    tokenize_api,
)

DEMO_MODEL = openai_params.DEMO_MODEL  # what `greenroom serve` serves by default; used in examples

# --- helpers --------------------------------------------------------------------------


def _ref(name: str, kind: str = "schemas") -> dict:
    return {"$ref": f"#/components/{kind}/{name}"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(properties: dict, required: tuple[str, ...] = (), **extra) -> dict:
    """An object schema; extra properties are allowed unless `additionalProperties` says not."""
    schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    return schema


def _closed(properties: dict, required: tuple[str, ...] = (), **extra) -> dict:
    """A response object: exactly these properties."""
    return _obj(properties, required, additionalProperties=False, **extra)


def _array(items: dict, **extra) -> dict:
    return {"type": "array", "items": items, **extra}


def _string(**extra) -> dict:
    return {"type": "string", **extra}


def _integer(**extra) -> dict:
    return {"type": "integer", **extra}


def _number(**extra) -> dict:
    return {"type": "number", **extra}


def _described(schema: dict, description: str) -> dict:
    return {**schema, "description": description}


_BOOLEAN = {"type": "boolean"}
_COUNT = _integer(minimum=0)
_ANY_OBJECT = {"type": "object"}


# --- errors ---------------------------------------------------------------------------

# (status, component name, description); the codes of each status are those of errors.TABLE
# (on greenroom's own surface, less the Ollama surface's own)
_ERRORS = (
    (
        400,
        "BadRequest",
        "The request was refused: malformed, invalid, too long, a scoring request or a JSON schema "
        "greenroom cannot honour, or asking for something this endpoint or engine cannot honour",
    ),
    (
        401,
        "Unauthorized",
        "An API key is configured and the request did not send it (Authorization: Bearer <key>); "
        "on /api/pull, the Hugging Face Hub asked for a token",
    ),
    (
        403,
        "Forbidden",
        "A browser page on an origin the server does not allow (Origin header; cors_origins, "
        "OLLAMA_ORIGINS); on /api/pull, the Hub refused the token",
    ),
    (404, "NotFound", "Unknown model, profile, circuit or route"),
    (405, "MethodNotAllowed", "The route exists but not for this method"),
    (408, "RequestTimeout", "The request body did not arrive in time"),
    (409, "Conflict", "The name is in use"),
    (413, "PayloadTooLarge", "The request body (or an embedding input) is larger than the server takes"),
    (429, "TooManyRequests", "/v1/needle/*: the engine queue is full (engine_busy); Retry-After says when to retry"),
    (
        500,
        "InternalError",
        "Generation or the server failed (non-finite logits and a complete constrained "
        "document that does not validate included)",
    ),
    (502, "BadGateway", "The Hugging Face Hub could not be reached or failed"),
    (
        503,
        "ServiceUnavailable",
        "No engine can take the request now (not loaded, busy, queue full, or crashed "
        "during the request); retry later (Retry-After on queue_full and model_busy)",
    ),
    (504, "GatewayTimeout", "The request took longer than the server's request timeout and was cancelled"),
    (529, "Overloaded", "Anthropic's overloaded_error: the engine queue is full or the model busy; Retry-After"),
)
_PREFIX = {Surface.OPENAI: "", Surface.OLLAMA: "Ollama", Surface.ANTHROPIC: "Anthropic"}


def status_on(code: str, surface: Surface) -> int:
    """The status `code` is answered with on `surface`."""
    return anthropic_status(code) if surface is Surface.ANTHROPIC else TABLE[code].status


def error_codes(status: int, surface: Surface = Surface.OPENAI) -> list[str]:
    """The codes greenroom answers with `status` on `surface`, in the error table's order."""
    return [
        code
        for code, kind in TABLE.items()
        if status_on(code, surface) == status and (surface is Surface.OLLAMA or not kind.ollama_only)
    ]


def _statuses(surface: Surface):
    return [
        (status, _PREFIX[surface] + name, description)
        for status, name, description in _ERRORS
        if error_codes(status, surface)
    ]


_ANTHROPIC_ERROR = messages_format.ERROR.render({})


def _error_schemas() -> dict:
    """Each envelope once, and one narrowing per status that pins the codes it may carry."""
    schemas = {
        "Error": _obj(
            {
                "error": _obj(
                    {
                        "message": _string(),
                        "type": _string(),
                        "param": _nullable(_string()),
                        "code": _string(),
                    },
                    ("message", "type", "param", "code"),
                )
            },
            ("error",),
            description="OpenAI's error envelope",
        ),
        "OllamaError": _closed(
            {
                "error": _described(_string(), f"The message, then (request id: <{headers.REQUEST_ID_HEADER}>)"),
                "code": _string(),
            },
            ("error", "code"),
            description="Ollama's flat error envelope, with greenroom's code",
        ),
    }
    for status, name, _ in _statuses(Surface.OPENAI):
        codes = error_codes(status)
        types = sorted({TABLE[code].type for code in codes})
        schemas[f"{name}Error"] = {
            "allOf": [_ref("Error")],
            "properties": {"error": {"properties": {"code": {"enum": codes}, "type": {"enum": types}}}},
        }
    for status, name, _ in _statuses(Surface.OLLAMA):
        schemas[f"{name}Error"] = {
            "allOf": [_ref("OllamaError")],
            "properties": {"code": {"enum": error_codes(status, Surface.OLLAMA)}},
        }
    schemas["AnthropicError"] = _closed(
        {
            "type": {"const": "error"},
            "error": _ANTHROPIC_ERROR,
            "request_id": _described(
                _string(), f"The request's id (its request-id and {headers.REQUEST_ID_HEADER} headers)"
            ),
        },
        ("type", "error"),
        description="Anthropic's error envelope; an answer's (not a stream's error event) carries request_id",
    )
    for status, name, _ in _statuses(Surface.ANTHROPIC):
        codes = error_codes(status, Surface.ANTHROPIC)
        schemas[f"{name}Error"] = {
            "allOf": [_ref("AnthropicError")],
            "properties": {
                "error": {
                    "properties": {
                        "code": {"enum": codes},
                        "type": {"enum": sorted({anthropic_type(c) for c in codes})},
                    }
                }
            },
        }
    return schemas


def _error_response_components() -> dict:
    return {
        name: _json(_ref(f"{name}Error"), description)
        for surface in Surface
        for _, name, description in _statuses(surface)
    }


def _error_responses(surface: Surface) -> dict:
    return {str(status): _ref(name, "responses") for status, name, _ in _statuses(surface)}


# --- requests: the parsers' declarations, each field with its ledger rule (contracts.py) ------

_REQUESTS: dict[str, contracts.Shape] = {
    "ChatCompletionRequest": openai_api.CHAT,
    "CompletionRequest": openai_api.COMPLETION,
    "EmbeddingRequest": openai_params.EMBEDDING,
    "NeedleExtractRequest": needle.EXTRACT,
    "NeedleCompleteRequest": needle.COMPLETE,
    "ModelRequest": manage_api.MODEL,
    "SAEAttachRequest": steering_api.ATTACH,
    "SAEDetachRequest": steering_api.DETACH,
    "SteeringRequest": steering_api.SET,
    "SteeringLockRequest": steering_api.LOCK,
    "ProfileCreateRequest": steering_api.PROFILE,
    "ProfileUpdateRequest": steering_api.UPDATE,
    "ProfileDocument": steering_api.EXPORTED,
    "ClusterDocument": clusters_api.CLUSTER,
    "CircuitDocument": clusters_api.CIRCUIT,
    "IntensityRequest": clusters_api.INTENSITY,
    "MonitoringRequest": monitoring_api.CONFIGURE,
    "DashboardsRequest": features_api.DASHBOARDS,
    "FeatureLabelRequest": features_api.LABEL,
    "FeatureSearchRequest": features_api.SEARCH,
    "ContrastRequest": features_api.CONTRAST,
    "OllamaGenerateRequest": ollama_api.GENERATE_REQUEST,
    "OllamaChatRequest": ollama_api.CHAT_REQUEST,
    "OllamaShowRequest": ollama_api.SHOW_REQUEST,
    "OllamaEmbedRequest": ollama_embed.EMBED_REQUEST,
    "OllamaEmbeddingsRequest": ollama_embed.EMBEDDINGS_REQUEST,
    "OllamaPullRequest": ollama_models.PULL_REQUEST,
    "OllamaDeleteRequest": ollama_models.DELETE_REQUEST,
    "OllamaCopyRequest": ollama_models.COPY_REQUEST,
    "OllamaCreateRequest": ollama_models.CREATE_REQUEST,
    "ResponseRequest": responses_api.REQUEST,
    "MessageRequest": messages_api.REQUEST,
    "MessageCountTokensRequest": messages_api.COUNT_REQUEST,
    "TokenizeRequest": tokenize_api.TOKENIZE,
    "DetokenizeRequest": tokenize_api.DETOKENIZE,
}
_QUERIES: dict[str, contracts.Shape] = {
    "ModelQuery": monitoring_api.MODEL_QUERY,
    "MonitoringRecordsQuery": monitoring_api.RECORDS_QUERY,
    "SearchQuery": ollama_models.SEARCH_QUERY,
    "InputItemsQuery": responses_api.INPUT_ITEMS_QUERY,
}
_PATH_PARAMETERS = {
    "id": openai_params.MODEL,
    "name": steering_api.PROFILE_NAME,
    "sae_id": steering_api.SAE_ID,
    "response_id": responses_api.RESPONSE_ID,
    "digest": ollama_blobs.DIGEST,
    "file": console.FILE,
    "job_id": features_api.JOB_ID,
    "index": features_api.INDEX,
}


# --- response bodies ------------------------------------------------------------------

# The objects the formatters build from their declarations (http/core/objects.py); the parts
# they name (Usage, Millm, XNeedle, the logprobs) come with them.
_OBJECTS = (
    *chat_format.OBJECTS,
    *needle_format.OBJECTS,
    *responses_format.OBJECTS,
    *messages_format.OBJECTS,
    *ollama_format.OBJECTS,
    *openai_api.OBJECTS,
    *ollama_embed.OBJECTS,
    *tokenize_api.OBJECTS,
    *model_facts.OBJECTS,
    *features_api.OBJECTS,
)


def _request_schemas(components: dict) -> None:
    for name, shape in _REQUESTS.items():
        components[name] = shape.render(components)


def _sse_event(chunk: str) -> dict:
    """One SSE event of a completion stream: a JSON chunk, the final `data: [DONE]`, or an
    `error` event carrying the error envelope. An event with no `event:` line is a
    `message` event (WHATWG), which is how SSE parsers report it."""

    def json_data(schema: str) -> dict:
        return {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref(schema)}

    message = {"const": "message"}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"event": _string(), "data": _string(), "id": _string(), "retry": _integer()},
        "oneOf": [
            {"properties": {"event": message, "data": {"const": "[DONE]"}}},
            {"properties": {"event": message, "data": json_data(chunk)}},
            {"properties": {"event": {"const": "error"}, "data": json_data("Error")}, "required": ["event"]},
        ],
    }


def _response_schemas() -> dict:
    actor = _obj(
        {
            "name": _string(),
            "role": _string(),
            "host": _described(_string(), "The host the actor runs on: this one's name, or a worker host's"),
            "pid": _nullable(_described(_integer(), "Its process id on its host")),
            "state": _string(),
            "models": _array(_string()),
            "queue_depth": _COUNT,
            "rss_bytes": _nullable(_integer()),
            "restarts": _COUNT,
            "last_error": _nullable(_string()),
            "counters": _nullable({"type": "object"}),
        },
        ("name", "role", "host", "pid", "state", "models", "queue_depth", "rss_bytes", "restarts"),
    )
    return {
        "ChatCompletionEvent": _sse_event("ChatCompletionChunk"),
        "TextCompletionEvent": _sse_event("TextCompletionChunk"),
        "Index": _obj(
            {
                "name": _string(),
                "version": _string(),
                "api_key_required": {
                    "type": "boolean",
                    "description": "Whether the other routes need the API key (the console asks for it when they do)",
                },
                "endpoints": _array(
                    _obj(
                        {"method": _string(), "path": _string(), "description": _string()},
                        ("method", "path", "description"),
                    )
                ),
            },
            ("name", "version", "api_key_required", "endpoints"),
        ),
        "Health": _obj(
            {
                "status": {"enum": ["ok", "loading"]},
                "model": {"type": ["string", "null"], "description": "The default model (Needle's field)"},
                "weights": {
                    "type": ["string", "null"],
                    "description": "The default model's weights: its id and source (Needle's field)",
                },
                "models": _array(_string()),
                "converting": _described(
                    _array(_string()),
                    "Models whose first load is converting a GGUF file into the transformers engine's checkpoint",
                ),
                "queue_depth": _COUNT,
                "max_queue_depth": _COUNT,
                "exact_token_counts": {"type": "boolean", "description": "Usage comes from the model's tokenizer"},
            },
            (
                "status",
                "model",
                "weights",
                "models",
                "converting",
                "queue_depth",
                "max_queue_depth",
                "exact_token_counts",
            ),
        ),
        "Actor": actor,
        "Actors": _obj(
            {
                "actors": _array(_ref("Actor")),
                "server": _closed(
                    {
                        "version": _string(),
                        "pid": _integer(),
                        "listening": _described(_array(_string()), "The URLs the front end listens on"),
                        "started_at": _described(_number(), "Seconds since the epoch"),
                        "uptime_s": _number(),
                        "limits": _closed(
                            {
                                "max_loaded_models": _described(
                                    _COUNT, "The most models loaded per device (0: no limit)"
                                ),
                                "memory_budget_bytes": _nullable(_COUNT),
                                "evict_pinned": _BOOLEAN,
                                "gguf_parallel": _COUNT,
                                "max_queue": _COUNT,
                            },
                            ("max_loaded_models", "memory_budget_bytes", "evict_pinned", "gguf_parallel", "max_queue"),
                        ),
                        "devices": _described(
                            _array(
                                _closed(
                                    {
                                        "host": _nullable(_string()),
                                        "device": _string(),
                                        "models": _array(_string()),
                                        "bytes": _described(
                                            _COUNT, "What they take: reported after loading, else estimated"
                                        ),
                                    },
                                    ("host", "device", "models", "bytes"),
                                )
                            ),
                            "The models holding memory on each device",
                        ),
                    },
                    ("version", "pid", "listening", "started_at", "uptime_s", "limits", "devices"),
                ),
            },
            ("actors", "server"),
        ),
        "Inference": _obj(
            {
                "backend": {
                    "enum": ["serial", "continuous_batching"],
                    "description": "The configured backend "
                    "(continuous batching is opt-in: continuous_batching = true, --continuous-batching)",
                },
                "actors": _array(
                    _obj(
                        {
                            "name": _string(),
                            "state": _string(),
                            "backend": _described(
                                {"enum": ["serial", "continuous_batching", "llama.cpp_parallel", None]},
                                "continuous_batching once it is on and a loaded model batches; "
                                "llama.cpp_parallel for a GGUF model (llama.cpp batches its sequences, "
                                "whatever their sampling); null while the actor is not up",
                            ),
                            "models": _described(_array(_string()), "The loaded models whose requests may be batched"),
                            "parallel": _described(_COUNT, "llama.cpp_parallel: sequences decoded together at most"),
                            "decode": _described(
                                {"enum": ["together", "in_turns"]},
                                "llama.cpp_parallel: one llama_decode "
                                "for every sequence, or one each in turn where that measured faster at load",
                            ),
                            "flash_attn": _described(
                                _BOOLEAN,
                                "llama.cpp_parallel: whether generation uses flash attention (where it measured "
                                "faster at load)",
                            ),
                            "batched": _described(_COUNT, "Requests decoding in the batch now"),
                            "fixed_sampling": _described(
                                _obj(
                                    {
                                        "temperature": _number(),
                                        "top_p": _number(),
                                        "top_k": _integer(),
                                        "repetition_penalty": _number(),
                                    }
                                ),
                                "What a request must ask for to be batched (no seed, "
                                "n = 1, one prompt, no response_format or forced tool call); any other request runs on "
                                "the serial path",
                            ),
                        },
                        ("name", "state", "backend"),
                    )
                ),
            },
            ("backend", "actors"),
        ),
        "OpenAPIDocument": _obj(
            {"openapi": _string(), "info": {"type": "object"}, "paths": {"type": "object"}},
            ("openapi", "info", "paths"),
        ),
    }


# --- steering management (http/manage/steering_api.py) ----------------------------------------

_STRENGTHS = steering_api.STRENGTHS.render({})
_SUMMARY = _obj({k: _number() for k in ("min", "median", "max")}, ("min", "median", "max"))
_PROFILE_NAME = steering_api.PROFILE_NAME.render({})


def _steering_schemas() -> dict:
    sae = _obj(
        {
            "sae_id": _string(),
            "source": _described(_string(), "As attached: a directory, demo:<size>[:<layer>] or random:<d_in>:<layer>"),
            "path": _string(),
            "layer": _COUNT,
            "block": _described(_COUNT, "The decoder block whose output the SAE's hook point reads"),
            "hook_point": _string(),
            "width": _described(_COUNT, "Features (d_sae)"),
            "d_in": _COUNT,
            "architecture": _string(),
            "reads": _described(
                _string(), "What its hook point reads, in words (the residual stream after block N, attention/MLP out)"
            ),
            "decoder_norm": _described(_SUMMARY, "‖W_dec[i]‖ over its features (every one: GET /api/saes/{sae_id})"),
            "residual_norm": _described(
                _nullable(_number()),
                "ρ_L: the calibrated typical norm at its hook point; a strength of 100 adds a vector this long "
                "(null until an engine holding the model measured it)",
            ),
            "coefficient_per_strength": _described(
                _nullable(_obj({k: _nullable(_number()) for k in ("min", "median", "max")})),
                "The SAELens/Neuronpedia coefficient a strength of 1 is (residual_norm / (100 × decoder_norm[i])), "
                "over its features; null until residual_norm is measured",
            ),
        },
        ("sae_id", "source", "layer", "hook_point", "width", "d_in"),
    )
    state = _obj(
        {
            "model": _string(),
            "version": _described(_COUNT, "Grows with every change to this model's steering (0: never set)"),
            "enabled": _BOOLEAN,
            "saes": _array(_ref("AttachedSAE")),
            "strengths": _STRENGTHS,
            "active": _described(
                _nullable(_obj({"kind": {"enum": ["profile", "circuit"]}, "name": _string()}, ("kind", "name"))),
                "What the live values came from (a profile or cluster activated, or a circuit); null "
                "when they were set directly",
            ),
            "serving": _described(_nullable(_ref("Serving")), "How the active base serves now; null: none is active"),
            "live": _described(_BOOLEAN, "Whether every loaded placement of the model holds this version"),
        },
        ("model", "version", "enabled", "saes", "strengths", "live"),
    )
    return {
        "AttachedSAE": sae,
        "SAE": {
            "allOf": [
                sae,
                _obj(
                    {
                        "model": _string(),
                        "decoder_norms": _described(_array(_number()), "‖W_dec[i]‖ of every feature, by index"),
                    },
                    ("model", "decoder_norms"),
                ),
            ]
        },
        "ModelSteering": state,
        "SteeringList": _obj({"models": _array(_ref("ModelSteering"))}, ("models",)),
        "SAEList": _obj(
            {
                "models": _array(_ref("ModelSteering")),
                "available": _described(
                    _array(
                        _obj(
                            {"sae": _string(), "model_size": _string(), "layer": _COUNT}, ("sae", "model_size", "layer")
                        )
                    ),
                    "The demo SAEs attach builds on first use (for the demo model of that size)",
                ),
            },
            ("models", "available"),
        ),
        "Profile": _obj(
            {
                "name": _PROFILE_NAME,
                "model": _string(),
                "description": _string(),
                "strengths": _STRENGTHS,
                "saes": _described(
                    _array(_ref("ProfileSAE")), "The SAEs its strengths refer to, as attached when they were set"
                ),
                "created_at": _COUNT,
                "updated_at": _COUNT,
                "cluster": _described(
                    _nullable(
                        _obj(
                            {
                                "sae_id": _string(),
                                "intensity": _number(),
                                "intensity_range": _nullable(_RANGE),
                                "labels": {"type": "object", "additionalProperties": _string()},
                            }
                        )
                    ),
                    "A cluster's dial, range and member labels (GET /api/clusters/{name}); null for a plain profile",
                ),
                "labels": _described(
                    {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": _string()}},
                    "Per SAE, feature → the user's label (PUT /api/saes/{sae_id}/features/{index}/label), for "
                    "the features its strengths name that have one; left out when none has",
                ),
            },
            ("name", "model", "description", "strengths", "saes", "created_at", "updated_at"),
        ),
        "ProfileSAE": _obj(
            {
                "sae_id": _string(),
                "source": _string(),
                "layer": _COUNT,
                "hook_point": _string(),
                "width": _COUNT,
                "d_in": _COUNT,
                "architecture": _string(),
            },
            ("sae_id", "source", "layer", "hook_point", "width", "d_in", "architecture"),
            additionalProperties=False,
        ),
        "ProfileList": _obj({"profiles": _array(_ref("Profile"))}, ("profiles",)),
        "ProfileDeleted": _obj(
            {
                "name": _string(),
                "deleted": _BOOLEAN,
                "state": _described(
                    _nullable(_ref("ModelSteering")),
                    "The model's steering when it steered through the deleted document (its active base, or "
                    "the active circuit's slice_fallback): deactivated, or re-derived without it; null otherwise",
                ),
            },
            ("name", "deleted", "state"),
        ),
    }


_RANGE = _array(_number(minimum=0), minItems=2, maxItems=2)
_RUNG = clusters_api.CIRCUIT.fields["rung"].render({})


def _document_schemas() -> dict:
    """Clusters, circuits and the steering lock (http/manage/clusters_api.py, steering_api.py)."""
    listed = _array(_obj({"feature": _COUNT, "strength": _number(), "label": _string()}, ("feature", "strength")))
    cluster = _obj(
        {
            "name": _string(),
            "model": _string(),
            "description": _string(),
            "sae_id": _string(),
            "members": listed,
            "intensity": _described(_number(), "The persistent dial"),
            "intensity_range": _described(
                _nullable(_RANGE), "As declared; null: [CLUSTER_INTENSITY_MIN, the server's maximum]"
            ),
            "active": _described(_BOOLEAN, "Whether it is its model's active base"),
            "created_at": _COUNT,
            "updated_at": _COUNT,
        },
        ("name", "model", "sae_id", "members", "intensity", "intensity_range", "active"),
    )
    circuit = _obj(
        {
            "name": _string(),
            "model": _string(),
            "description": _string(),
            "rung": _RUNG,
            "language": _described(_string(), "The rung's phrase, rendered by the server"),
            "layers": _array(
                _obj(
                    {"layer": _COUNT, "sae_id": _nullable(_string()), "members": listed}, ("layer", "sae_id", "members")
                )
            ),
            "intensity": _described(_number(), "The persistent dial (serving clamps it into the range)"),
            "intensity_range": _described(
                _nullable(_RANGE), "As declared; null: [CIRCUIT_INTENSITY_MIN, the server's maximum]"
            ),
            "slice_fallback": _described(_nullable(_string()), "The backing cluster"),
            "active": _BOOLEAN,
            "created_at": _COUNT,
            "updated_at": _COUNT,
            "unparseable": _described(_string(), "Only when the stored definition no longer parses (it never steers)"),
        },
        ("name", "model", "intensity", "active"),
    )
    return {
        "Serving": _obj(
            {
                "kind": _described({"enum": ["profile", "cluster", "circuit", "live"]}, "The active base's kind"),
                "name": _nullable(_string()),
                "mode": _described(
                    _nullable({"enum": ["circuit", "slice_fallback"]}),
                    "A circuit's serving mode; null: it is not serving",
                ),
                "reason": _described(
                    _nullable(
                        {
                            "enum": [
                                "no_sae_attached",
                                "layers_unbound",
                                "unparseable_definition",
                                "steering_disabled",
                                "intensity_off",
                            ]
                        }
                    ),
                    "Why a circuit is not genuinely steering",
                ),
                "intensity": _described(_number(), "The λ the persistent dial resolves to"),
                "rung": _RUNG,
                "language": _described(_string(), "Present with rung: only while a circuit genuinely steers"),
            },
            ("kind", "name"),
        ),
        "Cluster": cluster,
        "ClusterList": _obj({"clusters": _array(_ref("Cluster"))}, ("clusters",)),
        "Circuit": circuit,
        "CircuitList": _obj({"circuits": _array(_ref("Circuit"))}, ("circuits",)),
        "CircuitsActive": _obj({"models": _array(_ref("CircuitActive"))}, ("models",)),
        "CircuitActive": _obj(
            {
                "model": _string(),
                "circuit": _nullable(_ref("Circuit")),
                "serving_mode": _nullable({"enum": ["circuit", "slice_fallback"]}),
                "reason": _nullable(_string()),
                "steering": _described(
                    _nullable(
                        _obj(
                            {
                                "rung": _RUNG,
                                "language": _string(),
                                "header": _described(_string(), f"{headers.CIRCUIT_RUNG_HEADER} as responses carry it"),
                                "intensity": _number(),
                                "layers": _array(
                                    _obj(
                                        {"layer": _COUNT, "sae_id": _string(), "strengths": {"type": "object"}},
                                        ("layer", "sae_id", "strengths"),
                                    )
                                ),
                            },
                            ("rung", "language", "header", "intensity", "layers"),
                        )
                    ),
                    f"Present only while the circuit genuinely steers generation (what {headers.CIRCUIT_RUNG_HEADER} reports); "
                    "read this, not whether a circuit is active, before showing evidence language",
                ),
            },
            ("model", "circuit", "serving_mode", "reason", "steering"),
        ),
        "ClusterDialled": _obj(
            {
                "cluster": _ref("Cluster"),
                "state": _described(
                    _nullable(_ref("ModelSteering")),
                    "The model's steering when the cluster is active (re-applied at once); null otherwise",
                ),
            },
            ("cluster", "state"),
        ),
        "CircuitDialled": _obj(
            {
                "circuit": _ref("Circuit"),
                "state": _described(
                    _nullable(_ref("ModelSteering")),
                    "The model's steering when the circuit is active (re-applied at once); null otherwise",
                ),
            },
            ("circuit", "state"),
        ),
        "SteeringLock": _obj(
            {
                "model": _described(
                    _nullable(_string()), "The model locked for steering: /v1/models lists it alone; null: none"
                )
            },
            ("model",),
        ),
    }


def _monitoring_schemas() -> dict:
    config = _obj(
        {
            "model": _string(),
            "enabled": _BOOLEAN,
            "sae_id": _described(_nullable(_string()), "The attached SAE it reads (null until one is chosen)"),
            "top_k": _described(monitoring_api.CONFIGURE.fields["top_k"].render({}), "Features each record lists"),
        },
        ("model", "enabled", "sae_id", "top_k"),
        additionalProperties=False,
    )
    record = _obj(
        {
            "id": _described(_integer(minimum=1), "Increasing from 1 since the server started"),
            "time": _described(_number(), "Unix time, seconds"),
            "model": _string(),
            "request_id": _described(_string(), "The generation's id"),
            "endpoint": _described(_string(), "The route that generated it"),
            "choice": _COUNT,
            "sae_id": _string(),
            "layer": _COUNT,
            "positions": _described(_COUNT, "Positions read: every token fed to the model (prompt and generated)"),
            "features": _described(
                _array(
                    _obj(
                        {
                            "index": _COUNT,
                            "max": _number(),
                            "mean": _number(),
                            "label": _described(
                                _string(), "Its label (PUT /api/saes/{sae_id}/features/{index}/label), where one is set"
                            ),
                        },
                        ("index", "max", "mean"),
                        additionalProperties=False,
                    )
                ),
                "The top-k features by their max over the positions, pre-steering (a feature that "
                "never fired is not listed); mean over every position read",
            ),
        },
        ("id", "time", "model", "request_id", "endpoint", "choice", "sae_id", "layer", "positions", "features"),
        additionalProperties=False,
    )
    return {
        "MonitoringConfig": config,
        "MonitoringList": _obj({"models": _array(_ref("MonitoringConfig"))}, ("models",), additionalProperties=False),
        "MonitoringRecord": record,
        "MonitoringRecords": _obj(
            {
                "records": _array(_ref("MonitoringRecord")),
                "next": _described(_COUNT, "The `since` that continues after these records"),
            },
            ("records", "next"),
            additionalProperties=False,
        ),
    }


# --- the rest of greenroom's API and the Ollama surface --------------------------------


def _management_schemas() -> dict:
    placed = {
        "actor": _string(),
        "engine": _string(),
        "device": _string(),
        "state": _described(
            {"enum": ["loaded", "unloaded", "loading", "converting", "unloading"]},
            "converting: loading, its GGUF file being converted into the transformers engine's checkpoint",
        ),
        "footprint_bytes": _described(
            _nullable(_COUNT), "What the loaded model takes on its device, as its actor reported; null: not loaded"
        ),
    }
    return {
        "ModelState": _closed(
            {
                "id": _string(),
                **placed,
                "replicas": _described(
                    _array(_closed(placed, tuple(placed))), "Every placement, when there are several"
                ),
            },
            ("id", *placed),
        ),
        "ModelStates": _closed({"models": _array(_ref("ModelState"))}, ("models",)),
    }


def _ollama_schemas() -> dict:
    known = _closed(
        {
            "ollama_name": _string(),
            "huggingface_repo": _string(),
            "type": _string(),
            "format": _string(),
            "family": _string(),
            "parameter_size": _string(),
            "quantization": _string(),
            "released": _string(),
        },
        ("ollama_name", "huggingface_repo", "type", "format", "family", "parameter_size", "quantization", "released"),
    )
    status = _closed({"status": _string(), "digest": _string(), "total": _COUNT, "completed": _COUNT}, ("status",))
    return {
        "OllamaVersion": _closed({"version": {"const": "0.2.0-npu-proxy"}}, ("version",)),
        "OllamaStatus": status,
        "OllamaStatusLine": {"anyOf": [_ref("OllamaStatus"), _ref("OllamaError")]},
        "OllamaEmpty": _closed({}),
        "KnownModel": known,
        "KnownModels": _closed({"models": _array(_ref("KnownModel"))}, ("models",)),
        "SearchResults": _closed(
            {"models": _array(_ref("KnownModel")), "total": _COUNT, "limit": _COUNT, "offset": _COUNT},
            ("models", "total", "limit", "offset"),
        ),
    }


# --- the Responses API (http/openai/responses_api.py), Anthropic's Messages API (http/anthropic/messages_api.py) --


def _responses_schemas() -> dict:
    text = responses_format.OUTPUT_TEXT.render({})
    input_text = _closed({"type": {"const": "input_text"}, "text": _string()}, ("type", "text"))
    listed = {"id": _string(), "status": {"const": "completed"}}
    input_item = {
        "anyOf": [
            _closed(
                {
                    **listed,
                    "type": {"const": "message"},
                    "role": {"enum": ["user", "system", "developer"]},
                    "content": _array(input_text),
                },
                ("id", "status", "type", "role", "content"),
            ),
            _closed(
                {**listed, "type": {"const": "message"}, "role": {"const": "assistant"}, "content": _array(text)},
                ("id", "status", "type", "role", "content"),
            ),
            _closed(
                {
                    **listed,
                    "type": {"const": "function_call"},
                    "call_id": _string(),
                    "name": _string(),
                    "arguments": _string(),
                },
                ("id", "status", "type", "call_id", "name", "arguments"),
            ),
            _closed(
                {
                    **listed,
                    "type": {"const": "function_call_output"},
                    "call_id": _string(),
                    "output": {"anyOf": [_string(), _array(input_text)]},
                },
                ("id", "status", "type", "call_id", "output"),
            ),
        ],
        "description": "An item of the input as sent, with its id (the one sent, else a new one)",
    }
    return {
        "ResponseListedItem": input_item,
        "ResponseItemList": _closed(
            {
                "object": {"const": "list"},
                "data": _array(_ref("ResponseListedItem")),
                "first_id": _nullable(_string()),
                "last_id": _nullable(_string()),
                "has_more": _BOOLEAN,
            },
            ("object", "data", "first_id", "last_id", "has_more"),
            description="first_id and last_id null on an empty page",
        ),
        "ResponseDeleted": _closed(
            {"id": _string(), "object": {"const": "response"}, "deleted": {"const": True}}, ("id", "object", "deleted")
        ),
    }


def _messages_schemas() -> dict:
    return {"MessageTokensCount": _closed({"input_tokens": _COUNT}, ("input_tokens",))}


# --- headers and parameters -----------------------------------------------------------

_RFC8941_STRING = r'"(?:[\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'


def _headers() -> dict:
    return {
        "IgnoredFields": {
            "description": "Request fields this route did not use, as an RFC 8941 list of strings giving "
            'each field\'s location ("foo", "messages[2].name"); absent when none was ignored',
            "schema": _string(pattern=rf"^{_RFC8941_STRING}(?:[ \t]*,[ \t]*{_RFC8941_STRING})*$"),
        },
        "Seed": {
            "description": "The seed applied, with the scope of the reproducibility promise; absent "
            "when the request sent no seed",
            "schema": _string(pattern=r'^[0-9]+;scope="(?:request|batch-shape|best-effort)"$'),
            "example": '7;scope="request"',
        },
        "DrawnSeed": {
            "description": f"Beyond the spec: the seed drawn for a request sent without one, in {headers.SEED_HEADER}'s form; "
            "sent back as the seed, it reproduces the answer. Absent when a seed was sent, or where none would "
            "reproduce (a request decoded in the transformers continuous batch)",
            "schema": _string(pattern=r'^[0-9]+;scope="(?:request|batch-shape)"$'),
            "example": '2920794996;scope="request"',
        },
        "Steering": {
            "description": "none on a scoring response: scoring runs with every attached SAE's hook "
            "suppressed (unsteered)",
            "schema": {"const": "none"},
        },
        "SteeringIntensity": {
            "description": "The λ a steering_intensity resolved to (its base's rule applied); absent when the dial "
            "changes nothing: no SAE attached, an unknown profile at 0, steering disabled with a "
            "dial-only request, or an empty base",
            "schema": _string(pattern=r"^[0-9]+(?:\.[0-9]+)?$"),
            "example": "0.5",
        },
        "CircuitRung": {
            "description": "While a circuit genuinely steers this response: its evidence rung and the server's "
            "phrase for it, in RFC 8941 form. Absent otherwise (no active circuit, a slice-fallback "
            "serve, an unparseable definition, no SAE on any member layer): absence is not rung 0",
            "schema": _string(pattern=r'^[0-3]; language="[^"\\]*"$'),
            "example": '2; language="causally validated (edge)"',
        },
        "Constrained": {
            "description": "The constraint the answer was decoded under, when response_format asked for one: "
            "json_object, or json_schema with the schema's name as an RFC 8941 string",
            "schema": _string(pattern=rf"^(?:json_object|json_schema;name={_RFC8941_STRING})$"),
            "example": 'json_schema;name="Invoice"',
        },
        "NotStored": {
            "description": "On a response that asked to be stored (store: true) and could not be — its `store` "
            "then says false, and its id is unknown to GET and previous_response_id: why, as "
            "`storage_unavailable: <the store file and SQLite's reason>`",
            "schema": _string(pattern="^storage_unavailable: "),
        },
    }


def _ollama_headers() -> dict:
    return {
        "NumCtx": {
            "description": "The context window the request ran with: options.num_ctx (else the default 2048) "
            "clamped to [4, the model's window], as Ollama clamps it",
            "schema": _string(pattern="^[0-9]+$"),
        },
        "Dimensions": {
            "description": "The length of each vector answered: dimensions when from 1 to below the model's width, "
            "else the width",
            "schema": _string(pattern="^[0-9]+$"),
        },
        "Truncated": {
            "description": "What Ollama's rule cut from a prompt longer than num_ctx, as an RFC 8941 dictionary",
            "schema": _string(pattern=r"^messages=[0-9]+, tokens=[0-9]+$"),
        },
        "Device": {"description": "The device of the placement that served the request", "schema": _string()},
        "RouteReason": {"description": "Why the router chose that placement", "schema": _string()},
        "TokenCount": {"description": "The prompt's token count", "schema": _string(pattern="^[0-9]+$")},
    }


_HEADER_NAMES = {
    "IgnoredFields": headers.IGNORED_FIELDS_HEADER,
    "Seed": headers.SEED_HEADER,
    "DrawnSeed": headers.DRAWN_SEED_HEADER,
    "Steering": headers.STEERING_HEADER,
    "CircuitRung": headers.CIRCUIT_RUNG_HEADER,
    "Constrained": headers.CONSTRAINED_HEADER,
    "NotStored": headers.NOT_STORED_HEADER,
    "SteeringIntensity": headers.STEERING_INTENSITY_HEADER,
    "NumCtx": headers.NUM_CTX_HEADER,
    "Dimensions": headers.DIMENSIONS_HEADER,
    "Truncated": headers.TRUNCATED_HEADER,
    "Device": headers.DEVICE_HEADER,
    "RouteReason": headers.ROUTE_REASON_HEADER,
    "TokenCount": headers.TOKEN_COUNT_HEADER,
}

_STRICT = {
    "name": headers.STRICT_HEADER,
    "in": "header",
    "required": False,
    "description": "true or 1: refuse unused fields with 400 unused_fields_refused instead of reporting them; "
    "false or 0: report (the default); true and false in any case. Any other value is a 400.",
    "schema": _string(pattern="^(?:[Tt][Rr][Uu][Ee]|1|[Ff][Aa][Ll][Ss][Ee]|0)$"),
}


# --- examples: what the fuzz test's example phase sends first ----------------------------

_INVOICE = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string", "maxLength": 12},
        "total": {"type": "integer", "minimum": 0, "maximum": 100000},
    },
    "required": ["vendor", "total"],
    "additionalProperties": False,
}
_WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
_CHAT_EXAMPLES = {
    "chat": {
        "model": DEMO_MODEL,
        "messages": [
            {"role": "system", "content": "You are concise."},
            {"role": "user", "content": "What is a sparse autoencoder?"},
        ],
        "temperature": 0.7,
        "max_tokens": 50,
        "stop": ["\n\n"],
        "seed": 7,
    },
    "streamed": {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 32,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "json schema": {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "Acme Corp billed $1,200"}],
        "max_tokens": 64,
        "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {"name": "Invoice", "schema": _INVOICE}},
    },
    "tool call": {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "Weather in Lagos?"}],
        "max_tokens": 64,
        "seed": 3,
        "tools": [{"type": "function", "function": _WEATHER}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    },
    "streamed tool call": {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "Weather in Lagos?"}],
        "max_tokens": 48,
        "seed": 3,
        "stream": True,
        "tools": [{"type": "function", "function": _WEATHER}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "streamed with logprobs": {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 6,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 2,
    },
    "scoring": {
        "model": DEMO_MODEL,
        "messages": [{"role": "user", "content": "Is it true? Answer yes or no."}],
        "extra_messages": [[{"role": "user", "content": "Is it false? Answer yes or no."}]],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 3,
    },
}
_COMPLETION_EXAMPLES = {
    "completion": {"model": DEMO_MODEL, "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0},
    "streamed": {"model": DEMO_MODEL, "prompt": ["Once upon a time", "In a hole"], "max_tokens": 8, "stream": True},
    "with logprobs": {"model": DEMO_MODEL, "prompt": "Once upon a time", "max_tokens": 6, "logprobs": 2},
    "scoring": {"model": DEMO_MODEL, "prompt": "[question] is it true?\n[decision]:", "max_tokens": 1, "logprobs": 5},
    "scoring allowed tokens": {
        "model": DEMO_MODEL,
        "prompt": [[1, 2, 3], [4, 5]],
        "max_tokens": 1,
        "logprobs": 2,
        "allowed_token_ids": [10, 11, 12],
        "return_tokens_as_token_ids": True,
    },
}
_EMBEDDING_EXAMPLES = {
    "texts": {"model": DEMO_MODEL, "input": ["The food was delicious", "Hello"]},
    "base64 token ids": {"model": DEMO_MODEL, "input": [[1, 2, 3]], "encoding_format": "base64"},
}
_EXTRACT_EXAMPLES = {
    "invoice": {
        "text": "Invoice from Acme Corp, $1,200.00",
        "name": "Invoice",
        "schema": _INVOICE,
        "max_tokens": 64,
        "seed": 1,
    },
}
_COMPLETE_EXAMPLES = {
    "query with tools": {
        "query": "What is it like in Lagos right now?",
        "system": "Be brief.",
        "tools": [_WEATHER],
        "max_tokens": 32,
        "seed": 3,
    },
    "messages": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
}

# a demo SAE already attached by default (a 400: one SAE per block), and a harmless write, so the
# examples leave a shared server's steering as it was
_ATTACH_EXAMPLES = {"demo SAE": {"model": DEMO_MODEL, "sae": "demo:tiny"}}
_STEERING_EXAMPLES = {"enable": {"model": DEMO_MODEL, "enabled": True}}

_OLLAMA_OPTIONS = {"num_predict": 8, "temperature": 0}
_EXAMPLES = {
    "ChatCompletionRequest": _CHAT_EXAMPLES,
    "CompletionRequest": _COMPLETION_EXAMPLES,
    "EmbeddingRequest": _EMBEDDING_EXAMPLES,
    "NeedleExtractRequest": _EXTRACT_EXAMPLES,
    "NeedleCompleteRequest": _COMPLETE_EXAMPLES,
    "SAEAttachRequest": _ATTACH_EXAMPLES,
    "SAEDetachRequest": {"detach": {"model": DEMO_MODEL, "sae_id": "sae_example"}},
    "SteeringRequest": _STEERING_EXAMPLES,
    "MonitoringRequest": {"disable": {"model": DEMO_MODEL, "enabled": False}},
    "OllamaGenerateRequest": {
        "generate": {
            "model": DEMO_MODEL,
            "prompt": "Why is the sky blue?",
            "stream": False,
            "options": _OLLAMA_OPTIONS,
        },
        "streamed": {"model": DEMO_MODEL, "prompt": "Hello", "options": _OLLAMA_OPTIONS},
    },
    "OllamaChatRequest": {
        "chat": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Hello"}], "options": _OLLAMA_OPTIONS},
        "json": {
            "model": DEMO_MODEL,
            "messages": [{"role": "user", "content": "A city?"}],
            "format": "json",
            "stream": False,
            "options": {"num_predict": 16},
        },
    },
    "OllamaEmbedRequest": {"embed": {"model": DEMO_MODEL, "input": ["The food was delicious", "Hello"]}},
    "OllamaEmbeddingsRequest": {"embeddings": {"model": DEMO_MODEL, "prompt": "Hello"}},
    "OllamaShowRequest": {"show": {"model": DEMO_MODEL}},
}


# --- operations, from the route table ----------------------------------------------------


def _json(schema: dict, description: str, documented: dict | None = None) -> dict:
    """A response with an `application/json` body (and, optionally, documented headers)."""
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if documented:
        response["headers"] = documented
    return response


def _answer(route: Route) -> dict:
    """The route's 200. For `text/event-stream`, an OpenAPI 3.1 `schema` describes each event
    (the fields `event`, `data`, `id`, `retry`; `data` a string), as OpenAPI 3.2's `itemSchema`
    does; an NDJSON stream is described as the array of its lines."""
    documented = {_HEADER_NAMES[h]: _ref(h, "headers") for h in route.headers} or None
    if route.framing is Framing.FILE:
        return {"description": route.answer, "content": {t: {"schema": _string()} for t in console.MEDIA_TYPES}}
    if route.response is None:  # no body (a HEAD's, an upload's)
        return {"description": route.answer}
    if route.framing is Framing.TEXT:
        return {"description": route.answer, "content": {"text/plain": {"schema": _string()}}}
    if route.framing is Framing.ONLY_SSE:
        response = {"description": route.answer, "content": {"text/event-stream": {"schema": _ref(route.stream)}}}
        return {**response, "headers": documented} if documented else response
    response = _json(_ref(route.response), route.answer, documented)
    if route.framing is Framing.SSE:
        response["content"]["text/event-stream"] = {"schema": _ref(route.stream)}
    elif route.framing is Framing.NDJSON:
        response["content"]["application/x-ndjson"] = {"schema": _array(_ref(route.stream))}
    return response


def _parameters(route: Route, components: dict) -> list[dict]:
    out = [
        {"name": p, "in": "path", "required": True, "schema": _PATH_PARAMETERS[p].render(components)}
        for p in route.params
    ]
    if route.query is not None:
        for name, field in _QUERIES[route.query].fields.items():
            schema = field.render(components)
            notes = {k: schema.pop(k) for k in ("description",) if k in schema}
            out.append({"name": name, "in": "query", "required": False, "schema": schema, **notes})
    if route.strict:
        out.append(_ref("Strict", "parameters"))
    return out


def _operation(route: Route, components: dict) -> dict:
    op = {
        "operationId": route.operation,
        "summary": route.description,
        "responses": {
            "200": _answer(route),
            **({"201": {"description": route.created}} if route.created else {}),
            **_error_responses(route.surface),
        },
    }
    if route.details:
        op["description"] = route.details
    parameters = _parameters(route, components)
    if parameters:
        op["parameters"] = parameters
    if route.request is not None:
        media = {"schema": _ref(route.request)}
        if route.request in _EXAMPLES:
            media["examples"] = {name: {"value": value} for name, value in _EXAMPLES[route.request].items()}
        op["requestBody"] = {"required": True, "content": {"application/json": media}}
    if route.upload:  # any Content-Type: Ollama's CLI labels the file application/json
        op["requestBody"] = {
            "description": "The file's bytes (any length up to max_blob_bytes, none too), whatever the Content-Type",
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    return op


def _paths(components: dict) -> dict:
    paths: dict = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, components)
    return paths


def document() -> dict:
    """The OpenAPI 3.1 document of greenroom's HTTP surface (a fresh copy on every call)."""
    schemas: dict = {}
    _request_schemas(schemas)
    paths = _paths(schemas)
    for declared in _OBJECTS:
        (declared if isinstance(declared, contracts.Named) else declared.ref()).render(schemas)
    schemas.update(
        {
            **_error_schemas(),
            **_response_schemas(),
            **_steering_schemas(),
            **_document_schemas(),
            **_monitoring_schemas(),
            **_management_schemas(),
            **_ollama_schemas(),
            **_responses_schemas(),
            **_messages_schemas(),
        }
    )
    return copy.deepcopy(
        {
            "openapi": "3.1.0",
            "info": {
                "title": "greenroom",
                "version": __version__,
                "description": "A workstation LLM server: an OpenAI-compatible /v1 surface, Needle's /v1/needle routes, "
                "greenroom's management and steering API (errors in OpenAI's envelope {\"error\": "
                "{message, type, param, code}}) and Ollama's /api surface (errors in Ollama's flat "
                'envelope {"error", "code"}).',
            },
            "paths": paths,
            "components": {
                "schemas": schemas,
                "responses": _error_response_components(),
                "parameters": {"Strict": _STRICT},
                "headers": {**_headers(), **_ollama_headers()},
            },
        }
    )
