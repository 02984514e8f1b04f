"""The front end's end of steering: requests to the steering coordinator (the only writer of
steering state), its answers pushed to the engine actors holding each model, and the one
cache of its last answer per model."""

from __future__ import annotations

import logging
import uuid

import attrs

from greenroom import steering_rules as rules
from greenroom.engines.capabilities import ENGINES
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    AttachDefaultSAE,
    AttachSAE,
    CalibrateSAEs,
    Deleted,
    Dialled,
    Failed,
    GetLock,
    GetSteering,
    ModelRequest,
    SteeringAnswer,
    SteeringCall,
    SteeringLock,
    SteeringRequest,
    SteeringState,
    SteerUpdate,
)
from greenroom.supervisor.placements import LoadState, ModelState, ModelTable
from greenroom.supervisor.slots import ActorSlot

log = logging.getLogger("greenroom.supervisor")


class SteeringRelay:
    """`coordinator`: the steering actor's slot; `default_saes`: model → its configured `sae`."""

    def __init__(self, table: ModelTable, coordinator: ActorSlot, ready_timeout_s: float, default_saes: dict[str, str]):
        self.table = table
        self._coordinator = coordinator
        self._ready_timeout_s = ready_timeout_s
        self._default_saes = default_saes
        # The steering coordinator's last state answer per model, the front end's one cache of it:
        # written only by `steering`, through which every steering write goes (so it is current).
        # It exists so that a request with no profile or dial reads its circuit rung
        # (steering_api.live_headers) without a round trip to the coordinator.
        self.last_steering_states: dict[str, SteeringState] = {}
        self.locked_model: str | None = None  # locked for steering: /v1/models lists it alone

    async def steering(self, request: SteeringRequest) -> SteeringAnswer:
        """Send `request` to the steering coordinator (the only writer of steering state) and
        return its answer. A `ModelRequest` for a model that cannot steer is refused here, before
        it is sent. Every model state answered is kept in `last_steering_states`."""
        if isinstance(request, ModelRequest):
            self.require_steering(request.model)
            if isinstance(request, (AttachSAE, AttachDefaultSAE)):  # the coordinator checks the SAE fits the model
                request = attrs.evolve(request, placement=self.table.state_of(request.model).placement.to_spec())
        elif isinstance(request, GetSteering):
            self.table.state_of(request.model)  # 404 for an unknown name; a read for any engine
        model = request.model if isinstance(request, (ModelRequest, GetSteering)) else "steering"
        client = self._coordinator.client
        if client is None:  # the coordinator (re)starting: waited for
            client = await self._coordinator.wait_client(model, self._ready_timeout_s)
        async with client.submit(SteeringCall(f"steer-{uuid.uuid4().hex[:12]}", request)) as events:
            reply = await events.__anext__()
        if isinstance(reply, Failed):
            raise GreenroomError.from_wire(reply.error)
        state = reply.answer.state if isinstance(reply.answer, (Dialled, Deleted)) else reply.answer
        if isinstance(state, SteeringState):
            self.last_steering_states[state.model] = state
        if isinstance(reply.answer, SteeringLock):
            self.locked_model = reply.answer.model
        return reply.answer

    def steers(self, model: str) -> bool:
        """Whether `model` can steer: every engine it is placed on has the `steering` capability
        (engines/capabilities.py, the one place that says which engines have SAE hooks)."""
        return self.table.capabilities(model)[1].steering

    def require_steering(self, model: str, done: str = "steered") -> None:
        """400 steering_unsupported unless `model` can steer; `done`: what the refusal says only
        steering engines' models are (steered, monitored)."""
        if not self.steers(model):
            if not self.table.capabilities(model)[1].generation:
                raise GreenroomError(
                    "steering_unsupported",
                    f"model {model!r} is an embedding model: it generates nothing to steer, and embeddings are "
                    "never steered",
                    "model",
                )
            engines = "/".join(e for e, caps in ENGINES.items() if caps.steering)
            raise GreenroomError(
                "steering_unsupported",
                f"model {model!r} runs on "
                f"{self.table.capabilities(model)[0]}, which has no SAE hooks: only {engines} "
                f"models are {done}",
                "model",
            )

    def steerable(self) -> list[str]:
        """The models that can steer (`steers`)."""
        return [model for model in self.table.replicas if self.steers(model)]

    async def push_steering(self, m: ModelState, state: SteeringState) -> bool:
        """Send `state` to the engine actor holding placement `m`; whether it is live there
        (a placement not loaded, or not steerable, holds none)."""
        if not m.placement.capabilities().steering or m.state != LoadState.LOADED or m.slot.client is None:
            return False
        if state.version == 0:
            return True  # nothing was ever set: the engine's unsteered start is the state
        update = SteerUpdate(
            f"steer-{uuid.uuid4().hex[:12]}",
            m.id,
            state.version,
            state.enabled,
            {s["sae_id"]: s["path"] for s in state.saes},
            rules.indexed(state.strengths),
        )
        async with m.slot.client.submit(update) as events:
            reply = await events.__anext__()
        if isinstance(reply, Failed):
            log.warning(
                "steering of %s (version %d) not applied on %s: %s",
                m.id,
                state.version,
                m.slot.name,
                reply.error["message"],
            )
            return False
        await self._calibrated(m.id, state, reply.residual_norms)
        return reply.version >= state.version

    async def _calibrated(self, model: str, state: SteeringState, norms: dict[str, float]) -> None:
        """Record the ρ_L the engine measured for SAEs whose record has none yet (strength
        units: GET /api/saes/{sae_id}); `last_steering_states` then holds the records with it."""
        missing = {s["sae_id"] for s in state.saes if s.get("residual_norm") is None}
        measured = {sae_id: norm for sae_id, norm in norms.items() if sae_id in missing}
        if measured:
            await self.steering(CalibrateSAEs(model, measured))

    async def push_model_steering(self, model: str, state: SteeringState) -> bool:
        """`state` to every placement of `model`; whether each loaded one now holds it."""
        live = True
        for m in self.table.replicas_of(model):
            live = await self.push_steering(m, state) and live
        return live

    async def steering_live(self, model: str, state: SteeringState) -> bool:
        """Whether every loaded placement of `model` holds `state`'s version (from the actors' status)."""
        for m in self.table.replicas_of(model):
            loaded = m.state == LoadState.LOADED and m.slot.client is not None
            status = await m.slot.client.status() if loaded else None
            held = ((status or {}).get("steering") or {}).get(model)
            if held is None or held["version"] < state.version:
                return False
        return True

    async def push_steering_quietly(self, m: ModelState) -> None:
        """After an engine (re)start or a load: the model's current state. A failure is
        logged, never the load's or the actor's: the model then runs as the engine holds it."""
        if not m.placement.capabilities().steering:
            return
        try:
            await self.push_steering(m, await self.steering(GetSteering(m.id)))
        except Exception as exc:
            log.warning("steering of %s not pushed to %s: %s", m.id, m.slot.name, exc)

    async def attach_default_saes(self) -> None:
        """A model's configured `sae`, attached on its first start (while nothing was ever set
        for it): later starts restore what the store holds, detached or not. Then the steering
        lock and every steerable model's state, as the store holds them."""
        try:
            await self.steering(GetLock())
        except Exception as exc:
            log.error("the steering lock was not read: %s", exc)
        for model, sae in self._default_saes.items():
            try:
                await self.push_model_steering(model, await self.steering(AttachDefaultSAE(model, sae)))
            except Exception as exc:
                log.error("default SAE %r of model %s not attached: %s", sae, model, exc)
        for model in self.steerable():
            if model not in self.last_steering_states:
                try:
                    await self.steering(GetSteering(model))
                except Exception as exc:
                    log.error("steering state of model %s not read: %s", model, exc)
