"""return_sae_activations on chat and text completions (spec: "Per-request SAE
activations"): the field's values, its refusals before anything is generated, and the
response's `millm` object.

Which SAEs are attached, and how wide they are, is the steering coordinator's state. The
worst-case cap (positions × top_k, max_tokens counted in full) needs the prompt's token
count, so the engine actor checks it when it admits the request: still a 400 before any
token is generated (engines/steering.py, `Steering.readout`).
"""

from __future__ import annotations

import attrs

from greenroom.engines.base import SAE_ACTIVATIONS_MAX_TOP_K, Activations, Positions, ReadoutRequest, Span
from greenroom.errors import GreenroomError
from greenroom.http.core.contracts import Choice, ListOf
from greenroom.http.core.objects import COUNT, FLOAT, TEXT, Object, or_null
from greenroom.protocol import Generate, GetSteering, Score, Text
from greenroom.supervisor.tree import Tree

FIELD = "return_sae_activations"
KEYS = ("sae_id", "features", "top_k", "positions", "read_point")
POSITIONS = ("last", "prompt", "completion", "all")
READ_POINTS = ("post_steering", "pre_steering")
DEFAULT_TOP_K = 8
DEFAULT_POSITIONS = "last"
NOTES = {
    "post_steering": "post_steering is what the model computed at this layer for this request; it is not an "
    "unsteered counterfactual: steering at earlier layers, and tokens generated under steering, "
    "still shape the residual at this layer.",
    "pre_steering": "pre_steering removes only this layer's own steering delta; it is not an unsteered "
    "counterfactual: steering at earlier layers, and tokens generated under steering, still shape "
    "the residual at this layer.",
    "unsteered": "A scoring request runs with every SAE hook suppressed: these are the unsteered model's "
    "activations at this layer, whatever steering is live.",
}

MILLM = Object(
    name="Millm",
    fields={
        "sae_activations": Object(
            name="SaeActivations",
            fields={
                "sae_id": TEXT,
                "layer": COUNT,
                "read_point": Choice(
                    values=(*READ_POINTS, "unsteered"),
                    description="unsteered on a scoring request, whose pass runs with every SAE hook suppressed",
                ),
                "positions": ListOf(
                    items=Object(
                        name="PositionRead",
                        fields={
                            "position": COUNT,
                            "token_id": or_null(COUNT, "null: a position past the tokens fed"),
                            "features": ListOf(
                                items=Object(
                                    name="FeatureValue",
                                    fields={
                                        "index": COUNT,
                                        "value": FLOAT,
                                        "label": attrs.evolve(TEXT, description="Its label, where one is set"),
                                    },
                                    optional=("label",),
                                )
                            ),
                        },
                    ),
                    description="The positions actually read (the last sampled token is never fed back, so it has none)",
                ),
                "note": TEXT,
            },
        )
    },
)
SAE_ACTIVATIONS = MILLM.fields["sae_activations"]


async def attach(tree: Tree, value, gen: Generate | Score, several: bool = False) -> Generate | Score:
    """`gen` carrying the validated field (`value`, as sent: its callers call this only when it
    was); every refusal a typed 400. `several`: extra_messages were sent. On a scoring request the
    pass is unsteered, and so is what it reads: read_point is reported as "unsteered"."""
    if not isinstance(value, dict):
        raise GreenroomError("invalid_parameter", f"'{FIELD}' must be an object with {', '.join(KEYS)}", FIELD)
    unknown = [k for k in value if k not in KEYS]
    if unknown:
        raise GreenroomError(
            "invalid_parameter",
            f"'{FIELD}.{unknown[0]}' is not a field of {FIELD} ({', '.join(KEYS)})",
            f"{FIELD}.{unknown[0]}",
        )
    # one position axis: one prompt or conversation, one choice
    if several:
        _refuse("extra_messages", "extra_messages gives several conversations")
    if gen.rows > 1:
        _refuse("prompt", "several prompts have no single position axis")
    if gen.n > 1:
        _refuse("n", "n > 1 gives several sequences")
    top_k = _top_k(value.get("top_k"))
    positions = _positions(value.get("positions"))
    read_point = value.get("read_point", "post_steering")
    if read_point not in READ_POINTS:
        raise GreenroomError(
            "invalid_parameter", f"'{FIELD}.read_point' must be one of {', '.join(READ_POINTS)}", f"{FIELD}.read_point"
        )
    sae = await _sae(tree, gen.model, value.get("sae_id"))
    features = _features(value.get("features"), sae)
    return attrs.evolve(gen, sae_activations=ReadoutRequest(sae["sae_id"], features, top_k, positions, read_point))


def millm(activations: Activations) -> dict:
    """The response's `millm` object from the engine's readout (a feature's label where it has one)."""
    read = attrs.asdict(activations)
    for position in read["positions"]:
        for feature in position["features"]:
            if feature["label"] is None:
                del feature["label"]
    return MILLM.build(sae_activations=SAE_ACTIVATIONS.build(**read, note=NOTES[activations.read_point]))


def labelled(tree: Tree, gen: Generate, events):
    """`events` of a request that asked for a readout, its features carrying their labels."""
    return _Labelled(tree, gen.model, events)


def with_labels(tree: Tree, model: str, event):
    """`event` (a generation's finishing Text, or Scores) with its readout's features carrying
    their labels (the user's, PUT /api/saes/{sae_id}/features/{index}/label); as it was where
    it has no readout or none of its SAE's features is labelled."""
    read = event.sae_activations
    labels = tree.dashboards.labels(model, read.sae_id) if read is not None else None
    if not labels:
        return event
    positions = [
        attrs.evolve(p, features=[attrs.evolve(f, label=labels.get(f.index)) for f in p.features])
        for p in read.positions
    ]
    return attrs.evolve(event, sae_activations=attrs.evolve(read, positions=positions))


class _Labelled:
    """A request's events (engine_client.RequestEvents), its readout's features labelled on their way past."""

    def __init__(self, tree: Tree, model: str, events):
        self._tree, self._model, self._events = tree, model, events

    def __aiter__(self):
        return self

    async def __anext__(self):
        return self._label(await self._events.__anext__())

    def ready(self) -> list:
        return [self._label(event) for event in self._events.ready()]

    def _label(self, event):
        return with_labels(self._tree, self._model, event) if isinstance(event, Text) else event


def _refuse(param: str, why: str) -> None:
    raise GreenroomError(
        "field_not_honoured", f"'{FIELD}' reads one sequence: {why}; send one prompt or conversation and n: 1", param
    )


def _top_k(value) -> int:
    if value is None:
        return DEFAULT_TOP_K
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GreenroomError("invalid_parameter", f"'{FIELD}.top_k' must be a positive integer", f"{FIELD}.top_k")
    if value > SAE_ACTIVATIONS_MAX_TOP_K:
        raise GreenroomError(
            "invalid_parameter",
            f"'{FIELD}.top_k' is at most SAE_ACTIVATIONS_MAX_TOP_K ({SAE_ACTIVATIONS_MAX_TOP_K}), got {value}",
            f"{FIELD}.top_k",
        )
    return value


def _positions(value) -> Positions:
    if value is None:
        return DEFAULT_POSITIONS
    if value in POSITIONS:
        return value
    if (
        isinstance(value, dict)
        and value.keys() == {"start", "end"}
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values())
        and 0 <= value["start"] < value["end"]
    ):
        return Span(value["start"], value["end"])
    raise GreenroomError(
        "invalid_parameter",
        f"'{FIELD}.positions' must be one of {', '.join(POSITIONS)} or "
        '{"start": int, "end": int} with 0 ≤ start < end (half-open)',
        f"{FIELD}.positions",
    )


async def _sae(tree: Tree, model: str, sae_id) -> dict:
    """The attached SAE the request reads: the one named, or the only one."""
    if sae_id is not None and not isinstance(sae_id, str):
        raise GreenroomError("invalid_parameter", f"'{FIELD}.sae_id' must be a string", f"{FIELD}.sae_id")
    return await attached_sae(tree, model, sae_id, f"{FIELD}.sae_id", ambiguous="invalid_parameter")


async def attached_sae(tree: Tree, model: str, sae_id: str | None, param: str, ambiguous: str) -> dict:
    """The SAE `sae_id` attached to `model` (the coordinator's state), or left out the only one;
    refusals name `param`: sae_not_attached, or `ambiguous` naming the candidates."""
    attached = (await tree.steering(GetSteering(model))).saes
    names = [s["sae_id"] for s in attached]
    if sae_id is None:
        if len(attached) == 1:
            return attached[0]
        if attached:
            raise GreenroomError(
                ambiguous,
                f"several SAEs are attached to model {model!r}; name one with '{param}': {', '.join(names)}",
                param,
            )
        raise GreenroomError(
            "sae_not_attached", f"no SAE is attached to model {model!r} (POST /api/saes/attach)", param
        )
    for sae in attached:
        if sae["sae_id"] == sae_id:
            return sae
    raise GreenroomError(
        "sae_not_attached",
        f"no SAE named {sae_id!r} is attached to model {model!r} (attached: {', '.join(names) or 'none'})",
        param,
    )


def _features(value, sae: dict) -> list[int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    ):
        raise GreenroomError(
            "invalid_parameter", f"'{FIELD}.features' must be a non-empty array of feature indices", f"{FIELD}.features"
        )
    width = sae["width"]
    for i in value:
        if not 0 <= i < width:
            raise GreenroomError(
                "invalid_feature_index",
                f"feature {i} is outside SAE {sae['sae_id']!r} (width {width}: 0–{width - 1})",
                f"{FIELD}.features",
            )
    return sorted(set(value))
