"""The OpenAPI 3.1 description of every route greenroom serves, built from plain dicts.

`document()` returns the whole document; the front end serves it at `GET /openapi.json`
and tests/test_openapi.py fuzzes the live server against it. Shared shapes live once in
`components` (schemas, responses, parameters, headers) and are reached by `$ref`; the
helpers below only assemble them. The error codes each status may carry are read from
the one error table (greenroom/errors.py), so a code added there is documented here.
No torch and no third-party schema tooling: this module is part of the front end.

Response objects are closed (`additionalProperties: false`): a field the server starts
sending must be described here first, or the fuzz test fails. Request objects are open:
the server accepts unknown fields and names them in X-miLLM-Ignored-Fields.
"""

from __future__ import annotations

import copy

from greenroom import __version__
from greenroom.engines.base import SAE_ACTIVATIONS_MAX_ENTRIES, SAE_ACTIVATIONS_MAX_TOP_K
from greenroom.errors import TABLE

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
MAX_CHOICES = 16  # openai_params.MAX_CHOICES: choices, prompts or conversations per request
MAX_LOGPROBS = 20  # scoring.MAX_LOGPROBS
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
_MODEL = {"type": "string", "minLength": 1, "examples": [DEMO_MODEL]}
_NULL = {"type": "null"}
_COUNT = _integer(minimum=0)
_ANY_OBJECT = {"type": "object"}


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
    return {str(status): _ref(name, "responses") for status, name, _ in _ERRORS}


def _operation(summary: str, responses: dict, *, body: dict | None = None, examples: dict | None = None,
               parameters: tuple[dict, ...] = (), operation_id: str, description: str | None = None) -> dict:
    op = {"operationId": operation_id, "summary": summary,
          "responses": {**responses, **_error_responses()}}
    if description:
        op["description"] = description
    if parameters:
        op["parameters"] = list(parameters)
    if body is not None:
        op["requestBody"] = _json_body(body, examples)
    return op


# --- errors ---------------------------------------------------------------------------

# (status, component name, description); the codes of each status are those of errors.TABLE
# (but the Ollama surface's own, which no route described here raises)
_ERRORS = (
    (400, "BadRequest", "The request was refused: malformed, invalid, too long, a scoring request or a "
     "JSON schema greenroom cannot honour, or asking for something this endpoint or engine cannot honour"),
    (401, "Unauthorized", "An API key is configured and the request did not send it (Authorization: Bearer <key>)"),
    (403, "Forbidden", "A browser page on an origin the server does not allow (Origin header; cors_origins, "
     "OLLAMA_ORIGINS)"),
    (404, "NotFound", "Unknown model or route"),
    (405, "MethodNotAllowed", "The route exists but not for this method"),
    (408, "RequestTimeout", "The request body did not arrive in time"),
    (409, "Conflict", "The name is in use (a steering profile of that name exists)"),
    (413, "PayloadTooLarge", "The request body is larger than the server takes"),
    (429, "TooManyRequests", "/v1/needle/*: the engine queue is full (engine_busy); Retry-After says when to retry"),
    (500, "InternalError", "Generation or the server failed (non-finite logits and a complete constrained "
     "document that does not validate included)"),
    (503, "ServiceUnavailable", "No engine can take the request now (not loaded, busy, queue full, or "
     "crashed during the request); retry later (Retry-After on queue_full and model_busy)"),
    (504, "GatewayTimeout", "The request took longer than the server's request timeout and was cancelled"),
)


def error_codes(status: int) -> list[str]:
    """The codes greenroom answers with `status`, in the error table's order."""
    return [code for code, kind in TABLE.items() if kind.status == status and not kind.ollama_only]


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
    for status, name, _ in _ERRORS:
        codes = error_codes(status)
        types = sorted({TABLE[code].type for code in codes})
        schemas[f"{name}Error"] = {
            "allOf": [_ref("Error")],
            "properties": {"error": {"properties": {"code": {"enum": codes}, "type": {"enum": types}}}},
        }
    return schemas


def _error_response_components() -> dict:
    return {name: _json(_ref(f"{name}Error"), description) for _, name, description in _ERRORS}


# --- request fields -------------------------------------------------------------------

_SAMPLING_FIELDS = {
    "stream": _BOOLEAN,
    "stream_options": _obj({"include_usage": _described(
        _BOOLEAN, "With stream: true, a last chunk with `choices: []` and the usage follows")}),
    "temperature": _number(minimum=0, maximum=2, description="0 is greedy"),
    "top_p": _number(minimum=0, maximum=1),
    "top_k": _integer(minimum=-1, maximum=INT32_MAX, description="vLLM's extension: the k most probable tokens; "
                      "0 or -1 is off"),
    "max_tokens": _integer(minimum=0, maximum=INT32_MAX, description="Absent: the server default, bounded by the "
                           "context window (a constrained answer: the whole window)"),
    "max_completion_tokens": _integer(minimum=0, maximum=INT32_MAX, description="max_tokens by its newer name"),
    "seed": _integer(minimum=0, maximum=UINT32_MAX),
    "stop": _ref("Stop"),
    "frequency_penalty": _ref("Penalty"),
    "presence_penalty": _ref("Penalty"),
    "user": _described(_string(), "Not read: reported in X-miLLM-Ignored-Fields"),
}

_NOT_HONOURED = "Refused with 400 field_not_honoured unless null"
_STEERING = ("A steering dial for this request only: a λ in 0–2, or \"off\", \"min\" or \"max\". It scales the "
             "base (the named profile, else the model's active profile, cluster or circuit, else the live values) by "
             "the spec's intensity rules (clusters: capped at the declared range's top, else the server's maximum; "
             "circuits: clamped into the declared range at both ends); 0/\"off\" turns steering off. The resolved "
             "λ is echoed in X-miLLM-Steering-Intensity. Anything else: 400 invalid_parameter. GGUF/OpenVINO and "
             "scoring: " + _NOT_HONOURED.lower())

# Fields every generation endpoint knows and refuses, unless they carry a "no change" value.
_REFUSED_FIELDS = {
    "steering": _described({}, _NOT_HONOURED),
    "dimensions": _described({}, _NOT_HONOURED + ": only /v1/embeddings could use it"),
    "logit_bias": _described(_ANY_OBJECT, _NOT_HONOURED + " or {}"),
}

_SCORING_ONLY = ("Scoring mode (with max_tokens: 1, unstreamed, n: 1; never with response_format or "
                 "steering): no text is generated, the next token's log-probabilities are returned")

_CHAT_FIELDS = {
    "n": _integer(minimum=1, maximum=MAX_CHOICES, description="Choices per conversation (n × conversations ≤ "
                  f"{MAX_CHOICES}); refused with stream: true"),
    "chat_template_kwargs": _described(_ANY_OBJECT, "Variables for the chat template; its renderer's own "
                                       "arguments are refused"),
    "response_format": _ref("ResponseFormat"),
    "tools": _array(_ref("Tool"), description="Rendered by the chat template; calls in the answer are parsed "
                    "into message.tool_calls"),
    "tool_choice": _ref("ToolChoice"),
    "functions": _array(_ref("FunctionDefinition"), description="Deprecated form of tools (not both)"),
    "function_call": {"anyOf": [{"enum": ["none", "auto"]}, _obj({"name": _string()}, ("name",))],
                      "description": "Deprecated form of tool_choice"},
    "parallel_tool_calls": _described(_BOOLEAN, "false: at most one call when tool_choice forces calls"),
    "extra_messages": _array(_array(_ref("ChatMessage"), minItems=1), minItems=1, maxItems=MAX_CHOICES - 1,
                             description="More conversations answered in the same request: their choices "
                             "follow those of messages, in order"),
    "logprobs": _described(_BOOLEAN, "true: " + _SCORING_ONLY),
    "top_logprobs": _integer(minimum=0, maximum=MAX_LOGPROBS, description="Alternatives per scored token; "
                             "needs logprobs: true"),
    "allowed_token_ids": _described(_ref("AllowedTokenIds"), _SCORING_ONLY + ", normalised over these tokens"),
    "return_tokens_as_token_ids": _described(_BOOLEAN, "Scoring: tokens written \"token_id:<id>\""),
    "profile": _described(_string(), "A steering profile (/api/profiles) steering this request only, on the "
                          "serial path; the live steering is unchanged. 404 profile_not_found; 400 when invalid "
                          "for the attached SAEs; no SAE attached: unsteered. GGUF/OpenVINO and scoring: "
                          + _NOT_HONOURED.lower()),
    "steering_intensity": _described({"type": ["number", "string"]}, _STEERING),
    "return_sae_activations": _ref("SAEActivationsRequest"),
}

# Legacy completions: accepted only at OpenAI's defaults, plus the scoring fields.
_COMPLETION_FIELDS = {
    "n": _integer(minimum=1, description="Only 1 (send a list of prompts for several choices)"),
    "echo": {**_BOOLEAN, "description": "Only false"},
    "best_of": _integer(minimum=1, description="Only 1"),
    "suffix": _nullable(_string(description="Only null")),
    "logprobs": {"anyOf": [_integer(minimum=0, maximum=MAX_LOGPROBS), {"const": False}],
                 "description": "An integer: " + _SCORING_ONLY + "; the most probable ones reported"},
    "allowed_token_ids": _described(_ref("AllowedTokenIds"), _SCORING_ONLY + ", normalised over these tokens"),
    "add_special_tokens": _described(_BOOLEAN, "false: the prompt is tokenised as written (no BOS)"),
    "return_tokens_as_token_ids": _described(_BOOLEAN, "Scoring: tokens written \"token_id:<id>\""),
    "top_logprobs": _described({}, _NOT_HONOURED + " (use logprobs)"),
    "response_format": _described({}, _NOT_HONOURED + " or {\"type\": \"text\"}: served on chat completions"),
    "tools": _described({}, _NOT_HONOURED + " or []: served on chat completions"),
    "tool_choice": _described({}, _NOT_HONOURED + ": served on chat completions"),
    "profile": _described({}, _NOT_HONOURED + ": steering is served on chat completions"),
    "steering_intensity": _described({}, _NOT_HONOURED + ": steering is served on chat completions"),
    "return_sae_activations": _ref("SAEActivationsRequest"),
}

# Generation and scoring fields the embeddings route knows, to refuse them.
_NOT_EMBEDDINGS = ("n", "logprobs", "allowed_token_ids", "top_logprobs", "response_format", "seed", "profile",
                   "steering_intensity", "steering", "tools", "tool_choice", "logit_bias", "max_completion_tokens")

_TOOL_NAME = _string(pattern="^[A-Za-z0-9_-]{1,64}$")
_JSON_SCHEMA = _described(_ANY_OBJECT, "A JSON schema in greenroom's supported subset (type, properties, "
                          "required, additionalProperties, items, minItems, maxItems, enum, const, minimum, "
                          "maximum, minLength, maxLength, pattern, anyOf, $ref, $defs; title, description, "
                          "default and examples are ignored); anything else is a 400 response_format_unsupported")


def _request_schemas() -> dict:
    message = _obj({
        "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
        "content": {"anyOf": [_string(), _array(_ref("TextPart")), _NULL]},
        "name": _described(_string(), "Not read: reported"),
        "tool_calls": _array(_ref("MessageToolCall"), description="An assistant's earlier calls, rendered by "
                             "the chat template"),
        "tool_call_id": _described(_string(), "Not read: reported"),
    }, ("role",), description="A trailing assistant message is continued, not answered")
    chat = _obj({
        "model": _MODEL,
        "messages": _array(_ref("ChatMessage"), minItems=1),
        **_SAMPLING_FIELDS,
        **_CHAT_FIELDS,
        **_REFUSED_FIELDS,
    }, ("model", "messages"), description="Unknown fields are accepted and named in the "
                                          "X-miLLM-Ignored-Fields response header")
    completion = _obj({
        "model": _MODEL,
        "prompt": {"anyOf": [_string(), _array(_string(), minItems=1, maxItems=MAX_CHOICES), _ref("TokenIds"),
                             _array(_ref("TokenIds"), minItems=1, maxItems=MAX_CHOICES)],
                   "description": "A string, a list of strings (one choice each), a token array or a list of "
                                  "token arrays; no chat template"},
        **_SAMPLING_FIELDS,
        **_COMPLETION_FIELDS,
        **_REFUSED_FIELDS,
    }, ("model", "prompt"), description="Unknown fields are accepted and named in the "
                                        "X-miLLM-Ignored-Fields response header")
    embeddings = _obj({
        "model": _MODEL,
        "input": {"anyOf": [_string(minLength=1), _array(_string(minLength=1), minItems=1), _ref("TokenIds"),
                            _array(_ref("TokenIds"), minItems=1)],
                  "description": "At most 2,048 inputs, each within the context window"},
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": _integer(description="Refused (not yet implemented)"),
        "user": _described(_string(), "Not read: reported in X-miLLM-Ignored-Fields"),
        **{field: _described({}, _NOT_HONOURED + " or its no-change value: embeddings have no such setting")
           for field in _NOT_EMBEDDINGS},
    }, ("model", "input"), description="Unknown fields are accepted and named in the "
                                       "X-miLLM-Ignored-Fields response header")
    json_schema_format = _obj({
        "type": {"const": "json_schema"},
        "json_schema": _obj({
            "name": _string(minLength=1, description="Echoed in the X-miLLM-Constrained response header"),
            "schema": _JSON_SCHEMA,
            "strict": _described(_BOOLEAN, "Accepted; the schema is enforced by decoding either way"),
            "description": _string(),
        }, ("name",)),
    }, ("type", "json_schema"))
    response_format = {
        "anyOf": [_obj({"type": {"const": "text"}}, ("type",)), _obj({"type": {"const": "json_object"}}, ("type",)),
                  json_schema_format],
        "description": "json_object or json_schema: the answer is decoded under the schema and validated; "
                       "refused (400 response_format_unsupported) with stream: true, with stop, and with tools "
                       "unless tool_choice is \"none\"",
    }
    function = _obj({"name": _TOOL_NAME, "description": _string(), "parameters": _JSON_SCHEMA}, ("name",))
    tool_choice = {
        "anyOf": [{"enum": ["none", "auto", "required"]},
                  _obj({"type": {"const": "function"}, "function": _obj({"name": _string()}, ("name",))},
                       ("type", "function"))],
        "description": "auto (the default with tools): the model may call; required or a named function: "
                       "calls are enforced by decoding, with the functions' parameters",
    }
    needle_tool = {"anyOf": [_obj({"name": _TOOL_NAME, "description": _string(), "parameters": _JSON_SCHEMA},
                                  ("name",)), _ref("Tool")]}
    needle_common = {
        "model": _described({}, "Any value: a model not served is answered by the first model, with a warning"),
        "max_tokens": _integer(minimum=0, maximum=INT32_MAX),
        "temperature": _number(minimum=0, maximum=2),
        "seed": _integer(minimum=0, maximum=UINT32_MAX),
    }
    extract = _obj({
        "text": _string(minLength=1),
        "name": _string(minLength=1, description="What is extracted"),
        "schema": _JSON_SCHEMA,
        **needle_common,
    }, ("text", "name", "schema"), description="Other fields are accepted and listed in x_needle.warnings")
    complete = _obj({
        "query": _string(minLength=1, description="The user's message (with messages absent)"),
        "system": _string(description="A system message before the query"),
        "messages": _array(_ref("ChatMessage"), minItems=1, description="Instead of query and system"),
        "tools": {"anyOf": [_array(needle_tool), _string(contentMediaType="application/json")],
                  "description": "Needle's flat {name, description, parameters}, as an array or as its JSON text"},
        **needle_common,
    }, anyOf=[{"required": ["query"]}, {"required": ["messages"]}],
        description="Other fields are accepted and listed in x_needle.warnings")
    return {
        "TextPart": _obj({"type": {"const": "text"}, "text": _string()}, ("type", "text")),
        "ChatMessage": message,
        "MessageToolCall": _obj({"id": _string(), "type": {"const": "function"},
                                 "function": _obj({"name": _string(), "arguments": _string()})}),
        "Stop": {"anyOf": [_string(), _array(_string())]},
        "Penalty": _number(minimum=-2, maximum=2),
        "TokenIds": _array(_integer(minimum=0, maximum=INT32_MAX), minItems=1),
        "AllowedTokenIds": _array(_integer(), minItems=1),
        "ResponseFormat": response_format,
        "FunctionDefinition": function,
        "Tool": _obj({"type": {"const": "function"}, "function": _ref("FunctionDefinition")}, ("type", "function")),
        "ToolChoice": tool_choice,
        "SAEActivationsRequest": _obj({
            "sae_id": _described(_string(), "An attached SAE; may be left out while exactly one is attached"),
            "features": _array(_integer(minimum=0), minItems=1, description="Restricts the candidates (then zero "
                               "values are listed too); each inside the SAE's width"),
            "top_k": _integer(minimum=1, maximum=SAE_ACTIVATIONS_MAX_TOP_K, description="The largest activations "
                              "per position (default 8)"),
            "positions": {"anyOf": [{"enum": ["last", "prompt", "completion", "all"]}, _obj(
                {"start": _COUNT, "end": _integer(minimum=1)}, ("start", "end"), additionalProperties=False)],
                "description": "Absolute over prompt-then-generated tokens ({start, end} half-open); default last"},
            "read_point": {"enum": ["post_steering", "pre_steering"], "description": "Default post_steering"},
        }, additionalProperties=False, description=(
            "miLLM extension (transformers models only, refused on GGUF before any load): this request's "
            "activations of an attached SAE, returned under millm. Refused with 400 with n > 1, extra_messages "
            f"or several prompts, and when positions × top_k could exceed {SAE_ACTIVATIONS_MAX_ENTRIES} "
            "(max_tokens counted in full for completion and all). Served on the serial path. On a scoring "
            "request it reads the unsteered scoring pass (read_point reported as unsteered).")),
        "ChatCompletionRequest": chat,
        "CompletionRequest": completion,
        "EmbeddingRequest": embeddings,
        "NeedleExtractRequest": extract,
        "NeedleCompleteRequest": complete,
    }


# --- response bodies ------------------------------------------------------------------

_FINISH_REASON = {"enum": ["stop", "length"]}
_CHAT_FINISH_REASON = {"enum": ["stop", "length", "tool_calls"]}


def _completion_object(object_name: str, choice: dict, *, chunk: bool, x_needle: bool = False) -> dict:
    """A chat or text completion (or one streamed chunk of it): the fields both share."""
    properties = {
        "id": _string(),
        "object": {"const": object_name},
        "created": _integer(),
        "model": _string(),
        "choices": _array(choice, description="Empty on the usage-only chunk of stream_options.include_usage")
        if chunk else _array(choice),
    }
    required = ("id", "object", "created", "model", "choices")
    if chunk:
        properties["usage"] = _described(_ref("Usage"), "On the request's last finishing chunk and on the "
                                         "usage-only chunk")
    else:
        properties["system_fingerprint"] = _string(
            description="millm:<model>@<revision>:<dtype>/<quantization>:<engine>", pattern="^millm:")
        properties["usage"] = _ref("Usage")
        required += ("system_fingerprint", "usage")
    properties["millm"] = _described(_ref("Millm"), (
        "On the last chunk (choices: [], before [DONE])" if chunk else "Only when the request sent")
        + " return_sae_activations")
    if x_needle:
        properties["x_needle"] = _described(_ref("XNeedle"), (
            "On the chunk that finishes choice 0" if chunk else "Generated answers only (not scoring)")
            + "; absent when the server runs with --no-extras")
    return _closed(properties, required)


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


def _choice(content: dict, *, streamed: bool, logprobs: dict, finish: dict) -> dict:
    """One choice of a completion: its content fields between `index` and `finish_reason`
    (null on every streamed chunk but the one that ends the choice)."""
    return _closed({"index": _COUNT, **content, "logprobs": logprobs,
                    "finish_reason": _nullable(finish) if streamed else finish},
                   ("index", *content, "logprobs", "finish_reason"))


def _response_schemas() -> dict:
    tool_call = _closed({"id": _string(), "type": {"const": "function"},
                         "function": _closed({"name": _string(), "arguments": _string(
                             description="The arguments as JSON text (an object)")}, ("name", "arguments"))},
                        ("id", "type", "function"))
    message = _closed({
        "role": {"const": "assistant"},
        "content": _nullable(_string()),
        "tool_calls": _array(tool_call, minItems=1),
        "reasoning_content": _described(_string(), "The text around tool calls (choice 0, with x_needle)"),
    }, ("role", "content"), description="content is null only beside tool_calls")
    chunk_tool_call = _closed({
        "index": _COUNT, "id": _string(), "type": {"const": "function"},
        "function": _closed({"name": _string(), "arguments": _string()}),
    }, ("index", "function"), description="A call's id, type and name first, then fragments of its arguments")
    delta = _closed({"role": {"const": "assistant"}, "content": _string(),
                     "tool_calls": _array(chunk_tool_call, minItems=1)})
    top_logprob = _closed({"token": _string(), "logprob": _number(), "bytes": _array(_integer(minimum=0, maximum=255))},
                          ("token", "logprob", "bytes"))
    chat_logprobs = _closed({"content": _array(_closed({
        **top_logprob["properties"], "top_logprobs": _array(top_logprob)},
        ("token", "logprob", "bytes", "top_logprobs")))}, ("content",))
    text_logprobs = _closed({
        "tokens": _array(_string()),
        "token_logprobs": _array(_number()),
        "top_logprobs": _array(_obj({}, additionalProperties=_number())),
        "text_offset": _array(_COUNT),
    }, ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
    chat_choice = _choice({"message": message}, streamed=False, logprobs=_nullable(_ref("ChatLogprobs")),
                          finish=_CHAT_FINISH_REASON)
    chunk_choice = _choice({"delta": delta}, streamed=True, logprobs=_NULL, finish=_CHAT_FINISH_REASON)
    text_choice = _choice({"text": _string()}, streamed=False, logprobs=_nullable(_ref("CompletionLogprobs")),
                          finish=_FINISH_REASON)
    text_chunk_choice = _choice({"text": _string()}, streamed=True, logprobs=_NULL, finish=_FINISH_REASON)
    seconds = _number(minimum=0)
    x_needle = _closed({
        "type": {"enum": ["call", "respond", "refuse"]},
        "confidence": _number(minimum=0, maximum=1, description="Geometric mean of the produced tokens' "
                              "probabilities; 0 for an empty answer"),
        "reasoning": _string(description="The text beside tool calls; empty without calls"),
        "validation": _closed({"ungrounded": _array(_string()), "negation": _BOOLEAN}, ("ungrounded", "negation")),
        "prefill_tps": _nullable(_number(minimum=0)),
        "decode_tps": _nullable(_number(minimum=0)),
        "peak_ram_mb": _nullable(_number(minimum=0)),
        "replayed_turns": _integer(minimum=1),
        "reinitialized": _BOOLEAN,
        "queue_wait_seconds": seconds,
        "compute_seconds": seconds,
        "warnings": _array(_string()),
    }, ("type", "confidence", "reasoning", "validation", "prefill_tps", "decode_tps", "peak_ram_mb",
        "replayed_turns", "reinitialized", "queue_wait_seconds", "compute_seconds", "warnings"),
        description="What the OpenAI schema has no place for, from the engine's own figures")
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
    embedding = _closed({
        "object": {"const": "embedding"},
        "index": _COUNT,
        "embedding": {"anyOf": [_array(_number()), _string(contentEncoding="base64")]},
    }, ("object", "index", "embedding"))
    return {
        "Millm": _closed({"sae_activations": _closed({
            "sae_id": _string(),
            "layer": _COUNT,
            "read_point": _described({"enum": ["post_steering", "pre_steering", "unsteered"]},
                                     "unsteered on a scoring request, whose pass runs with every SAE hook suppressed"),
            "positions": _array(_closed({
                "position": _COUNT,
                "token_id": _COUNT,
                "features": _array(_closed({"index": _COUNT, "value": _number()}, ("index", "value"))),
            }, ("position", "token_id", "features")), description="The positions actually read (the last "
                "sampled token is never fed back, so it has none)"),
            "note": _string(),
        }, ("sae_id", "layer", "read_point", "positions", "note"))}, ("sae_activations",)),
        "Usage": _closed({"prompt_tokens": _COUNT, "completion_tokens": _COUNT, "total_tokens": _COUNT},
                         ("prompt_tokens", "completion_tokens", "total_tokens")),
        "ChatLogprobs": chat_logprobs,
        "CompletionLogprobs": text_logprobs,
        "XNeedle": x_needle,
        "ChatCompletion": _completion_object("chat.completion", chat_choice, chunk=False, x_needle=True),
        "ChatCompletionChunk": _completion_object("chat.completion.chunk", chunk_choice, chunk=True, x_needle=True),
        "ChatCompletionEvent": _sse_event("ChatCompletionChunk"),
        "TextCompletion": _completion_object("text_completion", text_choice, chunk=False),
        "TextCompletionChunk": _completion_object("text_completion", text_chunk_choice, chunk=True),
        "TextCompletionEvent": _sse_event("TextCompletionChunk"),
        "Embedding": embedding,
        "EmbeddingList": _closed({
            "object": {"const": "list"},
            "data": _array(_ref("Embedding")),
            "model": _string(),
            "usage": _closed({"prompt_tokens": _COUNT, "total_tokens": _COUNT}, ("prompt_tokens", "total_tokens")),
        }, ("object", "data", "model", "usage")),
        "NeedleExtraction": _closed({
            "object": {"const": "needle.extraction"},
            "data": {"description": "The extracted value, valid against the request's schema; null unless matched"},
            "matched": _described(_BOOLEAN, "true when the constrained answer was complete and valid"),
            "x_needle": {"anyOf": [_ref("XNeedle"), _closed(
                {"type": {"const": "refuse"}, "warnings": _array(_string())}, ("type", "warnings"),
                description="When the model produced no valid document: only the type and the request's "
                            "unknown fields")]},
        }, ("object", "data", "matched", "x_needle")),
        "NeedleCompletion": _closed({
            "object": {"const": "needle.completion"},
            "model": _string(),
            "content": _nullable(_string()),
            "tool_calls": _array(_closed({"name": _string(), "arguments": _ANY_OBJECT}, ("name", "arguments"))),
            "finish_reason": _CHAT_FINISH_REASON,
            "usage": _ref("Usage"),
            "x_needle": _ref("XNeedle"),
        }, ("object", "model", "content", "tool_calls", "finish_reason", "usage", "x_needle")),
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
            "model": {"type": ["string", "null"], "description": "The default model (Needle's field)"},
            "models": _array(_string()),
            "queue_depth": _COUNT,
            "max_queue_depth": _COUNT,
            "exact_token_counts": {"type": "boolean", "description": "Usage comes from the model's tokenizer"},
        }, ("status", "model", "models", "queue_depth", "max_queue_depth", "exact_token_counts")),
        "Actor": actor,
        "Actors": _obj({"actors": _array(_ref("Actor"))}, ("actors",)),
        "Inference": _obj({
            "backend": {"enum": ["serial", "continuous_batching"], "description": "The configured backend "
                        "(continuous batching is opt-in: continuous_batching = true, --continuous-batching)"},
            "actors": _array(_obj({
                "name": _string(),
                "state": _string(),
                "backend": _described({"enum": ["serial", "continuous_batching", "llama.cpp_parallel", None]},
                                      "continuous_batching once it is on and a loaded model batches; "
                                      "llama.cpp_parallel for a GGUF model (llama.cpp batches its sequences, "
                                      "whatever their sampling); null while the actor is not up"),
                "models": _described(_array(_string()), "The loaded models whose requests may be batched"),
                "parallel": _described(_COUNT, "llama.cpp_parallel: sequences decoded together at most"),
                "decode": _described({"enum": ["together", "in_turns"]}, "llama.cpp_parallel: one llama_decode "
                                     "for every sequence, or one each in turn where that measured faster at load"),
                "batched": _described(_COUNT, "Requests decoding in the batch now"),
                "fixed_sampling": _described(_obj({
                    "temperature": _number(), "top_p": _number(), "top_k": _integer(),
                    "repetition_penalty": _number()}), "What a request must ask for to be batched (no seed, "
                    "n = 1, one prompt, no response_format or forced tool call); any other request runs on "
                    "the serial path"),
            }, ("name", "state", "backend"))),
        }, ("backend", "actors")),
        "OpenAPIDocument": _obj({"openapi": _string(), "info": {"type": "object"}, "paths": {"type": "object"}},
                                ("openapi", "info", "paths")),
    }


# --- steering management (http/steering_api.py) ----------------------------------------

_SAE_ID = _string(pattern="^[A-Za-z0-9_.-]{1,64}$")
_STRENGTHS = _described(
    {"type": "object", "additionalProperties": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                                                "additionalProperties": _number(minimum=-200, maximum=200)}},
    "Per attached SAE (by sae_id), feature index → strength in ±200: a percentage of the layer's typical "
    "residual norm added along the feature's unit decoder direction (docs/architecture.md)")


_PROFILE_NAME = _string(pattern="^[A-Za-z0-9_.-]{1,64}$")
_DESCRIPTION = _string(maxLength=4096)


def _steering_schemas() -> dict:
    sae = _obj({
        "sae_id": _string(),
        "source": _described(_string(), "As attached: a directory, demo:<size>[:<layer>] or random:<d_in>:<layer>"),
        "path": _string(),
        "layer": _COUNT,
        "block": _described(_COUNT, "The decoder block whose output the SAE's hook point reads"),
        "hook_point": _string(),
        "width": _described(_COUNT, "Features (d_sae)"),
        "d_in": _COUNT,
        "architecture": _string(),
    }, ("sae_id", "source", "layer", "hook_point", "width", "d_in"))
    state = _obj({
        "model": _string(),
        "version": _described(_COUNT, "Grows with every change to this model's steering (0: never set)"),
        "enabled": _BOOLEAN,
        "saes": _array(_ref("AttachedSAE")),
        "strengths": _STRENGTHS,
        "active": _described(_nullable(_obj({"kind": {"enum": ["profile", "circuit"]}, "name": _string()},
                                            ("kind", "name"))),
                             "What the live values came from (a profile or cluster activated, or a circuit); null "
                             "when they were set directly"),
        "serving": _described(_nullable(_ref("Serving")), "How the active base serves now; null: none is active"),
        "live": _described(_BOOLEAN, "Whether every loaded placement of the model holds this version"),
    }, ("model", "version", "enabled", "saes", "strengths", "live"))
    return {
        "AttachedSAE": sae,
        "ModelSteering": state,
        "SteeringList": _obj({"models": _array(_ref("ModelSteering"))}, ("models",)),
        "SAEList": _obj({
            "models": _array(_ref("ModelSteering")),
            "available": _described(_array(_obj({"sae": _string(), "model_size": _string(), "layer": _COUNT},
                                                ("sae", "model_size", "layer"))),
                                    "The demo SAEs attach builds on first use (for the demo model of that size)"),
        }, ("models", "available")),
        "SAEAttachRequest": _obj({
            "model": _MODEL,
            "sae": _described(_string(minLength=1), "A directory holding an SAELens SAE (cfg.json + "
                              "sae_weights.safetensors), demo:<size>[:<layer>], or random:<d_in>:<layer> "
                              "(random directions)"),
            "layer": _described(_integer(minimum=0), "The layer the SAE must read (a demo SAE: which one)"),
            "sae_id": _described(_SAE_ID, "Its name (default: derived from the source)"),
        }, ("model", "sae"), additionalProperties=False),
        "SAEDetachRequest": _obj({"model": _MODEL, "sae_id": _SAE_ID}, ("model", "sae_id"),
                                 additionalProperties=False),
        "Profile": _obj({
            "name": _PROFILE_NAME,
            "model": _string(),
            "description": _string(),
            "strengths": _STRENGTHS,
            "saes": _described(_array(_ref("ProfileSAE")), "The SAEs its strengths refer to, as attached when "
                               "they were set"),
            "created_at": _COUNT,
            "updated_at": _COUNT,
            "cluster": _described(_nullable(_obj({
                "sae_id": _string(), "intensity": _number(), "intensity_range": _nullable(_RANGE),
                "labels": {"type": "object", "additionalProperties": _string()}})),
                "A cluster's dial, range and member labels (GET /api/clusters/{name}); null for a plain profile"),
        }, ("name", "model", "description", "strengths", "saes", "created_at", "updated_at")),
        "ProfileSAE": _obj({"sae_id": _string(), "source": _string(), "layer": _COUNT, "hook_point": _string(),
                            "width": _COUNT, "d_in": _COUNT, "architecture": _string()},
                           ("sae_id", "source", "layer", "hook_point", "width", "d_in", "architecture"),
                           additionalProperties=False),
        "ProfileList": _obj({"profiles": _array(_ref("Profile"))}, ("profiles",)),
        "ProfileDeleted": _obj({"name": _string(), "deleted": _BOOLEAN}, ("name", "deleted")),
        "ProfileCreateRequest": _obj({
            "name": _PROFILE_NAME,
            "model": _MODEL,
            "description": _DESCRIPTION,
            "strengths": _described(_STRENGTHS, "Checked against the SAEs attached to the model now (default {})"),
        }, ("name", "model"), additionalProperties=False),
        "ProfileUpdateRequest": _obj({
            "description": _DESCRIPTION,
            "strengths": _described(_STRENGTHS, "Replaces the profile's strengths; left out: they stay"),
        }, additionalProperties=False),
        "ProfileDocument": _obj({
            "format": {"const": "greenroom.steering_profile.v1"},
            "profile": _obj({"name": _PROFILE_NAME, "model": _MODEL, "description": _DESCRIPTION,
                             "strengths": _STRENGTHS}, ("name", "model"), additionalProperties=False),
            "saes": _described(_array(_ref("ProfileSAE")), "The identities of the SAEs the strengths refer to: "
                               "an import needs each attached to the model (same layer, hook point, width, d_in, "
                               "architecture)"),
        }, ("format", "profile", "saes"), additionalProperties=False),
        "SteeringRequest": _obj({
            "model": _MODEL,
            "enabled": _BOOLEAN,
            "strengths": _described(_STRENGTHS, "Replaces every strength of the model ({} clears them); zeros "
                                    "are dropped. Left out: the strengths stay"),
        }, ("model",), additionalProperties=False),
    }


_RANGE = _array(_number(minimum=0), minItems=2, maxItems=2)
_DIAL = _number(minimum=0, maximum=2)
_RUNG = _described(_integer(minimum=0, maximum=3), "The evidence rung: 0 associated, 1 suggested "
                   "(attribution-supported), 2 causally validated (edge), 3 faithfulness-tested (circuit)")


def _document_schemas() -> dict:
    """Clusters, circuits and the steering lock (http/clusters_api.py, steering_api.py)."""
    def members(feature_max: str) -> dict:
        return _described(_array(_obj({
            "feature": _integer(minimum=0), "strength": _number(minimum=-200, maximum=200),
            "label": _string(maxLength=200)}, ("feature", "strength"), additionalProperties=False),
            minItems=1, maxItems=64),
            f"1–64 members, each feature once, strengths non-zero within ±200; {feature_max}")

    listed = _array(_obj({"feature": _COUNT, "strength": _number(), "label": _string()}, ("feature", "strength")))
    cluster = _obj({
        "name": _string(), "model": _string(), "description": _string(), "sae_id": _string(), "members": listed,
        "intensity": _described(_number(), "The persistent dial"),
        "intensity_range": _described(_nullable(_RANGE), "As declared; null: [CLUSTER_INTENSITY_MIN, the "
                                      "server's maximum]"),
        "active": _described(_BOOLEAN, "Whether it is its model's active base"),
        "created_at": _COUNT, "updated_at": _COUNT,
    }, ("name", "model", "sae_id", "members", "intensity", "intensity_range", "active"))
    circuit = _obj({
        "name": _string(), "model": _string(), "description": _string(), "rung": _RUNG,
        "language": _described(_string(), "The rung's phrase, rendered by the server"),
        "layers": _array(_obj({"layer": _COUNT, "sae_id": _nullable(_string()), "members": listed},
                              ("layer", "sae_id", "members"))),
        "intensity": _described(_number(), "The persistent dial (serving clamps it into the range)"),
        "intensity_range": _described(_nullable(_RANGE), "As declared; null: [CIRCUIT_INTENSITY_MIN, the "
                                      "server's maximum]"),
        "slice_fallback": _described(_nullable(_string()), "The backing cluster"),
        "active": _BOOLEAN, "created_at": _COUNT, "updated_at": _COUNT,
        "unparseable": _described(_string(), "Only when the stored definition no longer parses (it never steers)"),
    }, ("name", "model", "intensity", "active"))
    common = {"name": _PROFILE_NAME, "model": _MODEL, "description": _DESCRIPTION,
              "intensity_range": _described(_RANGE, "[low, high], 0 ≤ low ≤ high, low ≤ 2; intersected with the "
                                            "[0, 2] envelope"),
              "intensity": _described(_DIAL, "The persistent dial (default 1)")}
    return {
        "Serving": _obj({
            "kind": _described({"enum": ["profile", "cluster", "circuit", "live"]}, "The active base's kind"),
            "name": _nullable(_string()),
            "mode": _described(_nullable({"enum": ["circuit", "slice_fallback"]}), "A circuit's serving mode; "
                               "null: it is not serving"),
            "reason": _described(_nullable({"enum": ["no_sae_attached", "layers_unbound", "unparseable_definition",
                                                     "steering_disabled", "intensity_off"]}),
                                 "Why a circuit is not genuinely steering"),
            "intensity": _described(_number(), "The λ the persistent dial resolves to"),
            "rung": _RUNG,
            "language": _described(_string(), "Present with rung: only while a circuit genuinely steers"),
        }, ("kind", "name")),
        "Cluster": cluster,
        "ClusterList": _obj({"clusters": _array(_ref("Cluster"))}, ("clusters",)),
        "ClusterDocument": _obj({
            "format": {"const": "greenroom.cluster.v1"}, **common,
            "sae_id": _described(_SAE_ID, "The attached SAE the members belong to"),
            "members": members("each inside the SAE's width"),
        }, ("format", "name", "model", "sae_id", "members"), additionalProperties=False),
        "Circuit": circuit,
        "CircuitList": _obj({"circuits": _array(_ref("Circuit"))}, ("circuits",)),
        "CircuitDocument": _obj({
            "format": {"const": "greenroom.circuit.v1"}, **common, "rung": _RUNG,
            "layers": _described(_array(_obj({
                "layer": _integer(minimum=0),
                "sae_id": _described(_SAE_ID, "The SAE the members were authored against; left out: whichever "
                                     "SAE is attached at that layer"),
                "members": members("checked against the SAE attached at that layer, if any")},
                ("layer", "members"), additionalProperties=False), minItems=1, maxItems=16),
                "Members per layer, each layer once"),
            "slice_fallback": _described(_PROFILE_NAME, "A cluster of the same model that steers while some member "
                                         "layer has no SAE attached (under the cluster rule, with no rung)"),
        }, ("format", "name", "model", "rung", "layers"), additionalProperties=False),
        "CircuitsActive": _obj({"models": _array(_ref("CircuitActive"))}, ("models",)),
        "CircuitActive": _obj({
            "model": _string(),
            "circuit": _nullable(_ref("Circuit")),
            "serving_mode": _nullable({"enum": ["circuit", "slice_fallback"]}),
            "reason": _nullable(_string()),
            "steering": _described(_nullable(_obj({
                "rung": _RUNG, "language": _string(),
                "header": _described(_string(), "X-miLLM-Circuit-Rung as responses carry it"),
                "intensity": _number(),
                "layers": _array(_obj({"layer": _COUNT, "sae_id": _string(), "strengths": {"type": "object"}},
                                      ("layer", "sae_id", "strengths")))},
                ("rung", "language", "header", "intensity", "layers"))),
                "Present only while the circuit genuinely steers generation (what X-miLLM-Circuit-Rung reports); "
                "read this, not whether a circuit is active, before showing evidence language"),
        }, ("model", "circuit", "serving_mode", "reason", "steering")),
        "IntensityRequest": _obj({"intensity": _DIAL}, ("intensity",), additionalProperties=False),
        "ClusterDialled": _obj({"cluster": _ref("Cluster"), "state": _described(
            _nullable(_ref("ModelSteering")), "The model's steering when the cluster is active (re-applied at "
            "once); null otherwise")}, ("cluster", "state")),
        "CircuitDialled": _obj({"circuit": _ref("Circuit"), "state": _described(
            _nullable(_ref("ModelSteering")), "The model's steering when the circuit is active (re-applied at "
            "once); null otherwise")}, ("circuit", "state")),
        "SteeringLock": _obj({"model": _described(_nullable(_string()), "The model locked for steering: "
                                                  "/v1/models lists it alone; null: none")}, ("model",)),
        "SteeringLockRequest": _obj({"model": _MODEL}, ("model",), additionalProperties=False),
    }


def _document_paths() -> dict:
    def op(method: str, operation_id: str, summary: str, schema: str, description: str, body: str | None = None,
           params: tuple = ()) -> dict:
        return {method: _operation(summary, {"200": _json(_ref(schema), description)}, operation_id=operation_id,
                                   body=_ref(body) if body else None, parameters=params)}

    named_param = (_ref("ProfileName", "parameters"),)
    model = {"name": "model", "in": "query", "required": False, "schema": _string(),
             "description": "Only this model"}
    state = "The model's resulting steering state, its version, and whether it is live"

    def named(kind: str, dial: str, activate: str) -> dict:
        """/api/{kind}s/{name}…: one route set per document kind, as http/clusters_api.py registers it."""
        title, root = kind.capitalize(), f"/api/{kind}s/{{name}}"
        return {
            root: {**op("get", f"get{title}", f"One {kind}", title, f"The {kind}", params=named_param),
                   **op("delete", f"delete{title}", f"Delete a {kind}", "ProfileDeleted", "Deleted",
                        params=named_param)},
            root + "/intensity": op("put", f"dial{title}", f"Set a {kind}'s persistent dial, {dial}",
                                    f"{title}Dialled", f"The {kind}, and the re-applied steering when it is active",
                                    "IntensityRequest", named_param),
            root + "/export": op("get", f"export{title}", f"A {kind} as a document", f"{title}Document",
                                 f"The document POST /api/{kind}s/import takes", params=named_param),
            root + "/activate": op("post", f"activate{title}", activate, "ModelSteering", state, params=named_param),
        }

    return {
        "/api/clusters": op("get", "listClusters", "Clusters (profiles with an intensity range and a dial)",
                            "ClusterList", "Every cluster"),
        "/api/clusters/import": op("post", "importCluster", "Import a cluster document", "Cluster",
                                   "The cluster (409 profile_exists when the name is taken)", "ClusterDocument"),
        **named("cluster", "within [0, its range's top (else the server's maximum)]",
                "A cluster's dialled strengths as its model's live steering"),
        "/api/circuits": op("get", "listCircuits", "Circuits", "CircuitList", "Every circuit"),
        "/api/circuits/import": op("post", "importCircuit", "Import a circuit document", "Circuit",
                                   "The circuit (409 circuit_exists when the name is taken)", "CircuitDocument"),
        "/api/circuits/active": op("get", "activeCircuit", "Each steerable model's active circuit and whether it "
                                   "genuinely steers", "CircuitsActive", "Per model: the circuit, its serving mode "
                                   "and its `steering`", params=(model,)),
        **named("circuit", "within [0, 2] (serving clamps it into the circuit's range)",
                "A circuit's dialled members as its model's live steering, each layer through its own SAE"),
        "/api/steering/lock": {
            **op("get", "getSteeringLock", "The model locked for steering", "SteeringLock", "The lock"),
            **op("put", "lockSteering", "Lock the server to one steerable model (/v1/models lists it alone)",
                 "SteeringLock", "The lock", "SteeringLockRequest"),
            **op("delete", "unlockSteering", "Lift the steering lock", "SteeringLock", "The lock (null)")},
    }


def _monitoring_schemas() -> dict:
    config = _obj({
        "model": _string(),
        "enabled": _BOOLEAN,
        "sae_id": _described(_nullable(_string()), "The attached SAE it reads (null until one is chosen)"),
        "top_k": _described(_integer(minimum=1, maximum=64), "Features each record lists"),
    }, ("model", "enabled", "sae_id", "top_k"), additionalProperties=False)
    record = _obj({
        "id": _described(_integer(minimum=1), "Increasing from 1 since the server started"),
        "time": _described(_number(), "Unix time, seconds"),
        "model": _string(),
        "request_id": _described(_string(), "The generation's id"),
        "endpoint": _described(_string(), "The route that generated it"),
        "choice": _COUNT,
        "sae_id": _string(),
        "layer": _COUNT,
        "positions": _described(_COUNT, "Positions read: every token fed to the model (prompt and generated)"),
        "features": _described(_array(_obj({"index": _COUNT, "max": _number(), "mean": _number()},
                                           ("index", "max", "mean"), additionalProperties=False)),
                               "The top-k features by their max over the positions, pre-steering (a feature that "
                               "never fired is not listed); mean over every position read"),
    }, ("id", "time", "model", "request_id", "endpoint", "choice", "sae_id", "layer", "positions", "features"),
        additionalProperties=False)
    return {
        "MonitoringConfig": config,
        "MonitoringList": _obj({"models": _array(_ref("MonitoringConfig"))}, ("models",),
                               additionalProperties=False),
        "MonitoringRequest": _obj({
            "model": _MODEL,
            "enabled": _BOOLEAN,
            "sae_id": _described(_SAE_ID, "An SAE attached to the model; left out: the one attached (when "
                                 "several are, name one), or when disabling, the one configured"),
            "top_k": _described(_integer(minimum=1, maximum=64), "Left out: as configured (8 at first)"),
        }, ("model", "enabled"), additionalProperties=False),
        "MonitoringRecord": record,
        "MonitoringRecords": _obj({
            "records": _array(_ref("MonitoringRecord")),
            "next": _described(_COUNT, "The `since` that continues after these records"),
        }, ("records", "next"), additionalProperties=False),
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
        "ProfileName": {"name": "name", "in": "path", "required": True, "schema": _PROFILE_NAME},
    }


# --- paths ----------------------------------------------------------------------------

_INVOICE = {"type": "object", "properties": {"vendor": {"type": "string", "maxLength": 12},
                                            "total": {"type": "integer", "minimum": 0, "maximum": 100000}},
            "required": ["vendor", "total"], "additionalProperties": False}
_WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
    "additionalProperties": False}}
_CHAT_EXAMPLES = {
    "chat": {"model": DEMO_MODEL, "messages": [{"role": "system", "content": "You are concise."},
                                               {"role": "user", "content": "What is a sparse autoencoder?"}],
             "temperature": 0.7, "max_tokens": 50, "stop": ["\n\n"], "seed": 7},
    "streamed": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Tell me a story"}],
                 "max_tokens": 32, "stream": True, "stream_options": {"include_usage": True}},
    "json schema": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Acme Corp billed $1,200"}],
                    "max_tokens": 64, "seed": 1,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "Invoice", "schema": _INVOICE}}},
    "tool call": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Weather in Lagos?"}],
                  "max_tokens": 64, "seed": 3, "tools": [{"type": "function", "function": _WEATHER}],
                  "tool_choice": "required", "parallel_tool_calls": False},
    "streamed tool call": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Weather in Lagos?"}],
                           "max_tokens": 48, "seed": 3, "stream": True,
                           "tools": [{"type": "function", "function": _WEATHER}],
                           "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "scoring": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "Is it true? Answer yes or no."}],
                "extra_messages": [[{"role": "user", "content": "Is it false? Answer yes or no."}]],
                "max_tokens": 1, "logprobs": True, "top_logprobs": 3},
}
_COMPLETION_EXAMPLES = {
    "completion": {"model": DEMO_MODEL, "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0},
    "streamed": {"model": DEMO_MODEL, "prompt": ["Once upon a time", "In a hole"], "max_tokens": 8,
                 "stream": True},
    "scoring": {"model": DEMO_MODEL, "prompt": "[question] is it true?\n[decision]:", "max_tokens": 1,
                "logprobs": 5},
    "scoring allowed tokens": {"model": DEMO_MODEL, "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 1,
                               "logprobs": 2, "allowed_token_ids": [10, 11, 12], "return_tokens_as_token_ids": True},
}
_EMBEDDING_EXAMPLES = {
    "texts": {"model": DEMO_MODEL, "input": ["The food was delicious", "Hello"]},
    "base64 token ids": {"model": DEMO_MODEL, "input": [[1, 2, 3]], "encoding_format": "base64"},
}
_EXTRACT_EXAMPLES = {
    "invoice": {"text": "Invoice from Acme Corp, $1,200.00", "name": "Invoice", "schema": _INVOICE,
                "max_tokens": 64, "seed": 1},
}
_COMPLETE_EXAMPLES = {
    "query with tools": {"query": "What is it like in Lagos right now?", "system": "Be brief.",
                         "tools": [_WEATHER], "max_tokens": 32, "seed": 3},
    "messages": {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
}

# a demo SAE already attached by default (a 400: one SAE per block), and a harmless write, so the
# examples leave a shared server's steering as it was
_ATTACH_EXAMPLES = {"demo SAE": {"model": DEMO_MODEL, "sae": "demo:tiny"}}
_STEERING_EXAMPLES = {"enable": {"model": DEMO_MODEL, "enabled": True}}


def _paths() -> dict:
    strict = _ref("Strict", "parameters")
    ignored = {"X-miLLM-Ignored-Fields": _ref("IgnoredFields", "headers")}
    seeded = {**ignored, "X-miLLM-Seed": _ref("Seed", "headers"), "X-miLLM-Steering": _ref("Steering", "headers"),
              "X-miLLM-Circuit-Rung": _ref("CircuitRung", "headers")}
    constrained = {**seeded, "X-miLLM-Constrained": _ref("Constrained", "headers"),
                   "X-miLLM-Steering-Intensity": _ref("SteeringIntensity", "headers")}

    def get(operation_id: str, summary: str, schema: str, description: str, **kw) -> dict:
        return {"get": _operation(summary, {"200": _json(_ref(schema), description)},
                                  operation_id=operation_id, **kw)}

    def completion(operation_id: str, summary: str, request: str, name: str, examples: dict, headers: dict,
                   description: str) -> dict:
        return {"post": _operation(
            summary,
            {"200": _json_or_stream(_ref(name), _ref(f"{name}Event"),
                                    f"The {name} object, or with stream: true its SSE stream", headers)},
            body=_ref(request), examples=examples, parameters=(strict,), operation_id=operation_id,
            description=description)}

    def steer(method: str, operation_id: str, summary: str, request: str, examples: dict) -> dict:
        return {method: _operation(summary, {"200": _json(_ref("ModelSteering"), "The model's resulting steering "
                                                          "state, its version, and whether it is live")},
                                   body=_ref(request), examples=examples, operation_id=operation_id)}

    def profile(method: str, operation_id: str, summary: str, schema: str, description: str, request=None,
                named: bool = True) -> dict:
        return {method: _operation(summary, {"200": _json(_ref(schema), description)},
                                   body=_ref(request) if request else None, operation_id=operation_id,
                                   parameters=(_ref("ProfileName", "parameters"),) if named else ())}

    def needle(operation_id: str, summary: str, request: str, name: str, examples: dict, description: str):
        return {"post": _operation(summary, {"200": _json(_ref(name), description)}, body=_ref(request),
                                   examples=examples, operation_id=operation_id)}

    return {
        "/": get("index", "Endpoint index", "Index", "The routes this server answers"),
        "/health": get("health", "Readiness", "Health", "ok once the tree is up, loading before"),
        "/api/actors": get("actors", "The live actor tree", "Actors", "One row per actor"),
        "/api/health/inference": get("inference", "The inference backend of each engine actor", "Inference",
                                     "serial or continuous_batching, per engine actor"),
        "/openapi.json": get("openapi", "This document", "OpenAPIDocument", "The OpenAPI 3.1 document"),
        "/api/saes": get("listSAEs", "The SAEs attached to each steerable model", "SAEList",
                         "Per model: its steering state with each SAE's width, layer and hook point; the demo SAEs"),
        "/api/saes/attach": steer("post", "attachSAE", "Attach an SAE to a transformers model",
                                  "SAEAttachRequest", _ATTACH_EXAMPLES),
        "/api/saes/detach": steer("post", "detachSAE", "Detach an SAE (its strengths go with it)",
                                  "SAEDetachRequest", {"detach": {"model": DEMO_MODEL, "sae_id": "sae_example"}}),
        "/api/steering": {**get("getSteering", "Each steerable model's steering", "SteeringList",
                                "Strengths, enabled, version and whether it is live"),
                          **steer("put", "setSteering", "Set a model's steering", "SteeringRequest",
                                  _STEERING_EXAMPLES)},
        "/api/profiles": {
            **profile("get", "listProfiles", "Steering profiles", "ProfileList", "Every profile", named=False),
            **profile("post", "createProfile", "Create a steering profile for a model", "Profile",
                      "The profile (409 profile_exists when the name is taken)", "ProfileCreateRequest",
                      named=False)},
        "/api/profiles/{name}": {
            **profile("get", "getProfile", "One steering profile", "Profile", "The profile"),
            **profile("put", "updateProfile", "Update a steering profile", "Profile", "The updated profile",
                      "ProfileUpdateRequest"),
            **profile("delete", "deleteProfile", "Delete a steering profile", "ProfileDeleted", "Deleted")},
        "/api/profiles/{name}/activate": profile(
            "post", "activateProfile", "A profile's strengths as its model's live steering (as PUT /api/steering)",
            "ModelSteering", "The model's resulting steering state, its version, and whether it is live"),
        "/api/profiles/{name}/export": profile("get", "exportProfile", "A profile as a self-contained document",
                                               "ProfileDocument", "The document POST /api/profiles/import takes"),
        "/api/profiles/import": profile("post", "importProfile", "Import an exported profile", "Profile",
                                        "The imported profile", "ProfileDocument", named=False),
        **_document_paths(),
        **_monitoring_paths(),
        "/v1/models": get("listModels", "Models served", "ModelList", "The models served"),
        "/v1/models/{model_id}": get("getModel", "One model card", "Model", "The model's card",
                                     parameters=(_ref("ModelId", "parameters"),)),
        "/v1/chat/completions": completion(
            "createChatCompletion", "Chat completion", "ChatCompletionRequest", "ChatCompletion", _CHAT_EXAMPLES,
            constrained, "Generation (structured output and tool calls included), or scoring mode with "
            "logprobs: true, top_logprobs or allowed_token_ids (one choice per conversation)"),
        "/v1/completions": completion(
            "createCompletion", "Text completion (no chat template)", "CompletionRequest", "TextCompletion",
            _COMPLETION_EXAMPLES, seeded, "Generation, or scoring mode with logprobs (an integer) or "
            "allowed_token_ids (one choice per prompt)"),
        "/v1/embeddings": {"post": _operation(
            "Embeddings (mean-pooled last hidden layer, never steered)",
            {"200": _json(_ref("EmbeddingList"), "One embedding per input", ignored)},
            body=_ref("EmbeddingRequest"), examples=_EMBEDDING_EXAMPLES, parameters=(strict,),
            operation_id="createEmbedding")},
        "/v1/needle/extract": needle(
            "needleExtract", "Extract a value from text under a JSON schema (constrained decoding)",
            "NeedleExtractRequest", "NeedleExtraction", _EXTRACT_EXAMPLES,
            "The extracted value, or matched: false when the model produced none"),
        "/v1/needle/complete": needle(
            "needleComplete", "A query or messages, with Needle's flat tools, answered as a chat completion",
            "NeedleCompleteRequest", "NeedleCompletion", _COMPLETE_EXAMPLES,
            "The answer: content and tool calls with parsed arguments"),
    }


def _monitoring_paths() -> dict:
    def query(name: str, schema: dict, description: str) -> dict:
        return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}

    model = query("model", _string(), "Only this model's records")
    record_event = {
        "type": "object", "required": ["data"],
        "properties": {"event": _string(), "data": _string(), "id": _string(), "retry": _integer()},
        "oneOf": [
            {"properties": {"event": {"const": "message"}, "data": {
                "type": "string", "contentMediaType": "application/json",
                "contentSchema": _ref("MonitoringRecord")}}},
            {"properties": {"event": {"const": "dropped"}, "data": {
                "type": "string", "contentMediaType": "application/json",
                "contentSchema": _obj({"dropped": _integer(minimum=1)}, ("dropped",))}}, "required": ["event"]},
        ],
    }
    return {
        "/api/monitoring": {
            "get": _operation("Each steerable model's SAE monitoring", {"200": _json(
                _ref("MonitoringList"), "enabled, sae_id and top_k per transformers model")},
                operation_id="getMonitoring"),
            "put": _operation("Set a model's SAE monitoring", {"200": _json(
                _ref("MonitoringConfig"), "The configuration now held (persisted)")},
                body=_ref("MonitoringRequest"), examples={"disable": {"model": DEMO_MODEL, "enabled": False}},
                operation_id="setMonitoring"),
        },
        "/api/monitoring/records": {"get": _operation(
            "Monitoring records kept (the last 1,000), oldest first", {"200": _json(
                _ref("MonitoringRecords"), "The records newer than `since`, and the next `since`")},
            parameters=(model, query("since", _integer(minimum=0), "Only records with a larger id (default 0)"),
                        query("limit", _integer(minimum=1, maximum=1000), "At most this many (default 100)")),
            operation_id="getMonitoringRecords")},
        "/api/monitoring/stream": {"get": _operation(
            "New monitoring records as server-sent events, until the client goes",
            {"200": {"description": "One `data:` event per record; an event `dropped` when this reader fell "
                                    "behind and lost some (GET /api/monitoring/records still has them); comment "
                                    "lines while idle",
                     "content": {"text/event-stream": {"schema": record_event}}}},
            parameters=(model,), operation_id="streamMonitoring")},
    }


def document() -> dict:
    """The OpenAPI 3.1 document of greenroom's HTTP surface (a fresh copy on every call)."""
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {
            "title": "greenroom",
            "version": __version__,
            "description": "A workstation LLM server with an OpenAI-compatible /v1 surface and Needle's "
                           "/v1/needle routes. Every error is OpenAI's envelope {\"error\": {message, type, "
                           "param, code}}.",
        },
        "paths": _paths(),
        "components": {
            "schemas": {**_error_schemas(), **_request_schemas(), **_response_schemas(), **_steering_schemas(),
                        **_document_schemas(), **_monitoring_schemas()},
            "responses": _error_response_components(),
            "parameters": _parameters(),
            "headers": _headers(),
        },
    })
