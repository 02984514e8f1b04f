"""The field ledger: every request field is honoured, reported or refused — one
mechanism, driven by the engine's declared capabilities (engines/capabilities.py).

Each endpoint has a table of the fields it knows. A field is
- USE: read and honoured;
- REPORT: accepted but not read; named in X-miLLM-Ignored-Fields (unknown fields too) — one
  with listed no-op values (`reported`) only when its value asks for something (not null, not
  a no-op: the `ollama` CLI sends an empty `system` and `template` on every /api/show);
- refused with 400 field_not_honoured, unless its value means "no change" (an explicit
  null, or the field's listed no-op value) or the engine has the capability that
  honours it.
Nested objects the request path reads (messages, content parts, response_format,
stream_options) are walked, so an unread key is reported with its location, e.g.
"messages[2].name" or "response_format.schema". The surfaces
translated onto chat completions (Responses, Anthropic's Messages) have their top-level fields
here; their translations (responses_api.py, messages_api.py) report the nested keys they do not
read, and the chat body they make goes through `constrained_choice`.
"""

from __future__ import annotations

import json
import logging

from greenroom import structured_fields as sf
from greenroom.engines.capabilities import Capabilities
from greenroom.errors import GreenroomError
from greenroom.http import structured
from greenroom.http.contracts import Rule, needs

log = logging.getLogger("greenroom.http")

IGNORED_FIELDS_HEADER_MAX_BYTES = 1024


USE = Rule()
REPORTED = Rule(report=True)


def reported(*noop) -> Rule:
    """Accepted, never read; reported unless null or one of `noop`."""
    return Rule(report=True, noop=noop)


def refused(*noop, why: str) -> Rule:
    return Rule(refuse=True, noop=noop, why=why)


# Images, audio and files, on every surface (chat's content parts, the Responses API's, Anthropic's
# blocks, Ollama's `images`): one code and one reason. The spec's field_not_honoured is "an
# output-changing field this endpoint or engine cannot honour" — not a malformed request.
TEXT_ONLY = "greenroom serves text-only models"
MEDIA_PARTS = frozenset({"image_url", "input_audio", "file", "input_image", "input_file", "image", "document"})


def media_refused(where: str) -> GreenroomError:
    """The refusal of an image, audio or file at `where` (the content part's location)."""
    return GreenroomError("field_not_honoured", f"'{where}' cannot be honoured: {TEXT_ONLY}", where)


_NOT_YET = "not yet implemented"

_COMMON = {
    "model": USE,
    "stream": USE,
    "stream_options": USE,
    "temperature": USE,
    "top_p": USE,
    "top_k": USE,
    "max_tokens": USE,
    "max_completion_tokens": USE,
    "stop": USE,
    "user": REPORTED,
    "seed": needs("seed"),
    "frequency_penalty": needs("penalties", 0, 0.0),
    "presence_penalty": needs("penalties", 0, 0.0),
    "response_format": needs("response_format", {"type": "text"}),
    "steering": refused(why=_NOT_YET),
    "dimensions": refused(why="only /v1/embeddings could use it"),
    "logit_bias": refused({}, why=_NOT_YET),
    "tools": needs("tools", []),
    "tool_choice": needs("tools"),
}

CHAT = {
    **_COMMON,
    "messages": USE,
    "n": needs("n", 1),
    "chat_template_kwargs": Rule(needs="chat_template_kwargs", report=True),  # GGUF: reported, never refused
    # a generation's tokens, or scoring's (an engine that scores reports tokens: capabilities.py)
    "logprobs": needs("token_logprobs", False),
    "top_logprobs": needs("token_logprobs"),
    "allowed_token_ids": needs("scoring"),
    "return_tokens_as_token_ids": needs("token_logprobs", False),
    "extra_messages": USE,
    "echo": refused(
        False,
        why="echo is served on text completions (/v1/completions), where it returns the prompt's log-probabilities",
    ),  # vLLM's chat echo prepends the last message: not served
    "profile": needs("profile"),
    "steering_intensity": needs("steering"),
    "return_sae_activations": needs("sae_activations"),
    "functions": needs("tools", []),
    "function_call": needs("tools"),
    "parallel_tool_calls": needs("tools"),
}

COMPLETIONS = {
    **_COMMON,
    "prompt": USE,
    "add_special_tokens": USE,
    "n": refused(1, why="send a list of prompts for several choices"),
    "logprobs": needs("token_logprobs", False),
    "allowed_token_ids": needs("scoring"),
    "return_tokens_as_token_ids": needs("token_logprobs", False),
    "top_logprobs": refused(why="use logprobs"),
    "profile": refused(why="per-request steering is served on chat completions"),
    "steering_intensity": refused(why="per-request steering is served on chat completions"),
    "return_sae_activations": needs("sae_activations"),
    "echo": needs("scoring", False),  # prompt scoring (http/scoring.py): the prompt's log-probabilities
    "best_of": refused(1, why=_NOT_YET),
    "suffix": refused(why=_NOT_YET),
    "response_format": refused({"type": "text"}, why="structured output is served on chat completions"),
    "tools": refused([], why="tools are served on chat completions"),
    "tool_choice": refused(why="tools are served on chat completions"),
}

_NOT_EMBEDDINGS = "embeddings have no such setting"
EMBEDDINGS = {
    "model": USE,
    "input": USE,
    "encoding_format": USE,
    "user": REPORTED,
    "dimensions": refused(why=_NOT_YET),
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
}

# miLLM's extensions, with the rules chat completions has (SDKs send them with extra_body)
_MILLM = {key: CHAT[key] for key in ("seed", "profile", "steering_intensity", "return_sae_activations")}
_NO_SERVER_TOOLS = "greenroom runs no tools of its own: send function tools"

RESPONSES = {
    "model": USE,
    "input": USE,
    "instructions": USE,
    "max_output_tokens": USE,
    "temperature": USE,
    "top_p": USE,
    "stream": USE,
    "store": USE,
    "previous_response_id": USE,
    "metadata": USE,  # stored and echoed
    "text": needs("response_format", {}, {"format": {"type": "text"}}),
    "tools": needs("tools", []),
    "tool_choice": needs("tools"),
    "parallel_tool_calls": needs("tools"),
    **_MILLM,
    "user": REPORTED,
    "safety_identifier": REPORTED,
    "prompt_cache_key": REPORTED,
    "prompt_cache_retention": REPORTED,
    "service_tier": REPORTED,
    "stream_options": REPORTED,  # include_obfuscation: no obfuscation is sent
    "reasoning": refused({}, why="this model does not reason"),
    "background": refused(False, why="a response is answered within its request: there is no background queue"),
    "truncation": refused(
        "disabled", why="a prompt past the context window is refused (context_length_exceeded), never cut"
    ),
    "include": refused([], why="no reasoning, search results or log-probabilities are produced to include"),
    "top_logprobs": refused(0, why=_NOT_YET),
    "max_tool_calls": refused(why=_NOT_YET),
    "conversation": refused(why="continue a stored response with previous_response_id"),
    "prompt": refused(why="stored prompt templates are not served"),
    "context_management": refused(why=_NOT_YET),
}

_MESSAGES_COMMON = {
    "model": USE,
    "messages": USE,
    "system": USE,
    "tools": needs("tools", []),
    "tool_choice": needs("tools"),
    "output_config": needs("response_format", {}),
    "thinking": refused({"type": "disabled"}, why="this model does not think"),
    "mcp_servers": refused([], why=_NO_SERVER_TOOLS),
    "container": refused(why=_NO_SERVER_TOOLS),
    "context_management": refused(why=_NOT_YET),
}
MESSAGES = {
    **_MESSAGES_COMMON,
    "max_tokens": USE,
    "stop_sequences": USE,
    "temperature": USE,
    "top_p": USE,
    "top_k": USE,
    "stream": USE,
    **_MILLM,
    "metadata": REPORTED,  # user_id
    "service_tier": REPORTED,
}
COUNT_TOKENS = _MESSAGES_COMMON

TOKENIZE = {
    "model": USE,
    "prompt": USE,
    "add_special_tokens": USE,
    "messages": USE,
    "tools": USE,
    "chat_template_kwargs": CHAT["chat_template_kwargs"],
    "add_generation_prompt": USE,
    "chat_template": refused(why="the model's own chat template (or its config's chat_template) renders"),
    "return_token_strs": USE,
}
DETOKENIZE = {"model": USE, "tokens": USE}

_MESSAGE_KEYS = {"role", "content", "tool_calls"}
_RESULT_KEYS = _MESSAGE_KEYS | {"tool_call_id"}  # a tool message's: the call it answers (openai_params.messages)
_PART_KEYS = {"type", "text"}
_STREAM_OPTION_KEYS = {"include_usage"}


def check(endpoint: dict, body: dict, caps: Capabilities, where: str, translated: bool = False) -> list[str]:
    """Refuse what cannot be honoured; return the locations of every field not read.
    `translated`: a surface translated onto chat completions — its top-level fields only (its
    translation reports its nested keys; `constrained_choice` checks the chat body it makes)."""
    ignored: list[str] = []
    for field, value in body.items():
        rule = endpoint.get(field)
        if rule is None or (rule.report and not (rule.needs and getattr(caps, rule.needs))):
            if rule is None or not (rule.noop and (value is None or _is_noop(value, rule.noop))):
                ignored.append(field)
            continue
        if (
            rule.refuse
            and value is not None
            and not _is_noop(value, rule.noop)
            and not (rule.needs and getattr(caps, rule.needs))
        ):
            reason = f": {rule.why}" if rule.why else ""
            raise GreenroomError("field_not_honoured", f"'{field}' cannot be honoured {where}{reason}", field)
    if translated:
        return ignored
    constrained_choice(body, caps, where)
    return ignored + _nested(body)


def constrained_choice(body: dict, caps: Capabilities, where: str) -> None:
    """tool_choice "required" or a named function is enforced by constrained decoding: an
    engine with tools but without it (OpenVINO, for now) serves "auto" and "none" only."""
    for field in ("tool_choice", "function_call"):
        choice = body.get(field)
        if (
            choice not in (None, "none", "auto")
            and body.get("tools" if field == "tool_choice" else "functions")
            and caps.tools
            and not caps.response_format
        ):
            raise GreenroomError(
                "field_not_honoured",
                f"'{field}' {json.dumps(choice)[:80]} cannot be honoured "
                f"{where}: a required or named call is enforced by constrained decoding, which "
                'this engine does not have yet; send "auto" or "none"',
                field,
            )


def _is_noop(value, noop: tuple) -> bool:
    # by type too: logprobs 0 asks for scoring, only logprobs false is "no change"
    return any(type(value) is type(n) and value == n for n in noop)


def _nested(body: dict) -> list[str]:
    out = []
    out += _unread_in_messages(body.get("messages"), "messages")
    extra = body.get("extra_messages")
    if isinstance(extra, list):
        for i, conversation in enumerate(extra):
            out += _unread_in_messages(conversation, f"extra_messages[{i}]")
    out += structured.unread_in_format(body.get("response_format"), "response_format")
    options = body.get("stream_options")
    if isinstance(options, dict):
        if body.get("stream") is True:
            out += [f"stream_options.{k}" for k in options if k not in _STREAM_OPTION_KEYS]
        else:  # only a stream reads them
            out.append("stream_options")
    return out


def _unread_in_messages(messages, where: str) -> list[str]:
    out = []
    if not isinstance(messages, list):
        return out
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        read = _RESULT_KEYS if m.get("role") == "tool" else _MESSAGE_KEYS
        out += [f"{where}[{i}].{k}" for k in m if k not in read]
        if isinstance(m.get("content"), list):
            for j, part in enumerate(m["content"]):
                if isinstance(part, dict):
                    out += [f"{where}[{i}].content[{j}].{k}" for k in part if k not in _PART_KEYS]
    return out


def strict_mode(value: str | None) -> bool:
    """X-miLLM-Strict: true/1 → refuse unused fields; false/0/absent → report them."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise GreenroomError(
        "invalid_parameter", f"X-miLLM-Strict must be true, 1, false or 0, got {value!r}", "X-miLLM-Strict"
    )


def settle(ignored: list[str], strict: bool) -> str | None:
    """Refuse under strict mode, else log once and return the X-miLLM-Ignored-Fields value."""
    if not ignored:
        return None
    if strict:
        raise GreenroomError(
            "unused_fields_refused",
            "X-miLLM-Strict is set and these fields would be ignored: " + ", ".join(ignored),
            ignored[0],
        )
    log.warning("request_fields_unused locations=%s", ignored)
    return ignored_fields_header(ignored)


def report_headers(ignored: list[str], strict: bool) -> dict[str, str]:
    """The response headers of a request's unread fields (or its refusal under strict mode)."""
    header = settle(ignored, strict)
    return {"X-miLLM-Ignored-Fields": header} if header else {}


def ignored_fields_header(locations: list[str]) -> str:
    """An RFC 8941 list of strings, at most IGNORED_FIELDS_HEADER_MAX_BYTES; when the
    locations do not fit, as many as fit and a last entry "+N more"."""
    items = [sf.string(loc) for loc in locations]
    whole = ", ".join(items)
    if len(whole) <= IGNORED_FIELDS_HEADER_MAX_BYTES:
        return whole
    for keep in range(len(items) - 1, -1, -1):
        value = ", ".join(items[:keep] + [sf.string(f"+{len(items) - keep} more")])
        if len(value) <= IGNORED_FIELDS_HEADER_MAX_BYTES:
            return value
    raise AssertionError("unreachable: '+N more' alone always fits")
