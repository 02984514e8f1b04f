"""Parsing /v1 request bodies into engine requests, with typed refusals.

The field ledger (ledger.py) has already refused what cannot be honoured and noted
what will be ignored; this module validates the values of the fields that are used.
Each check raises GreenroomError naming the offending parameter. The fields it validates
are declared here (contracts.py): their bounds and enums are what the checks read, and
what openapi.py documents.
"""

from __future__ import annotations

import itertools
import json

import attrs

from greenroom.engines.base import SAE_ACTIVATIONS_MAX_ENTRIES, SAE_ACTIVATIONS_MAX_TOP_K, Constraint, SamplingParams
from greenroom.errors import GreenroomError
from greenroom.http.core import ledger
from greenroom.http.core.contracts import (
    DATA,
    INT64,
    NULL,
    AnyOf,
    Boolean,
    Choice,
    Field,
    ListOf,
    MapOf,
    Named,
    Number,
    Rule,
    Schema,
    Shape,
    Text,
    needs,
    refused,
    reported,
    sent,
    when,
)
from greenroom.http.core.headers import DRAWN_SEED_HEADER, SEED_HEADER
from greenroom.http.core.request_ids import new_rid
from greenroom.http.pipeline import sae_activations
from greenroom.http.pipeline.request import ChatRequest, Streaming
from greenroom.http.pipeline.structured import Output
from greenroom.protocol import Embed, Generate

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_CHOICES = 16
MAX_EMBEDDING_INPUTS = 2048
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
DEMO_MODEL = "greenroom-demo"  # what `greenroom serve` serves by default: the declarations' example
# apply_chat_template's own arguments: a template variable must not override them
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)

# --- the fields, declared once (contracts.py) ---------------------------------------------

MODEL = Text(min_length=1, examples=(DEMO_MODEL,))
TEMPERATURE = Number(
    lo=0.0,
    hi=2.0,
    default=1.0,
    description="0–2; 0 is greedy (so is anything below 1e-5, which float32 cannot divide by)",
)
TOP_P = Number(
    lo=0.0, hi=1.0, default=1.0, description="0–1; the most probable token is always kept, so `top_p: 0` is greedy"
)
TOP_K = Number(
    lo=-1,
    hi=INT32_MAX,
    integer=True,
    description="vLLM's extension: sample among the k most probable tokens; 0 or −1 is off",
)
SEED = Number(
    lo=0,
    hi=UINT32_MAX,
    integer=True,
    description="0 to 2³²−1 (anything else, `true` included, → 400). Same seed + body + model → byte-identical text "
    f'and finish_reason. Echoed as `{SEED_HEADER}: 7;scope="request"`; absent when no seed was sent. Choice *j* > 0 '
    "of an `n` request gets its own seed derived from it; each prompt of a list is seeded with the seed itself. "
    "Beyond the spec: a request sent without one runs with a seed drawn for it, named in "
    f'`{DRAWN_SEED_HEADER}: 2920794996;scope="request"` — sent back as `seed`, it reproduces the answer (not drawn '
    "in the transformers continuous batch, whose rows share one generator: [Seeds](ollama.md#seeds))",
    rule=needs("seed"),
)
PENALTY = Number(
    lo=-2.0,
    hi=2.0,
    default=0.0,
    description="−2 to 2, mapped to one repetition penalty `max(0.1, 1 + (presence + frequency) / 2)` applied to every "
    "token already in the prompt or the answer (HF's rule) — not OpenAI's count-based penalties",
    rule=needs("penalties", 0, 0.0),
)


def max_tokens(least: int, description: str) -> Number:
    return Number(
        lo=least,
        hi=INT32_MAX,
        integer=True,
        description=f"{description}. max_tokens and max_completion_tokens are the same thing; both sent with "
        "different values → 400 naming both. Validated against the context window before anything runs: 400 "
        "`context_length_exceeded` giving the limit and what was asked (also before a stream starts). Absent → the "
        "server default (512), bounded by the window",
    )


# chat completions take at least 1 token (OpenAI's minimum); text completions 0 (the prompt's usage alone)
CHAT_MAX_TOKENS = max_tokens(1, "At least 1 (OpenAI's minimum); a constrained answer may take the whole window")
COMPLETION_MAX_TOKENS = max_tokens(
    0, 'At least 0: 0 generates nothing (`finish_reason: "length"` and the prompt\'s `usage`, a token count)'
)
N = Number(lo=1, hi=MAX_CHOICES, integer=True, default=1)
TOKEN_IDS = ListOf(items=Number(lo=0, hi=INT32_MAX, integer=True), min_items=1)
TEXT_PART = Named(
    name="TextPart",
    field=Shape(fields={"type": Choice(values=("text",)), "text": Text()}, required=("type", "text"), ledger=True),
)
TOOL_CALL = Named(
    name="MessageToolCall",
    field=Shape(
        fields={
            "function": Shape(
                fields={
                    "name": Text(),
                    "arguments": AnyOf(
                        options=(Text(), MapOf(values=DATA)),
                        null=False,
                        default={},
                        description="JSON text (OpenAI) or an object (Ollama)",
                    ),
                },
                required=("name",),
                extra=DATA,
            )
        },
        required=("function",),
        extra=DATA,
        description="Its other fields (id, type) go to the chat template as they come",
    ),
)
MESSAGE = Named(
    name="ChatMessage",
    field=Shape(
        fields={
            "role": Choice(values=ROLES),
            "content": AnyOf(options=(Text(), ListOf(items=TEXT_PART))),
            "name": reported(),
            "tool_calls": ListOf(
                items=TOOL_CALL, description="An assistant's earlier calls, rendered by the chat template"
            ),
            "tool_call_id": Text(
                description="A tool message's: the id of the earlier call it answers (refused if no earlier call has "
                "it); results are rendered in their calls' order, and the id is handed to the chat template",
                rule=Rule(when=("role", "tool")),
            ),
        },
        required=("role",),
        description="A trailing assistant message is continued, not answered.",
        ledger=True,
    ),
)


def conversation(message: Field, min_items: int = 1) -> Schema:
    """A list of messages the chat template renders; a trailing assistant message is continued,
    one alone too (a bare prefix, rendered as the template renders it: tests/live/test_continue.py)."""
    return Schema(schema={"type": "array", "items": message, "minItems": min_items})


MESSAGES = conversation(MESSAGE)
# return_sae_activations, as sae_activations.py checks it (its names and limits read from there)
SAE_ACTIVATIONS = Named(
    name="SAEActivationsRequest",
    field=Shape(
        fields={
            "sae_id": Text(description="An attached SAE; may be left out while exactly one is attached"),
            "features": ListOf(
                items=Number(lo=0, hi=INT64[1], integer=True),
                min_items=1,
                description="Restricts the candidates (then zero values are listed too); each inside the SAE's width",
            ),
            "top_k": Number(
                lo=1,
                hi=SAE_ACTIVATIONS_MAX_TOP_K,
                integer=True,
                default=sae_activations.DEFAULT_TOP_K,
                description="The largest activations per position",
            ),
            "positions": AnyOf(
                options=(
                    Choice(values=sae_activations.POSITIONS),
                    Shape(
                        fields={
                            "start": Number(lo=0, hi=INT64[1], integer=True),
                            "end": Number(lo=1, hi=INT64[1], integer=True),
                        },
                        required=("start", "end"),
                        closed=True,
                    ),
                ),
                default=sae_activations.DEFAULT_POSITIONS,
                description="Absolute over prompt-then-generated tokens ({start, end} half-open, start < end)",
            ),
            "read_point": Choice(
                values=sae_activations.READ_POINTS, default=sae_activations.READ_POINTS[0], null=False
            ),
        },
        closed=True,
        description=(
            "miLLM extension, served on transformers and GGUF models (refused on OpenVINO models before any load; see "
            "[Per-request SAE activations](steering.md#per-request-sae-activations)): this request's activations of "
            "an attached SAE, returned under millm. Refused with 400 with n > 1, extra_messages or several prompts, and "
            f"when positions × top_k could exceed {SAE_ACTIVATIONS_MAX_ENTRIES} (max_tokens counted in full for "
            "completion and all). Served on the serial path. On a scoring request it reads the unsteered scoring pass "
            "(read_point reported as unsteered)."
        ),
    ),
    rule=needs("sae_activations"),
)
assert SAE_ACTIVATIONS.field.names == frozenset(sae_activations.KEYS)


NOT_YET = "not yet implemented"


def _sampling(tokens: Number) -> dict:
    return {
        "model": attrs.evolve(MODEL, description="Must name a configured model (404 `model_not_found`)"),
        "stream": Boolean(
            default=False,
            description="`true`: the answer as server-sent events, one chunk per step and `data: [DONE]` last; a "
            "failure after the first chunk is an `error` event carrying the error envelope",
        ),
        "stream_options": Shape(
            fields={
                "include_usage": Boolean(
                    description="Without it the request's last finishing chunk carries `usage` (the spec's rule); "
                    "with `include_usage: true`, OpenAI's: every chunk carries `usage: null` but the extra usage-only "
                    "chunk (`choices: []`) at the end, so a client that adds chunks up (LangChain's "
                    "`stream_usage=True`, pydantic-ai) counts the usage once"
                )
            },
            description="Read with stream: true only (else reported whole)",
            ledger=True,
        ),
        "temperature": TEMPERATURE,
        "top_p": TOP_P,
        "top_k": TOP_K,
        "max_tokens": tokens,
        "max_completion_tokens": attrs.evolve(
            tokens, description="max_tokens by its newer name (sent with max_tokens, the same value)"
        ),
        "seed": SEED,
        "stop": AnyOf(
            options=(Text(), ListOf(items=Text())),
            description="A string or a list; matched on the text, also across token boundaries, streamed or not; the "
            "string that ended a choice is its `stop_reason` (vLLM's field: null when none did), on the finishing "
            "chunk when streamed",
        ),
        "frequency_penalty": PENALTY,
        "presence_penalty": PENALTY,
        # OpenAI's and vLLM's, no parser reads them
        "user": reported(),
        "steering": refused(why=NOT_YET),
        "dimensions": refused(why="only /v1/embeddings could use it"),
        "logit_bias": refused({}, why=NOT_YET),
    }


def _n_rules() -> tuple[dict, ...]:
    """n × conversations ≤ MAX_CHOICES, as JSON Schema: the fewest extra_messages each n allows."""
    caps = {k: MAX_CHOICES // k - 1 for k in range(2, MAX_CHOICES + 1)}
    firsts = {cap: min(k for k, c in caps.items() if c == cap) for cap in set(caps.values())}
    return tuple(
        when(
            {"properties": {"n": {"type": "integer", "minimum": k}}, "required": ["n"]},
            {"properties": {"extra_messages": NULL if cap == 0 else {"maxItems": cap}}},
            f"n × conversations ≤ {MAX_CHOICES}",
        )
        for cap, k in sorted(firsts.items())
    )


_STREAMED = {"properties": {"stream": {"const": True}}, "required": ["stream"]}

CHAT = Shape(
    fields={
        **_sampling(CHAT_MAX_TOKENS),
        "messages": attrs.evolve(
            MESSAGES,
            description="Roles system, developer (treated as system), user, assistant, tool, function; content a "
            "string, text parts (an `image_url`, `input_audio` or `file` part: 400 `field_not_honoured`, greenroom "
            'serves text-only models), or null (rendered as `""`, as llama.cpp does: an assistant turn that only '
            "called tools breaks no template that joins content). A **trailing assistant message is continued**, not "
            "answered: the conversation before it is rendered with the generation prompt and the partial answer "
            "appended raw; a lone one (a bare prefix, or what Open WebUI's Continue sends once `num_ctx` truncation "
            "dropped the question) is rendered as the template renders that message — SmolLM2's default system "
            "message first — and continued where its content starts, as vLLM's `continue_final_message` does, on "
            "every engine and surface. A model with no chat template answers 400 `no_chat_template` (give it one with "
            "`chat_template` in its `[[models]]` entry, or use `/v1/completions`). " + MESSAGES.description,
        ),
        "n": attrs.evolve(
            N,
            description=f"1–{MAX_CHOICES} choices per conversation (n × conversations ≤ {MAX_CHOICES}); refused with "
            "`stream: true` (400 `field_not_honoured`)",
            rule=needs("n", 1),
        ),
        "chat_template_kwargs": MapOf(
            values=DATA,
            keys=Schema(schema={"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}}),
            description="Variables for the chat template; its renderer's own arguments are refused",
            rule=Rule(needs="chat_template_kwargs", report=True),  # GGUF: reported, never refused
        ),
        "extra_messages": ListOf(
            items=MESSAGES,
            min_items=1,
            max_items=MAX_CHOICES - 1,
            description="More conversations answered in the same request: their choices follow those of messages, in "
            "order; scored or generated, constrained per row; a seed's scope is then `batch-shape`",
        ),
        "return_sae_activations": SAE_ACTIVATIONS,
        # vLLM's chat echo prepends the last message: not served
        "echo": refused(
            False,
            why="echo is served on text completions (/v1/completions), where it returns the prompt's log-probabilities",
        ),
    },
    required=("model", "messages"),
    rules=(
        when(_STREAMED, {"properties": {"n": {"enum": [1, None]}}}, "n above 1 cannot be streamed"),
        *_n_rules(),
        when(
            sent("return_sae_activations"),
            {"properties": {"extra_messages": NULL, "n": {"enum": [1, None]}}},
            "return_sae_activations reads one sequence: one conversation, n: 1",
        ),
    ),
)

COMPLETION = Shape(
    fields={
        **_sampling(COMPLETION_MAX_TOKENS),
        "prompt": AnyOf(
            options=(
                Text(),
                ListOf(items=Text(), min_items=1, max_items=MAX_CHOICES),
                TOKEN_IDS,
                ListOf(items=TOKEN_IDS, min_items=1, max_items=MAX_CHOICES),
            ),
            description="A string, a list of strings (one choice each, in order), a token array or a list of token "
            "arrays; no chat template",
        ),
        "add_special_tokens": Boolean(
            default=True,
            description="`false`: the prompt is tokenised exactly as written (no BOS), in scoring mode too",
        ),
        "return_sae_activations": SAE_ACTIVATIONS,
        "n": refused(1, why="send a list of prompts for several choices"),
        "top_logprobs": refused(why="use logprobs"),
        **dict.fromkeys(
            ("profile", "steering_intensity"), refused(why="per-request steering is served on chat completions")
        ),
        "best_of": refused(1, why=NOT_YET),
        "suffix": refused(why=NOT_YET),
        "response_format": refused({"type": "text"}, why="structured output is served on chat completions"),
        "tools": refused([], why="tools are served on chat completions"),
        "tool_choice": refused(why="tools are served on chat completions"),
    },
    required=("model", "prompt"),
    rules=(
        when(
            sent("return_sae_activations"),
            {
                "properties": {
                    "prompt": {"not": {"type": "array", "minItems": 2, "items": {"type": ["string", "array"]}}}
                }
            },
            "return_sae_activations reads one sequence: one prompt",
        ),
    ),
)

_NOT_EMBEDDINGS = "embeddings have no such setting"
EMBEDDING = Shape(
    fields={
        "model": MODEL,
        "input": AnyOf(
            options=(
                Text(min_length=1),
                ListOf(items=Text(min_length=1), min_items=1),
                TOKEN_IDS,
                ListOf(items=TOKEN_IDS, min_items=1),
            ),
            description=f"At most {MAX_EMBEDDING_INPUTS:,} inputs, each within the context window",
        ),
        "encoding_format": Choice(values=("float", "base64"), default="float"),
        "user": reported(),
        "dimensions": Number(
            lo=1,
            integer=True,
            description="The first this many of each vector, at unit length again; the model's width: the whole "
            "vector; more: 400",
        ),
        "n": refused(1, why=_NOT_EMBEDDINGS),
        **{
            f: refused(*noop, why=_NOT_EMBEDDINGS)
            for f, noop in (
                ("logprobs", (False,)),
                ("allowed_token_ids", ()),
                ("top_logprobs", ()),
                ("response_format", ({"type": "text"},)),
                ("seed", ()),
                ("profile", ()),
                ("steering_intensity", ()),
                ("steering", ()),
                ("tools", ([],)),
                ("tool_choice", ()),
                ("logit_bias", ({},)),
                ("max_completion_tokens", ()),
            )
        },
    },
    required=("model", "input"),
    ledger=True,
)


def parse_json(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GreenroomError("invalid_json", f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GreenroomError("invalid_json", "The request body must be a JSON object")
    return data


def model_name(body: dict) -> str:
    model = body.get("model")
    if model is None:
        raise GreenroomError("missing_parameter", "you must provide a model parameter", "model")
    if not MODEL.matches(model):
        raise GreenroomError("invalid_parameter", "'model' must be a non-empty string", "model")
    return model


def _number(body: dict, name: str, field: Number) -> float:
    value = body.get(name)
    if value is None:
        return field.default
    if not field.typed(value):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a number", name)
    if not field.within(value):
        raise GreenroomError(
            "invalid_parameter", f"'{name}' must be between {field.lo:g} and {field.hi:g}, got {value}", name
        )
    return float(value)


def integer(body: dict, name: str, field: Number) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not field.typed(value):
        raise GreenroomError("invalid_parameter", f"'{name}' must be an integer", name)
    if not field.within(value):
        raise GreenroomError(
            "invalid_parameter", f"'{name}' must be between {field.lo} and {field.hi}, got {value}", name
        )
    return value


def boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a boolean", name)
    return value


def string(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a string", name)
    return value


def mapping(body: dict, name: str) -> dict | None:
    """An object field (None when left out or null)."""
    value = body.get(name)
    if value is not None and not isinstance(value, dict):
        raise GreenroomError("invalid_parameter", f"'{name}' must be an object", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise GreenroomError("invalid_parameter", "'stop' must be a string or a list of strings", "stop")


def repetition_penalty(presence: float, frequency: float) -> float:
    """OpenAI's penalties → one repetition penalty, the mapping greenroom's Ollama surface
    uses too: 1 + (presence + frequency) / 2, floored at 0.1 (a penalty must be > 0)."""
    return max(0.1, 1.0 + (presence + frequency) / 2)


def sampling_max_tokens(body: dict, tokens: Number = COMPLETION_MAX_TOKENS) -> int | None:
    """max_tokens, or max_completion_tokens (OpenAI's newer name for it), within `tokens`
    (CHAT_MAX_TOKENS or COMPLETION_MAX_TOKENS)."""
    max_tokens = integer(body, "max_tokens", tokens)
    max_completion = integer(body, "max_completion_tokens", tokens)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise GreenroomError(
            "invalid_parameter",
            "'max_tokens' and 'max_completion_tokens' were both sent with different values; send one of them",
            "max_completion_tokens",
        )
    return max_tokens if max_tokens is not None else max_completion


def temperature(body: dict) -> float:
    return _number(body, "temperature", TEMPERATURE)


def sampling(body: dict, tokens: Number = COMPLETION_MAX_TOKENS) -> SamplingParams:
    return SamplingParams(
        max_tokens=sampling_max_tokens(body, tokens),
        temperature=temperature(body),
        top_p=_number(body, "top_p", TOP_P),
        top_k=max(integer(body, "top_k", TOP_K) or 0, 0),  # vLLM's extension; -1 and 0 mean off
        stop=_stop(body),
        seed=integer(body, "seed", SEED),
        repetition_penalty=repetition_penalty(
            _number(body, "presence_penalty", PENALTY), _number(body, "frequency_penalty", PENALTY)
        ),
    )


def streaming(body: dict) -> Streaming:
    on = boolean(body, "stream", False)
    include = (mapping(body, "stream_options") or {}).get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise GreenroomError(
            "invalid_parameter", "'stream_options.include_usage' must be a boolean", "stream_options.include_usage"
        )
    return Streaming(on, on and bool(include))


def choices_n(body: dict, stream: bool) -> int:
    n = integer(body, "n", N) or N.default
    if n > 1 and stream:
        raise GreenroomError(
            "field_not_honoured", "'n' above 1 cannot be honoured with stream: true; send n: 1 or stream: false", "n"
        )
    return n


def messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise GreenroomError("missing_parameter", "'messages' is a required property", "messages")
    return turns(msgs)


def turns(msgs) -> list[dict]:
    """A conversation (MESSAGES) as the chat template renders it, checked — its locations
    `messages[i]…`: what a translated surface's FieldPaths name."""
    if not isinstance(msgs, list) or not msgs:
        raise GreenroomError("invalid_parameter", "'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise GreenroomError("invalid_parameter", f"'{where}' must be an object", where)
        role = m.get("role")
        if role not in ROLES:  # MESSAGE's role
            raise GreenroomError(
                "invalid_parameter", f"'{where}.role' must be one of {', '.join(ROLES)}", f"{where}.role"
            )
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: text only
            parts = []
            for j, part in enumerate(content):
                if isinstance(part, dict) and ledger.is_media(part.get("type")):
                    raise ledger.media_refused(f"{where}.content[{j}]")
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise GreenroomError(
                        "invalid_parameter", f"'{where}.content[{j}]' must be a text part", f"{where}.content[{j}]"
                    )
                parts.append(part["text"])
            content = "".join(parts)
        elif content is not None and not isinstance(content, str):
            raise GreenroomError(
                "invalid_parameter",
                f"'{where}.content' must be a string, an array of text parts or null",
                f"{where}.content",
            )
        # null (an assistant turn that only calls tools) renders as "", as llama.cpp does: templates
        # that join or concatenate content would fail on None
        msg = {"role": "system" if role == "developer" else role, "content": "" if content is None else content}
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = tool_calls(m["tool_calls"], f"{where}.tool_calls")
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = answered(m["tool_call_id"], out, f"{where}.tool_call_id")
        out.append(msg)
    return in_call_order(out)


def answered(call_id, earlier: list[dict], where: str) -> str:
    """A tool result's id of the call it answers (chat's tool_call_id, Anthropic's tool_use_id,
    Responses' call_id): one of the calls in the `earlier` messages, else a 400 naming `where`."""
    if not isinstance(call_id, str):
        raise GreenroomError("invalid_parameter", f"'{where}' must be a string", where)
    if not any(c.get("id") == call_id for m in earlier for c in m.get("tool_calls") or ()):
        raise GreenroomError(
            "invalid_parameter", f"'{where}' is {call_id[:80]!r}, which no earlier call in the conversation has", where
        )
    return call_id


def in_call_order(messages: list[dict]) -> list[dict]:
    """Each run of tool results in the order of the calls they answer (the last assistant turn
    with calls before it): a template that renders results one after another, without ids,
    then pairs each with its call. Results without an id keep their place after those with."""
    out: list[dict] = []
    order: dict = {}
    for results, run in itertools.groupby(messages, lambda m: m["role"] == "tool"):
        run = list(run)
        if results:
            run.sort(key=lambda r: order.get(r.get("tool_call_id"), len(order)))
        for m in run:
            if m["role"] == "assistant" and m.get("tool_calls"):
                order = {c.get("id"): k for k, c in enumerate(m["tool_calls"])}
        out += run
    return out


def text_of(content, where: str, kinds: tuple[str, ...], read: frozenset[str], unread: list[str]) -> str:
    """`content` as one text: a string, or text parts (their `type` one of `kinds`) joined —
    images, files and audio refused (ledger.media_refused); a part's keys outside `read` added
    to `unread`. The Responses and Messages translations' content."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise GreenroomError("invalid_parameter", f"'{where}' must be a string or an array of text parts", where)
    out = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if isinstance(part, dict) and ledger.is_media(part.get("type")):
            raise ledger.media_refused(at)
        if not (isinstance(part, dict) and part.get("type") in kinds):
            raise GreenroomError("invalid_parameter", f"'{at}' must be a {' or '.join(kinds)} part", at)
        if not isinstance(part.get("text"), str):
            raise GreenroomError("invalid_parameter", f"'{at}.text' must be a string", f"{at}.text")
        out.append(part["text"])
        unread += [f"{at}.{k}" for k in part if k not in read]
    return "".join(out)


def tool_calls(calls, where: str) -> list[dict]:
    """An assistant's earlier calls (TOOL_CALL), their arguments {} when left out: every chat
    template reads each call's function name and arguments."""
    if not isinstance(calls, list):
        raise GreenroomError("invalid_parameter", f"'{where}' must be an array", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments", {}), (dict, str))
        ):
            raise GreenroomError(
                "invalid_parameter",
                f'\'{where}[{j}]\' must be {{"function": {{"name": ..., "arguments": {{...}}}}}}',
                f"{where}[{j}]",
            )
        out.append({**call, "function": {**fn, "arguments": fn.get("arguments", {})}})
    return out


def template_kwargs(body: dict) -> dict | None:
    kwargs = mapping(body, "chat_template_kwargs")
    for key in kwargs or ():
        if key in RESERVED_TEMPLATE_KWARGS:
            raise GreenroomError(
                "invalid_parameter",
                f"'chat_template_kwargs.{key}' is an argument of the template renderer, not a template variable",
                f"chat_template_kwargs.{key}",
            )
    return kwargs


def _token_lists(value) -> list[list[int]] | None:
    """A token array or an array of token arrays, as lists of ids; None if not one."""

    def ids(v):
        return (
            isinstance(v, list)
            and bool(v)
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in v)
        )

    if ids(value):
        return [value]
    if isinstance(value, list) and value and all(ids(v) for v in value):
        return value
    return None


def conversations(body: dict) -> list[list[dict]]:
    """messages, then each conversation of extra_messages (one row each)."""
    rows = [messages(body)]
    extra = body.get("extra_messages")
    if extra is None:
        return rows
    if not isinstance(extra, list) or not extra:
        raise GreenroomError(
            "invalid_parameter", "'extra_messages' must be a non-empty array of message arrays", "extra_messages"
        )
    if len(extra) + 1 > MAX_CHOICES:
        raise GreenroomError("invalid_parameter", f"at most {MAX_CHOICES} conversations per request", "extra_messages")
    for i, conversation in enumerate(extra):
        try:
            rows.append(messages({"messages": conversation}))
        except GreenroomError as exc:
            where = f"extra_messages[{i}]" + (exc.param or "").removeprefix("messages")
            raise GreenroomError(exc.code, f"extra_messages[{i}]: {exc.message}", where) from None
    return rows


def millm(fields: dict) -> dict:
    """miLLM's per-request fields but the seed (a sampling parameter), as sent: ChatRequest's
    arguments (every chat surface takes them at its top level: generation.MILLM)."""
    return {
        "sae_activations": fields.get("return_sae_activations"),
        "profile": fields.get("profile"),
        "steering_intensity": fields.get("steering_intensity"),
    }


def translated(model: str | None, conversation: list[dict], output: Output, fields: dict) -> ChatRequest:
    """A translated surface's ChatRequest: its `conversation` made of its messages (checked as
    chat's: `messages[i]…`), its `output` (tools and format), and `fields`: the top-level fields
    it shares with chat by meaning (sampling, stream, miLLM's), under chat's names — read by the
    same readers. The caller renames a refusal into its own fields (its FieldPaths)."""
    return ChatRequest(
        model,
        [turns(conversation)],
        sampling(fields, CHAT_MAX_TOKENS),
        streaming(fields),
        output=output,
        **millm(fields),
    )


def choices(rows: list[list[dict]], n: int) -> int:
    """n, checked against the conversations it multiplies."""
    if len(rows) * n > MAX_CHOICES:
        raise GreenroomError("invalid_parameter", f"n × conversations must be at most {MAX_CHOICES}", "n")
    return n


def chat_request(
    request: ChatRequest, model: str, tools: list[dict] | None = None, constraint: Constraint | None = None
) -> Generate:
    """The engine request of a chat request, served by `model`, with its plan's tools and constraint."""
    return Generate(
        new_rid("chatcmpl"),
        model,
        request.params,
        conversations=request.conversations,
        n=request.n,
        template_kwargs=request.template_kwargs,
        tools=tools,
        constraint=constraint,
    )


def completion_request(body: dict, model: str, stream: Streaming) -> Generate:
    prompt = body.get("prompt")
    if prompt is None:
        raise GreenroomError("missing_parameter", "'prompt' is a required property", "prompt")
    common = dict(
        rid=new_rid("cmpl"),
        model=model,
        params=sampling(body),
        n=choices_n(body, stream.on),
        add_special_tokens=boolean(body, "add_special_tokens", True),
    )
    if isinstance(prompt, str):
        return Generate(prompts=[prompt], **common)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > MAX_CHOICES:
            raise GreenroomError("invalid_parameter", f"at most {MAX_CHOICES} prompts per request", "prompt")
        return Generate(prompts=prompt, **common)
    token_ids = _token_lists(prompt)
    if token_ids is not None and len(token_ids) <= MAX_CHOICES:
        return Generate(prompt_token_ids=token_ids, **common)
    raise GreenroomError(
        "invalid_parameter",
        "'prompt' must be a string, a non-empty array of strings, a token "
        f"array or an array of token arrays (at most {MAX_CHOICES} prompts)",
        "prompt",
    )


def embedding_request(body: dict, model: str) -> tuple[Embed, str, int | None]:
    """The Embed a /v1/embeddings body asks for, its encoding_format and its dimensions (None: whole)."""
    value = body.get("input")
    if value is None:
        raise GreenroomError("missing_parameter", "'input' is a required property", "input")
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = EMBEDDING.fields["encoding_format"].default
    if fmt not in EMBEDDING.fields["encoding_format"].values:
        raise GreenroomError("invalid_parameter", "'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and not EMBEDDING.fields["dimensions"].holds(dimensions):
        raise GreenroomError("invalid_parameter", "'dimensions' must be an integer of at least 1", "dimensions")
    rid = new_rid("embd")
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if any(not v for v in value):
            raise GreenroomError("invalid_parameter", "'input' must not contain empty strings", "input")
        embed = Embed(rid, model, texts=value)
    else:
        token_ids = _token_lists(value)
        if token_ids is None:
            raise GreenroomError(
                "invalid_parameter",
                "'input' must be a non-empty string, an array of strings, a token array or an array of token arrays",
                "input",
            )
        embed = Embed(rid, model, token_ids=token_ids)
    if len(embed.texts or embed.token_ids) > MAX_EMBEDDING_INPUTS:
        raise GreenroomError("invalid_parameter", f"at most {MAX_EMBEDDING_INPUTS} inputs per request", "input")
    return embed, fmt, dimensions
