"""Every message that crosses a process boundary, in one place.

The front end holds one long-lived stream per engine actor and multiplexes
requests over it by request id (`rid`); the engine actor answers with `Events` messages
(actors/outbox.py), each carrying what every request produced since the previous one, one
`Text` per request and choice (`EventBatch`).
Messages travel as plain dicts (tractor encodes with msgpack); `to_wire` and
`from_wire` convert, tagged by `t`. Their payloads are typed too, nested attrs classes (the
engine's values from engines/base.py), a union's class tagged by `t` within its field.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs
import msgspec
from cattrs.strategies import configure_tagged_union

from .engines.base import (
    Activations,
    Constraint,
    ModelInfo,
    MonitorRecord,
    MonitorRequest,
    Positions,
    ReadoutRequest,
    SamplingParams,
    Span,
    Strengths,
)
from .engines.prompt_fit import Truncated


# front end → engine actor
@attrs.frozen
class Fit:
    """Ollama's rule for a prompt longer than its window (http/ollama/ollama_api.py; engines/
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
    constraint: Constraint | None = None  # constrained decoding, one matcher per choice
    # return_sae_activations, validated by the front end (one row, n = 1); served on the serial path
    sae_activations: ReadoutRequest | None = None
    # this request's own steering — a profile's strengths and/or a steering_intensity dial,
    # resolved and checked by the coordinator ({} = unsteered): served on the serial path, in
    # place of the live steering, which it never changes
    request_strengths: Strengths | None = None
    # monitoring (the operator's, per model): each choice's top-k features pre-steering come back
    # on its finishing Text. Served on the serial path
    monitor: MonitorRequest | None = None
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
    sae_activations: ReadoutRequest | None = None
    # echo (/v1/completions): each row's prompt comes back — its text, and with echo_logprobs (the
    # alternatives per prompt position) every prompt token's log-probability (engine.prompt_logprobs)
    echo: bool = False
    echo_logprobs: int | None = None
    next_token: bool = True  # False (echo with max_tokens 0): the prompt alone, no token scored after it

    @property
    def rows(self) -> int:
        return len(self.prompts or self.prompt_token_ids or self.conversations)

    n = 1  # scoring reads one next token per row


@attrs.frozen
class Tokenize:
    """The ids of `prompt` (tokenised as a /v1/completions prompt), of `conversation` (rendered with
    `tools` as a chat request's prompt is, its generation prompt included unless
    `generation_prompt` is false), or the text of `token_ids` (detokenised) — one of the three.
    Answered with `Tokenized`, between decode steps."""

    rid: str
    model: str
    prompt: str | None = None
    add_special_tokens: bool = True  # for prompt
    conversation: list[dict] | None = None
    tools: list[dict] | None = None
    template_kwargs: dict | None = None
    generation_prompt: bool = True
    token_ids: list[int] | None = None
    token_strs: bool = False  # each id's own text too


@attrs.frozen
class ReadFeatures:
    """SAE `sae_id`'s activations on one unsteered pass over each of `texts` (tokenised as a
    /v1/completions prompt): feature search by text and contrast. Answered with `FeaturesRead`."""

    rid: str
    model: str
    sae_id: str
    texts: list[str]
    top_k: int  # features listed per position


@attrs.frozen
class StartDashboards:
    """Start dashboards job `rid` (engines/dashboards.py) over `features` of SAE `sae_id`: its
    corpus is the texts of `files`, else what the model writes after `seeds`. Checked when it
    is taken (answered with Done, or Failed), then run in the engine actor's spare time
    (actors/dashboard_runner.py), which writes its progress and results to the store of cache
    directory `store`."""

    rid: str
    model: str
    sae_id: str
    features: list[int]
    files: list[str]
    seeds: list[str]
    generated_tokens: int
    top_k: int
    context_tokens: int
    max_tokens: int
    logit_k: int
    store: str | None


@attrs.frozen
class Load:
    """Load a model into the engine actor (queued behind the requests before it)."""

    rid: str
    spec: dict  # the model's placement (supervisor/placements.Placement.to_spec)


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
    the model: the SAEs to have attached, their strengths, enabled. Applied between decode
    steps; a version not newer than the one applied is ignored. Answered with `Steered`."""

    rid: str
    model: str
    version: int
    enabled: bool
    saes: dict[str, str]  # sae_id → the SAE's directory
    strengths: Strengths


# front end ⇄ steering coordinator. One class per kind of request (vLLM's EngineCoreRequestType,
# as types): the front end sends `SteeringCall(rid, request)`, the coordinator answers
# `SteeringReply(rid, answer)` or `Failed`. Request and answer travel tagged by class name under
# "t", as every message does. The strength maps of requests and documents are {sae_id: {feature:
# strength}}, features as decimal strings, as the JSON that stores and answers them; their shape
# and the ±200 range are the front end's checks, everything that depends on the SAEs attached
# (widths, identities) the coordinator's. What an engine steers by is `Strengths`.
Dial = float | str  # a request's steering_intensity: λ in [0, 2], or "off" | "min" | "max"


@attrs.frozen
class ModelRequest:
    """A request about `model`'s steering: the tree refuses it (400 steering_unsupported) unless
    every engine the model is placed on can steer. For a named profile, cluster or circuit,
    `model` is the one it steers (the route reads it first)."""

    model: str


@attrs.frozen
class GetSteering:
    """`model`'s state; a read, for any model."""

    model: str


@attrs.frozen
class AttachSAE(ModelRequest):
    """Load SAE `sae` (a directory, "demo:<size>[:<layer>]" or "random:<d_in>:<layer>"), check
    it fits the model at `placement`, and record it attached."""

    sae: str
    layer: int | None = None  # the layer `sae` must read
    sae_id: str | None = None  # None: a name derived from `sae`
    placement: dict | None = None  # the model's first placement's to_spec() (the steering relay fills it in)


@attrs.frozen
class AttachDefaultSAE(ModelRequest):
    """The model's configured `sae`, attached only while nothing was ever set for it (version 0)."""

    sae: str
    placement: dict | None = None  # as AttachSAE's


@attrs.frozen
class DetachSAE(ModelRequest):
    sae_id: str


@attrs.frozen
class SetSteering(ModelRequest):
    """PUT /api/steering: `strengths` replace the live values (and end the active base);
    `enabled` alone keeps them. None leaves a field as it is."""

    enabled: bool | None = None
    strengths: dict[str, dict[str, float]] | None = None


@attrs.frozen
class CalibrateSAEs(ModelRequest):
    """Record the residual norm (ρ_L) an engine measured for each attached SAE named, where
    the record has none yet; not a steering change (the version stays)."""

    residual_norms: dict[str, float]


@attrs.frozen
class ConvertStrengths(ModelRequest):
    """{sae_id: {feature: coefficient}} (SAELens' unit) as spec-scale strengths, through each
    attached SAE's ρ_L and decoder norms (strength_units.py); `param`: what a refusal names
    (None: strengths.<sae_id>[.<feature>], as PUT /api/steering's body has them)."""

    coefficients: dict[str, dict[str, float]]
    param: str | None = None


@attrs.frozen
class DescribeSAE(ModelRequest):
    """One attached SAE's record with its decoder norms, feature by feature (a read)."""

    sae_id: str


@attrs.frozen
class ResolveRequestSteering(ModelRequest):
    """A chat request's own steering (a read): its `profile` and/or `intensity` dial."""

    profile: str | None = None
    intensity: Dial | None = None


@attrs.frozen
class ListProfiles:
    pass


@attrs.frozen
class GetProfile:
    name: str


@attrs.frozen
class CreateProfile(ModelRequest):
    name: str
    description: str
    strengths: dict[str, dict[str, float]]


@attrs.frozen
class ImportProfile(CreateProfile):
    """An exported profile: refused unless each SAE of `saes` (SAE identities: sae_id, source,
    layer, hook_point, width, d_in, architecture) is attached as it was."""

    saes: list[dict]


@attrs.frozen
class UpdateProfile(ModelRequest):
    """None leaves a field as stored."""

    name: str
    description: str | None = None
    strengths: dict[str, dict[str, float]] | None = None


@attrs.frozen
class DeleteProfile:
    """A profile or a cluster; a model it was active on is deactivated (`Deleted`)."""

    name: str


@attrs.frozen
class ActivateProfile(ModelRequest):
    """The profile's strengths (a cluster's: dialled) as the model's live state: its active base."""

    name: str


@attrs.frozen
class ListClusters:
    pass


@attrs.frozen
class GetCluster:
    name: str


@attrs.frozen
class ImportCluster(ModelRequest):
    """A cluster: a profile of one attached SAE's `members` with a range and a persistent dial."""

    name: str
    description: str
    sae_id: str
    members: dict[str, float]  # feature → strength
    labels: dict[str, str]  # feature → label
    intensity_range: list[float] | None
    intensity: float


@attrs.frozen
class DialCluster(ModelRequest):
    """The cluster's persistent dial, within [0, its cap]; an active cluster re-applies at once."""

    name: str
    intensity: float


@attrs.frozen
class DeleteCluster:
    name: str


@attrs.frozen
class ListCircuits:
    pass


@attrs.frozen
class GetCircuit:
    name: str


@attrs.frozen
class ImportCircuit(ModelRequest):
    """A circuit: members per layer, each steered through the SAE attached at its layer."""

    name: str
    description: str
    rung: int  # the evidence rung, 0–3 (steering_rules.RUNGS)
    layers: list[dict]  # [{"layer", "sae_id" (None: whichever is attached), "members", "labels"}]
    intensity_range: list[float] | None
    intensity: float
    slice_fallback: str | None  # a cluster of the model's that steers while a member layer is unbound


@attrs.frozen
class ActivateCircuit(ModelRequest):
    name: str


@attrs.frozen
class DialCircuit(ModelRequest):
    """The circuit's persistent dial, within [0, 2] (serving clamps it into its range)."""

    name: str
    intensity: float


@attrs.frozen
class DeleteCircuit:
    name: str


@attrs.frozen
class GetActiveCircuit(ModelRequest):
    pass


@attrs.frozen
class GetLock:
    pass


@attrs.frozen
class LockSteering(ModelRequest):
    """Lock the server to `model`: /v1/models lists it alone."""


@attrs.frozen
class UnlockSteering:
    pass


SteeringRequest = (
    GetSteering
    | AttachSAE
    | AttachDefaultSAE
    | DetachSAE
    | SetSteering
    | CalibrateSAEs
    | ConvertStrengths
    | DescribeSAE
    | ResolveRequestSteering
    | ListProfiles
    | GetProfile
    | CreateProfile
    | ImportProfile
    | UpdateProfile
    | DeleteProfile
    | ActivateProfile
    | ListClusters
    | GetCluster
    | ImportCluster
    | DialCluster
    | DeleteCluster
    | ListCircuits
    | GetCircuit
    | ImportCircuit
    | ActivateCircuit
    | DialCircuit
    | DeleteCircuit
    | GetActiveCircuit
    | GetLock
    | LockSteering
    | UnlockSteering
)


@attrs.frozen
class SteeringState:
    """A model's steering as stored (store/steering.py's ModelSteering) and `serving`: what its
    active base is — {"kind", "name", "mode"?, "reason"?, "intensity"?}, with "rung" and
    "language" only while a circuit genuinely steers (steering_bases.serving); None: no base."""

    model: str
    version: int  # one more per change; 0: nothing was ever set
    enabled: bool
    saes: list[dict]  # {sae_id, source, path, layer, block, hook_point, width, d_in, architecture}
    strengths: dict[str, dict[str, float]]
    active: dict | None  # {"kind": "profile" | "circuit", "name"}
    serving: dict | None


@attrs.frozen
class Converted:
    """ConvertStrengths' answer: {sae_id: {feature: strength}} in the spec's ±200 scale."""

    strengths: dict[str, dict[str, float]]


@attrs.frozen
class SAEDescription:
    """DescribeSAE's answer: the SAE's record (as a state lists it) and ‖W_dec[i]‖ for every feature."""

    sae: dict
    decoder_norms: list[float]


@attrs.frozen
class ResolvedSteering:
    """A chat request's steering: the strengths its forwards use ({}: unsteered), the λ to echo
    in X-miLLM-Steering-Intensity (None: no echo), and a circuit's rung when one genuinely
    steers it (X-miLLM-Circuit-Rung)."""

    strengths: Strengths
    intensity: float | None
    rung: int | None


# The coordinator's documents: a profile, a cluster's or circuit's summary, a listing. The store
# keeps its own records (JSON in SQLite, feature ids as decimal strings); these are what crosses
# to the front end, feature ids as ints, and http/manage/steering_api.document writes their JSON.


@attrs.frozen
class SAEIdentity:
    """An SAE a profile was made with, as it was attached (an import compares them)."""

    sae_id: str
    source: str
    layer: int
    hook_point: str
    width: int
    d_in: int
    architecture: str


@attrs.frozen
class ClusterSettings:
    """A cluster's own part of its profile: the SAE its members belong to and the dial."""

    sae_id: str
    intensity: float
    intensity_range: list[float] | None
    labels: dict[int, str]  # feature → label


@attrs.frozen
class Profile:
    name: str
    model: str
    description: str
    strengths: dict[str, dict[int, float]]  # SAE id → feature → strength
    saes: list[SAEIdentity]
    created_at: int
    updated_at: int
    cluster: ClusterSettings | None  # None: a plain profile


@attrs.frozen
class Profiles:
    profiles: list[Profile]


@attrs.frozen
class Member:
    """A feature of a cluster or a circuit layer."""

    feature: int
    strength: float
    label: str | None = None  # None: unlabelled (left out of the JSON)


@attrs.frozen
class ClusterSummary:
    name: str
    model: str
    description: str
    sae_id: str
    members: list[Member]
    intensity: float
    intensity_range: list[float] | None
    active: bool
    created_at: int
    updated_at: int


@attrs.frozen
class Clusters:
    clusters: list[ClusterSummary]


@attrs.frozen
class CircuitLayer:
    layer: int
    sae_id: str | None  # None: the SAE attached at the layer, once one is
    members: list[Member]


@attrs.frozen
class CircuitSummary:
    """A circuit; one whose stored definition no longer parses has `unparseable` (the reason)
    and none of the definition's fields."""

    name: str
    model: str
    active: bool
    intensity: float
    created_at: int
    updated_at: int
    unparseable: str | None = None
    description: str | None = None
    rung: int | None = None
    language: str | None = None
    layers: list[CircuitLayer] | None = None
    intensity_range: list[float] | None = None
    slice_fallback: str | None = None


@attrs.frozen
class Circuits:
    circuits: list[CircuitSummary]


SteeringDocument = Profile | Profiles | ClusterSummary | Clusters | CircuitSummary | Circuits
Summary = ClusterSummary | CircuitSummary


@attrs.frozen
class Dialled:
    """A moved dial: the cluster's or circuit's summary, and the model's new state if it was active."""

    summary: Summary
    state: SteeringState | None


@attrs.frozen
class Deleted:
    """A deleted profile, cluster or circuit, and the model's new state if it steered through
    it (it was the active base, or the active circuit's slice_fallback): a deleted document
    never steers."""

    name: str
    state: SteeringState | None


@attrs.frozen
class ActiveCircuit:
    """GET /api/circuits/active, per model: the active circuit's summary (None: none), how it
    serves and why not, and `steering` ({rung, language, header, intensity, layers}) only while
    it genuinely steers."""

    model: str
    circuit: CircuitSummary | None
    serving_mode: str | None
    reason: str | None
    steering: dict | None


@attrs.frozen
class SteeringLock:
    model: str | None  # None: unlocked


SteeringAnswer = (
    SteeringState
    | Converted
    | SAEDescription
    | ResolvedSteering
    | Dialled
    | Deleted
    | ActiveCircuit
    | SteeringLock
    | SteeringDocument
)


@attrs.frozen
class SteeringCall:
    """One request to the coordinator; the request's own class is its kind (the handler it runs)."""

    rid: str
    request: SteeringRequest


@attrs.frozen
class SteeringReply:
    rid: str
    answer: SteeringAnswer


@attrs.frozen
class StatusQuery:
    rid: str


# engine actor → front end
@attrs.frozen
class Admitted:
    """Every row passed validation and is tokenised; a stream may start."""

    rid: str
    prompt_tokens: int  # summed over rows (each prompt counted once, whatever n)
    truncated: Truncated | None = None  # what Generate.fit cut
    as_is: bool = False  # no chat template: the last message was rendered as it is
    # the seed drawn for a request sent without one, where its lane reproduces seeds (the answer's
    # X-Greenroom-Drawn-Seed: sent back as the seed, it reproduces the answer); None: none drawn
    drawn_seed: int | None = None
    # prompts with SamplingParams.logprobs: each row's length in characters, where its text_offset starts
    prompt_chars: list[int] | None = None


@attrs.frozen
class GenerationStats:
    """The engine actor's own figures of one choice, on its finishing Text (for x_needle and
    Ollama's durations): the summed log-probability of its tokens (None: the engine reports
    none), its time to first token, decoding and queueing, its compute time, and the actor's
    peak resident memory."""

    logprob_sum: float | None
    prefill_s: float
    decode_s: float
    queue_wait_s: float
    compute_s: float
    peak_rss_mb: float


@attrs.frozen
class Text:
    rid: str
    index: int  # the choice
    text: str
    completion_tokens: int
    finish_reason: str | None = None
    stats: GenerationStats | None = None  # on the finishing event
    sae_activations: Activations | None = None  # on the finishing event of a request with sae_activations
    monitor: MonitorRecord | None = None  # on the finishing event of a monitored choice
    stop: str | None = None  # on the finishing event: the stop string that ended the choice, if one did
    # with SamplingParams.logprobs: the tokens since the previous event, each [id, text, log-probability,
    # [[id, text, log-probability] of the most probable at its position, …]] (engines/generation.py's Delta.token)
    logprobs: list | None = None


@attrs.frozen
class Embedded:
    rid: str
    vectors: list[bytes]  # float32, little-endian, one per input
    prompt_tokens: int


@attrs.frozen
class ScoredRow:
    token: list | None  # [id, text, utf-8 bytes]; None: nothing scored after the prompt (Score.next_token)
    logprob: float | None
    top: list[list]  # [[id, text, utf-8 bytes, logprob], …], most probable first
    prompt_tokens: int
    prompt_chars: int  # length of the prompt's text: OpenAI's text_offset of the answer
    prompt_text: str | None = None  # with Score.echo
    # with Score.echo_logprobs: each prompt token [id, text, logprob, [[id, text, logprob], …]] — the first
    # with logprob and alternatives None (nothing predicts it)
    prompt: list[list] | None = None


@attrs.frozen
class Scores:
    rid: str
    rows: list[ScoredRow]
    # with the request's sae_activations: as Text's, read_point "unsteered"
    sae_activations: Activations | None = None


@attrs.frozen
class Tokenized:
    rid: str
    tokens: list[int]
    context_length: int  # the model's window (vLLM's max_model_len)
    text: str | None = None  # the detokenised text of Tokenize.token_ids
    token_strs: list[str] | None = None  # with Tokenize.token_strs


@attrs.frozen
class TextFeatures:
    """One text of a ReadFeatures: its tokens, each feature's mean activation over its positions
    after the first (an attention sink), and per position its `top_k` active features."""

    tokens: list[int]
    token_texts: list[str]
    mean: bytes  # float32, little-endian, one per feature
    top: list[list[list]]  # per position [[index, value], …], largest first


@attrs.frozen
class FeaturesRead:
    rid: str
    rows: list[TextFeatures]


@attrs.frozen
class Loading:
    """A Load has entered a long stage: "converting" (a GGUF file into the transformers engine's
    checkpoint, once: 25 s to minutes). Done or Failed follows."""

    rid: str
    stage: str


@attrs.frozen
class Done:
    """A Load (with the model's info) or an Unload (info None) has completed."""

    rid: str
    info: ModelInfo | None = None


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
    update's when it could not apply it) and each attached SAE's calibrated ρ_L (what the
    coordinator records, CalibrateSAEs)."""

    rid: str
    version: int
    residual_norms: dict[str, float] = attrs.Factory(dict)


@attrs.frozen
class Events:
    events: list[
        Admitted
        | Text
        | Embedded
        | Scores
        | Tokenized
        | FeaturesRead
        | Loading
        | Done
        | Failed
        | Status
        | Steered
        | SteeringReply
    ]


class EventBatch:
    """The events the engine actor gathers for one `Events` message, each request's choice one
    Text: its texts joined (the later's count and ending, their reported tokens together), where
    the first came. The front end's cost goes by the Text (decoded, routed, queued), and a message
    carries every step since the previous one: one stream of the tiny demo makes about six a
    message, a GPU's batch several.

    A running text (`text`: no ending, nothing on it but its words) is kept as its wire row,
    joined in place: no Text made, evolved or unstructured per token — at 32 tiny streams, ~8 µs
    of the worker's CPU per token (a Text, `attrs.evolve` per join, cattrs) against ~0.4 µs."""

    __slots__ = ("items", "_rows")

    def __init__(self):
        self.items: list = []  # events, and running texts' rows (wire form)
        self._rows: dict = {}  # (rid, choice) → its running text's place in `items`

    def __len__(self) -> int:
        return len(self.items)

    def text(self, rid: str, index: int, text: str, completion_tokens: int, logprobs: list | None) -> None:
        """A running text (`logprobs` as Text.logprobs)."""
        at = self._rows.get((rid, index))
        if at is None:
            self._rows[rid, index] = len(self.items)
            self.items.append([rid, index, text, completion_tokens, logprobs])
            return
        row = self.items[at]
        row[2] += text
        row[3] = completion_tokens
        if logprobs is not None:
            row[4] = logprobs if row[4] is None else row[4] + logprobs

    def add(self, event) -> None:
        """Any event; a Text joins its choice's running text, in that text's place."""
        if isinstance(event, Text) and (at := self._rows.pop((event.rid, event.index), None)) is not None:
            row = self.items[at]
            logprobs = None if row[4] is None and event.logprobs is None else (row[4] or []) + (event.logprobs or [])
            self.items[at] = attrs.evolve(event, text=row[2] + event.text, logprobs=logprobs)
            return
        self.items.append(event)


def _running(text: Text) -> bool:
    """Whether `text` crosses as a row: nothing on it but its words (and reported tokens)."""
    return (
        text.finish_reason is None
        and text.stats is None
        and text.sae_activations is None
        and text.monitor is None
        and text.stop is None
    )


def events_wire(items: list) -> dict:
    """The wire form of an Events message of `items` (events, or an EventBatch's rows).
    Packed: tractor formats every message it receives into log f-strings, its log level whatever
    (runtime._packets quiets them); a running text is a row, [rid, choice, text, tokens, logprobs]."""
    out = []
    for item in items:
        if type(item) is list:
            out.append(item)
        elif type(item) is Text and _running(item):
            out.append([item.rid, item.index, item.text, item.completion_tokens, item.logprobs])
        else:
            out.append(to_wire(item))
    return {"t": "Events", "packed": msgspec.msgpack.encode(out)}


# worker host ↔ main host: the worker link's control messages (hosts/link.py frames them, over TLS)
@attrs.frozen
class Join:
    """Worker → main, first on a control connection: the host's name, the engine actors it offers."""

    host: str
    actors: list[str]
    pid: int  # the worker's root process: its actors' parent


@attrs.frozen
class JoinPipe:
    """Worker → main, first on a pipe connection: it carries the bytes of tractor connection `pipe`."""

    host: str
    pipe: str


@attrs.frozen
class Joined:
    """Main → worker: admitted."""


@attrs.frozen
class Refused:
    reason: str


@attrs.frozen
class Spawn:
    """Main → worker: start engine actor `actor` (its bare name on the worker) serving `module`."""

    actor: str
    module: str


@attrs.frozen
class Spawned:
    actor: str
    pid: int
    port: int  # its tractor port, on the worker's loopback: reached only through a pipe


@attrs.frozen
class SpawnFailed:
    actor: str
    error: str


@attrs.frozen
class Exited:
    """Worker → main: an actor's process is gone (supervision restarts it through Spawn)."""

    actor: str
    code: int | None


@attrs.frozen
class Stop:
    actor: str


@attrs.frozen
class OpenPipe:
    """Main → worker: dial a pipe connection for `pipe` and join it to the actor port `port`."""

    pipe: str
    port: int


@attrs.frozen
class Ping:
    """Either way, every second: silence past the timeout means the other host is lost."""


@attrs.frozen
class Bye:
    """Main → worker: the main host is shutting down; the worker stops its actors and exits."""

    reason: str


_TAGS: dict[str, type] = {
    c.__name__: c
    for c in (
        Generate,
        Embed,
        Score,
        Tokenize,
        ReadFeatures,
        StartDashboards,
        Load,
        Unload,
        Cancel,
        StatusQuery,
        Admitted,
        Text,
        Embedded,
        Scores,
        Tokenized,
        FeaturesRead,
        Loading,
        Done,
        Failed,
        Status,
        SteerUpdate,
        SteeringCall,
        Steered,
        SteeringReply,
        Join,
        JoinPipe,
        Joined,
        Refused,
        Spawn,
        Spawned,
        SpawnFailed,
        Exited,
        Stop,
        OpenPipe,
        Ping,
        Bye,
    )
}
_conv = cattrs.Converter()
_conv.register_structure_hook(Dial | None, lambda value, _: value)  # checked by the front end
configure_tagged_union(SteeringRequest, _conv, tag_name="t")
configure_tagged_union(SteeringAnswer, _conv, tag_name="t")
configure_tagged_union(Constraint, _conv, tag_name="t")
configure_tagged_union(Summary, _conv, tag_name="t")
# an optional field of a tagged union carries the tag too (cattrs would otherwise guess the class by its keys)
_conv.register_unstructure_hook(Constraint | None, lambda value: value and _conv.unstructure(value, Constraint))
_conv.register_structure_hook(Constraint | None, lambda value, _: value and _conv.structure(value, Constraint))
_conv.register_structure_hook(
    Positions, lambda value, _: value if isinstance(value, str) else _conv.structure(value, Span)
)


def to_wire(msg: Any) -> dict:
    if isinstance(msg, Events):
        return events_wire(msg.events)
    d = _conv.unstructure(msg)
    d["t"] = type(msg).__name__
    return d


def from_wire(d: dict) -> Any:
    tag = d["t"]
    if tag == "Events":  # a row is a running text (events_wire): one call, positional
        return Events(
            [
                Text(e[0], e[1], e[2], e[3], None, None, None, None, None, e[4]) if type(e) is list else from_wire(e)
                for e in msgspec.msgpack.decode(d["packed"])
            ]
        )
    return _conv.structure({k: v for k, v in d.items() if k != "t"}, _TAGS[tag])
