"""The engine protocol every engine implements, and the values it speaks in.

An engine core only turns prompt token ids into new token ids, one per decode
step; detokenisation, stop sequences and finish reasons live once, in
`generation.py`, for every engine. Unlike vLLM V1, whose output processor runs in the API
server's process, greenroom's `Decoder` runs in the engine actor's worker thread, between
decode steps, so the front end only frames bytes: it costs 8.5 µs a token (two stop strings,
the tiny demo model: 0.5 % of its 1.7 ms step; measured with the decoder fed a 256-token
greedy answer), and it lets a stop string end the sequence at the step that completes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import attrs

from .capabilities import Capabilities

if TYPE_CHECKING:
    from .generation import Delta
    from .scoring import Echoed, Scored


# miLLM's steering range: a feature's strength is within ±STRENGTH_MAX (engines/steering.py)
STRENGTH_MAX = 200.0
# return_sae_activations' caps: top-k per position, and positions × top_k in the worst case
SAE_ACTIVATIONS_MAX_TOP_K = 64
SAE_ACTIVATIONS_MAX_ENTRIES = 65_536

# What an engine steers by: per SAE id, feature index → strength (steering.SteeringState).
Strengths = dict[str, dict[int, float]]

# Below this a temperature underflows float32 arithmetic; its limit is greedy decoding anyway.
GREEDY_BELOW = 1e-5


def default_cpu_threads() -> int:
    """All cores but one, which the front end and the actors' loops need: batch-1
    decoding gains nothing from a second thread here (measured: tiny 1,413 vs 1,213
    tok/s, 100M 35 vs 34 tok/s, 1 vs 2 threads on 2 cores)."""
    return max(1, (os.cpu_count() or 1) - 1)


class EngineError(Exception):
    """A refusal an engine can only discover while computing (a token id outside the
    vocabulary, non-finite logits), or one engines and the actor's admission share (the
    context length); the actor turns it into greenroom's typed error."""

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def context_length_exceeded(
    limit: int,
    however: str,
    param: str,
    reduce: str | None = None,
    *,
    window: str = "context length",
    setting: str | None = None,
) -> EngineError:
    """The one refusal of a request past a model's window, in OpenAI's words: "This model's
    maximum {window} is {limit} tokens[ ({setting})]. However, {however}.", then what to
    shorten where the message says it (`reduce`)."""
    named = f" ({setting})" if setting else ""
    advice = f" Please reduce the length of the {reduce}." if reduce else ""
    return EngineError(
        "context_length_exceeded",
        f"This model's maximum {window} is {limit} tokens{named}. However, {however}.{advice}",
        param,
    )


SEED_MAX = 2**32 - 1  # the largest seed: torch's CPU generator keeps 32 bits


@attrs.frozen
class SamplingParams:
    max_tokens: int | None = None  # None: the server default, bounded by the context
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off; else sample among the k most probable tokens
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repetition_penalty: float = 1.0  # 1 = off; >1 discourages tokens already seen
    # each generated token's log-probability reported, with this many of the most probable
    # tokens at its position (0–20: Ollama's `top_logprobs`); None: none reported
    logprobs: int | None = None


@attrs.frozen
class ModelInfo:
    id: str
    engine: str
    context_length: int
    dtype: str
    device: str
    parameters: int
    revision: str | None = None
    quantization: str | None = None
    # what the loaded model takes on its device — weights, KV cache, buffers: the larger of the
    # engine's own figure and what the load took there (engine_actor.py); None: not known
    footprint_bytes: int | None = None
    # an embedding model (engines/embedding_models.py): it pools vectors and generates nothing
    embedding_only: bool = False


# What a request asks of an engine beside its prompt, and what the engine reads back: typed
# values that cross the process boundary as they are (protocol.py's codec nests them).


@attrs.frozen
class JsonSchemaConstraint:
    """A document valid against `schema` (a JSON schema, checked by the front end)."""

    schema: dict


@attrs.frozen
class JsonObjectConstraint:
    """Any single JSON object."""


@attrs.frozen
class ToolCallsConstraint:
    """Tool calls in the model's own syntax: of the OpenAI tool objects `tools`, of `name` alone
    where set, one call or several (`parallel`)."""

    tools: list[dict]
    name: str | None = None
    parallel: bool = True


Constraint = JsonSchemaConstraint | JsonObjectConstraint | ToolCallsConstraint


def constraint_param(constraint: Constraint) -> str:
    """The request field a constraint came from: what its refusals name."""
    return "tools" if isinstance(constraint, ToolCallsConstraint) else "response_format"


@attrs.frozen
class Span:
    """Positions start … end - 1 (half-open), absolute over prompt then generated tokens."""

    start: int
    end: int


Positions = str | Span  # "last" | "prompt" | "completion" | "all", or a span


@attrs.frozen
class ReadoutRequest:
    """return_sae_activations as the front end validated it: SAE `sae_id`'s top_k features (of
    `features` only where given; None: every feature) at `positions`, read at `read_point`."""

    sae_id: str
    features: list[int] | None
    top_k: int
    positions: Positions
    read_point: str  # "post_steering" | "pre_steering"


@attrs.frozen
class FeatureValue:
    index: int
    value: float
    label: str | None = None  # the user's label of the feature (the front end adds it: store/dashboards.py)


@attrs.frozen
class PositionRead:
    position: int
    token_id: int | None  # None: a position past the tokens fed
    features: list[FeatureValue]


@attrs.frozen
class Activations:
    """What a readout read (steering.Readout.result): its SAE, the SAE's layer, the read point
    ("unsteered" on a scoring pass) and each position read, in order. Field order is the
    response's `millm.sae_activations` key order."""

    sae_id: str
    layer: int
    read_point: str
    positions: list[PositionRead]


@attrs.frozen
class MonitorRequest:
    """The operator's monitoring of a request: SAE `sae_id`'s top_k features, pre-steering."""

    sae_id: str
    top_k: int


@attrs.frozen
class MonitoredFeature:
    index: int
    max: float
    mean: float


@attrs.frozen
class MonitorRecord:
    """What a monitor read over one sequence (steering.Monitor.result): the top-k features by
    max, those that never fired left out; `positions` is how many were fed."""

    sae_id: str
    layer: int
    positions: int
    features: list[MonitoredFeature]


class Engine(Protocol):
    info: ModelInfo
    capabilities: Capabilities
    eos_token_ids: frozenset[int]
    vocab_size: int  # embedding rows: valid input ids
    scoring_vocab: int  # real tokens among the output rows
    has_chat_template: bool

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def render_chat(
        self,
        messages: list[dict],
        template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
        generation_prompt: bool = True,
    ) -> list[int]:
        """Prompt ids for a conversation, with the generation prompt appended (a trailing
        assistant message is continued, not answered: see chat.py), or without it."""
        ...

    def score(
        self, prompt_ids: list[int], temperature: float, allowed: list[int] | None, report: int, readout=None
    ) -> Scored:
        """One forward pass, nothing generated (scoring.py); `readout`: SAE activations to read (steering.py)."""
        ...

    def prompt_logprobs(
        self,
        prompt_ids: list[int],
        temperature: float,
        report: int,
        allowed: list[int] | None = None,
        next_report: int | None = None,
        readout=None,
    ) -> Echoed:
        """`echo` on a scoring request: one pass over the whole prompt, unsteered, giving each prompt
        token's log-probability after the ones before it and the `report` most probable there
        (scoring.prompt_tokens); with `next_report` not None, also the position after the prompt
        scored as `score` scores it (`allowed`, `next_report` alternatives)."""
        ...

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Mean-pooled last-hidden-layer embeddings, one per tokenised input."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def token_text(self, token_id: int) -> str:
        """One token's own text, a special token's written out (`<|im_start|>`): /tokenize's token_strs."""
        ...

    def compile_constraint(self, spec: Constraint) -> object:
        """A grammar for constrained decoding (engines without the capability never get one)."""
        ...

    def matcher(self, grammar) -> object:
        """A fresh constraint state for one sequence (constraints.Matcher)."""
        ...

    def generate_ids(
        self, prompt_ids: list[int], params: SamplingParams, matcher=None
    ) -> Iterator[tuple[int, float, tuple]]:
        """Yield (token id, its log-probability, the `params.logprobs` most probable (id,
        log-probability) pairs at its position — () unless asked for) per decode step; the
        log-probabilities are at temperature 1, after any constraint's mask. Closing the iterator
        frees the sequence's cache; the next forward pass runs only when the next id is asked
        for. With a matcher, each step samples only what its grammar allows."""
        ...

    def unload(self) -> None: ...

    # An engine that decodes sequences together also has `batchable: bool` (True when it can
    # batch its model now) and `new_batch(sampling) -> Batch`; the engine actor reads both
    # with getattr, so the others need neither. An engine whose pipeline embeds text (OpenVINO's
    # TextEmbeddingPipeline) also has `embed_texts(texts) -> vectors`, which the actor calls
    # for text inputs instead of `embed` on their ids; one whose tokenizer takes many texts in
    # one call has `tokenize_many(texts) -> rows`, which counts an embedding request's tokens.


class Batch(Protocol):
    """Sequences decoded together, one step for all of them (batching.DecodeBatch,
    llama_cpp_engine.LlamaCppBatch). Keys are the caller's (request ids)."""

    keys: list
    # one forward prefills all of a join's prompts (DecodeBatch); False: one after another
    # (LlamaCppBatch), so the engine actor joins them one at a time and each joiner's first
    # token goes out before the next one's prefill, not after the last one's
    prefills_together: bool

    def __len__(self) -> int: ...

    def join(self, joining: list[tuple[object, list[int], SamplingParams]]) -> list[Delta]:
        """Prefill each (key, prompt ids, params) and return its first Delta; a sequence whose
        first Delta finishes it does not stay."""
        ...

    def step(self) -> list[tuple[object, Delta]]:
        """One decode step of every sequence; the ones that finish leave."""
        ...

    def leave(self, keys) -> None:
        """Drop these sequences (cancelled or failed) and free what they held."""
        ...
