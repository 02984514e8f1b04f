"""Scoring mode on /v1/completions and /v1/chat/completions (spec: "Scoring mode",
"Chat scoring"): which requests are scoring requests, their refusals, and the
OpenAI-shaped logprobs of their answers."""

from __future__ import annotations

import time

from greenroom.errors import GreenroomError
from greenroom.http import openai_params, structured
from greenroom.http.openai_params import new_rid
from greenroom.protocol import Score, Scores

MAX_LOGPROBS = 20
# steering and constraints change the distribution a judge reads: never on a scoring request
# (return_sae_activations is served: read on the unsteered pass, sae_activations.py)
_UNSCORABLE = ("profile", "steering_intensity", "steering", "response_format")
# settings that have nothing to act on when nothing is sampled (tools are rendered, not called)
NOT_APPLICABLE = ("top_p", "top_k", "stop", "frequency_penalty", "presence_penalty", "tool_choice", "function_call",
                  "parallel_tool_calls")


def is_completion_scoring(body: dict) -> bool:
    return body.get("logprobs") not in (None, False) or body.get("allowed_token_ids") is not None


def is_chat_scoring(body: dict) -> bool:
    # top_logprobs alone is a scoring request without logprobs: true, refused there
    return body.get("logprobs") is True or any(body.get(f) is not None for f in ("allowed_token_ids", "top_logprobs"))


# read only by scoring: reported when a request generates
SCORING_ONLY = ("return_tokens_as_token_ids",)


def _common(body: dict, stream: bool) -> tuple[float, list[int] | None]:
    for field in _UNSCORABLE:
        value = body.get(field)
        if value is not None and not (field == "response_format" and value == {"type": "text"}):
            raise GreenroomError("field_not_honoured", f"'{field}' cannot be used on a scoring request: scoring is "
                                 "always unsteered and unconstrained", field)
    if stream:
        raise GreenroomError("invalid_scoring_request", "scoring requests cannot be streamed", "stream")
    max_tokens = openai_params.sampling_max_tokens(body)
    if max_tokens != 1:
        raise GreenroomError("invalid_scoring_request", "scoring mode needs max_tokens: 1 (or max_completion_tokens: "
                             f"1); got {max_tokens}. It reads the next token's probabilities and generates nothing",
                             "max_tokens")
    if body.get("n") not in (None, 1):
        raise GreenroomError("invalid_scoring_request", "scoring mode needs n: 1", "n")
    temperature = openai_params.temperature(body)
    if 0 < temperature < 0.001:
        raise GreenroomError("invalid_parameter", "a scoring temperature must be 0 (no scaling) or at least 0.001; "
                             "smaller values overflow the logits", "temperature")
    allowed = body.get("allowed_token_ids")
    if allowed is not None and not (isinstance(allowed, list) and allowed and all(
            isinstance(t, int) and not isinstance(t, bool) for t in allowed)):
        raise GreenroomError("invalid_parameter", "'allowed_token_ids' must be a non-empty array of token ids",
                             "allowed_token_ids")
    return temperature, allowed


def completion_score(body: dict, model: str, stream: bool) -> Score:
    temperature, allowed = _common(body, stream)
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= MAX_LOGPROBS):
        raise GreenroomError("invalid_parameter", f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS}",
                             "logprobs")
    gen = openai_params.completion_request(body, model, openai_params.Streaming(False, False))
    # normalised over the allowed set, every listed token is reported
    report = len(set(allowed)) if allowed is not None else (logprobs or 0)
    return Score(new_rid("cmpl"), model, temperature, allowed, report, prompts=gen.prompts,
                 prompt_token_ids=gen.prompt_token_ids, add_special_tokens=gen.add_special_tokens)


def chat_score(body: dict, model: str, stream: bool) -> Score:
    temperature, allowed = _common(body, stream)
    top = body.get("top_logprobs")
    if top is not None:
        if body.get("logprobs") is not True:
            raise GreenroomError("invalid_parameter", "'top_logprobs' needs logprobs: true", "top_logprobs")
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS:
            raise GreenroomError("invalid_parameter", f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS}",
                                 "top_logprobs")
    conversations = openai_params.conversations(body)
    candidates = len(set(allowed)) if allowed is not None else MAX_LOGPROBS
    tools = structured.plan({k: v for k, v in body.items() if k in ("tools", "functions")}, stream=False).tools
    return Score(new_rid("chatcmpl"), model, temperature, allowed, min(top or 0, candidates),
                 conversations=conversations, template_kwargs=openai_params.template_kwargs(body), tools=tools)


def _key(token: list, as_ids: bool) -> str:
    return f"token_id:{token[0]}" if as_ids else token[1]


def completion_response(score: Score, result: Scores, body: dict, fingerprint: str) -> dict:
    as_ids = body.get("return_tokens_as_token_ids") is True
    with_logprobs = body.get("logprobs") not in (None, False)
    choices = []
    for i, row in enumerate(result.rows):
        logprobs = None
        if with_logprobs:
            top: dict[str, float] = {}
            for alt in row.top:  # two ids with one text share the entry of the more probable
                top.setdefault(_key(alt, as_ids), alt[3])
            logprobs = {"tokens": [_key(row.token, as_ids)], "token_logprobs": [row.logprob],
                        "top_logprobs": [top], "text_offset": [row.prompt_chars]}
        choices.append({"index": i, "text": row.token[1], "logprobs": logprobs, "finish_reason": "length"})
    return _response(score, result, choices, "text_completion", fingerprint)


def chat_response(score: Score, result: Scores, body: dict, fingerprint: str) -> dict:
    as_ids = body.get("return_tokens_as_token_ids") is True
    choices = []
    for i, row in enumerate(result.rows):
        logprobs = None
        if body.get("logprobs") is True:
            logprobs = {"content": [{
                "token": _key(row.token, as_ids), "logprob": row.logprob, "bytes": row.token[2],
                "top_logprobs": [{"token": _key(alt, as_ids), "logprob": alt[3], "bytes": alt[2]} for alt in row.top],
            }]}
        choices.append({"index": i, "message": {"role": "assistant", "content": row.token[1]}, "logprobs": logprobs,
                        "finish_reason": "length"})
    return _response(score, result, choices, "chat.completion", fingerprint)


def _response(score: Score, result: Scores, choices: list, kind: str, fingerprint: str) -> dict:
    prompt_tokens = sum(r.prompt_tokens for r in result.rows)
    return {"id": score.rid, "object": kind, "created": int(time.time()), "model": score.model,
            "system_fingerprint": fingerprint, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(result.rows),
                      "total_tokens": prompt_tokens + len(result.rows)}}
