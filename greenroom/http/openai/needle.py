"""The Needle surface: the `x_needle` block on chat completions, and /v1/needle/*.

x_needle reports what the OpenAI schema has no place for, from the engine's own
figures (engine_actor.py sends them with each choice's last event):

- type: "call" when the answer holds tool calls, "refuse" when it is empty, else "respond";
- confidence: the geometric mean of the model's probabilities of the tokens it produced,
  exp(Σ log p / n), each p read from the distribution it sampled from (temperature 1,
  after any constraint mask) — in (0, 1], 0 for an empty answer; null, with a warning, on an
  engine that reports no probabilities (OpenVINO);
- validation.ungrounded: tool-call argument values (strings and numbers) that appear
  nowhere in the request's messages, as "<function>.<path>";
- validation.negation: a negation word in the user's messages;
- prefill_tps / decode_tps: prompt tokens over the first step's time, further tokens over
  the rest; peak_ram_mb: the engine actor's peak resident memory;
- replayed_turns: engine calls the answer needed (1: one generation); reinitialized: true,
  as greenroom keeps no session between requests and processes every prompt afresh;
- queue_wait_seconds / compute_seconds: time queued in the engine actor, and from leaving
  the queue to the last token;
- warnings: "ignored field: <location>" for each field the request path did not read — the
  same ledger as X-miLLM-Ignored-Fields — and any other note on how the request was served.
"""

from __future__ import annotations

import json
import math
import re

import attrs

from greenroom.errors import GreenroomError
from greenroom.http.core.contracts import AnyOf, Anything, Choice, ListOf, Number, Shape, Text, sent, when
from greenroom.http.core.objects import BOOLEAN, Object, or_null
from greenroom.http.core.schema_subset import SCHEMA
from greenroom.http.openai import openai_params
from greenroom.http.pipeline import paths
from greenroom.http.pipeline.events import Call
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.http.pipeline.request import ChatRequest
from greenroom.http.pipeline.structured import FUNCTION, TOOL, Output
from greenroom.protocol import GenerationStats

_NEGATION = re.compile(r"\b(not|no|never|none|neither|nor|without|cannot)\b|n't\b", re.IGNORECASE)


_NOT_NEGATIVE = Number(lo=0)
X_NEEDLE = Object(
    name="XNeedle",
    fields={
        "type": Choice(values=("call", "respond", "refuse")),
        "confidence": or_null(
            Number(lo=0, hi=1),
            "Geometric mean of the produced tokens' probabilities; 0 for an empty answer; null where the engine "
            "reports no token probabilities (said in warnings)",
        ),
        "reasoning": Text(description="The text beside tool calls; empty without calls"),
        "validation": Object(name="Validation", fields={"ungrounded": ListOf(items=Text()), "negation": BOOLEAN}),
        "prefill_tps": or_null(_NOT_NEGATIVE),
        "decode_tps": or_null(_NOT_NEGATIVE),
        "peak_ram_mb": or_null(_NOT_NEGATIVE),
        "replayed_turns": Number(integer=True, lo=1),
        "reinitialized": BOOLEAN,
        "queue_wait_seconds": _NOT_NEGATIVE,
        "compute_seconds": _NOT_NEGATIVE,
        "warnings": ListOf(items=Text()),
    },
    description="What the OpenAI schema has no place for, from the engine's own figures",
)
VALIDATION = X_NEEDLE.fields["validation"]


def x_needle(
    text: str,
    calls: list[Call],
    completion_tokens: int,
    stats: GenerationStats,
    prompt_tokens: int,
    conversation: list[dict],
    warnings: list[str],
) -> dict:
    """The block of an answer: its content `text` and tool `calls`, the engine's figures, the request."""
    content = text.strip()
    kind = "call" if calls else ("respond" if content else "refuse")
    prefill, decode = stats.prefill_s, stats.decode_s
    request_text = " ".join(m.get("content") or "" for m in conversation).lower()
    return X_NEEDLE.build(
        type=kind,
        confidence=_confidence(stats.logprob_sum, completion_tokens),
        reasoning=content if calls else "",
        validation=VALIDATION.build(
            ungrounded=_ungrounded(calls, request_text),
            negation=any(_NEGATION.search(m.get("content") or "") for m in conversation if m.get("role") == "user"),
        ),
        prefill_tps=round(prompt_tokens / prefill, 1) if prefill > 0 else None,
        decode_tps=round((completion_tokens - 1) / decode, 1) if decode > 0 and completion_tokens > 1 else None,
        peak_ram_mb=round(stats.peak_rss_mb, 1),
        replayed_turns=1,
        reinitialized=True,
        queue_wait_seconds=round(stats.queue_wait_s, 4),
        compute_seconds=round(stats.compute_s, 4),
        warnings=warnings
        + (
            []
            if stats.logprob_sum is not None
            else ["confidence is null: this model's engine reports no token probabilities"]
        ),
    )


def _confidence(logprob_sum: float | None, completion_tokens: int) -> float | None:
    """exp(mean log p); None (warnings say why) where the engine reports no probabilities —
    never a made-up certainty."""
    if logprob_sum is None:
        return None
    return round(math.exp(logprob_sum / max(completion_tokens, 1)), 4) if completion_tokens else 0.0


def _ungrounded(calls: list[Call], request_text: str) -> list[str]:
    out = []
    for call in calls:
        try:
            args = json.loads(call.arguments)
        except ValueError:
            continue
        for path, value in _leaves(args, call.name):
            if str(value).lower() not in request_text:
                out.append(path)
    return out


def _leaves(value, path: str):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != "":
        yield path, value


# -- /v1/needle/* request translation ------------------------------------------------------

_FILLED = Text(min_length=1)
# what both routes pass on to the chat request they translate to (which checks them)
COMMON = {
    "model": Anything(description="Any value: a model not served is answered by the first model, with a warning"),
    "max_tokens": openai_params.CHAT_MAX_TOKENS,
    "temperature": openai_params.TEMPERATURE,
    "seed": openai_params.SEED,
}
_PASSED = tuple(k for k in COMMON if k != "model")
EXTRACT = Shape(
    fields={
        "text": _FILLED,
        "name": attrs.evolve(_FILLED, description="What is extracted"),
        "schema": attrs.evolve(SCHEMA, null=False),
        **COMMON,
    },
    required=("text", "name", "schema"),
    description="Other fields are accepted and listed in x_needle.warnings",
)
_TOOLS = ListOf(items=AnyOf(options=(FUNCTION, TOOL)))
COMPLETE = Shape(
    fields={
        "query": Anything(description="The user's message (a non-empty string; read when messages is absent)"),
        "system": Anything(description="A system message before the query (a string; read when messages is absent)"),
        "messages": attrs.evolve(openai_params.MESSAGES, description="Instead of query and system"),
        "tools": AnyOf(options=(_TOOLS, Text(description="The array as JSON text"))),
        **COMMON,
    },
    rules=(
        when(
            {"not": sent("messages")},
            Shape(fields={"query": _FILLED, "system": Text()}, required=("query",)),
            "query, unless messages are sent",
        ),
    ),
    description="Needle's flat tools {name, description, parameters} (or OpenAI's), as an array or as its JSON text. "
    "Other fields are accepted and listed in x_needle.warnings",
)


def _required_str(body: dict, name: str) -> str:
    value = body.get(name)
    if not _FILLED.matches(value):
        raise GreenroomError.wrong(value, f"'{name}' must be a non-empty string", name)
    return value


def extraction_chat(body: dict) -> tuple[ChatRequest, FieldPaths]:
    """/v1/needle/extract → the chat request that extracts: the schema is enforced by
    constrained decoding (response_format json_schema); and where its locations came from (the
    system message and response_format, made of name and schema together, keep chat's names).
    Its model is the route's to choose (any name is answered)."""
    text, name = _required_str(body, "text"), _required_str(body, "name")
    schema = body.get("schema")
    if not isinstance(schema, dict):
        raise GreenroomError.wrong(schema, "'schema' must be a JSON schema object", "schema")
    messages = [
        {
            "role": "system",
            "content": f"Extract the {name} from the user's text as JSON matching this schema: {json.dumps(schema)}",
        },
        {"role": "user", "content": text},
    ]
    # a response-format name allows letters, digits, '_' and '-' only
    fmt = {"type": "json_schema", "json_schema": {"name": re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64], "schema": schema}}
    names = {"response_format.json_schema.name": "name", "response_format.json_schema.schema": "schema"}
    return _request(messages, Output(response_format=fmt), body, FieldPaths(names | paths.message(1, "text")))


def completion_chat(body: dict) -> tuple[ChatRequest, FieldPaths]:
    """/v1/needle/complete → a chat request: `query` (+ `system`) or `messages`; `tools` as
    an array or a JSON string, in Needle's flat {name, description, parameters} shape; and where
    its locations came from."""
    names: dict[str, str] = {}
    if body.get("messages") is not None:
        messages = body["messages"]
    else:
        query = _required_str(body, "query")
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            raise GreenroomError("invalid_parameter", "'system' must be a string", "system")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": query}]
        names = {**(paths.message(0, "system") if system else {}), **paths.message(len(messages) - 1, "query")}
    tools = body.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise GreenroomError("invalid_parameter", "'tools' is a string but not JSON", "tools") from None
    functions = None
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise GreenroomError(
                "invalid_parameter", "'tools' must be an array of {name, description, parameters}", "tools"
            )
        functions = []
        for i, t in enumerate(tools):
            if t.get("type") == "function" and "function" in t:  # OpenAI's: as sent
                functions.append(t)
            else:  # Needle's flat one: the function
                functions.append({"type": "function", "function": t})
                names[f"tools[{i}].function"] = f"tools[{i}]"
    return _request(messages, Output(tools=functions), body, FieldPaths(names))


def _request(messages, output: Output, body: dict, field_paths: FieldPaths) -> tuple[ChatRequest, FieldPaths]:
    """A Needle route's chat request: `messages`, `output`, and the fields passed on as they are."""
    with field_paths.renaming():
        return openai_params.translated(None, messages, output, {k: body.get(k) for k in _PASSED}), field_paths
