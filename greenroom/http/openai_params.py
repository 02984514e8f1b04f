"""Parsing /v1 request bodies into engine requests, with typed refusals.

The field ledger (ledger.py) has already refused what cannot be honoured and noted
what will be ignored; this module validates the values of the fields that are used.
Each check raises GreenroomError naming the offending parameter.
"""

from __future__ import annotations

import json
import uuid

import attrs

from greenroom.engines.base import SamplingParams
from greenroom.errors import GreenroomError
from greenroom.protocol import Embed, Generate

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_CHOICES = 16
MAX_EMBEDDING_INPUTS = 2048
# apply_chat_template's own arguments: a template variable must not override them
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})


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
    if not isinstance(model, str) or not model:
        raise GreenroomError("invalid_parameter", "'model' must be a non-empty string", "model")
    return model


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise GreenroomError("invalid_parameter", f"'{name}' must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def _int(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise GreenroomError("invalid_parameter", f"'{name}' must be an integer", name)
    if not lo <= value <= hi:
        raise GreenroomError("invalid_parameter", f"'{name}' must be between {lo} and {hi}, got {value}", name)
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


def sampling_max_tokens(body: dict, least: int = 0) -> int | None:
    """max_tokens, or max_completion_tokens (OpenAI's newer name for it), at least `least`:
    1 on chat completions (OpenAI's minimum); text completions take 0 (no token generated:
    the prompt's usage alone)."""
    max_tokens = _int(body, "max_tokens", least, 2**31 - 1)
    max_completion = _int(body, "max_completion_tokens", least, 2**31 - 1)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise GreenroomError("invalid_parameter", "'max_tokens' and 'max_completion_tokens' were both sent with "
                             "different values; send one of them", "max_completion_tokens")
    return max_tokens if max_tokens is not None else max_completion


def temperature(body: dict) -> float:
    return _number(body, "temperature", 1.0, 0.0, 2.0)


def sampling(body: dict, least_tokens: int = 0) -> SamplingParams:
    return SamplingParams(
        max_tokens=sampling_max_tokens(body, least_tokens),
        temperature=temperature(body),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=max(_int(body, "top_k", -1, 2**31 - 1) or 0, 0),  # vLLM's extension; -1 and 0 mean off
        stop=_stop(body),
        seed=_int(body, "seed", 0, 2**32 - 1),
        repetition_penalty=repetition_penalty(_number(body, "presence_penalty", 0.0, -2.0, 2.0),
                                              _number(body, "frequency_penalty", 0.0, -2.0, 2.0)),
    )


@attrs.frozen
class Streaming:
    on: bool
    include_usage: bool  # stream_options.include_usage: an extra usage-only chunk


def streaming(body: dict) -> Streaming:
    on = boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise GreenroomError("invalid_parameter", "'stream_options' must be an object", "stream_options")
    include = (options or {}).get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise GreenroomError("invalid_parameter", "'stream_options.include_usage' must be a boolean",
                             "stream_options.include_usage")
    return Streaming(on, on and bool(include))


def choices_n(body: dict, stream: bool) -> int:
    n = _int(body, "n", 1, MAX_CHOICES) or 1
    if n > 1 and stream:
        raise GreenroomError("field_not_honoured", "'n' above 1 cannot be honoured with stream: true; "
                             "send n: 1 or stream: false", "n")
    return n


def messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise GreenroomError("missing_parameter", "'messages' is a required property", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise GreenroomError("invalid_parameter", "'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise GreenroomError("invalid_parameter", f"'{where}' must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise GreenroomError("invalid_parameter", f"'{where}.role' must be one of {', '.join(ROLES)}",
                                 f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: text only
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise GreenroomError("invalid_parameter", f"'{where}.content[{j}]' must be a text part "
                                         "(images and audio are not supported)", f"{where}.content[{j}]")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is not None and not isinstance(content, str):
            raise GreenroomError("invalid_parameter", f"'{where}.content' must be a string, an array of text "
                                 "parts or null", f"{where}.content")
        # null (an assistant turn that only calls tools) renders as "", as llama.cpp does: templates
        # that join or concatenate content would fail on None
        msg = {"role": "system" if role == "developer" else role, "content": "" if content is None else content}
        if m.get("tool_calls") is not None:
            if not isinstance(m["tool_calls"], list):
                raise GreenroomError("invalid_parameter", f"'{where}.tool_calls' must be an array",
                                     f"{where}.tool_calls")
            msg["tool_calls"] = m["tool_calls"]
        out.append(msg)
    return out


def template_kwargs(body: dict) -> dict | None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise GreenroomError("invalid_parameter", "'chat_template_kwargs' must be an object", "chat_template_kwargs")
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise GreenroomError("invalid_parameter", f"'chat_template_kwargs.{key}' is an argument of the "
                                 "template renderer, not a template variable", f"chat_template_kwargs.{key}")
    return kwargs


def _token_lists(value) -> list[list[int]] | None:
    """A token array or an array of token arrays, as lists of ids; None if not one."""
    def ids(v):
        return isinstance(v, list) and bool(v) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in v)

    if ids(value):
        return [value]
    if isinstance(value, list) and value and all(ids(v) for v in value):
        return value
    return None


def new_rid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def conversations(body: dict) -> list[list[dict]]:
    """messages, then each conversation of extra_messages (one row each)."""
    rows = [messages(body)]
    extra = body.get("extra_messages")
    if extra is None:
        return rows
    if not isinstance(extra, list) or not extra:
        raise GreenroomError("invalid_parameter", "'extra_messages' must be a non-empty array of message arrays",
                             "extra_messages")
    if len(extra) + 1 > MAX_CHOICES:
        raise GreenroomError("invalid_parameter", f"at most {MAX_CHOICES} conversations per request",
                             "extra_messages")
    for i, conversation in enumerate(extra):
        try:
            rows.append(messages({"messages": conversation}))
        except GreenroomError as exc:
            where = f"extra_messages[{i}]" + (exc.param or "").removeprefix("messages")
            raise GreenroomError(exc.code, f"extra_messages[{i}]: {exc.message}", where) from None
    return rows


def chat_request(body: dict, model: str, stream: Streaming, tools: list[dict] | None = None,
                 constraint: dict | None = None) -> Generate:
    rows = conversations(body)
    n = choices_n(body, stream.on)
    if len(rows) * n > MAX_CHOICES:
        raise GreenroomError("invalid_parameter", f"n × conversations must be at most {MAX_CHOICES}", "n")
    return Generate(new_rid("chatcmpl"), model, sampling(body, least_tokens=1), conversations=rows, n=n,
                    template_kwargs=template_kwargs(body), tools=tools, constraint=constraint)


def completion_request(body: dict, model: str, stream: Streaming) -> Generate:
    prompt = body.get("prompt")
    if prompt is None:
        raise GreenroomError("missing_parameter", "'prompt' is a required property", "prompt")
    common = dict(rid=new_rid("cmpl"), model=model, params=sampling(body), n=choices_n(body, stream.on),
                  add_special_tokens=boolean(body, "add_special_tokens", True))
    if isinstance(prompt, str):
        return Generate(prompts=[prompt], **common)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > MAX_CHOICES:
            raise GreenroomError("invalid_parameter", f"at most {MAX_CHOICES} prompts per request", "prompt")
        return Generate(prompts=prompt, **common)
    token_ids = _token_lists(prompt)
    if token_ids is not None and len(token_ids) <= MAX_CHOICES:
        return Generate(prompt_token_ids=token_ids, **common)
    raise GreenroomError("invalid_parameter", "'prompt' must be a string, a non-empty array of strings, a token "
                         f"array or an array of token arrays (at most {MAX_CHOICES} prompts)", "prompt")


def embedding_request(body: dict, model: str) -> tuple[Embed, str]:
    value = body.get("input")
    if value is None:
        raise GreenroomError("missing_parameter", "'input' is a required property", "input")
    fmt = body.get("encoding_format")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise GreenroomError("invalid_parameter", "'encoding_format' must be 'float' or 'base64'", "encoding_format")
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
            raise GreenroomError("invalid_parameter", "'input' must be a non-empty string, an array of strings, "
                                 "a token array or an array of token arrays", "input")
        embed = Embed(rid, model, token_ids=token_ids)
    if len(embed.texts or embed.token_ids) > MAX_EMBEDDING_INPUTS:
        raise GreenroomError("invalid_parameter", f"at most {MAX_EMBEDDING_INPUTS} inputs per request", "input")
    return embed, fmt
