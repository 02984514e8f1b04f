"""The OpenAPI 3.1 description of every route greenroom serves, built from plain dicts.

`document()` returns the whole document; the front end serves it at `GET /openapi.json`
and tests/test_openapi.py fuzzes the live server against it. Shared shapes live once in
`components` (schemas, responses, parameters, headers) and are reached by `$ref`; the
helpers below only assemble them. Standard library only: this module is part of the
front end, which never imports torch or any third-party schema tooling.
"""

from __future__ import annotations

import copy

from greenroom import __version__

UINT32_MAX = 2**32 - 1
DEMO_MODEL = "greenroom-demo"  # what `greenroom serve` serves by default; used in examples

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


def _array(items: dict, **extra) -> dict:
    return {"type": "array", "items": items, **extra}


def _string(**extra) -> dict:
    return {"type": "string", **extra}


def _integer(**extra) -> dict:
    return {"type": "integer", **extra}


def _number(**extra) -> dict:
    return {"type": "number", **extra}


_BOOLEAN = {"type": "boolean"}
_MODEL = {"type": "string", "minLength": 1, "examples": [DEMO_MODEL]}
_NULL = {"type": "null"}
_COUNT = _integer(minimum=0)


def _json_body(schema: dict, examples: dict | None = None) -> dict:
    """A required `application/json` request body, with named example values."""
    media = {"schema": schema}
    if examples:
        media["examples"] = {name: {"value": value} for name, value in examples.items()}
    return {"required": True, "content": {"application/json": media}}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    """A response with an `application/json` body (and, optionally, documented headers)."""
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


def _json_or_stream(schema: dict, event: dict, description: str, headers: dict) -> dict:
    """A completion's 200: one JSON object, or with `"stream": true` an SSE stream.

    For `text/event-stream`, an OpenAPI 3.1 `schema` describes each event (the fields
    `event`, `data`, `id`, `retry`; `data` a string), as OpenAPI 3.2's `itemSchema` does.
    """
    response = _json(schema, description, headers)
    response["content"]["text/event-stream"] = {"schema": event}
    return response


def _error_responses() -> dict:
    """Every route may answer each of these with OpenAI's error envelope."""
    return {str(status): _ref(name, "responses") for status, name, _, _ in _ERRORS}


def _operation(summary: str, responses: dict, *, body: dict | None = None, examples: dict | None = None,
               parameters: tuple[dict, ...] = (), operation_id: str) -> dict:
    op = {"operationId": operation_id, "summary": summary,
          "responses": {**responses, **_error_responses()}}
    if parameters:
        op["parameters"] = list(parameters)
    if body is not None:
        op["requestBody"] = _json_body(body, examples)
    return op


# --- errors ---------------------------------------------------------------------------

# (status, component name, description, the codes greenroom answers with that status)
_ERRORS = (
    (400, "BadRequest", "The request was refused: malformed, invalid, too long, or asking for "
     "something this endpoint or engine cannot honour",
     ("invalid_json", "missing_parameter", "invalid_parameter", "context_length_exceeded",
      "field_not_honoured", "unused_fields_refused")),
    (404, "NotFound", "Unknown model or route", ("model_not_found", "not_found")),
    (405, "MethodNotAllowed", "The route exists but not for this method", ("method_not_allowed",)),
    (500, "InternalError", "Generation or the server failed", ("generation_failed", "internal_error")),
    (503, "ServiceUnavailable", "No engine can take the request now; retry later",
     ("model_not_loaded", "model_busy", "queue_full", "engine_crashed")),
)


def _error_schemas() -> dict:
    """The envelope once, and one narrowing per status that pins the codes it may carry."""
    schemas = {"Error": _obj({
        "error": _obj({
            "message": _string(),
            "type": _string(),
            "param": _nullable(_string()),
            "code": _string(),
        }, ("message", "type", "param", "code")),
    }, ("error",))}
    for status, name, _, codes in _ERRORS:
        schemas[f"{name}Error"] = {
            "allOf": [_ref("Error")],
            "properties": {"error": {"properties": {"code": {"enum": list(codes)}}}},
        }
    return schemas


def _error_response_components() -> dict:
    return {name: _json(_ref(f"{name}Error"), description) for _, name, description, _ in _ERRORS}


# --- request fields -------------------------------------------------------------------

_SAMPLING_FIELDS = {
    "stream": _BOOLEAN,
    "stream_options": _obj({"include_usage": _BOOLEAN}),
    "temperature": _number(minimum=0, maximum=2),
    "top_p": _number(minimum=0, maximum=1),
    "max_tokens": _integer(minimum=0),
    "max_completion_tokens": _integer(minimum=0),
    "seed": _integer(minimum=0, maximum=UINT32_MAX),
    "stop": _ref("Stop"),
    "frequency_penalty": _ref("Penalty"),
    "presence_penalty": _ref("Penalty"),
    "user": _string(),
}

# Output-changing fields this engine does not honour: 400 field_not_honoured unless they
# carry their "no change" value (null, false, {"type": "text"}, [], {}).
_REFUSED_FIELDS = {
    "response_format": {"type": "object"},
    "profile": _string(),
    "steering_intensity": {"type": ["number", "string"]},
    "steering": {},
    "dimensions": {},
    "tools": _array({}),
    "tool_choice": {},
    "logit_bias": {"type": "object"},
    "extra_messages": {},
    "return_sae_activations": {},
}

# Chat scoring: refused on this engine like the fields above.
_CHAT_SCORING_FIELDS = {
    "logprobs": _BOOLEAN,
    "top_logprobs": _integer(),
    "allowed_token_ids": _ref("TokenIds"),
    "return_tokens_as_token_ids": _BOOLEAN,
}

# Legacy completions: accepted only at OpenAI's defaults, plus the scoring fields.
_COMPLETION_ONLY_FIELDS = {
    "n": _integer(minimum=1, description="Only 1; more is refused with 400"),
    "echo": {**_BOOLEAN, "description": "Only false"},
    "best_of": _integer(minimum=1, description="Only 1"),
    "suffix": _nullable(_string(description="Only null")),
    "logprobs": _integer(),
    "allowed_token_ids": _ref("TokenIds"),
    "add_special_tokens": _BOOLEAN,
    "return_tokens_as_token_ids": _BOOLEAN,
}


def _request_schemas() -> dict:
    message = _obj({
        "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
        "content": {"anyOf": [_string(), _array(_ref("TextPart")), _NULL]},
        "name": _string(),
        "tool_calls": _array({}),
        "tool_call_id": _string(),
    }, ("role",))
    chat = _obj({
        "model": _MODEL,
        "messages": _array(_ref("ChatMessage"), minItems=1),
        **_SAMPLING_FIELDS,
        "n": _integer(minimum=1, description="Several choices; refused with stream: true"),
        "chat_template_kwargs": {"type": "object"},
        **_REFUSED_FIELDS,
        **_CHAT_SCORING_FIELDS,
    }, ("model", "messages"), description="Unknown fields are accepted and named in the "
                                          "X-miLLM-Ignored-Fields response header")
    completion = _obj({
        "model": _MODEL,
        "prompt": {"anyOf": [_string(), _array(_string())]},
        **_SAMPLING_FIELDS,
        **_REFUSED_FIELDS,
        **_COMPLETION_ONLY_FIELDS,
    }, ("model", "prompt"))
    embeddings = _obj({
        "model": _MODEL,
        "input": {"anyOf": [_string(), _array(_string()), _ref("TokenIds"), _array(_ref("TokenIds"))]},
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": _integer(description="Refused (not yet implemented)"),
        "user": _string(),
    }, ("model", "input"))
    return {
        "TextPart": _obj({"type": {"const": "text"}, "text": _string()}, ("type", "text")),
        "ChatMessage": message,
        "Stop": {"anyOf": [_string(), _array(_string())]},
        "Penalty": _number(minimum=-2, maximum=2),
        "TokenIds": _array(_integer()),
        "ChatCompletionRequest": chat,
        "CompletionRequest": completion,
        "EmbeddingRequest": embeddings,
    }


# --- response bodies ------------------------------------------------------------------

_FINISH_REASON = {"enum": ["stop", "length"]}


def _completion_object(object_name: str, choice: dict, *, chunk: bool) -> dict:
    """A chat or text completion (or one streamed chunk of it): the fields both share."""
    properties = {
        "id": _string(),
        "object": {"const": object_name},
        "created": _integer(),
        "model": _string(),
        "system_fingerprint": _string(),
        "choices": _array(choice),
        "usage": _nullable(_ref("Usage")) if chunk else _ref("Usage"),
    }
    required = ("id", "object", "created", "model", "choices")
    if not chunk:
        required += ("system_fingerprint", "usage")
    return _obj(properties, required)


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


def _choice(content: dict, *, streamed: bool) -> dict:
    """One choice of a completion: its content fields between `index` and `finish_reason`
    (null on every streamed chunk but the one that ends the choice)."""
    finish = _nullable(_FINISH_REASON) if streamed else _FINISH_REASON
    return _obj({"index": _COUNT, **content, "logprobs": _NULL, "finish_reason": finish},
                ("index", *content, "finish_reason"))


def _response_schemas() -> dict:
    message = _obj({"role": {"const": "assistant"}, "content": _string()}, ("role", "content"))
    delta = _obj({"role": {"const": "assistant"}, "content": _string()})
    chat_choice = _choice({"message": message}, streamed=False)
    chunk_choice = _choice({"delta": delta}, streamed=True)
    text_choice = _choice({"text": _string()}, streamed=False)
    text_chunk_choice = _choice({"text": _string()}, streamed=True)
    model_card = _obj({"id": _string(), "object": {"const": "model"}, "created": _integer(),
                       "owned_by": _string()}, ("id", "object", "created", "owned_by"))
    actor = _obj({
        "name": _string(),
        "role": _string(),
        "pid": _nullable(_integer()),
        "state": _string(),
        "models": _array(_string()),
        "queue_depth": _COUNT,
        "rss_bytes": _nullable(_integer()),
        "restarts": _COUNT,
        "last_error": _nullable(_string()),
        "counters": _nullable({"type": "object"}),
    }, ("name", "role", "pid", "state", "models", "queue_depth", "rss_bytes", "restarts"))
    embedding = _obj({
        "object": {"const": "embedding"},
        "index": _COUNT,
        "embedding": {"anyOf": [_array(_number()), _string(contentEncoding="base64")]},
    }, ("object", "index", "embedding"))
    return {
        "Usage": _obj({"prompt_tokens": _COUNT, "completion_tokens": _COUNT, "total_tokens": _COUNT},
                      ("prompt_tokens", "completion_tokens", "total_tokens")),
        "ChatCompletion": _completion_object("chat.completion", chat_choice, chunk=False),
        "ChatCompletionChunk": _completion_object("chat.completion.chunk", chunk_choice, chunk=True),
        "ChatCompletionEvent": _sse_event("ChatCompletionChunk"),
        "TextCompletion": _completion_object("text_completion", text_choice, chunk=False),
        "TextCompletionChunk": _completion_object("text_completion", text_chunk_choice, chunk=True),
        "TextCompletionEvent": _sse_event("TextCompletionChunk"),
        "Embedding": embedding,
        "EmbeddingList": _obj({
            "object": {"const": "list"},
            "data": _array(_ref("Embedding")),
            "model": _string(),
            "usage": _obj({"prompt_tokens": _COUNT, "total_tokens": _COUNT}, ("prompt_tokens", "total_tokens")),
        }, ("object", "data", "model", "usage")),
        "Model": model_card,
        "ModelList": _obj({"object": {"const": "list"}, "data": _array(_ref("Model"))}, ("object", "data")),
        "Index": _obj({
            "name": _string(),
            "version": _string(),
            "endpoints": _array(_obj({"method": _string(), "path": _string(), "description": _string()},
                                     ("method", "path", "description"))),
        }, ("name", "version", "endpoints")),
        "Health": _obj({
            "status": {"enum": ["ok", "loading"]},
            "models": _array(_string()),
            "queue_depth": _COUNT,
            "max_queue_depth": _COUNT,
        }, ("status", "models", "queue_depth", "max_queue_depth")),
        "Actor": actor,
        "Actors": _obj({"actors": _array(_ref("Actor"))}, ("actors",)),
        "OpenAPIDocument": _obj({"openapi": _string(), "info": {"type": "object"}, "paths": {"type": "object"}},
                                ("openapi", "info", "paths")),
    }


# --- headers and parameters -----------------------------------------------------------

_RFC8941_STRING = r'"(?:[\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'


def _headers() -> dict:
    return {
        "IgnoredFields": {
            "description": "Request fields this route did not use, as an RFC 8941 list of strings giving "
                           "each field's location (\"foo\", \"messages[2].name\"); absent when none was ignored",
            "schema": _string(pattern=rf"^{_RFC8941_STRING}(?:[ \t]*,[ \t]*{_RFC8941_STRING})*$"),
        },
        "Seed": {
            "description": "The seed applied, with the scope of the reproducibility promise; absent "
                           "when the request sent no seed",
            "schema": _string(pattern=r'^[0-9]+;scope="(?:request|batch-shape|best-effort)"$'),
            "example": '7;scope="request"',
        },
    }


def _parameters() -> dict:
    return {
        "Strict": {
            "name": "X-miLLM-Strict", "in": "header", "required": False,
            "description": "true or 1: refuse unused fields with 400 unused_fields_refused instead of "
                           "reporting them; false or 0: report (the default). Any other value is a 400.",
            "schema": {"enum": ["true", "1", "false", "0"]},
        },
        "ModelId": {"name": "model_id", "in": "path", "required": True, "schema": _MODEL},
    }


# --- paths ----------------------------------------------------------------------------

_CHAT_EXAMPLES = {
    "chat": {"model": DEMO_MODEL, "messages": [{"role": "system", "content": "You are concise."},
                                               {"role": "user", "content": "What is a sparse autoencoder?"}],
             "temperature": 0.7, "max_tokens": 50, "stop": ["\n\n"], "seed": 7},
    "streamed": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Tell me a story"}],
                 "max_tokens": 32, "stream": True, "stream_options": {"include_usage": True}},
}
_COMPLETION_EXAMPLES = {
    "completion": {"model": DEMO_MODEL, "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0},
    "streamed": {"model": DEMO_MODEL, "prompt": ["Once upon a time", "In a hole"], "max_tokens": 8,
                 "stream": True},
}
_EMBEDDING_EXAMPLES = {
    "texts": {"model": DEMO_MODEL, "input": ["The food was delicious", "Hello"]},
    "base64 token ids": {"model": DEMO_MODEL, "input": [[1, 2, 3]], "encoding_format": "base64"},
}


def _paths() -> dict:
    strict = _ref("Strict", "parameters")
    ignored = {"X-miLLM-Ignored-Fields": _ref("IgnoredFields", "headers")}
    seeded = {**ignored, "X-miLLM-Seed": _ref("Seed", "headers")}

    def get(operation_id: str, summary: str, schema: str, description: str, **kw) -> dict:
        return {"get": _operation(summary, {"200": _json(_ref(schema), description)},
                                  operation_id=operation_id, **kw)}

    def completion(operation_id: str, summary: str, request: str, name: str, examples: dict) -> dict:
        return {"post": _operation(
            summary,
            {"200": _json_or_stream(_ref(name), _ref(f"{name}Event"),
                                    f"The {name} object, or with stream: true its SSE stream", seeded)},
            body=_ref(request), examples=examples, parameters=(strict,), operation_id=operation_id)}

    return {
        "/": get("index", "Endpoint index", "Index", "The routes this server answers"),
        "/health": get("health", "Readiness", "Health", "ok once the tree is up, loading before"),
        "/api/actors": get("actors", "The live actor tree", "Actors", "One row per actor"),
        "/openapi.json": get("openapi", "This document", "OpenAPIDocument", "The OpenAPI 3.1 document"),
        "/v1/models": get("listModels", "Models served", "ModelList", "The models served"),
        "/v1/models/{model_id}": get("getModel", "One model card", "Model", "The model's card",
                                     parameters=(_ref("ModelId", "parameters"),)),
        "/v1/chat/completions": completion("createChatCompletion", "Chat completion", "ChatCompletionRequest",
                                           "ChatCompletion", _CHAT_EXAMPLES),
        "/v1/completions": completion("createCompletion", "Text completion (no chat template)",
                                      "CompletionRequest", "TextCompletion", _COMPLETION_EXAMPLES),
        "/v1/embeddings": {"post": _operation(
            "Embeddings (mean-pooled last hidden layer, never steered)",
            {"200": _json(_ref("EmbeddingList"), "One embedding per input", ignored)},
            body=_ref("EmbeddingRequest"), examples=_EMBEDDING_EXAMPLES, parameters=(strict,),
            operation_id="createEmbedding")},
    }


def document() -> dict:
    """The OpenAPI 3.1 document of greenroom's HTTP surface (a fresh copy on every call)."""
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {
            "title": "greenroom",
            "version": __version__,
            "description": "A workstation LLM server with an OpenAI-compatible /v1 surface. Every "
                           "error is OpenAI's envelope {\"error\": {message, type, param, code}}.",
        },
        "paths": _paths(),
        "components": {
            "schemas": {**_error_schemas(), **_request_schemas(), **_response_schemas()},
            "responses": _error_response_components(),
            "parameters": _parameters(),
            "headers": _headers(),
        },
    })
