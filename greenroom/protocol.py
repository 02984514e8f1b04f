"""Every message that crosses a process boundary, in one place.

The front end holds one long-lived stream per engine actor and multiplexes
requests over it by request id (`rid`); the engine actor answers with at most one
`Events` message per decode step, carrying every request that advanced.
Messages travel as plain dicts (tractor encodes with msgpack); `to_wire` and
`from_wire` convert, tagged by `t`.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs

from .engines.base import SamplingParams


# front end → engine actor
@attrs.frozen
class Fit:
    """Ollama's rule for a prompt longer than its window (http/ollama_api.py; engines/
    prompt_fit.py does it): the oldest messages go first — never a system one nor the last
    — then the prompt's middle, its first `keep` tokens kept, until the prompt leaves room
    for min(`answer`, window / 2) tokens; the answer is then cut at the window."""

    window: int
    keep: int
    answer: int  # num_predict, or Ollama's default where it fills the window (-1/-2)
    fill: bool  # num_predict -1/-2: the answer may take the rest of the window


@attrs.frozen
class Generate:
    """One request: `n` choices for each row — each prompt of `prompts` or
    `prompt_token_ids` (no template: /v1/completions), or each conversation of
    `conversations` (chat: messages, then each of extra_messages; chat template).
    Choice index = row * n + j. The actor validates every row before generating any."""

    rid: str
    model: str
    params: SamplingParams
    prompts: list[str] | None = None
    prompt_token_ids: list[list[int]] | None = None  # prompts already tokenised
    conversations: list[list[dict]] | None = None
    n: int = 1
    add_special_tokens: bool = True  # for prompts
    template_kwargs: dict | None = None  # for conversations
    tools: list[dict] | None = None  # OpenAI tool objects, rendered by the chat template
    # constrained decoding, one matcher per choice: {"type": "json_schema", "schema"} |
    # {"type": "json_object"} | {"type": "tool_calls", "tools", "name"?, "parallel"}
    constraint: dict | None = None
    # return_sae_activations, validated by the front end (one row, n = 1): {"sae_id", "features"
    # (None: every feature), "top_k", "positions", "read_point"}; served on the serial path
    sae_activations: dict | None = None
    # this request's own steering — a profile's strengths and/or a steering_intensity dial,
    # resolved and checked by the coordinator (sae_id → feature → strength, features as decimal
    # strings; {} = unsteered): served on the serial path, in place of the live steering, which
    # it never changes
    request_strengths: dict[str, dict[str, float]] | None = None
    # monitoring (the operator's, per model): {"sae_id", "top_k"}; each choice's top-k features
    # pre-steering come back on its finishing Text. Served on the serial path
    monitor: dict | None = None
    fit: Fit | None = None  # one row: cut it to its window by Ollama's rule instead of refusing it
    # a model without a chat template renders the conversation's last message as it is (Ollama's
    # `{{ .Prompt }}`, /api/generate) instead of refusing it (no_chat_template)
    as_is_without_template: bool = False

    @property
    def rows(self) -> int:
        return len(self.prompts or self.prompt_token_ids or self.conversations)

    @property
    def choices(self) -> int:
        return self.rows * self.n


@attrs.frozen
class Embed:
    """Embed every input: texts, or inputs already tokenised (one of the two)."""

    rid: str
    model: str
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None


@attrs.frozen
class Score:
    """Scoring mode: one forward pass per row, nothing generated. Rows are prompts
    (`prompts` / `prompt_token_ids`, /v1/completions) or conversations (`conversations`:
    messages then each of extra_messages, rendered with the chat template)."""

    rid: str
    model: str
    temperature: float
    allowed_token_ids: list[int] | None
    report: int  # alternatives to return (all allowed ids on completions)
    prompts: list[str] | None = None
    prompt_token_ids: list[list[int]] | None = None
    conversations: list[list[dict]] | None = None
    add_special_tokens: bool = True
    template_kwargs: dict | None = None
    tools: list[dict] | None = None
    # return_sae_activations (one row), as on Generate: read on the unsteered scoring pass
    sae_activations: dict | None = None

    @property
    def rows(self) -> int:
        return len(self.prompts or self.prompt_token_ids or self.conversations)

    n = 1  # scoring reads one next token per row


@attrs.frozen
class Load:
    """Load a model into the engine actor (queued behind the requests before it)."""

    rid: str
    spec: dict  # {"id", "source", "engine", "device", "dtype", "cache_dir"}


@attrs.frozen
class Unload:
    """Unload a model once every request queued before this has finished."""

    rid: str
    model: str


@attrs.frozen
class Cancel:
    rid: str


@attrs.frozen
class SteerUpdate:
    """A model's steering as the coordinator resolved it, pushed to the engine actor holding
    the model: the SAEs to have attached ({"sae_id", "path"}), per SAE feature → strength
    (features as decimal strings), enabled. Applied between decode steps; a version not
    newer than the one applied is ignored. Answered with `Steered`."""

    rid: str
    model: str
    version: int
    enabled: bool
    saes: list[dict]
    strengths: dict[str, dict[str, float]]


# front end → steering coordinator
@attrs.frozen
class SteeringCommand:
    """get | attach {sae, layer?, sae_id?, placement} | detach {sae_id} |
    set {enabled?, strengths?} | default {sae, placement}: attach `sae` only if nothing was
    ever set for the model. Profiles (by name; `model` only where one is created):
    profile_list | profile_get {name} | profile_delete {name} | profile_create {name,
    description, strengths} | profile_import {the same, saes: the identities to match} |
    profile_update {name, description?, strengths?} | profile_activate {name}: its strengths
    as the live state. Clusters (profiles with a dial): cluster_list | cluster_get | cluster_delete
    {name} | cluster_import {name, description, sae_id, members, labels, intensity_range,
    intensity} | cluster_intensity {name, intensity}. Circuits: circuit_list | circuit_get |
    circuit_delete | circuit_activate {name} | circuit_import {name, description, rung, layers,
    intensity_range, intensity, slice_fallback} | circuit_intensity {name, intensity} |
    circuit_active. request {profile?, intensity?}: a chat request's own steering (a read).
    lock_get | lock_set (`model`, "" to unlock). Answered with `SteeringSnapshot` (the model's
    state with `serving`; for the other ops, their own dict) or `Failed`."""

    rid: str
    op: str
    model: str
    args: dict = attrs.Factory(dict)


@attrs.frozen
class StatusQuery:
    rid: str


# engine actor → front end
@attrs.frozen
class Admitted:
    """Every row passed validation and is tokenised; a stream may start."""

    rid: str
    prompt_tokens: int  # summed over rows (each prompt counted once, whatever n)
    # what Generate.fit cut: {"messages": oldest messages dropped, "tokens": prompt tokens dropped}
    truncated: dict | None = None
    as_is: bool = False  # no chat template: the last message was rendered as it is


@attrs.frozen
class Text:
    rid: str
    index: int  # the choice
    text: str
    completion_tokens: int
    finish_reason: str | None = None
    # on the finishing event: {"logprob_sum", "prefill_s", "decode_s", "queue_wait_s",
    # "compute_s", "peak_rss_mb"} — the engine's own figures for x_needle
    stats: dict | None = None
    # on the finishing event of a request with sae_activations: {"sae_id", "layer", "read_point",
    # "positions": [{"position", "token_id", "features": [{"index", "value"}]}]}
    sae_activations: dict | None = None
    # on the finishing event of a monitored choice: {"sae_id", "layer", "positions" (a count),
    # "features": [{"index", "max", "mean"}]} (engines/steering.py, Monitor.result)
    monitor: dict | None = None


@attrs.frozen
class Embedded:
    rid: str
    vectors: list[bytes]  # float32, little-endian, one per input
    prompt_tokens: int


@attrs.frozen
class ScoredRow:
    token: list  # [id, text, utf-8 bytes]
    logprob: float
    top: list[list]  # [[id, text, utf-8 bytes, logprob], …], most probable first
    prompt_tokens: int
    prompt_chars: int  # length of the prompt's text: OpenAI's text_offset of the answer


@attrs.frozen
class Scores:
    rid: str
    rows: list[ScoredRow]
    # with the request's sae_activations: as Text's, read_point "unsteered"
    sae_activations: dict | None = None


@attrs.frozen
class Done:
    """A Load (with the model's info) or an Unload (info None) has completed."""

    rid: str
    info: dict | None = None


@attrs.frozen
class Failed:
    rid: str
    error: dict  # GreenroomError.to_wire()


@attrs.frozen
class Status:
    rid: str
    status: dict


@attrs.frozen
class Steered:
    """The engine's answer to a SteerUpdate: the version it now holds (older than the
    update's when it could not apply it) and its attached SAEs (steering.AttachedSAE)."""

    rid: str
    version: int
    attached: list[dict]


# steering coordinator → front end
@attrs.frozen
class SteeringSnapshot:
    """A model's steering state after a command: {"model", "version", "enabled", "saes",
    "strengths"} (store/steering.py's ModelSteering)."""

    rid: str
    state: dict


@attrs.frozen
class Events:
    events: list[Admitted | Text | Embedded | Scores | Done | Failed | Status | Steered | SteeringSnapshot]


_TAGS: dict[str, type] = {c.__name__: c for c in (
    Generate, Embed, Score, Load, Unload, Cancel, StatusQuery, Admitted, Text, Embedded, Scores, Done, Failed,
    Status, SteerUpdate, SteeringCommand, Steered, SteeringSnapshot)}
_conv = cattrs.Converter()


def to_wire(msg: Any) -> dict:
    if isinstance(msg, Events):
        return {"t": "Events", "events": [to_wire(e) for e in msg.events]}
    d = _conv.unstructure(msg)
    d["t"] = type(msg).__name__
    return d


def from_wire(d: dict) -> Any:
    tag = d["t"]
    if tag == "Events":
        return Events([from_wire(e) for e in d["events"]])
    body = {k: v for k, v in d.items() if k != "t"}
    return _conv.structure(body, _TAGS[tag])
