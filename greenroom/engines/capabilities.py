"""What each engine honours, as data. The front end's field ledger reads this table
(by the engine named in the model's placement) to honour, report or refuse every
request field before any model is loaded; nothing here imports an engine."""

from __future__ import annotations

import attrs


@attrs.frozen
class Capabilities:
    seed: bool = False  # per-request seeds that reproduce byte-identically
    n: bool = False  # several choices per request
    penalties: bool = False  # frequency/presence → repetition penalty
    embeddings: bool = False
    chat_template_kwargs: bool = False  # variables passed to the chat template
    scoring: bool = False  # logprobs / allowed_token_ids scoring mode
    response_format: bool = False  # constrained decoding
    tools: bool = False
    steering: bool = False  # steering_intensity (per-request dial)
    profile: bool = False  # a per-request steering profile: SAE hooks steering one request's forwards
    sae_activations: bool = False  # return_sae_activations: SAE hooks on the model's residual stream


ENGINES: dict[str, Capabilities] = {
    "transformers": Capabilities(seed=True, n=True, penalties=True, embeddings=True, chat_template_kwargs=True,
                                 scoring=True, response_format=True, tools=True, sae_activations=True,
                                 profile=True, steering=True),
    # llama.cpp: its repeat penalty honours ours; seeds are not measured to reproduce, there is no
    # per-token distribution for scoring, no grammar bridge, and the file's template takes no variables
    "llama.cpp": Capabilities(penalties=True, embeddings=True),
    # OpenVINO GenAI: rng_seed reproduces (CPU and NPU pipeline alike), its repetition penalty is
    # HF's rule (measured: greedy ids equal transformers'), the template takes variables; no
    # per-token distribution (scoring), no grammar bridge, no hooks for steering
    "openvino": Capabilities(seed=True, n=True, penalties=True, embeddings=True, chat_template_kwargs=True),
}


def capabilities_of(engine: str) -> Capabilities:
    return ENGINES[engine]


def common(engines: list[str]) -> Capabilities:
    """What every one of these engines honours: a model placed on several engines is
    routed to any of them, so a field is honoured only where all of them honour it."""
    caps = [ENGINES[e] for e in engines]
    return Capabilities(**{f.name: all(getattr(c, f.name) for c in caps) for f in attrs.fields(Capabilities)})
