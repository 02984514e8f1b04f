"""The steering coordinator's reasoning over stored state: it owns what a model's steering
comes from (its bases, `serving`), a chat request's resolution (`request`), the checks against
the SAEs attached now (strengths, SAE identities, a new circuit's members) and the summaries of
clusters and circuits the routes answer. It runs in the coordinator and reads the store, never
writes it (actors/steering_actor.py does); the dial rules themselves are steering_rules.py's.

A **base** is a plain profile, a cluster (a profile with an intensity range and a persistent
dial), a circuit (members per layer, one dial for all), or the live values set directly. The
model's *active* base is recorded beside its live values (store/steering.py); a request's base
is its `profile`, else the active base, else the live values (spec: "Intensity coupling").

A circuit serves in one of three ways, decided by the SAEs attached now:
- `circuit`: every member layer has an SAE attached (the one the document names, if it names
  one) and every member fits that SAE: each layer is steered through its own SAE, and
  responses carry X-miLLM-Circuit-Rung;
- `slice_fallback`: some member layer has no SAE, and the circuit names a backing cluster whose
  SAE is attached: the cluster steers, under the cluster rule, and no rung is claimed;
- not serving (nothing steers): `no_sae_attached` on any member layer, `layers_unbound`
  (some, with no usable fallback), `unparseable_definition` (a member past its SAE's width,
  or a stored definition that no longer parses).
"""

from __future__ import annotations

import time

import attrs

from greenroom import steering_rules as rules
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    CircuitLayer,
    CircuitSummary,
    ClusterSettings,
    ClusterSummary,
    Dial,
    ImportCircuit,
    Member,
    Profile,
    ResolvedSteering,
    SAEIdentity,
)
from greenroom.store.steering import ModelSteering, SteeringStore

LOCK = "steering_lock"  # the settings key of the model locked for steering


@attrs.frozen
class Base:
    kind: str  # live | profile | cluster | circuit | slice_fallback | not_serving
    name: str | None = None
    strengths: dict = attrs.Factory(dict)  # authored, before the dial
    declared: list[float] | None = None  # intensity_range
    dial: float = 1.0  # the persistent dial (plain profiles and live values: 1)
    rung: int | None = None  # a circuit's evidence rung
    reason: str | None = None  # why a circuit is not serving as one

    def lam(self, dial, limits: rules.Limits) -> float:
        """λ for a request's `dial` (None: the persistent one) under this base's rule."""
        if self.kind == "circuit":
            return rules.circuit_lambda(dial, self.dial, self.declared, limits)
        if dial is None and self.kind in ("live", "profile"):
            return 1.0  # undialled: the values as set
        return rules.cluster_lambda(dial, self.dial, self.declared, limits)

    def resolved(self, dial, limits: rules.Limits) -> dict:
        return rules.scaled(self.strengths, self.lam(dial, limits))


def profile_base(profile: dict, strengths: dict | None = None) -> Base:
    """`strengths`: the profile's, already checked against the attached SAEs."""
    strengths = profile["strengths"] if strengths is None else strengths
    cluster = profile.get("cluster")
    if cluster is None:
        return Base("profile", profile["name"], strengths)
    return Base("cluster", profile["name"], strengths, cluster["intensity_range"], cluster["intensity"])


def circuit_base(store: SteeringStore, state: ModelSteering, circuit: dict) -> Base:
    if "unparseable" in circuit:
        return Base("not_serving", circuit["name"], reason="unparseable_definition")
    by_layer = {sae["layer"]: sae for sae in state.saes}
    bound, missing = {}, 0
    for layer in circuit["layers"]:
        sae = by_layer.get(layer["layer"])
        if sae is None or layer["sae_id"] not in (None, sae["sae_id"]):
            missing += 1
            continue
        if any(int(f) >= sae["width"] for f in layer["members"]):
            return Base("not_serving", circuit["name"], reason="unparseable_definition")
        bound[sae["sae_id"]] = layer["members"]
    if not missing:
        return Base(
            "circuit", circuit["name"], bound, circuit["intensity_range"], circuit["intensity"], circuit["rung"]
        )
    fallback = store.profile(circuit["slice_fallback"]) if circuit["slice_fallback"] else None
    if fallback is not None and fallback.get("cluster") and fallback["model"] == state.model:
        try:
            strengths = checked_strengths(state, fallback)
        except GreenroomError:
            strengths = None  # its SAE is not attached as it was: no fallback either
        if strengths:  # the cluster's rule and range, under the circuit's dial
            return Base(
                "slice_fallback",
                circuit["name"],
                strengths,
                fallback["cluster"]["intensity_range"],
                circuit["intensity"],
            )
    return Base("not_serving", circuit["name"], reason="layers_unbound" if bound else "no_sae_attached")


def active_base(store: SteeringStore, state: ModelSteering) -> Base:
    """The model's active base, else the live values (deleting a base deactivates it, so an
    active one is always stored: `deleted`)."""
    active = state.active or {}
    if active.get("kind") == "circuit":
        circuit = store.circuit(active["name"])
        if circuit is not None:
            return circuit_base(store, state, circuit)
    elif active.get("kind") == "profile":
        profile = store.profile(active["name"])
        if profile is not None and profile.get("cluster") is None:
            return profile_base(profile, state.strengths)  # activation copied it into the live values
        if profile is not None:  # a cluster: an SAE detached since steers nothing
            held = {sae["sae_id"] for sae in state.saes}
            return profile_base(profile, {k: v for k, v in profile["strengths"].items() if k in held})
    return Base("live", None, state.strengths)


def deleted(store: SteeringStore, state: ModelSteering) -> bool:
    """Whether the model's active base is no longer stored (a store written by a greenroom that
    left a deleted base steering)."""
    active = state.active or {}
    lookup = {"circuit": store.circuit, "profile": store.profile}.get(active.get("kind"))
    return lookup is not None and lookup(active["name"]) is None


def serving(store: SteeringStore, state: ModelSteering, limits: rules.Limits) -> dict | None:
    """What a state answer says of the active base; `rung` only while a circuit genuinely steers
    (enabled, bound, a non-zero dial): the X-miLLM-Circuit-Rung of undialled requests."""
    if state.active is None:
        return None
    base = active_base(store, state)
    out = {"kind": base.kind, "name": base.name}
    if base.kind in ("circuit", "slice_fallback", "not_serving"):
        out = {
            "kind": "circuit",
            "name": base.name,
            "mode": None if base.kind == "not_serving" else base.kind,
            "reason": base.reason,
        }
    if base.kind in ("cluster", "circuit", "slice_fallback"):
        out["intensity"] = base.lam(None, limits)
    if base.kind == "circuit" and state.enabled and base.resolved(None, limits):
        out["rung"], out["language"] = base.rung, rules.RUNGS[base.rung]
    elif base.kind == "circuit" and out.get("reason") is None:
        out["reason"] = "steering_disabled" if not state.enabled else "intensity_off"
    return out


def request(
    store: SteeringStore, state: ModelSteering, name: str | None, dial: Dial | None, limits: rules.Limits
) -> ResolvedSteering:
    """The steering of a chat request with a `profile` or a `dial` (an undialled request without
    a profile is served by the live state, and its rung comes from `serving`). The spec's
    omissions: no echo without an SAE, for an unknown profile at λ 0, for a dial-only request
    while steering is disabled, or for an empty base; 0/"off" turns steering off without
    checking the base."""
    profile = store.profile(name) if name is not None else None
    off = dial == "off" or (dial is not None and not isinstance(dial, str) and dial == 0)
    if name is not None and profile is None and not off:
        raise GreenroomError("profile_not_found", f"no steering profile named {name!r}", "profile")
    if off:
        base = (
            (profile_base(profile) if profile is not None else None) if name is not None else active_base(store, state)
        )
        changes = bool(state.saes) and base is not None and bool(base.strengths) and (name is not None or state.enabled)
        return ResolvedSteering({}, 0.0 if changes else None, None)
    if not state.saes or (name is None and not state.enabled):  # nothing to steer with, or disabled
        return ResolvedSteering({}, None, None)
    base = profile_base(profile, checked_strengths(state, profile)) if name is not None else active_base(store, state)
    strengths = base.resolved(dial, limits)
    return ResolvedSteering(
        rules.indexed(strengths),
        base.lam(dial, limits) if dial is not None and base.strengths else None,
        base.rung if base.kind == "circuit" and strengths else None,
    )


# what names an SAE wherever it is attached: an imported profile's SAEs must match on these
SAE_IDENTITY = ("sae_id", "source", "layer", "hook_point", "width", "d_in", "architecture")
SAME_SAE = ("layer", "hook_point", "width", "d_in", "architecture")  # the source's path may differ per machine


def attached(state: ModelSteering, sae_id: str, param: str) -> dict:
    for sae in state.saes:
        if sae["sae_id"] == sae_id:
            return sae
    raise GreenroomError(
        "sae_not_attached",
        f"no SAE named {sae_id!r} is attached to {state.model!r} (attached: {[s['sae_id'] for s in state.saes]})",
        param,
    )


def checked(state: ModelSteering, strengths: dict, param: str | None = None) -> dict[str, dict[str, float]]:
    """`strengths` (their values checked by the front end, http/manage/steering_api.py) checked against
    the attached SAEs' widths; zeros are dropped (a zero steers nothing), so clearing a feature
    and never setting it read the same. `param`: what a refusal names instead of the request's
    strengths (a stored profile's are not sent)."""
    out = {}
    for sae_id, features in strengths.items():
        width = attached(state, sae_id, param or f"strengths.{sae_id}")["width"]
        for feature in features:
            if not (feature.isdigit() and int(feature) < width):
                raise GreenroomError(
                    "invalid_feature_index",
                    f"feature {feature!r} is outside SAE {sae_id!r} (width {width}: features 0–{width - 1})",
                    param or f"strengths.{sae_id}.{feature}",
                )
        live = {str(int(f)): float(s) for f, s in features.items() if s}
        if live:
            out[sae_id] = live
    return out


def checked_strengths(state: ModelSteering, profile: dict) -> dict[str, dict[str, float]]:
    """The profile's strengths checked against the SAEs attached to `state`'s model now
    (a profile invalid for them → 400; no SAE attached → none)."""
    if not state.saes:
        return {}
    if profile["model"] != state.model:
        raise GreenroomError(
            "invalid_parameter",
            f"profile {profile['name']!r} steers model {profile['model']!r}, not {state.model!r}",
            "profile",
        )
    for sae in profile["saes"]:
        held = attached(state, sae["sae_id"], "profile")
        differs = [k for k in SAME_SAE if sae[k] != held[k]]
        if differs:
            raise GreenroomError(
                "sae_not_attached",
                f"SAE {sae['sae_id']!r} attached to {state.model!r} is not the "
                f"one profile {profile['name']!r} was made with: its {', '.join(differs)} differ",
                "profile",
            )
    return checked(state, profile["strengths"], "profile")


# -- clusters and circuits --------------------------------------------------------------------


def profile_document(profile: dict) -> Profile:
    """A stored profile (feature ids as the store writes them, decimal strings) as the document."""
    cluster = profile["cluster"]
    return Profile(
        profile["name"],
        profile["model"],
        profile["description"],
        rules.indexed(profile["strengths"]),
        [SAEIdentity(**sae) for sae in profile["saes"]],
        profile["created_at"],
        profile["updated_at"],
        cluster
        and ClusterSettings(
            cluster["sae_id"],
            cluster["intensity"],
            cluster["intensity_range"],
            {int(f): label for f, label in cluster["labels"].items()},
        ),
    )


def cluster_summary(profile: dict, store: SteeringStore) -> ClusterSummary:
    cluster = profile["cluster"]
    return ClusterSummary(
        profile["name"],
        profile["model"],
        profile["description"],
        cluster["sae_id"],
        _members(profile["strengths"].get(cluster["sae_id"], {}), cluster["labels"]),
        cluster["intensity"],
        cluster["intensity_range"],
        store.get(profile["model"]).active == {"kind": "profile", "name": profile["name"]},
        profile["created_at"],
        profile["updated_at"],
    )


def circuit_summary(circuit: dict, store: SteeringStore) -> CircuitSummary:
    own = (
        circuit["name"],
        circuit["model"],
        store.get(circuit["model"]).active == {"kind": "circuit", "name": circuit["name"]},
        circuit["intensity"],
        circuit["created_at"],
        circuit["updated_at"],
    )
    if "unparseable" in circuit:
        return CircuitSummary(*own, unparseable=circuit["unparseable"])
    return CircuitSummary(
        *own,
        description=circuit["description"],
        rung=circuit["rung"],
        language=rules.RUNGS[circuit["rung"]],
        layers=[
            CircuitLayer(layer["layer"], layer["sae_id"], _members(layer["members"], layer["labels"]))
            for layer in circuit["layers"]
        ],
        intensity_range=circuit["intensity_range"],
        slice_fallback=circuit["slice_fallback"],
    )


def _members(strengths: dict[str, float], labels: dict[str, str]) -> list[Member]:
    return [Member(int(f), s, labels.get(f)) for f, s in strengths.items()]


def new_circuit(store: SteeringStore, state: ModelSteering, doc: ImportCircuit) -> dict:
    """The circuit to store for document `doc` (the front end checked its shape), checked: a name
    not taken, a backing cluster that exists for the same model, and members fitting the SAEs
    attached now at their layers (a layer with no SAE yet is checked when one is attached:
    until then it is unbound)."""
    if store.circuit(doc.name) is not None:
        raise GreenroomError("circuit_exists", f"a circuit named {doc.name!r} exists; delete it first", "name")
    fallback = doc.slice_fallback
    if fallback is not None:
        profile = store.profile(fallback)
        if profile is None or not profile.get("cluster") or profile["model"] != state.model:
            raise GreenroomError(
                "invalid_parameter",
                f"slice_fallback {fallback!r} is not a cluster of model {state.model!r} (import the cluster first)",
                "slice_fallback",
            )
    by_layer = {sae["layer"]: sae for sae in state.saes}
    for i, layer in enumerate(doc.layers):
        sae = by_layer.get(layer["layer"])
        if sae is None or layer["sae_id"] not in (None, sae["sae_id"]):
            continue
        for f in layer["members"]:
            if int(f) >= sae["width"]:
                raise GreenroomError(
                    "invalid_feature_index",
                    f"feature {f} is outside SAE {sae['sae_id']!r} at layer {layer['layer']} (width {sae['width']})",
                    f"layers[{i}].members",
                )
    now = int(time.time())
    return {**attrs.asdict(doc), "model": state.model, "created_at": now, "updated_at": now}
