"""Chat completions' translator: its body → the surface-neutral ChatRequest (pipeline/request.py),
each field checked as openai_params declares it; its locations are chat's own, so its refusals
need no renaming."""

from __future__ import annotations

import attrs

from greenroom.http.openai import openai_params, scoring
from greenroom.http.pipeline.request import ChatRequest
from greenroom.http.pipeline.structured import Output


def parse(body: dict) -> ChatRequest:
    stream = openai_params.streaming(body)
    rows = openai_params.conversations(body)
    n = openai_params.choices(rows, openai_params.choices_n(body, stream.on))
    params = openai_params.sampling(body, openai_params.CHAT_MAX_TOKENS)
    kwargs = openai_params.template_kwargs(body)
    return ChatRequest(
        body.get("model"),
        rows,
        attrs.evolve(params, logprobs=scoring.generation_logprobs(body, chat=True)),
        stream,
        n,
        kwargs,
        Output.of(body),
        as_ids=body.get("return_tokens_as_token_ids"),
        **openai_params.millm(body),
    )
