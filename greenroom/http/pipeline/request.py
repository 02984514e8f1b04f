"""The chat request every surface's translator makes (chat completions, Responses, Anthropic's
Messages, Needle): surface-neutral and typed — what the generation path (generation.planned)
needs, and nothing of any surface's JSON. Its locations (`messages[2].content`, `max_tokens`,
`tools[0].function.name`) are the names a refusal of it uses, which each translator's
FieldPaths maps back to the field its client sent.

What is checked where: each translator (chat completions' own, openai_api.parse_chat, included)
checks the conversation, the sampling, the streaming, n and the template variables as it builds
this; what depends on the server is checked as the request is planned — the output's tools and
format (structured.plan), the SAE readout (sae_activations.attach, against the SAEs attached)
and the request's steering (steering_api.request_steering, by the coordinator).
"""

from __future__ import annotations

import attrs

from greenroom.engines.base import SamplingParams
from greenroom.http.pipeline.structured import Output


@attrs.frozen
class Streaming:
    on: bool
    include_usage: bool  # stream_options.include_usage: an extra usage-only chunk


@attrs.frozen
class ChatRequest:
    """One chat request, whichever surface it came from."""

    model: str | None  # as sent; the pipeline serves the model the route resolved (Prepared.model)
    conversations: list[list[dict]]  # checked messages (role, content, tool_calls, tool_call_id): then extra rows
    params: SamplingParams  # checked; logprobs: the alternatives per token reported (None: none)
    stream: Streaming = Streaming(False, False)
    n: int = 1
    template_kwargs: dict | None = None
    output: Output = Output()  # tools, tool_choice, response_format: what the plan reads
    as_ids: bool | None = None  # return_tokens_as_token_ids (None: not sent)
    sae_activations: dict | None = None  # return_sae_activations, as sent
    profile: object = None  # the request's steering profile, as sent
    steering_intensity: object = None  # its dial, as sent
