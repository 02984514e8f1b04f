"""The steering coordinator: the one writer of the steering state (store/steering.py).

It owns what the steering requests mean: one handler per kind (`HANDLERS`, keyed by the
request's type, protocol.py's `SteeringRequest`), each answering a typed `SteeringAnswer`.
It serves one session stream, like every actor. Each `SteeringCall` is run to the end
before the next is read, so writes are serialised here and every change gets the next
version; the answer is `SteeringReply` or a typed `Failed`. The front end pushes the state
it answers to the engine actors (`SteerUpdate`). An SAE is loaded once here to be checked
(files, width, hook, fit to the model) before it is recorded, so an engine actor never
receives one it cannot attach. Bases and a request's resolution are steering_bases.py's, the
dial rules steering_rules.py's.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from greenroom import steering_rules as rules
from greenroom import strength_units as units
from greenroom.actors import steering_bases as bases
from greenroom.actors.runtime import die_with_parent, tractor
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    ActivateCircuit,
    ActivateProfile,
    ActiveCircuit,
    AttachDefaultSAE,
    AttachSAE,
    CalibrateSAEs,
    Circuits,
    CircuitSummary,
    Clusters,
    ClusterSummary,
    Converted,
    ConvertStrengths,
    CreateProfile,
    DeleteCircuit,
    DeleteCluster,
    Deleted,
    DeleteProfile,
    DescribeSAE,
    DetachSAE,
    DialCircuit,
    DialCluster,
    Dialled,
    Events,
    Failed,
    GetActiveCircuit,
    GetCircuit,
    GetCluster,
    GetLock,
    GetProfile,
    GetSteering,
    ImportCircuit,
    ImportCluster,
    ImportProfile,
    ListCircuits,
    ListClusters,
    ListProfiles,
    LockSteering,
    Profile,
    Profiles,
    ResolvedSteering,
    ResolveRequestSteering,
    SAEDescription,
    SetSteering,
    Status,
    StatusQuery,
    SteeringAnswer,
    SteeringCall,
    SteeringLock,
    SteeringReply,
    SteeringRequest,
    SteeringState,
    UnlockSteering,
    UpdateProfile,
    from_wire,
    to_wire,
)
from greenroom.store.steering import ModelSteering, SteeringStore

log = logging.getLogger(__name__)


@tractor.context
async def steering_session(ctx, parent_pid: int, cache_dir: str | None, limits: dict):
    die_with_parent(parent_pid)
    coordinator = Coordinator(SteeringStore(cache_dir), cache_dir, rules.Limits(**limits))
    await trio.to_thread.run_sync(coordinator.deactivate_deleted)
    await ctx.started({"ok": True, "models": []})
    async with ctx.open_stream() as stream:
        async for raw in stream:
            msg = from_wire(raw)
            if isinstance(msg, StatusQuery):
                status = {"pid": os.getpid(), "role": "steering", "models": [], "queue_depth": 0}
                await stream.send(to_wire(Events([Status(msg.rid, status)])))
            elif isinstance(msg, SteeringCall):
                kind = type(msg.request).__name__
                try:  # SQLite and SAE files are blocking: off the loop, which keeps answering status
                    reply = SteeringReply(msg.rid, await trio.to_thread.run_sync(coordinator.handle, msg.request))
                except GreenroomError as exc:
                    reply = Failed(msg.rid, exc.to_wire())
                except Exception as exc:  # a fault in one request: that request's 500, not the coordinator's end
                    log.exception("steering request %s failed", kind)
                    reply = Failed(
                        msg.rid, GreenroomError("internal_error", f"steering request {kind} failed: {exc}").to_wire()
                    )
                await stream.send(to_wire(Events([reply])))


@attrs.frozen
class Coordinator:
    """The handlers, one per request kind; a model's state answers as `answer` makes it."""

    store: SteeringStore
    cache_dir: str | None
    limits: rules.Limits
    # an SAE file's ‖W_dec[i]‖, by path: read once (what ConvertStrengths and DescribeSAE need)
    _decoder_norms: dict[str, list[float]] = attrs.field(factory=dict)

    def handle(self, request: SteeringRequest) -> SteeringAnswer:
        return HANDLERS[type(request)](self, request)

    # a model's live state
    def get(self, req: GetSteering) -> SteeringState:
        return answer(self.store, self.store.get(req.model), self.limits)

    def attach(self, req: AttachSAE) -> SteeringState:
        return self._attach(self.store.get(req.model), req.sae, req.layer, req.sae_id, req.placement)

    def attach_default(self, req: AttachDefaultSAE) -> SteeringState:
        state = self.store.get(req.model)
        if state.version > 0:  # something was set since: the store says what is attached
            return answer(self.store, state, self.limits)
        return self._attach(state, req.sae, None, None, req.placement)

    def _attach(
        self, state: ModelSteering, source: str, layer: int | None, sae_id: str | None, placement: dict
    ) -> SteeringState:
        record = _resolve_sae(self.cache_dir, source, layer, sae_id, placement)
        for other in state.saes:
            if other["sae_id"] == record["sae_id"]:
                raise GreenroomError(
                    "invalid_parameter",
                    f"an SAE named {record['sae_id']!r} is already attached to "
                    f"{state.model!r}; detach it or choose another sae_id",
                    "sae_id",
                )
            if other["block"] == record["block"]:
                raise GreenroomError(
                    "invalid_parameter",
                    f"block {record['block']} of {state.model!r} already has SAE "
                    f"{other['sae_id']!r} attached (one SAE per block)",
                    "sae",
                )
        return self._put(attrs.evolve(state, saes=[*state.saes, record]))

    def detach(self, req: DetachSAE) -> SteeringState:
        state = self.store.get(req.model)
        bases.attached(state, req.sae_id, "sae_id")
        return self._put(
            attrs.evolve(
                state,
                saes=[s for s in state.saes if s["sae_id"] != req.sae_id],
                strengths={k: v for k, v in state.strengths.items() if k != req.sae_id},
            )
        )

    def set_live(self, req: SetSteering) -> SteeringState:
        state = self.store.get(req.model)
        if req.strengths is not None:  # values set directly replace the active base's; enabling alone keeps it
            state = attrs.evolve(state, strengths=bases.checked(state, req.strengths), active=None)
        if req.enabled is not None:
            state = attrs.evolve(state, enabled=req.enabled)
        return self._put(state)

    def calibrate(self, req: CalibrateSAEs) -> SteeringState:
        """Record each measured ρ_L on the SAE's record, unless it has one (the first engine to
        measure it is kept: a strength's meaning stays put while the SAE is attached)."""
        state = self.store.get(req.model)
        saes = [
            {**sae, **self._calibrated(sae, req.residual_norms[sae["sae_id"]])}
            if sae.get("residual_norm") is None and sae["sae_id"] in req.residual_norms
            else sae
            for sae in state.saes
        ]
        if saes != state.saes:
            self.store.put_saes(state.model, saes)
            state = attrs.evolve(state, saes=saes)
        return answer(self.store, state, self.limits)

    def convert(self, req: ConvertStrengths) -> Converted:
        state = self.store.get(req.model)
        out = {}
        for sae_id, coefficients in req.coefficients.items():
            where = req.param or f"strengths.{sae_id}"
            sae = bases.attached(state, sae_id, where)
            bases.checked(state, {sae_id: coefficients}, req.param)  # feature indices inside the width
            norms = self._norms(sae)
            out[sae_id] = units.converted(
                sae_id, coefficients, sae.get("residual_norm"), norms, where, per_feature=req.param is None
            )
        return Converted(out)

    def describe(self, req: DescribeSAE) -> SAEDescription:
        sae = bases.attached(self.store.get(req.model), req.sae_id, "sae_id")
        return SAEDescription(sae, self._norms(sae))

    def _calibrated(self, sae: dict, residual_norm: float) -> dict:
        """ρ_L and what a strength of 1 is as a SAELens coefficient (strength_units.py): over the
        SAE's features, from the largest decoder row's to the smallest's (null where a row is zero)."""
        norm = sae.get("decoder_norm") or _summary(self._norms(sae))  # a record from before it was kept
        per = {
            k: units.to_coefficient(1.0, residual_norm, norm[n]) if norm[n] else None
            for k, n in (("min", "max"), ("median", "median"), ("max", "min"))
        }
        return {"decoder_norm": norm, "residual_norm": residual_norm, "coefficient_per_strength": per}

    def _norms(self, sae: dict) -> list[float]:
        if sae["path"] not in self._decoder_norms:
            from greenroom.engines.sae import SAEFormatError, load_sae  # torch: only once an SAE is attached

            try:
                self._decoder_norms[sae["path"]] = load_sae(sae["path"]).W_dec.norm(dim=1).tolist()
            except (SAEFormatError, OSError) as exc:
                raise GreenroomError(
                    "invalid_sae", f"SAE {sae['sae_id']!r} can no longer be read: {exc}", "sae_id"
                ) from None
        return self._decoder_norms[sae["path"]]

    def resolve_request(self, req: ResolveRequestSteering) -> ResolvedSteering:
        return bases.request(self.store, self.store.get(req.model), req.profile, req.intensity, self.limits)

    # profiles: the model a profile steers is the one it was created (or imported) for
    def list_profiles(self, req: ListProfiles) -> Profiles:
        return Profiles([bases.profile_document(p) for p in self.store.profiles()])

    def get_profile(self, req: GetProfile) -> Profile:
        return bases.profile_document(self._profile(req.name))

    def create_profile(self, req: CreateProfile) -> Profile:
        state = self._state_for_new(req.name, req.model)
        return bases.profile_document(_put_profile(self.store, state, _new_profile(req, state), req.strengths))

    def import_profile(self, req: ImportProfile) -> Profile:
        state = self._state_for_new(req.name, req.model)
        for i, sae in enumerate(req.saes):  # the SAEs it was made with must be attached
            held = bases.attached(state, sae["sae_id"], f"saes[{i}]")
            differs = [k for k in bases.SAME_SAE if sae[k] != held[k]]
            if differs:
                raise GreenroomError(
                    "sae_not_attached",
                    f"SAE {sae['sae_id']!r} attached to {state.model!r} is not "
                    f"the document's: its {', '.join(differs)} differ",
                    f"saes[{i}]",
                )
        return bases.profile_document(_put_profile(self.store, state, _new_profile(req, state), req.strengths))

    def update_profile(self, req: UpdateProfile) -> Profile:
        profile = self._profile(req.name)
        if req.description is not None:
            profile["description"] = req.description
        if req.strengths is None:  # kept as stored, even if an SAE it names was detached since
            profile["updated_at"] = int(time.time())
            self.store.put_profile(profile)
            return bases.profile_document(profile)
        return bases.profile_document(
            _put_profile(self.store, self.store.get(profile["model"]), profile, req.strengths)
        )

    def delete_profile(self, req: DeleteProfile) -> Deleted:
        profile = self._profile(req.name)
        self.store.delete_profile(req.name)
        return self._deleted(profile["model"], "profile", req.name)

    def activate_profile(self, req: ActivateProfile) -> SteeringState:
        """The profile's (a cluster's: dialled) strengths as the live state, re-checked: refused, not
        half-applied, if invalid for the SAEs attached now."""
        profile = self._profile(req.name)
        state = self.store.get(profile["model"])
        bases.checked_strengths(state, profile)
        return self._activated(
            attrs.evolve(state, strengths=bases.checked(state, profile["strengths"], "strengths")), "profile", req.name
        )

    # clusters: profiles with an intensity range and a persistent dial
    def list_clusters(self, req: ListClusters) -> Clusters:
        return Clusters([bases.cluster_summary(p, self.store) for p in self.store.profiles() if p.get("cluster")])

    def get_cluster(self, req: GetCluster) -> ClusterSummary:
        return bases.cluster_summary(self._profile(req.name, cluster=True), self.store)

    def import_cluster(self, req: ImportCluster) -> ClusterSummary:
        state = self._state_for_new(req.name, req.model)
        bases.attached(state, req.sae_id, "sae_id")
        _dial(req.intensity, rules.cluster_bounds(req.intensity_range, self.limits)[1], "intensity")
        profile = {
            **_new_profile(req, state),
            "cluster": {
                "sae_id": req.sae_id,
                "intensity": req.intensity,
                "intensity_range": req.intensity_range,
                "labels": req.labels,
            },
        }
        profile = _put_profile(self.store, state, profile, {req.sae_id: req.members}, "members")
        return bases.cluster_summary(profile, self.store)

    def dial_cluster(self, req: DialCluster) -> Dialled:
        """The persistent dial: [0, the cap]; an active cluster re-applies at once."""
        profile = self._profile(req.name, cluster=True)
        cluster = profile["cluster"]
        _dial(req.intensity, rules.cluster_bounds(cluster["intensity_range"], self.limits)[1], "intensity")
        profile["cluster"] = {**cluster, "intensity": req.intensity}
        profile["updated_at"] = int(time.time())
        self.store.put_profile(profile)
        return Dialled(
            bases.cluster_summary(profile, self.store), self._reapplied(profile["model"], "profile", req.name)
        )

    def delete_cluster(self, req: DeleteCluster) -> Deleted:
        profile = self._profile(req.name, cluster=True)
        self.store.delete_profile(req.name)
        return self._deleted(profile["model"], "profile", req.name)

    # circuits
    def list_circuits(self, req: ListCircuits) -> Circuits:
        return Circuits([bases.circuit_summary(c, self.store) for c in self.store.circuits()])

    def get_circuit(self, req: GetCircuit) -> CircuitSummary:
        return bases.circuit_summary(self._circuit(req.name), self.store)

    def import_circuit(self, req: ImportCircuit) -> CircuitSummary:
        circuit = bases.new_circuit(self.store, self.store.get(req.model), req)
        self.store.put_circuit(circuit)
        return bases.circuit_summary(circuit, self.store)

    def activate_circuit(self, req: ActivateCircuit) -> SteeringState:
        return self._activated(self.store.get(self._circuit(req.name)["model"]), "circuit", req.name)

    def dial_circuit(self, req: DialCircuit) -> Dialled:
        """Stored as dialled; serving clamps it into the circuit's range."""
        circuit = self._circuit(req.name)
        _dial(req.intensity, rules.ENVELOPE[1], "intensity")
        circuit = {**circuit, "intensity": req.intensity, "updated_at": int(time.time())}
        self.store.put_circuit(circuit)
        return Dialled(
            bases.circuit_summary(circuit, self.store), self._reapplied(circuit["model"], "circuit", req.name)
        )

    def delete_circuit(self, req: DeleteCircuit) -> Deleted:
        circuit = self._circuit(req.name)
        self.store.delete_circuit(req.name)
        return self._deleted(circuit["model"], "circuit", req.name)

    def active_circuit(self, req: GetActiveCircuit) -> ActiveCircuit:
        state = self.store.get(req.model)
        circuit = self.store.circuit(state.active["name"]) if (state.active or {}).get("kind") == "circuit" else None
        serving = bases.serving(self.store, state, self.limits) if circuit is not None else None
        return ActiveCircuit(
            req.model,
            bases.circuit_summary(circuit, self.store) if circuit else None,
            serving and serving["mode"],
            serving and serving["reason"],
            _circuit_steering(state, serving) if serving else None,
        )

    # the lock
    def get_lock(self, req: GetLock) -> SteeringLock:
        return SteeringLock(self.store.setting(bases.LOCK))

    def lock(self, req: LockSteering) -> SteeringLock:
        self.store.put_setting(bases.LOCK, req.model)
        return SteeringLock(req.model)

    def unlock(self, req: UnlockSteering) -> SteeringLock:
        self.store.put_setting(bases.LOCK, None)
        return SteeringLock(None)

    def deactivate_deleted(self) -> None:
        """At start: a model whose active base is no longer stored (deleted by a greenroom that
        left deleted bases steering) is deactivated, as a deletion does now."""
        for state in self.store.models():
            if bases.deleted(self.store, state):
                log.info("model %s: its active %s %r was deleted; deactivated", state.model, *state.active.values())
                self._put(attrs.evolve(state, strengths={}, active=None))

    # shared by the handlers
    def _put(self, state: ModelSteering) -> SteeringState:
        """Store the next version of `state`, its live values re-derived from its active base (a
        circuit's bindings follow the SAEs attached)."""
        base = bases.active_base(self.store, state) if state.active is not None else None
        if base is not None and base.kind != "profile":  # a plain profile's activation copied its values
            state = attrs.evolve(state, strengths=base.resolved(None, self.limits))
        return answer(self.store, self.store.put(state), self.limits)

    def _deleted(self, model: str, kind: str, name: str) -> Deleted:
        """After a profile, cluster or circuit is deleted: a deleted document never steers. The
        model it was the active base of is deactivated — its live values cleared, active none, a
        new version — as if the user had cleared them; an active circuit it backed (its
        slice_fallback) is re-derived without it. Any other model's state is unchanged."""
        state = self.store.get(model)
        if state.active == {"kind": kind, "name": name}:
            return Deleted(name, self._put(attrs.evolve(state, strengths={}, active=None)))
        circuit = self.store.circuit(state.active["name"]) if (state.active or {}).get("kind") == "circuit" else None
        if kind == "profile" and circuit is not None and circuit.get("slice_fallback") == name:
            return Deleted(name, self._put(state))
        return Deleted(name, None)

    def _activated(self, state: ModelSteering, kind: str, name: str) -> SteeringState:
        return self._put(attrs.evolve(state, active={"kind": kind, "name": name}))

    def _reapplied(self, model: str, kind: str, name: str) -> SteeringState | None:
        """After a dial moved: the model's next state if the base is active on it, else None."""
        state = self.store.get(model)
        return self._put(state) if state.active == {"kind": kind, "name": name} else None

    def _profile(self, name: str, cluster: bool = False) -> dict:
        profile = self.store.profile(name)
        if profile is None or (cluster and not profile.get("cluster")):
            raise GreenroomError(
                "profile_not_found", f"no steering {'cluster' if cluster else 'profile'} named {name!r}", "name"
            )
        return profile

    def _circuit(self, name: str) -> dict:
        circuit = self.store.circuit(name)
        if circuit is None:
            raise GreenroomError("circuit_not_found", f"no circuit named {name!r}", "name")
        return circuit

    def _state_for_new(self, name: str, model: str) -> ModelSteering:
        """The state of `model`, which a new profile or cluster named `name` is made for."""
        if self.store.profile(name) is not None:
            raise GreenroomError(
                "profile_exists", f"a profile or cluster named {name!r} exists; update or delete it", "name"
            )
        return self.store.get(model)


HANDLERS: dict[type, Callable[[Coordinator, SteeringRequest], SteeringAnswer]] = {
    GetSteering: Coordinator.get,
    AttachSAE: Coordinator.attach,
    AttachDefaultSAE: Coordinator.attach_default,
    DetachSAE: Coordinator.detach,
    SetSteering: Coordinator.set_live,
    CalibrateSAEs: Coordinator.calibrate,
    ConvertStrengths: Coordinator.convert,
    DescribeSAE: Coordinator.describe,
    ResolveRequestSteering: Coordinator.resolve_request,
    ListProfiles: Coordinator.list_profiles,
    GetProfile: Coordinator.get_profile,
    CreateProfile: Coordinator.create_profile,
    ImportProfile: Coordinator.import_profile,
    UpdateProfile: Coordinator.update_profile,
    DeleteProfile: Coordinator.delete_profile,
    ActivateProfile: Coordinator.activate_profile,
    ListClusters: Coordinator.list_clusters,
    GetCluster: Coordinator.get_cluster,
    ImportCluster: Coordinator.import_cluster,
    DialCluster: Coordinator.dial_cluster,
    DeleteCluster: Coordinator.delete_cluster,
    ListCircuits: Coordinator.list_circuits,
    GetCircuit: Coordinator.get_circuit,
    ImportCircuit: Coordinator.import_circuit,
    ActivateCircuit: Coordinator.activate_circuit,
    DialCircuit: Coordinator.dial_circuit,
    DeleteCircuit: Coordinator.delete_circuit,
    GetActiveCircuit: Coordinator.active_circuit,
    GetLock: Coordinator.get_lock,
    LockSteering: Coordinator.lock,
    UnlockSteering: Coordinator.unlock,
}


def answer(store: SteeringStore, state: ModelSteering, limits: rules.Limits) -> SteeringState:
    """A model's state as the front end receives it: the stored fields and `serving`, what the
    active base is and, while a circuit genuinely steers, its rung."""
    return SteeringState(**attrs.asdict(state), serving=bases.serving(store, state, limits))


def _new_profile(req: CreateProfile | ImportCluster, state: ModelSteering) -> dict:
    return {
        "name": req.name,
        "model": state.model,
        "description": req.description,
        "created_at": int(time.time()),
        "cluster": None,
    }


def _circuit_steering(state: ModelSteering, serving: dict) -> dict | None:
    """GET /api/circuits/active's `steering`: present only while the circuit genuinely steers
    (what X-miLLM-Circuit-Rung says), with the values each layer applies."""
    if "rung" not in serving:
        return None
    by_id = {sae["sae_id"]: sae for sae in state.saes}
    return {
        "rung": serving["rung"],
        "language": serving["language"],
        "header": rules.rung_header(serving["rung"]),
        "intensity": serving["intensity"],
        "layers": [
            {"layer": by_id[sae_id]["layer"], "sae_id": sae_id, "strengths": strengths}
            for sae_id, strengths in state.strengths.items()
        ],
    }


def _dial(value: float, cap: float, param: str) -> None:
    if not 0 <= value <= cap:
        raise GreenroomError("invalid_parameter", f"the intensity {value:g} is outside [0, {cap:g}]", param)


def _put_profile(
    store: SteeringStore, state: ModelSteering, profile: dict, strengths: dict, param: str | None = None
) -> dict:
    """Store `profile` with `strengths` checked against the SAEs attached now, and their identities."""
    strengths = bases.checked(state, strengths, param)
    saes = [{k: sae[k] for k in bases.SAE_IDENTITY} for sae in state.saes if sae["sae_id"] in strengths]
    profile = {**profile, "strengths": strengths, "saes": saes, "updated_at": int(time.time())}
    store.put_profile(profile)
    return profile


def _resolve_sae(cache_dir: str | None, source: str, layer: int | None, sae_id: str | None, placement: dict) -> dict:
    """The record of SAE `source` ("demo:<size>[:<layer>]", "random:<d_in>:<layer>" or a
    directory) for the model placed at `placement` (as it crosses here: Placement.to_spec), after
    loading it and checking that the model can take it."""
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.demo.demo_sae import ensure_demo_sae
    from greenroom.engines.random_sae import PREFIX as RANDOM_SAE
    from greenroom.engines.random_sae import ensure_random_sae
    from greenroom.engines.sae import SAEFormatError, load_sae  # torch: only once an SAE is attached

    try:
        if source.startswith("demo:"):
            size, _, named = source[len("demo:") :].partition(":")
            if named and layer is not None and int(named) != layer:
                raise ValueError(f"{source!r} names layer {named}, the request layer {layer}")
            layer = int(named) if named else layer
            path = ensure_demo_sae(default_cache_dir(cache_dir), size, layer)
            default_id = f"sae_demo_{size}_l{path.name.removeprefix('layer-')}"
        elif source.startswith(RANDOM_SAE):  # random directions of a model's shape (engines/random_sae.py)
            path, default_id = ensure_random_sae(default_cache_dir(cache_dir), source)
        else:
            path = Path(source).expanduser().resolve()
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{path.parent.name}_{path.name}").strip("_")
            # a folder named "sae" (…/sae/layer-5) names no SAE twice: sae_layer-5, not sae_sae_layer-5
            default_id = "sae_" + (re.sub(r"^(sae[_.-]+)+", "", stem, flags=re.IGNORECASE) or stem)
        sae = load_sae(path)
    except (SAEFormatError, OSError, ValueError) as exc:
        raise GreenroomError("invalid_sae", f"{source!r} is not an SAE greenroom can load: {exc}", "sae") from None
    if layer is not None and sae.layer != layer:
        raise GreenroomError(
            "invalid_sae", f"{source!r} reads layer {sae.layer} ({sae.hook_name}), not layer {layer}", "layer"
        )
    width_in, blocks = _residual_shape(placement)
    why = _unservable_site(sae, placement)
    if why is not None:
        raise GreenroomError("invalid_sae", f"{source!r}: {why}", "sae")
    if placement.get("engine") == "llama.cpp":
        from greenroom.engines.llama_cpp.llama_steering import unsteerable

        why = unsteerable(sae)
        if why is not None:
            raise GreenroomError("invalid_sae", f"{source!r}: {why}", "sae")
    if width_in is not None and sae.d_in != width_in:
        raise GreenroomError(
            "invalid_sae",
            f"{source!r} reads {sae.d_in}-wide vectors; model {placement['id']!r}'s residual stream is {width_in} wide",
            "sae",
        )
    if blocks is not None and not 0 <= sae.block < blocks:
        raise GreenroomError(
            "invalid_sae", f"{source!r} hooks {sae.hook_name}; model {placement['id']!r} has {blocks} blocks", "sae"
        )
    return {
        "sae_id": sae_id or default_id[:64],
        "source": source,
        "path": str(path),
        "layer": sae.layer,
        "block": sae.block,
        "hook_point": sae.hook_name,
        "width": sae.d_sae,
        "d_in": sae.d_in,
        "architecture": sae.architecture,
        "reads": sae.reads,
        "decoder_norm": _summary(sae.W_dec.norm(dim=1).tolist()),
        "residual_norm": None,  # ρ_L, once an engine measured it (CalibrateSAEs)
        "coefficient_per_strength": None,
    }


def _summary(norms: list[float]) -> dict:
    """min, median (the lower middle one, as torch's) and max of an SAE's decoder norms."""
    return {"min": min(norms), "median": statistics.median_low(norms), "max": max(norms)}


def _unservable_site(sae, placement: dict) -> str | None:
    """Why the engine of `placement` cannot serve `sae`'s hook point, or None: a site it has no
    hook for (capabilities.HOOK_SITES), or a sublayer's output on a transformers model that may
    decode in fixed shapes (on CUDA by default: fixed_shape.py steers the residual stream only)."""
    from greenroom.engines.capabilities import capabilities_of

    engine = placement.get("engine", "transformers")
    sites = capabilities_of(engine).hook_sites
    if sae.site not in sites:
        return f"{sae.hook_name} reads {sae.reads}; {engine} models steer {', '.join(sites)} hook points only"
    fixed = placement.get("fixed_shape") or "auto"
    if not sae.residual and (fixed == "on" or fixed == "auto" and placement.get("device", "").startswith("cuda")):
        return (
            f"{sae.hook_name} reads {sae.reads}; this model decodes in fixed shapes (fixed_shape "
            f"{fixed!r} on {placement.get('device')}), which steer the residual stream only: "
            'set fixed_shape = "off" for it to serve attention and MLP out'
        )
    return None


def _residual_shape(placement: dict) -> tuple[int | None, int | None]:
    """The residual stream's width and the block count of the model placed at `placement`, from
    its checkpoint's config.json or its GGUF header; None for what cannot be read yet (a model
    not built or converted yet: the engine actor checks when it attaches)."""
    from greenroom.engines.llama_cpp import gguf_meta
    from greenroom.engines.loader import checkpoint_json, source_path

    path = source_path(placement["source"], placement["cache_dir"])
    if placement.get("engine") == "llama.cpp":
        try:
            meta = gguf_meta.read(path)
        except (OSError, gguf_meta.GGUFError):
            return None, None
        arch = meta.get("general.architecture")
        return meta.get(f"{arch}.embedding_length"), meta.get(f"{arch}.block_count")
    config = checkpoint_json(path)
    return config.get("hidden_size"), config.get("num_hidden_layers")
