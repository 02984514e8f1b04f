"""Scoring mode on /v1/completions and /v1/chat/completions (spec: "Scoring mode",
"Chat scoring"): which requests are scoring requests, their refusals, and the
OpenAI-shaped logprobs of their answers — and `echo` on /v1/completions, the prompt's own
log-probabilities (what lm-evaluation-harness's loglikelihood tasks send), in the shape
OpenAI's legacy completions and vLLM give them: the first token's entries null.

A request is scoring exactly when the spec says so: `logprobs` (chat: or `top_logprobs`) with
max_tokens 1, `allowed_token_ids`, or `echo`. `logprobs` on any other request — max_tokens
above 1 or left out, which the spec refuses — is a generation that reports its tokens'
log-probabilities, as OpenAI, vLLM and llama-server do (`generation_logprobs`; logprobs.py
writes them): greenroom goes beyond the spec there."""

from __future__ import annotations

import time

import attrs

from greenroom.errors import GreenroomError
from greenroom.http.core.contracts import INT64, NULL, AnyOf, Boolean, Choice, ListOf, Number, Shape, needs, sent, when
from greenroom.http.core.objects import Object
from greenroom.http.openai import chat_format, logprobs, openai_params
from greenroom.http.openai.openai_params import new_rid
from greenroom.http.pipeline import sae_activations, structured
from greenroom.http.pipeline.request import Streaming
from greenroom.protocol import Generate, Score, Scores

MAX_LOGPROBS = 20
MIN_TEMPERATURE = 0.001  # a scoring temperature is 0 (no scaling) or at least this: smaller ones overflow the logits
# steering and constraints change the distribution a judge reads: never on a scoring request
# (return_sae_activations is served: read on the unsteered pass, sae_activations.py)
_UNSCORABLE = ("profile", "steering_intensity", "steering", "response_format")
# settings that have nothing to act on when nothing is sampled (tools are rendered, not called)
NOT_APPLICABLE = (
    "top_p",
    "top_k",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "tool_choice",
    "function_call",
    "parallel_tool_calls",
)


def is_completion_scoring(body: dict) -> bool:
    """A scoring request, or an echo (served by the scoring pass: see completion_score)."""
    _flag(body)
    echo = openai_params.boolean(body, "echo", False)
    return echo or body.get("allowed_token_ids") is not None or (not _no_logprobs(body) and _one_token(body))


def _scores(body: dict) -> bool:
    # by identity: logprobs 0 asks for scoring (no alternatives), only false is "no change"
    return not _no_logprobs(body) or body.get("allowed_token_ids") is not None


def is_chat_scoring(body: dict) -> bool:
    _flag(body)
    openai_params.boolean(body, "logprobs", False)
    # top_logprobs alone is a scoring request without logprobs: true, refused there
    asks = body.get("logprobs") is True or body.get("top_logprobs") is not None
    return body.get("allowed_token_ids") is not None or (asks and _one_token(body))


def _one_token(body: dict) -> bool:
    """max_tokens (or max_completion_tokens) 1: what tells a scoring request from a generation
    with logprobs (a conflicting pair is refused by either path)."""
    value = body.get("max_tokens")
    if value is None:
        value = body.get("max_completion_tokens")
    return type(value) is int and value == 1


def generation_logprobs(body: dict, chat: bool) -> int | None:
    """The alternatives per generated token a generation asks for (SamplingParams.logprobs):
    chat's top_logprobs with logprobs: true, a text completion's integer logprobs; None when
    it asks for none."""
    if chat:
        _alternatives(body)
        return (body.get("top_logprobs") or 0) if body.get("logprobs") is True else None
    if _no_logprobs(body):
        return None
    return _completion_logprobs(body)


def reporting(gen: Generate, body: dict, chat: bool = True) -> Generate:
    """A generation that asks for logprobs: the engine reports each token, and the most probable
    `top` at its position."""
    top = generation_logprobs(body, chat)
    return gen if top is None else attrs.evolve(gen, params=attrs.evolve(gen.params, logprobs=top))


def _flag(body: dict) -> None:
    """return_tokens_as_token_ids is a boolean whether or not the request scores."""
    openai_params.boolean(body, "return_tokens_as_token_ids", False)


def _no_logprobs(body: dict) -> bool:
    return body.get("logprobs") is None or body.get("logprobs") is False


# read only where log-probabilities are written: reported when a request generates without them
# (generation.Prepared.unread_by)
SCORING_ONLY = ("return_tokens_as_token_ids",)

# --- the scoring fields (contracts.py), and what a scoring request is ---------------------

_SCORING_ONLY = (
    "Scoring mode (with max_tokens: 1, unstreamed, n: 1; never with response_format or steering): no "
    "text is generated, the next token's log-probabilities are returned"
)
_GENERATED = (
    "with max_tokens above 1 or left out, each generated token's log-probability (the model's at temperature 1, "
    "after a constraint's mask) comes back with the answer, streamed with each chunk's tokens"
)
_SEE = (
    " (see [Log-probabilities of generated tokens](openai.md#log-probabilities-of-generated-tokens) and "
    "[Scoring](openai.md#scoring-next-token-log-probabilities))"
)
_ALTERNATIVES = Number(lo=0, hi=MAX_LOGPROBS, integer=True)
_COMMON = {
    "allowed_token_ids": ListOf(
        items=Number(lo=INT64[0], hi=INT64[1], integer=True),
        min_items=1,
        description=_SCORING_ONLY
        + ", normalised over these tokens (see [Scoring](openai.md#scoring-next-token-log-probabilities))",
        rule=needs("scoring"),
    ),
    "return_tokens_as_token_ids": Boolean(
        default=False,
        description='Tokens written "token_id:<id>" in logprobs (scoring and generation alike)',
        rule=needs("token_logprobs", False),
    ),
}


def _present(field: str, schema: dict) -> dict:
    return {"properties": {field: schema}, "required": [field]}


def _tokens(values: list[int]) -> dict:
    """max_tokens (or, without it, max_completion_tokens) is one of `values`."""
    return {
        "anyOf": [
            _present("max_tokens", {"enum": values}),
            {
                "properties": {"max_tokens": NULL, "max_completion_tokens": {"enum": values}},
                "required": ["max_completion_tokens"],
            },
        ]
    }


def _scored_with(values: list[int]) -> dict:
    """What _common refuses of a scoring request whose max_tokens is one of `values`, as JSON Schema."""
    return {
        "properties": {
            "stream": {"enum": [False, None]},
            "n": {"enum": [1, None]},
            "temperature": {"anyOf": [NULL, {"const": 0}, {"minimum": MIN_TEMPERATURE}]},
            **{f: NULL for f in _UNSCORABLE if f != "response_format"},
            "response_format": {"anyOf": [NULL, {"const": {"type": "text"}}]},
        },
        **_tokens(values),
    }


_SCORED = _scored_with([1])
# max_tokens 1 as a condition: a branch per field (sent together they hold one value), which the
# fuzzer's canonicaliser negates without multiplying branches (tests/live/test_openapi.py)
_ONE_TOKEN = {"anyOf": [_present("max_tokens", {"const": 1}), _present("max_completion_tokens", {"const": 1})]}
# top_logprobs without logprobs: true is refused by the rule after it, so logprobs stands for both
_CHAT_SCORING = {"anyOf": [sent("allowed_token_ids"), {"allOf": [_present("logprobs", {"const": True}), _ONE_TOKEN]}]}
CHAT = Shape(
    fields={
        "logprobs": Boolean(
            default=False,
            description=f"true: {_GENERATED}; with max_tokens 1, {_SCORING_ONLY}{_SEE}",
            rule=needs("token_logprobs", False),
        ),
        "top_logprobs": attrs.evolve(
            _ALTERNATIVES,
            description="The most probable tokens listed at each position; needs logprobs: true",
            rule=needs("token_logprobs"),
        ),
        **_COMMON,
    },
    rules=(
        # one if/then/else: two complementary rules would double the branches the fuzzer expands
        {
            **when(
                _CHAT_SCORING,
                _SCORED,
                "a scoring request (is_chat_scoring: logprobs with max_tokens 1), else a generation (structured.plan)",
            ),
            "else": {"allOf": list(structured.GENERATION)},
        },
        when(sent("top_logprobs"), _present("logprobs", {"const": True}), "top_logprobs needs logprobs: true"),
    ),
)
_ASKS = _present("logprobs", {"not": {"enum": [None, False]}})
_COMPLETION_SCORING = {"anyOf": [sent("allowed_token_ids"), {"allOf": [_ASKS, _ONE_TOKEN]}]}
_ECHO = _present("echo", {"const": True})
COMPLETION = Shape(
    fields={
        "logprobs": AnyOf(
            options=(_ALTERNATIVES, Choice(values=(False,))),
            description=(
                f"An integer, the most probable tokens listed at each position (and the token itself): {_GENERATED}; "
                f"with max_tokens 1, {_SCORING_ONLY}{_SEE}"
            ),
            rule=needs("token_logprobs", False),
        ),
        "echo": Boolean(
            default=False,
            description=(
                "true: the prompt comes back — text prefixed to the answer and, with logprobs, every prompt token's "
                "log-probability after the tokens before it (the first's null, as OpenAI's legacy completions and vLLM "
                "give it). Served as prompt scoring: max_tokens 0 (the prompt alone) or 1 (and the most probable next "
                "token, scored as without echo); without logprobs or allowed_token_ids, max_tokens 0 only. What "
                "lm-eval's loglikelihood tasks send: see [Echo](openai.md#echo-the-prompts-log-probabilities)"
            ),
            rule=needs("scoring", False),  # prompt scoring: the prompt's log-probabilities
        ),
        **_COMMON,
    },
    rules=(
        when(
            _COMPLETION_SCORING,
            _SCORED,
            "a scoring request (is_completion_scoring): allowed_token_ids, or logprobs with max_tokens 1",
        ),
        when(
            _ECHO,
            {
                "anyOf": [
                    {"allOf": [{"anyOf": [_ASKS, sent("allowed_token_ids")]}, _scored_with([0, 1])]},
                    _scored_with([0]),
                ]
            },
            "an echo is prompt scoring: with logprobs, max_tokens 0 or 1; without, the prompt alone (max_tokens 0)",
        ),
    ),
)


def _common(body: dict, stream: bool, echo: bool = False) -> tuple[float, list[int] | None]:
    for field in _UNSCORABLE:
        value = body.get(field)
        if value is not None and not (field == "response_format" and value == {"type": "text"}):
            raise GreenroomError(
                "field_not_honoured",
                f"'{field}' cannot be used on a scoring request: scoring is always unsteered and unconstrained",
                field,
            )
    if stream:
        raise GreenroomError(
            "invalid_scoring_request", f"{'echo' if echo else 'scoring'} requests cannot be streamed", "stream"
        )
    max_tokens = openai_params.sampling_max_tokens(body)
    if echo and max_tokens not in (0, 1):
        raise GreenroomError(
            "invalid_scoring_request",
            "echo with logprobs needs max_tokens: 0 (the prompt's "
            f"log-probabilities alone) or 1 (and the next token's); got {max_tokens}. The prompt "
            "is scored, nothing is generated",
            "max_tokens",
        )
    if not echo and max_tokens != 1:
        raise GreenroomError(
            "invalid_scoring_request",
            "scoring mode needs max_tokens: 1 (or max_completion_tokens: "
            f"1); got {max_tokens}. It reads the next token's probabilities and generates nothing",
            "max_tokens",
        )
    if body.get("n") not in (None, 1):
        raise GreenroomError("invalid_scoring_request", "scoring mode needs n: 1", "n")
    temperature = openai_params.temperature(body)
    if 0 < temperature < MIN_TEMPERATURE:
        raise GreenroomError(
            "invalid_parameter",
            "a scoring temperature must be 0 (no scaling) or at least 0.001; smaller values overflow the logits",
            "temperature",
        )
    allowed = body.get("allowed_token_ids")
    if allowed is not None and not (
        isinstance(allowed, list) and allowed and all(isinstance(t, int) and not isinstance(t, bool) for t in allowed)
    ):
        raise GreenroomError(
            "invalid_parameter", "'allowed_token_ids' must be a non-empty array of token ids", "allowed_token_ids"
        )
    return temperature, allowed


def completion_score(body: dict, model: str, stream: bool) -> Score:
    """A scoring request, or an echo: with logprobs (or allowed_token_ids), max_tokens 0 or 1;
    without, max_tokens 0 — the prompt returned as it is, nothing computed. A generation does
    not echo its prompt (a stream would have to send it first; not served)."""
    echo = openai_params.boolean(body, "echo", False)
    if echo and not _scores(body) and openai_params.sampling_max_tokens(body) != 0:
        raise GreenroomError(
            "field_not_honoured",
            "'echo' cannot be honoured on a generation: it is served on a "
            "prompt-scoring request — with logprobs (or allowed_token_ids) and max_tokens 0 or 1, "
            "or with max_tokens 0 (the prompt alone)",
            "echo",
        )
    temperature, allowed = _common(body, stream, echo)
    alternatives = None if _no_logprobs(body) else _completion_logprobs(body)
    next_token = openai_params.sampling_max_tokens(body) == 1
    if allowed is not None and not next_token:
        raise GreenroomError(
            "invalid_scoring_request",
            "allowed_token_ids restricts the token after the prompt; with max_tokens 0 none is scored",
            "allowed_token_ids",
        )
    gen = openai_params.completion_request(body, model, Streaming(False, False))
    # normalised over the allowed set, every listed token is reported
    report = len(set(allowed)) if allowed is not None else (alternatives or 0)
    with_logprobs = echo and not _no_logprobs(body)
    return Score(
        new_rid("cmpl"),
        model,
        temperature,
        allowed,
        report,
        prompts=gen.prompts,
        prompt_token_ids=gen.prompt_token_ids,
        add_special_tokens=gen.add_special_tokens,
        echo=echo,
        echo_logprobs=alternatives if with_logprobs else None,
        next_token=next_token,
    )


def _completion_logprobs(body: dict) -> int:
    value = body.get("logprobs")
    if not _ALTERNATIVES.holds(value):
        raise GreenroomError("invalid_parameter", f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS}", "logprobs")
    return value


def _alternatives(body: dict) -> int | None:
    """Chat's top_logprobs: 0–20, and only with logprobs: true."""
    top = body.get("top_logprobs")
    if top is not None:
        if body.get("logprobs") is not True:
            raise GreenroomError("invalid_parameter", "'top_logprobs' needs logprobs: true", "top_logprobs")
        if not _ALTERNATIVES.holds(top):
            raise GreenroomError(
                "invalid_parameter", f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS}", "top_logprobs"
            )
    return top


def chat_score(body: dict, model: str, stream: bool) -> Score:
    temperature, allowed = _common(body, stream)
    top = _alternatives(body)
    conversations = openai_params.conversations(body)
    candidates = len(set(allowed)) if allowed is not None else MAX_LOGPROBS
    tools = structured.plan(structured.Output(tools=body.get("tools"), functions=body.get("functions"))).tools
    return Score(
        new_rid("chatcmpl"),
        model,
        temperature,
        allowed,
        min(top or 0, candidates),
        conversations=conversations,
        template_kwargs=openai_params.template_kwargs(body),
        tools=tools,
    )


def _key(token: list, as_ids: bool) -> str:
    return logprobs.key(token[0], token[1], as_ids)


def completion_response(score: Score, result: Scores, body: dict, fingerprint: str) -> dict:
    as_ids = body.get("return_tokens_as_token_ids") is True
    with_logprobs = not _no_logprobs(body)
    choices = []
    for i, row in enumerate(result.rows):
        answer = row.token[1] if row.token is not None else ""
        written = None
        if with_logprobs:
            echoed = logprobs.Writer(False, as_ids, 0)
            written = echoed(row.prompt or ())  # echo: the prompt's tokens, as a generation's are written
            if row.token is not None:  # the token after the prompt, exactly as without echo
                top = {}
                for alt in row.top:  # two ids with one text share the entry of the more probable
                    top.setdefault(_key(alt, as_ids), alt[3])
                logprobs.append(
                    written,
                    _key(row.token, as_ids),
                    row.logprob,
                    top,
                    echoed.offset if row.prompt is not None else row.prompt_chars,
                )
        text = row.prompt_text + answer if score.echo else answer
        choices.append(chat_format.TEXT_CHOICE.build(index=i, text=text, logprobs=written, finish_reason="length"))
    return _response(score, result, choices, chat_format.TEXT_COMPLETION, fingerprint)


def chat_response(score: Score, result: Scores, body: dict, fingerprint: str) -> dict:
    as_ids = body.get("return_tokens_as_token_ids") is True
    choices = []
    for i, row in enumerate(result.rows):
        written = None
        if body.get("logprobs") is True:
            top = [logprobs.entry(_key(alt, as_ids), alt[1], alt[3]) for alt in row.top]
            written = logprobs.chat([logprobs.chat_entry(_key(row.token, as_ids), row.token[1], row.logprob, top)])
        message = chat_format.MESSAGE.build(role="assistant", content=row.token[1], refusal=None)
        choices.append(
            chat_format.CHAT_CHOICE.build(index=i, message=message, logprobs=written, finish_reason="length")
        )
    return _response(score, result, choices, chat_format.CHAT_COMPLETION, fingerprint)


def _response(score: Score, result: Scores, choices: list, kind: Object, fingerprint: str) -> dict:
    prompt_tokens = sum(r.prompt_tokens for r in result.rows)
    scored = sum(r.token is not None for r in result.rows)  # an echo with max_tokens 0 scores none
    read = {} if result.sae_activations is None else {"millm": sae_activations.millm(result.sae_activations)}
    return kind.build(
        id=score.rid,
        object=kind.fields["object"].values[0],
        created=int(time.time()),
        model=score.model,
        system_fingerprint=fingerprint,
        choices=choices,
        usage=chat_format.USAGE.build(
            prompt_tokens=prompt_tokens, completion_tokens=scored, total_tokens=prompt_tokens + scored
        ),
        **read,
    )
