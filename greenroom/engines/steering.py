"""SAE steering, feature readouts, monitors and suppression, the same for every engine that
steers: the SAEs attached, the state, the deltas and who reads what are decided here; where a
delta is added and a residual read is the engine's (`Steering`'s subclasses). On transformers
an attached SAE owns one forward hook on the module whose output its hook point names (the
decoder block `model.model.layers[block]`, or its `self_attn` / `mlp` for attention and MLP
out: sae.py SITES); on llama.cpp the deltas are a control vector added to that layer's output
and residuals are read through the eval callback (llama_steering.py). Which hook points an
engine serves is capabilities.HOOK_SITES's. Several SAEs attach at once, one per block.

**Steering formula.** For every forward pass that is not suppressed, at each attached
block L, at every position t (prompt and generated alike):

    h_L[t] ← h_L[t] + (ρ_L / 100) · Σ_i s_i · W_dec[i] / ‖W_dec[i]‖

- s_i is feature i's strength, in miLLM's range [−200, 200] (clamped there at apply time);
- ρ_L is the layer's *typical residual norm*: the median ‖h_L[t]‖ of the unsteered model
  over a fixed calibration text (CALIBRATION_TEXT, the first position left out: a BOS
  attention sink has an outsized norm in real models), measured once at attach. For an SAE
  on a sublayer's output (attention or MLP out), h_L is that output and ρ_L its typical norm.
  A raw SAELens coefficient c (c · W_dec[i]) is the strength 100 · c · ‖W_dec[i]‖ / ρ_L
  (greenroom/strength_units.py).

So a strength is **a percentage of the residual norm at that layer**, added along the
feature's unit decoder direction: ±1 nudges by 1 % of a typical residual, ±100 adds a
vector as long as the residual itself (the feature then dominates that position's
direction), and ±200, the range's end, twice that: the end of the range is where the
feature swamps everything else the model computed there.
The unit direction makes strengths comparable across SAEs whether or not their training
folded the decoder norms; ρ_L makes them comparable across layers and models, whose
residual norms differ widely (≈12 at the tiny demo's layer 1, ≈30 at the 100m demo's layer 7).

**State.** The steering coordinator (actors/steering_actor.py) is the only writer: it pushes a
`SteeringState` (per attached SAE, feature → strength; enabled; a version that increases
with every change), and `Steering.apply` installs it if it is newer than the one held.
The delta vectors are computed once per apply, so a steered forward pays one add per
attached block.

**Which forwards are steered.** All of them — the serial decode loop and every
`DecodeBatch` forward (prefill and steps, every row: global steering is a property of
the model) — except those run inside `suppressed()`: embeddings and scoring, which the
spec keeps unsteered. Suppression is per thread and per `with` block, so it covers
exactly that pass. Per-request steering (a profile, `for_request`) replaces the live state
only for forwards run inside `steered(...)`: the serial path wraps that request's steps in it,
so a batch's rows decoded between them keep the live state, and the live state never needs
restoring. It lapses once a newer state is applied mid-request (the operator's write wins).

**Readouts.** `Steering.readout(...)` makes a `Readout` for one sequence; forwards run
inside `reading(readout)` record the top-k activations of its SAE at its positions, read
before this block's delta (`pre_steering`) or after it (`post_steering`). A readout
assumes one row per forward: readout requests run on the serial path.

**Monitors.** `Steering.monitor(...)` makes a `Monitor` for one sequence: the operator's side
channel. It reads every position fed (prompt and generated), always before this block's
delta, and keeps per feature the running max and sum; `result()` lists the top-k by max.
`reading(readout, monitor)` runs forwards with both (they may name different SAEs); like a
readout, a monitor is one row per forward, so a monitored request runs on the serial path.
Inside `suppressed()` nothing is read, so embeddings and scoring record nothing.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

import attrs
import torch

from .base import (
    SAE_ACTIVATIONS_MAX_ENTRIES,
    STRENGTH_MAX,
    Activations,
    EngineError,
    FeatureValue,
    MonitoredFeature,
    MonitorRecord,
    PositionRead,
    Positions,
    Span,
)
from .capabilities import capabilities_of
from .sae import SAE

READ_POINTS = ("pre_steering", "post_steering")
POSITION_MODES = ("last", "prompt", "completion", "all")
CALIBRATION_TEXT = (
    "The river winds through the valley, past orchards and under old stone bridges, until it reaches "
    "the harbour. Children played in the park while their parents talked on the benches nearby."
)


@attrs.frozen
class SteeringState:
    """Steering as the coordinator resolved it: per SAE id, feature index → strength."""

    version: int
    enabled: bool = True
    strengths: Mapping[str, Mapping[int, float]] = attrs.field(factory=dict)


@attrs.frozen
class AttachedSAE:
    """What is reported of an attached SAE."""

    sae_id: str
    layer: int  # the SAE's layer, as its hook name numbers it
    block: int  # the decoder block whose output is hooked
    hook_point: str  # SAELens' hook name, e.g. blocks.1.hook_resid_post
    width: int
    d_in: int
    architecture: str
    residual_norm: float  # ρ_L: the norm a strength of 100 adds (of the hook point's typical vector)


@attrs.define(eq=False)
class Hooked:
    info: AttachedSAE
    sae: SAE
    handle: object = None  # the engine's (transformers: the forward hook's handle)
    delta: torch.Tensor | None = None  # [d_in] in the model's dtype, None when unsteered
    version: int = 0  # of the state `delta` came from (a request's steering lapses once it is newer)


class _Local(threading.local):
    suppressed = 0
    observers: tuple = ()  # the Readout and/or Monitor the forwards on this thread feed
    request: RequestSteering | None = None


@attrs.frozen
class RequestSteering:
    """One request's steering (a profile's), made against the live state of `version`."""

    version: int
    deltas: Mapping[str, torch.Tensor | None]  # per attached SAE; one not named is unsteered
    key: tuple = ()  # the strengths, canonical: what Steering.key tells requests apart by


class Readout:
    """One sequence's top-k activations of one SAE, position by position (absolute over
    prompt-then-generated tokens). Made by `Steering.readout`; filled by forwards run in
    `Steering.reading(readout)`."""

    # a request asked for it: a suppressed (scoring) pass still reads, unsteered
    reads_suppressed = True

    def __init__(
        self, sae_id: str, layer: int, prompt_tokens: int, top_k: int, positions: Positions, features, read_point: str
    ):
        self.sae_id, self.layer, self.prompt_tokens, self.top_k = sae_id, layer, prompt_tokens, top_k
        self.positions, self.read_point = positions, read_point
        self.pre = read_point == "pre_steering"
        self.features = None if features is None else torch.tensor(sorted(set(features)))
        self._fed = 0  # tokens the model has been fed for this sequence
        self._read: dict[int, list[tuple[int, float]]] = {}

    def _wanted(self, start: int, count: int) -> range:
        end, mode = start + count, self.positions
        if mode == "last":
            return range(end - 1, end)
        if mode == "prompt":
            return range(start, min(end, self.prompt_tokens))
        if mode == "completion":
            return range(max(start, self.prompt_tokens), end)
        if mode == "all":
            return range(start, end)
        return range(max(start, mode.start), min(end, mode.end))

    def observe(self, sae: SAE, hidden: torch.Tensor) -> None:
        if hidden.shape[0] != 1:
            raise RuntimeError("an SAE readout reads one sequence per forward (serve it on the serial path)")
        start, count = self._fed, hidden.shape[1]
        self._fed += count
        wanted = self._wanted(start, count)
        if not wanted:
            return
        acts = sae.encode(hidden[0, wanted.start - start : wanted.stop - start])
        if self.features is not None:
            acts = acts[:, self.features.to(acts.device)]
        values, index = acts.topk(min(self.top_k, acts.shape[1]), dim=1)
        if self.features is not None:
            index = self.features.to(acts.device)[index]
        if self.positions == "last":
            self._read.clear()
        for pos, vals, idx in zip(wanted, values.tolist(), index.tolist()):
            # without a feature list, inactive features are not news: only positive values are listed
            self._read[pos] = [(i, v) for i, v in zip(idx, vals) if v > 0 or self.features is not None]

    def result(self, token_ids: list[int]) -> Activations:
        """What was read, the positions in order; `token_ids` is the sequence fed (prompt then generated)."""
        return Activations(
            self.sae_id,
            self.layer,
            self.read_point,
            [
                PositionRead(
                    pos, token_ids[pos] if pos < len(token_ids) else None, [FeatureValue(i, v) for i, v in feats]
                )
                for pos, feats in sorted(self._read.items())
            ],
        )


class Monitor:
    """One sequence's activations of one SAE, pre-steering, summarised over every position
    fed: per feature the max and the sum (one width-sized tensor each, one encode per forward).
    Made by `Steering.monitor`; filled by forwards run in `Steering.reading(..., monitor)`."""

    pre = True  # what a monitor records is what the model computed before this layer's steering
    reads_suppressed = False  # scoring and embeddings are never monitored

    def __init__(self, sae_id: str, layer: int, top_k: int):
        self.sae_id, self.layer, self.top_k = sae_id, layer, top_k
        self.positions = 0
        self._max: torch.Tensor | None = None
        self._sum: torch.Tensor | None = None

    def observe(self, sae: SAE, hidden: torch.Tensor) -> None:
        if hidden.shape[0] != 1:
            raise RuntimeError("an SAE monitor reads one sequence per forward (serve it on the serial path)")
        acts = sae.encode(hidden[0])
        if self._max is None:
            self._max, self._sum = acts.max(dim=0).values, acts.sum(dim=0)
        else:
            self._max = torch.maximum(self._max, acts.max(dim=0).values)
            self._sum = self._sum + acts.sum(dim=0)
        self.positions += hidden.shape[1]

    def result(self) -> MonitorRecord:
        """The top-k features by max, those that never fired left out."""
        features = []
        if self._max is not None:
            values, index = self._max.topk(min(self.top_k, self._max.shape[0]))
            sums = self._sum[index]
            features = [
                MonitoredFeature(i, v, s / self.positions)
                for i, v, s in zip(index.tolist(), values.tolist(), sums.tolist())
                if v > 0
            ]
        return MonitorRecord(self.sae_id, self.layer, self.positions, features)


def _worst_positions(positions: Positions, prompt_tokens: int, max_tokens: int) -> int:
    """The most positions a readout can list: the whole completion counted, as if no stop came."""
    if positions == "last":
        return 1
    if positions == "prompt":
        return prompt_tokens
    if positions == "completion":
        return max_tokens
    if positions == "all":
        return prompt_tokens + max_tokens
    return max(0, min(positions.end, prompt_tokens + max_tokens) - positions.start)


class _Scoped:
    """`local.<name> = value` for a block (`Steering.reading`, `Steering.steered`): a class, not
    a generator, because it wraps every decode step."""

    __slots__ = ("local", "name", "value", "previous")

    def __init__(self, local: _Local, name: str, value):
        self.local, self.name, self.value = local, name, value

    def __enter__(self):
        self.previous = getattr(self.local, self.name)
        setattr(self.local, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.local, self.name, self.previous)


class _Suppressed:
    __slots__ = ("local",)

    def __init__(self, local: _Local):
        self.local = local

    def __enter__(self):
        self.local.suppressed += 1

    def __exit__(self, *exc):
        self.local.suppressed -= 1


class Steering:
    """The SAEs attached to one engine's model, the steering state it applies, a request's own
    steering, readouts, monitors and suppression — the same for every engine. A subclass says
    where an attached SAE's delta is added and its residuals read (`_install`, `_remove`,
    `_residual_norm`): transformers' forward hooks (transformers_engine.py), llama.cpp's control
    vectors and eval callback (llama_steering.py). Either reads a forward's view of a block
    through `_at`, so what is steered and read is decided here, once."""

    engine = ""  # the engine's name in capabilities.ENGINES: the hook points it serves

    def __init__(self, d_model: int, n_blocks: int, device, dtype: torch.dtype):
        self._d_model, self._n_blocks = d_model, n_blocks
        self._device, self._dtype = torch.device(device), dtype
        self._hooked: dict[str, Hooked] = {}
        self._local = _Local()
        self.state = SteeringState(version=0)
        self.changes = 0  # counts attaches, detaches and applied states: what a cached view is keyed by

    # -- what a subclass provides ------------------------------------------------------------

    def _check(self, sae: SAE) -> None:
        """Refuse (ValueError) an SAE the engine cannot serve beyond the shared checks."""

    def _install(self, entry: Hooked) -> None:
        """Start adding `entry`'s delta and feeding its observers at its block."""
        raise NotImplementedError

    def _remove(self, entry: Hooked) -> None:
        """Stop: the block computes exactly what it did before the attach."""
        raise NotImplementedError

    def _residual_norm(self, sae: SAE) -> float:
        """ρ_L: the median norm of what `sae`'s hook point reads over CALIBRATION_TEXT, unsteered
        (`median_norm` of what the block, or its sublayer, gives)."""
        raise NotImplementedError

    # -- SAEs ---------------------------------------------------------------------------

    def attach(self, sae_id: str, sae: SAE) -> AttachedSAE:
        """Hook `sae` on its block; it starts unsteered (the next `apply` may steer it)."""
        if sae_id in self._hooked:
            raise ValueError(f"an SAE named {sae_id!r} is already attached")
        if not 0 <= sae.block < self._n_blocks:
            raise ValueError(f"SAE hook {sae.hook_name} reads block {sae.block}; the model has {self._n_blocks}")
        if sae.site not in capabilities_of(self.engine).hook_sites:
            raise ValueError(
                f"SAE hook {sae.hook_name} reads {sae.reads}, which the {self.engine} engine cannot steer "
                f"(it serves {', '.join(capabilities_of(self.engine).hook_sites)})"
            )
        if sae.d_in != self._d_model:
            raise ValueError(
                f"the SAE reads {sae.d_in}-wide vectors; this model's residual stream is {self._d_model} wide"
            )
        for other in self._hooked.values():
            if other.info.block == sae.block:
                raise ValueError(f"block {sae.block} already has SAE {other.info.sae_id!r} attached")
        self._check(sae)
        sae = sae.to(self._device)
        info = AttachedSAE(
            sae_id,
            sae.layer,
            sae.block,
            sae.hook_name,
            sae.d_sae,
            sae.d_in,
            sae.architecture,
            self._residual_norm(sae),
        )
        entry = Hooked(info, sae)
        self._install(entry)
        self._hooked[sae_id] = entry
        self.changes += 1
        return info

    def detach(self, sae_id: str) -> None:
        """Remove the SAE: its block computes exactly what it did before the attach."""
        entry = self._hooked.pop(sae_id, None)
        if entry is None:
            raise KeyError(f"no SAE named {sae_id!r} is attached")
        self._remove(entry)
        self.changes += 1

    def attached(self) -> list[AttachedSAE]:
        return [entry.info for entry in self._hooked.values()]

    def sae(self, sae_id: str) -> SAE:
        """The attached SAE `sae_id` (its weights, on the engine's device)."""
        entry = self._hooked.get(sae_id)
        if entry is None:
            raise EngineError(
                "sae_not_attached", f"no SAE named {sae_id!r} is attached (attached: {sorted(self._hooked)})", "sae_id"
            )
        return entry.sae

    # -- steering ------------------------------------------------------------------------

    def apply(self, state: SteeringState) -> bool:
        """Install `state` if it is newer than the one held (False: a stale push, ignored).
        Every SAE it names must be attached and every feature inside its width; strengths are
        clamped to ±STRENGTH_MAX. Nothing changes unless the whole state is valid."""
        if state.version <= self.state.version:
            return False
        deltas = {}
        for sae_id, strengths in state.strengths.items():
            entry = self._hooked.get(sae_id)
            if entry is None:
                raise EngineError(
                    "invalid_parameter",
                    f"steering names SAE {sae_id!r}, which is not attached (attached: {sorted(self._hooked)})",
                )
            deltas[sae_id] = self._delta(entry, strengths) if state.enabled else None
        for sae_id, entry in self._hooked.items():
            entry.delta, entry.version = deltas.get(sae_id), state.version
        self.state = state
        self.changes += 1
        return True

    def _delta(self, entry: Hooked, strengths: Mapping[int, float]) -> torch.Tensor | None:
        width = entry.info.width
        bad = [i for i in strengths if not (isinstance(i, int) and 0 <= i < width)]
        if bad:
            raise EngineError(
                "invalid_feature_index", f"feature {bad[0]} is outside SAE {entry.info.sae_id!r} (width {width})"
            )
        if any(not math.isfinite(s) for s in strengths.values()):
            raise EngineError("invalid_parameter", "a steering strength is not a finite number")
        live = {i: max(-STRENGTH_MAX, min(STRENGTH_MAX, float(s))) for i, s in strengths.items() if s}
        if not live:
            return None
        index = torch.tensor(list(live), device=self._device)
        rows = entry.sae.W_dec[index]
        weights = torch.tensor(list(live.values()), device=self._device, dtype=rows.dtype)
        direction = (weights[:, None] * rows / rows.norm(dim=1, keepdim=True)).sum(dim=0)
        return (direction * (entry.info.residual_norm / 100.0)).to(self._dtype)

    def _at(self, entry: Hooked) -> tuple[torch.Tensor | None, list]:
        """What a forward on this thread does at `entry`'s block: the delta it adds (None: none)
        and the observers that read it there. Suppressed, nothing is added and only a readout
        the request asked for reads; inside `steered(request)` the request's delta, unless a
        newer state was applied since (the operator wins); else the live state's."""
        local, sae_id = self._local, entry.info.sae_id
        if local.suppressed:
            return None, [o for o in local.observers if o.sae_id == sae_id and o.reads_suppressed]
        request = local.request
        delta = request.deltas.get(sae_id) if request is not None and request.version == entry.version else entry.delta
        return delta, [o for o in local.observers if o.sae_id == sae_id] if local.observers else []

    # -- readouts and suppression ------------------------------------------------------------

    def readout(
        self,
        prompt_tokens: int,
        *,
        sae_id: str | None = None,
        top_k: int = 8,
        positions: Positions = "last",
        features: list[int] | None = None,
        read_point: str = "post_steering",
        max_tokens: int | None = None,
    ) -> Readout:
        """A readout for one sequence whose prompt has `prompt_tokens` tokens. `positions`:
        last | prompt | completion | all | a Span (half-open); `features` restricts
        the candidates (then zero activations are listed too); `sae_id` may be left out while
        exactly one SAE is attached. With `max_tokens`, the worst case (positions × top_k,
        max_tokens counted in full) must be within SAE_ACTIVATIONS_MAX_ENTRIES."""
        if sae_id is None:
            if len(self._hooked) != 1:
                raise EngineError(
                    "invalid_parameter",
                    f"several SAEs are attached; name one with sae_id: {sorted(self._hooked)}"
                    if self._hooked
                    else "no SAE is attached",
                    "return_sae_activations.sae_id",
                )
            sae_id = next(iter(self._hooked))
        entry = self._hooked.get(sae_id)
        if entry is None:
            raise EngineError(
                "invalid_parameter",
                f"no SAE named {sae_id!r} is attached (attached: {sorted(self._hooked)})",
                "return_sae_activations.sae_id",
            )
        if read_point not in READ_POINTS:
            raise EngineError(
                "invalid_parameter",
                f"read_point must be one of {list(READ_POINTS)}",
                "return_sae_activations.read_point",
            )
        if not (positions in POSITION_MODES or isinstance(positions, Span) and 0 <= positions.start < positions.end):
            raise EngineError(
                "invalid_parameter",
                f"positions must be one of {list(POSITION_MODES)} or {{start, end}} with 0 ≤ start < end",
                "return_sae_activations.positions",
            )
        if not (isinstance(top_k, int) and top_k >= 1):
            raise EngineError("invalid_parameter", "top_k must be a positive integer", "return_sae_activations.top_k")
        width = entry.info.width
        for i in features or ():
            if not (isinstance(i, int) and 0 <= i < width):
                raise EngineError(
                    "invalid_feature_index",
                    f"feature {i} is outside SAE {sae_id!r} (width {width})",
                    "return_sae_activations.features",
                )
        if max_tokens is not None:
            worst = top_k * _worst_positions(positions, prompt_tokens, max_tokens)
            if worst > SAE_ACTIVATIONS_MAX_ENTRIES:
                raise EngineError(
                    "invalid_parameter",
                    f"return_sae_activations could list {worst} activations "
                    f"(positions × top_k, with the {prompt_tokens} prompt tokens and max_tokens "
                    f"{max_tokens}); at most {SAE_ACTIVATIONS_MAX_ENTRIES}: narrow positions or "
                    "lower top_k or max_tokens",
                    "return_sae_activations",
                )
        return Readout(sae_id, entry.info.layer, prompt_tokens, top_k, positions, features, read_point)

    def monitor(self, sae_id: str, top_k: int) -> Monitor | None:
        """A monitor of SAE `sae_id` for one sequence; None when it is not attached (any more):
        monitoring is a side channel, it never fails the request it watches."""
        entry = self._hooked.get(sae_id)
        return None if entry is None else Monitor(sae_id, entry.info.layer, top_k)

    def reading(self, *observers: Readout | Monitor | None) -> _Scoped:
        """Forwards inside this record into each observer given (None: not read)."""
        return _Scoped(self._local, "observers", tuple(o for o in observers if o is not None))

    def for_request(self, strengths: Mapping[str, Mapping[int, float]]) -> RequestSteering:
        """A profile's steering for one request, in place of the live state (enabled; an attached
        SAE it does not name is unsteered), checked as `apply` checks a state."""
        for sae_id in strengths:
            if sae_id not in self._hooked:
                raise EngineError(
                    "sae_not_attached",
                    f"the profile steers SAE {sae_id!r}, which is not attached (attached: {sorted(self._hooked)})",
                    "profile",
                )
        return RequestSteering(
            self.state.version,
            {sae_id: self._delta(self._hooked[sae_id], s) for sae_id, s in strengths.items()},
            tuple(sorted((sae_id, tuple(sorted(s.items()))) for sae_id, s in strengths.items())),
        )

    def steered(self, request: RequestSteering) -> _Scoped:
        """Forwards inside this are steered by `request` instead of the live state — until a
        newer state is applied (an operator's write mid-request wins, for the rest of it too).
        The live state itself never changes, so a batch's rows and later requests keep it."""
        return _Scoped(self._local, "request", request)

    def key(self) -> tuple:
        """What a forward on this thread adds, as a hashable value: two forwards under equal keys
        add the same (a cached prefix's KV is reused only under its key, prefix_cache.py). The
        attaches and applied states so far, and a request's own strengths while they hold."""
        local = self._local
        if local.suppressed:
            return (self.changes, "suppressed")
        request = local.request
        return (self.changes, request.key if request is not None and request.version == self.state.version else None)

    def deltas(self) -> dict[int, torch.Tensor]:
        """Per block, the delta a forward on this thread adds there (`_at`'s; blocks adding none
        left out): what the fixed-shape step adds from its buffer instead of running the hooks."""
        return {e.info.block: d for e in self._hooked.values() if (d := self._at(e)[0]) is not None}

    def suppressed(self) -> _Suppressed:
        """Forwards inside this, on this thread, run with every attached SAE's hook off: no
        steering, nothing read. A forward on another thread (or after the block) is steered."""
        return _Suppressed(self._local)


def feed(observers: list, sae: SAE, pre: torch.Tensor, post: torch.Tensor) -> None:
    """Give each observer its view of one forward at its SAE's block: the residual before the
    block's delta (`pre`) or after it (`post`), [1, positions, d_in]."""
    for observer in observers:
        observer.observe(sae, pre if observer.pre else post)


def median_norm(hidden: torch.Tensor) -> float:
    """ρ_L from a block's residuals over CALIBRATION_TEXT, [positions, d_in]: the median norm,
    the first position left out (a BOS attention sink has an outsized norm in real models)."""
    norms = hidden.float().norm(dim=-1)
    return float(norms[1:].median() if len(norms) > 1 else norms[0])
