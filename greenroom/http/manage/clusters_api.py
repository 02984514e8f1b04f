"""Clusters and circuits: imported steering documents with an intensity dial (spec:
"Intensity coupling", "X-miLLM-Circuit-Rung"). JSON under /api/, OpenAI's error envelope.

- A **cluster** is a set of members (feature, strength, label) of one attached SAE, with an
  optional `intensity_range` and a persistent dial (the Clusters page's slider). It is a
  profile too: `profile: "<cluster>"` on a chat request uses it, dialled.
- A **circuit** has members per layer (each steered through the SAE attached at that layer),
  an evidence `rung` (0–3), an optional `intensity_range`, a dial, and optionally a backing
  cluster (`slice_fallback`) that steers while some member layer has no SAE.

Activating either makes it the model's active base: its dialled strengths become the live
steering (a versioned write pushed to the engines, as PUT /api/steering is). Moving the dial
of the active one re-applies at once. Every answer that changes live steering carries the
state with its `version` and `live`. This module owns the routes, the documents' shapes and
their export (`document`); the coordinator (actors/steering_actor.py) checks what depends on
the SAEs attached.
"""

from __future__ import annotations

import math

import attrs
from quart import Quart, request

from greenroom import steering_rules as rules
from greenroom.engines.base import STRENGTH_MAX
from greenroom.errors import GreenroomError
from greenroom.http.core import routes
from greenroom.http.core.contracts import INT64, AnyOf, Choice, ListOf, Number, Schema, Shape, Text
from greenroom.http.manage.steering_api import (
    COEFFICIENT,
    DESCRIPTION,
    MODEL,
    PROFILE_NAME,
    SAE_ID,
    delete,
    document_json,
    given_strength,
    in_percent,
    name_and_description,
    read_body,
    state_json,
    write,
)
from greenroom.http.openai import openai_params
from greenroom.protocol import (
    ActivateCircuit,
    ActivateProfile,
    DeleteCircuit,
    DeleteCluster,
    DialCircuit,
    DialCluster,
    GetActiveCircuit,
    GetCircuit,
    GetCluster,
    GetSteering,
    ImportCircuit,
    ImportCluster,
    ListCircuits,
    ListClusters,
)
from greenroom.supervisor.tree import Tree

CLUSTER_FORMAT = "greenroom.cluster.v1"
CIRCUIT_FORMAT = "greenroom.circuit.v1"
MAX_MEMBERS = 64  # per cluster, and per circuit layer
MAX_LAYERS = 16
LABEL_MAX = 200

# --- request shapes (contracts.py) --------------------------------------------------------

DIAL = Number(lo=rules.ENVELOPE[0], hi=rules.ENVELOPE[1])
_MEMBER = Shape(
    fields={
        "feature": Number(lo=0, hi=INT64[1], integer=True),
        "strength": AnyOf(
            options=(
                Number(lo=-STRENGTH_MAX, hi=STRENGTH_MAX, nonzero=True),
                attrs.evolve(
                    COEFFICIENT,
                    fields={"coefficient": attrs.evolve(COEFFICIENT.fields["coefficient"], nonzero=True)},
                ),
            ),
            description=f'Non-zero: within ±{STRENGTH_MAX:g}, or {{"coefficient": c}} in SAELens\' unit',
        ),
        "label": Text(max_length=LABEL_MAX),
    },
    required=("feature", "strength"),
    closed=True,
)


def _listed(where: str) -> ListOf:
    return ListOf(
        items=_MEMBER,
        min_items=1,
        max_items=MAX_MEMBERS,
        description=f"1–{MAX_MEMBERS} members, each feature once, strengths non-zero; {where}",
    )


_DOCUMENT = {
    "name": PROFILE_NAME,
    "model": MODEL,
    "description": DESCRIPTION,
    "intensity_range": Schema(
        schema={  # rules.check_range
            "type": "array",
            "minItems": 2,
            "maxItems": 2,
            "items": {"type": "number", "minimum": rules.ENVELOPE[0]},
            "prefixItems": [{"type": "number", "minimum": rules.ENVELOPE[0], "maximum": rules.ENVELOPE[1]}],
        },
        description=f"[low, high], 0 ≤ low ≤ high, low ≤ {rules.ENVELOPE[1]:g}; intersected with the [0, 2] envelope",
    ),
    "intensity": attrs.evolve(DIAL, default=1.0, description="The persistent dial"),
}
CLUSTER = Shape(
    fields={
        "format": Choice(values=(CLUSTER_FORMAT,)),
        **_DOCUMENT,
        "sae_id": attrs.evolve(SAE_ID, description="The attached SAE the members belong to"),
        "members": _listed("each inside the SAE's width"),
    },
    required=("format", "name", "model", "sae_id", "members"),
    closed=True,
)
_LAYER = Shape(
    fields={
        "layer": Number(lo=0, hi=INT64[1], integer=True),
        "sae_id": attrs.evolve(
            SAE_ID,
            description="The SAE the members were authored against; left out: whichever SAE is attached at that layer",
        ),
        "members": _listed("checked against the SAE attached at that layer, if any"),
    },
    required=("layer", "members"),
    closed=True,
)
CIRCUIT = Shape(
    fields={
        "format": Choice(values=(CIRCUIT_FORMAT,)),
        **_DOCUMENT,
        "rung": Choice(
            values=tuple(sorted(rules.RUNGS)),
            description="The evidence rung: " + ", ".join(f"{k} {v}" for k, v in sorted(rules.RUNGS.items())),
        ),
        "layers": ListOf(
            items=_LAYER, min_items=1, max_items=MAX_LAYERS, description="Members per layer, each layer once"
        ),
        "slice_fallback": attrs.evolve(
            PROFILE_NAME,
            description="A cluster of the same model that steers while some "
            "member layer has no SAE attached (under the cluster rule, with no rung)",
        ),
    },
    required=("format", "name", "model", "rung", "layers"),
    closed=True,
)
INTENSITY = Shape(fields={"intensity": DIAL}, required=("intensity",), closed=True)


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "GET", "/api/clusters")
    async def clusters():
        return document_json(await tree.steering(ListClusters()))

    @routes.view(app, "POST", "/api/clusters/import")
    async def import_cluster():
        body, model = await _document(tree, CLUSTER, CLUSTER_FORMAT)
        sae_id = body.get("sae_id")
        if not SAE_ID.matches(sae_id):
            raise GreenroomError.wrong(sae_id, "'sae_id' must name the attached SAE the members belong to", "sae_id")
        members, labels = _members(body.get("members"), "members")
        members = (await in_percent(tree, model, {sae_id: members}, "members"))[sae_id]
        return document_json(
            await tree.steering(
                ImportCluster(model, *name_and_description(body), sae_id, members, labels, *_dialled(body))
            )
        )

    @routes.view(app, "GET", "/api/circuits")
    async def circuits():
        return document_json(await tree.steering(ListCircuits()))

    @routes.view(app, "POST", "/api/circuits/import")
    async def import_circuit():
        body, model = await _document(tree, CIRCUIT, CIRCUIT_FORMAT)
        rung = body.get("rung")
        if isinstance(rung, bool) or not isinstance(rung, int) or rung not in CIRCUIT.fields["rung"].values:
            raise GreenroomError.wrong(
                rung, f"'rung' must be the circuit's evidence rung, one of {sorted(rules.RUNGS)}", "rung"
            )
        fallback = body.get("slice_fallback")
        if fallback is not None and not PROFILE_NAME.matches(fallback):
            raise GreenroomError("invalid_parameter", "'slice_fallback' must name a cluster", "slice_fallback")
        name, description = name_and_description(body)
        layers = await _layers_in_percent(tree, model, _layers(body.get("layers")))
        return document_json(
            await tree.steering(ImportCircuit(model, name, description, rung, layers, *_dialled(body), fallback))
        )

    @routes.view(app, "GET", "/api/circuits/active")
    async def active_circuit():
        """Per steerable model (`?model=`: that one), its active circuit and `steering`: present
        only while the circuit genuinely steers (what X-miLLM-Circuit-Rung reports), else null
        with the reason."""
        name = request.args.get("model")
        models = [tree.resolve(name)] if name else tree.steerable()
        return {"models": [document_json(await tree.steering(GetActiveCircuit(model))) for model in models]}

    for kind in KINDS:
        _named_routes(app, tree, kind)


@attrs.frozen
class Kind:
    """The requests behind /api/{name}s/<name>, one set per kind of document."""

    name: str  # cluster | circuit
    get: type
    delete: type
    dial: type
    activate: type


KINDS = (
    Kind("cluster", GetCluster, DeleteCluster, DialCluster, ActivateProfile),  # a cluster is a profile
    Kind("circuit", GetCircuit, DeleteCircuit, DialCircuit, ActivateCircuit),
)


def _named_routes(app: Quart, tree: Tree, kind: Kind) -> None:
    """/api/{kind}s/<name>: read, delete, the persistent dial (a cluster's within [0, its range's
    top, else the server's maximum]; a circuit's within [0, 2], clamped into its range when
    serving), and activation (its dialled strengths as the model's live steering)."""
    root = f"/api/{kind.name}s/{{name}}"

    async def summary(name: str):
        return await tree.steering(kind.get(name))

    async def read(name: str):
        return document_json(await summary(name))

    async def deleted(name: str):
        return await delete(tree, kind.delete(name))

    async def dial(name: str):
        body = await read_body(INTENSITY)
        if body.get("intensity") is None:
            raise GreenroomError("missing_parameter", "you must provide intensity", "intensity")
        model = (await summary(name)).model
        dialled = await tree.steering(kind.dial(model, name, _number(body, "intensity")))
        state = dialled.state  # the base is active: the live steering moved with it
        return {
            kind.name: document_json(dialled.summary),
            "state": None if state is None else state_json(state, await tree.push_model_steering(model, state)),
        }

    async def activated(name: str):
        return await write(tree, kind.activate((await summary(name)).model, name))

    async def export(name: str):
        return document(kind.name, document_json(await summary(name)))

    for method, path, view in (
        ("GET", root, read),
        ("DELETE", root, deleted),
        ("PUT", root + "/intensity", dial),
        ("POST", root + "/activate", activated),
        ("GET", root + "/export", export),
    ):
        routes.view(app, method, path)(view)


def document(kind: str, summary: dict) -> dict:
    """A cluster's or circuit's import document, from what GET /api/{kind}s/<name> answers:
    POST /api/{kind}s/import takes it back (here, or on a server with the same SAEs attached)."""
    if "unparseable" in summary:
        raise GreenroomError(
            "invalid_parameter",
            f"circuit {summary['name']!r} no longer parses ({summary['unparseable']}): there is nothing to export",
            "name",
        )
    fields = ("name", "model", "description", "intensity", "intensity_range") + (
        ("sae_id", "members") if kind == "cluster" else ("rung", "layers", "slice_fallback")
    )
    out = {
        "format": CLUSTER_FORMAT if kind == "cluster" else CIRCUIT_FORMAT,
        **{k: summary[k] for k in fields if summary[k] is not None},
    }
    if kind == "circuit":
        out["layers"] = [{k: v for k, v in layer.items() if v is not None} for layer in out["layers"]]
    return out


async def _document(tree: Tree, shape: Shape, expected: str) -> tuple[dict, str]:
    """An imported document (a closed `shape`) of the `expected` format, and the model it names."""
    body = await read_body(shape)
    if body.get("format") != expected:
        raise GreenroomError("invalid_parameter", f"'format' must be {expected!r}", "format")
    return body, tree.resolve(openai_params.model_name(body))


def _dialled(body: dict) -> tuple[list[float] | None, float]:
    """The document's intensity_range and dial (default 1)."""
    dial = 1.0 if body.get("intensity") is None else _number(body, "intensity")
    return rules.check_range(body.get("intensity_range"), "intensity_range"), dial


def _number(body: dict, key: str) -> float:
    value = body[key]
    if not (DIAL.holds(value) and math.isfinite(value)):
        raise GreenroomError("invalid_parameter", f"'{key}' must be a number from 0 to 2", key)
    return float(value)


def _members(value, where: str) -> tuple[dict[str, tuple[bool, float]], dict[str, str]]:
    """[{feature, strength, label?}] → ({feature: (is_coefficient, strength)}, {feature: label}),
    features as decimal strings like every strength map (steering_api.given_strength)."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_MEMBERS:  # _listed
        raise GreenroomError.wrong(
            value, f"'{where}' must list 1–{MAX_MEMBERS} members {{feature, strength, label?}}", where
        )
    strengths, labels = {}, {}
    for i, member in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(member, dict) or not set(_MEMBER.required) <= member.keys() <= _MEMBER.names:
            raise GreenroomError("invalid_parameter", f"'{at}' must be {{feature, strength, label?}}", at)
        feature, strength, label = member["feature"], member["strength"], member.get("label")
        if not _MEMBER.fields["feature"].holds(feature):
            raise GreenroomError(
                "invalid_feature_index",
                f"'{at}.feature' must be a feature index (a non-negative integer)",
                f"{at}.feature",
            )
        if str(feature) in strengths:
            raise GreenroomError("invalid_parameter", f"feature {feature} is listed twice", f"{at}.feature")
        given = given_strength(strength, f"{at}.strength", nonzero=True)
        if label is not None and not _MEMBER.fields["label"].matches(label):
            raise GreenroomError(
                "invalid_parameter", f"'{at}.label' must be a string of at most {LABEL_MAX} characters", f"{at}.label"
            )
        strengths[str(feature)] = given
        if label is not None:
            labels[str(feature)] = label
    return strengths, labels


async def _layers_in_percent(tree: Tree, model: str, layers: list[dict]) -> list[dict]:
    """A circuit's layers with coefficients converted through the SAE each layer names, else the
    one attached at that layer (a layer with none cannot convert: sae_not_attached)."""
    saes = None
    out = []
    for i, layer in enumerate(layers):
        at = f"layers[{i}]"
        if not any(c for c, _ in layer["members"].values()):
            out.append({**layer, "members": {f: v for f, (_, v) in layer["members"].items()}})
            continue
        saes = saes if saes is not None else (await tree.steering(GetSteering(model))).saes
        sae_id = layer["sae_id"] or next((s["sae_id"] for s in saes if s["layer"] == layer["layer"]), None)
        if sae_id is None:
            raise GreenroomError(
                "sae_not_attached",
                f"no SAE is attached at layer {layer['layer']} of {model!r}: its coefficients cannot be converted",
                f"{at}.layer",
            )
        members = await in_percent(tree, model, {sae_id: layer["members"]}, f"{at}.members")
        out.append({**layer, "members": members[sae_id]})
    return out


def _layers(value) -> list[dict]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LAYERS:  # CIRCUIT's layers
        raise GreenroomError.wrong(
            value, f"'layers' must list 1–{MAX_LAYERS} layers {{layer, sae_id?, members}}", "layers"
        )
    out, seen = [], set()
    for i, layer in enumerate(value):
        at = f"layers[{i}]"
        if not isinstance(layer, dict) or not set(_LAYER.required) <= layer.keys() <= _LAYER.names:
            raise GreenroomError("invalid_parameter", f"'{at}' must be {{layer, sae_id?, members}}", at)
        number, sae_id = layer["layer"], layer.get("sae_id")
        if not _LAYER.fields["layer"].holds(number) or number in seen:
            raise GreenroomError(
                "invalid_parameter", f"'{at}.layer' must be a layer number, each listed once", f"{at}.layer"
            )
        if sae_id is not None and not SAE_ID.matches(sae_id):
            raise GreenroomError("invalid_parameter", f"'{at}.sae_id' must name an SAE", f"{at}.sae_id")
        seen.add(number)
        members, labels = _members(layer["members"], f"{at}.members")
        out.append({"layer": number, "sae_id": sae_id, "members": members, "labels": labels})
    return out
