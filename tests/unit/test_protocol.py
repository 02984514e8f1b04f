"""The process protocol's typed payloads cross the wire as they are: each message, its nested
classes included, encodes with msgpack (as tractor and the worker link send it) and decodes
equal, each class of a tagged union under its own tag."""

import attrs
import msgspec
import pytest

from greenroom import steering_rules as rules
from greenroom.engines.base import (
    Activations,
    FeatureValue,
    JsonObjectConstraint,
    JsonSchemaConstraint,
    ModelInfo,
    MonitoredFeature,
    MonitorRecord,
    MonitorRequest,
    PositionRead,
    ReadoutRequest,
    SamplingParams,
    Span,
    ToolCallsConstraint,
)
from greenroom.engines.prompt_fit import Truncated
from greenroom.protocol import (
    Admitted,
    Done,
    EventBatch,
    Events,
    Failed,
    Generate,
    GenerationStats,
    ResolvedSteering,
    Score,
    ScoredRow,
    Scores,
    SteeringReply,
    SteerUpdate,
    Text,
    events_wire,
    from_wire,
    to_wire,
)

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# key order kept: the grammar lists properties in the schema's order
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
CONSTRAINTS = [
    JsonSchemaConstraint(SCHEMA),
    JsonObjectConstraint(),
    ToolCallsConstraint(TOOLS),
    ToolCallsConstraint(TOOLS, "add", parallel=False),
]
ACTIVATIONS = Activations(
    "sae",
    1,
    "post_steering",
    [PositionRead(4, 17, [FeatureValue(12, 1.5), FeatureValue(3, 0.25)]), PositionRead(5, None, [])],
)
MONITORED = MonitorRecord("sae", 1, 9, [MonitoredFeature(7, 2.0, 0.5)])
STATS = GenerationStats(
    logprob_sum=-1.25, prefill_s=0.01, decode_s=0.2, queue_wait_s=0.0, compute_s=0.21, peak_rss_mb=512.0
)


def crossed(message):
    """`message` as the other process reads it."""
    return from_wire(msgspec.msgpack.decode(msgspec.msgpack.encode(to_wire(message))))


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: type(c).__name__)
@pytest.mark.parametrize("positions", ["completion", Span(2, 6)], ids=["mode", "span"])
def test_a_generate_with_a_constraint_a_readout_and_a_monitor_crosses_equal(constraint, positions):
    gen = Generate(
        "chatcmpl-1",
        "m",
        SamplingParams(max_tokens=8, temperature=0.0),
        conversations=[[{"role": "user", "content": "hi"}]],
        constraint=constraint,
        sae_activations=ReadoutRequest("sae", [3, 12], 4, positions, "pre_steering"),
        monitor=MonitorRequest("sae", 8),
    )
    back = crossed(gen)
    assert back == gen
    assert type(back.constraint) is type(constraint) and type(back.sae_activations.positions) is type(positions)
    if isinstance(constraint, JsonSchemaConstraint):
        assert list(back.constraint.schema["properties"]) == ["b", "a"]


def test_a_constraint_travels_tagged_by_its_class():
    """Tagged, not guessed from its keys: an empty JsonObjectConstraint is told from the others."""
    assert [
        to_wire(Generate("r", "m", SamplingParams(), prompts=["x"], constraint=c))["constraint"]["t"]
        for c in CONSTRAINTS
    ] == [
        "JsonSchemaConstraint",
        "JsonObjectConstraint",
        "ToolCallsConstraint",
        "ToolCallsConstraint",
    ]
    assert to_wire(Generate("r", "m", SamplingParams(), prompts=["x"]))["constraint"] is None


def test_the_engine_values_cross_equal_inside_events():
    events = Events(
        [
            Admitted("r", 12, Truncated(messages=2, tokens=30)),
            Text("r", 0, "hi", 3, "stop", STATS, ACTIVATIONS, MONITORED),
            Text("r", 1, "", 2, "length", GenerationStats(None, 0.0, 0.0, 0.0, 0.0, 1.0)),
            Text("r", 2, "partial", 1),
            Scores("s", [ScoredRow([5, "a", b"a"], -0.5, [[5, "a", b"a", -0.5]], 6, 20)], ACTIVATIONS),
            Done("l", ModelInfo("m", "transformers", 2048, "float32", "cpu", 1000, "abc", "F32")),
            Done("g", ModelInfo("g", "llama.cpp", 4096, "Q4_1", "cpu", 1000, None, "Q4_1", 474_064_128)),
            Done("u"),
        ]
    )
    assert crossed(events) == events


def test_a_model_info_crosses_as_the_engine_session_sends_it():
    """The engine session's first message carries attrs.asdict of each ModelInfo; the supervisor
    rebuilds it with ModelInfo(**info) (supervision.py): the footprint survives both ways."""
    info = ModelInfo("g", "llama.cpp", 4096, "Q4_1", "cpu", 1000, None, "Q4_1", 474_064_128)
    assert ModelInfo(**attrs.asdict(info)) == info and ModelInfo(**attrs.asdict(info)).footprint_bytes == 474_064_128


def test_a_score_with_a_readout_crosses_equal():
    score = Score(
        "s", "m", 1.0, None, 5, prompts=["x"], sae_activations=ReadoutRequest("sae", None, 8, "last", "post_steering")
    )
    assert crossed(score) == score


def test_activations_keep_the_response_key_order():
    """The response's `millm.sae_activations` is the class's fields in order (http/pipeline/sae_activations.millm)."""
    wire = to_wire(Text("r", 0, "", 1, "stop", STATS, ACTIVATIONS, MONITORED))
    assert list(wire["sae_activations"]) == ["sae_id", "layer", "read_point", "positions"]
    assert wire["sae_activations"]["positions"][0] == {
        "position": 4,
        "token_id": 17,
        "features": [{"index": 12, "value": 1.5, "label": None}, {"index": 3, "value": 0.25, "label": None}],
    }
    assert list(wire["monitor"]) == ["sae_id", "layer", "positions", "features"]


def test_what_an_engine_steers_by_crosses_keyed_by_feature_index():
    """Feature indices reach the engine actor as ints (the documents' decimal strings are turned
    once, by the coordinator: steering_rules.indexed), their order kept."""
    strengths = rules.indexed({"sae": {"12": 50.0, "3": -20.0}, "other": {}})
    assert strengths == {"sae": {12: 50.0, 3: -20.0}, "other": {}}
    update = SteerUpdate("steer-1", "m", 3, True, {"sae": "/saes/sae"}, strengths)
    gen = Generate("r", "m", SamplingParams(), prompts=["x"], request_strengths=strengths)
    reply = Events([SteeringReply("c", ResolvedSteering(strengths, 0.5, 2))])
    for message in (update, gen, reply):
        assert crossed(message) == message
    assert list(crossed(update).strengths["sae"]) == [12, 3]


def test_an_events_message_merges_each_choices_texts_and_keeps_the_rest():
    """EventBatch (what the engine actor's outbox sends): one Text per request and choice, its
    text the texts joined in order, the last one's count, ending and figures, the reported
    tokens together; every other event, and other requests' texts, as they were; the running
    texts cross as rows and every one arrives equal to its Text."""
    batch = EventBatch()
    batch.add(Admitted("a", 3))
    batch.text("a", 0, "Once", 1, [[1, "Once", -0.1, []]])
    batch.text("b", 0, "x", 7, None)
    batch.text("a", 1, "It", 1, None)
    batch.text("a", 0, " upon", 2, [[2, " upon", -0.2, []]])
    batch.text("b", 0, "y", 8, None)
    batch.add(Text("a", 0, " a", 3, "length", STATS, stop=None, logprobs=[[3, " a", -0.3, []]]))
    batch.add(Failed("c", {"code": "x"}))
    sent = from_wire(msgspec.msgpack.decode(msgspec.msgpack.encode(events_wire(batch.items))))
    assert sent == Events(
        [
            Admitted("a", 3),
            Text(
                "a",
                0,
                "Once upon a",
                3,
                "length",
                STATS,
                logprobs=[[1, "Once", -0.1, []], [2, " upon", -0.2, []], [3, " a", -0.3, []]],
            ),
            Text("b", 0, "xy", 8),
            Text("a", 1, "It", 1),
            Failed("c", {"code": "x"}),
        ]
    )
    assert crossed(sent) == sent  # an Events of Texts: the running ones as rows
