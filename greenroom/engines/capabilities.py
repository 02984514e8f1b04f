"""What each engine honours, as data. The front end's field ledger reads this table
(by the engine named in the model's placement) to honour, report or refuse every
request field before any model is loaded; nothing here imports an engine."""

from __future__ import annotations

import functools

import attrs


@attrs.frozen
class Capabilities:
    generation: bool = False  # chat and completions: an embedding model (EMBEDDING_MODEL) has none
    seed: bool = False  # per-request seeds that reproduce byte-identically
    n: bool = False  # several choices per request
    penalties: bool = False  # frequency/presence → repetition penalty
    embeddings: bool = False
    chat_template_kwargs: bool = False  # variables passed to the chat template
    scoring: bool = False  # logprobs / allowed_token_ids scoring mode (an engine with it has token_logprobs too)
    response_format: bool = False  # constrained decoding
    tools: bool = False
    steering: bool = False  # steering_intensity (per-request dial)
    profile: bool = False  # a per-request steering profile: SAE hooks steering one request's forwards
    sae_activations: bool = False  # return_sae_activations: SAE hooks on the model's residual stream
    # each generated token's log-probability: `logprobs` on a generation (/v1 and Ollama), x_needle's confidence
    token_logprobs: bool = False
    # the SAE hook points it reads and steers, by site (engines/sae.py SITES): an SAE on another is refused
    hook_sites: tuple[str, ...] = ()


RESIDUAL_SITES = ("resid_post", "resid_pre")


ENGINES: dict[str, Capabilities] = {
    "transformers": Capabilities(
        generation=True,
        seed=True,
        n=True,
        penalties=True,
        embeddings=True,
        chat_template_kwargs=True,
        scoring=True,
        response_format=True,
        tools=True,
        sae_activations=True,
        profile=True,
        steering=True,
        token_logprobs=True,
        # forward hooks on the block, or on its self_attn / mlp module (attention and MLP out: while
        # the model decodes eagerly, transformers_engine.BlockHooks)
        hook_sites=(*RESIDUAL_SITES, "attn_out", "mlp_out"),
    ),
    # llama.cpp: its repeat penalty honours ours; tools are rendered by the file's template (or
    # described in the system message, engines/text/chat.py) and parsed, with every tool_choice (required
    # and named decoded under a grammar in the template's call syntax); response_format masks
    # llama.cpp's logits with the constraint module transformers uses (engines/text/constraints.py);
    # scoring (and echo) reads llama.cpp's own logits (llama_get_logits) in a context of its own;
    # seeds reproduce byte for byte whatever ran before or beside (measured: llama_cpp_engine.py's
    # docstring), so n > 1 choices are seeded apart; the file's template takes no variables;
    # steering is a control vector per context and SAE readouts read the eval callback
    # (llama_steering.py), so a request's own steering and readouts decode alone
    "llama.cpp": Capabilities(
        generation=True,
        seed=True,
        n=True,
        penalties=True,
        embeddings=True,
        response_format=True,
        tools=True,
        token_logprobs=True,
        scoring=True,
        steering=True,
        profile=True,
        sae_activations=True,
        hook_sites=RESIDUAL_SITES,  # a control vector adds to a layer's output (l_out) only
    ),
    # OpenVINO GenAI: rng_seed reproduces (CPU and NPU pipeline alike), its repetition penalty is
    # HF's rule (measured: greedy ids equal transformers'), the template takes variables and tools
    # (auto and none, as on llama.cpp); no per-token distribution (scoring), no grammar bridge
    # (so no required/named tool_choice), no hooks for steering (the pipeline owns its forward)
    "openvino": Capabilities(
        generation=True, seed=True, n=True, penalties=True, embeddings=True, chat_template_kwargs=True, tools=True
    ),
}

# An embedding model (engines/embedding_models.py), on any engine: it pools vectors and generates
# nothing, so every generating route refuses it before a load, as Ollama refuses one
EMBEDDING_MODEL = Capabilities(embeddings=True)


# Why an engine without a capability cannot honour it: every refusal names its reason, on /v1
# (http/core/ledger.py) and on the Ollama surface (http/ollama/ollama_params.py) alike.
WHY_NOT: dict[str, str] = {
    "generation": "this is an embedding model: it generates nothing",
    "seed": "this engine's seeds are not measured to reproduce",
    "n": "this engine serves one choice per request",
    "penalties": "this engine has no repetition penalty",
    "embeddings": "this engine serves no embeddings",
    "chat_template_kwargs": "this engine's chat template takes no variables",
    "scoring": "scoring mode is not available on this engine yet",
    "response_format": "constrained decoding (structured output) is not available on this engine yet",
    "tools": "tool calling is not available on this engine yet",
    "steering": "this engine has no SAE hooks to steer with (transformers and llama.cpp models are steered)",
    "profile": "this engine has no SAE hooks to steer with (transformers and llama.cpp models are steered)",
    "sae_activations": "this engine has no SAE hooks (transformers and llama.cpp models read SAE activations)",
    "token_logprobs": "this engine reports no token probabilities (OpenVINO GenAI's pipeline has none)",
}


def capabilities_of(engine: str) -> Capabilities:
    return ENGINES[engine]


@functools.cache
def common(engines: tuple[str, ...]) -> Capabilities:
    """What every one of these engines honours: a model placed on several engines is
    routed to any of them, so a field is honoured only where all of them honour it."""
    caps = [ENGINES[e] for e in engines]
    sites = tuple(s for s in caps[0].hook_sites if all(s in c.hook_sites for c in caps))
    return Capabilities(
        **{f.name: all(getattr(c, f.name) for c in caps) for f in attrs.fields(Capabilities) if f.name != "hook_sites"},
        hook_sites=sites,
    )
