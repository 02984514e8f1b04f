"""The engine actor: hosts engines in its own process and serves the front end's one
multiplexed stream.

All blocking compute runs in one worker thread, fed by a queue; the actor's trio
loop only routes messages, so it always answers status and cancel. Events go back
through the outbox (outbox.py), which the worker writes to the stream itself: the loop
sleeps while requests run. The worker checks for cancellation between decode
steps and closes the sequence's iterator (freeing its cache) at the first step
boundary after a cancel.

Each turn of the worker: the scheduling policy (scheduling.py) says which queued requests
start and in which lane; they are admitted (admission.py: rendered, tokenised, checked) and
run — batchable ones join their model's batch, the serial request and Embed/Score/Load/Unload
run here — then one decode step of each model's batch and one step of the serial request,
if any; what the outbox holds goes out after each step once it is due, and before anything
else starts or the worker waits.
"""

from __future__ import annotations

import array
import collections
import contextlib
import gc
import hashlib
import os
import resource
import sys
import threading
import time

import attrs
import trio

from greenroom.actors.admission import admit, embed_rows, score_rows, tokenized
from greenroom.actors.dashboard_runner import DashboardRunner
from greenroom.actors.outbox import Outbox
from greenroom.actors.runtime import die_with_parent, tractor
from greenroom.actors.scheduling import FIXED_SAMPLING, Lane, ModelBatching, Request, SchedulingPolicy, Start
from greenroom.cpus import pin_process
from greenroom.engines.base import EngineError
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    Admitted,
    Cancel,
    Done,
    Embed,
    Embedded,
    Failed,
    FeaturesRead,
    Generate,
    GenerationStats,
    Load,
    Loading,
    ReadFeatures,
    Score,
    ScoredRow,
    Scores,
    StartDashboards,
    Status,
    StatusQuery,
    Steered,
    SteerUpdate,
    Text,
    TextFeatures,
    Tokenize,
    Tokenized,
    Unload,
    from_wire,
)


@tractor.context
async def engine_session(
    ctx,
    parent_pid: int,
    models: list[dict],
    max_queue: int,
    default_max_tokens: int,
    device: str,
    continuous_batching: bool = False,
    cpu: int | None = None,
    chunks_per_s: float = 0.0,
):
    """`models`: placements as they cross here (engines/loader.load_engine's spec); `cpu`: the one
    this process keeps to (cpus.py); `chunks_per_s`: the front end's pacing (outbox.py). Loads them, reports
    {"ok": True, "models": [ModelInfo…]} or {"ok": False, "error": …} as the first
    value, then serves the stream until the front end closes it."""
    die_with_parent(parent_pid)
    if cpu is not None:
        pin_process(cpu)
    # The worker thread holds the GIL between torch ops; a short switch interval lets the
    # loop thread's turns (a request, status, cancel) in promptly instead of after up to 5 ms
    # (measured while the loop still polled the outbox: one tiny-demo stream 4 % faster).
    sys.setswitchinterval(0.0005)
    try:
        engines = await trio.to_thread.run_sync(_load_engines, models)
    except Exception as exc:  # a load failure is a value, never a crashed tree
        await ctx.started({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    await ctx.started({"ok": True, "models": [attrs.asdict(e.info) for e in engines.values()]})
    loop = EngineLoop(engines, max_queue, default_max_tokens, device, continuous_batching, chunks_per_s)
    async with ctx.open_stream() as stream:
        await loop.serve(stream)


def _load_engines(models: list[dict]) -> dict:
    return {m["id"]: load_measured(m) for m in models}


def load_measured(spec: dict, stage=None):
    """loader.load_engine, with the engine's ModelInfo.footprint_bytes the larger of its own
    figure and what the load took on its device: the card's reserved memory (torch's caching
    allocator) or, on the CPU, the process's RSS, before and after. The engine's module is
    imported first: the libraries it imports stay when the model goes."""
    from greenroom.engines.loader import engine_class, load_engine  # torch is imported here, in the child

    engine_class(spec["engine"])
    device = spec.get("device", "cpu")
    before = _device_bytes(device)
    engine = load_engine(spec, stage)
    taken = _device_bytes(device) - before
    engine.info = attrs.evolve(engine.info, footprint_bytes=max(engine.info.footprint_bytes or 0, taken) or None)
    return engine


@attrs.define(eq=False)
class _Choice:
    """One choice's figures, for its finishing Text event."""

    rid: str
    index: int
    started: float  # the request's start of compute
    queue_wait: float
    logprobs: bool = True  # the engine reports each token's log-probability (capabilities.token_logprobs)
    start: float = attrs.Factory(time.monotonic)  # this choice's
    first_token: float | None = None
    shown: bool = False  # a text of this choice has gone to the outbox
    logprob_sum: float = 0.0
    tokens: list = attrs.Factory(list)  # the reported tokens (Delta.token) not yet sent


@attrs.define
class Counters:
    admitted: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    tokens_generated: int = 0


class EngineLoop:
    """The actor's state, shared by its two threads: the trio loop routes messages (`serve`,
    `_handle`); the worker thread runs turns (`_work`) and the runners."""

    def __init__(
        self,
        engines: dict,
        max_queue: int,
        default_max_tokens: int,
        device: str,
        continuous_batching: bool = False,
        chunks_per_s: float = 0.0,
    ):
        self.engines = engines
        self.chunks_per_s = chunks_per_s
        self.device = device
        self.max_queue = max_queue
        self.default_max_tokens = default_max_tokens
        self.continuous_batching = continuous_batching
        self.policy = SchedulingPolicy(continuous_batching)
        self._models = {m: ModelBatching.of(e) for m, e in engines.items()}  # the policy's view of `engines`
        self.counters = Counters()
        self._queue: collections.deque[Request] = collections.deque()
        self._wakeup = threading.Condition()
        self._cancelled: set[str] = set()
        self._running: set[str] = set()  # rids taken from the queue and not finished
        self._serial = None  # (request, its step iterator): the one request on the serial path
        self._batches: dict = {}  # model id → DecodeBatch, while it has sequences
        self._choices: dict[str, _Choice] = {}  # rid → a batched request's figures
        self._closing = False
        self._enqueued: dict[str, float] = {}  # rid → arrival, for queue-wait figures
        self._steers: collections.deque[SteerUpdate] = collections.deque()  # applied between steps, in order
        self._applied: dict[str, dict] = {}  # model → what _steer left applied, read by status()
        self._dashboards = DashboardRunner()  # run a step at a time while nothing else runs

    async def serve(self, stream) -> None:
        self._outbox = Outbox(stream, self.chunks_per_s)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._outbox.send)
                nursery.start_soon(self._run_worker)
                async for raw in stream:
                    self._handle(from_wire(raw))
                nursery.cancel_scope.cancel()
        finally:
            with self._wakeup:
                self._dashboards.drop()
                self._closing = True
                self._cancelled.update(g.rid for g in self._queue)
                self._cancelled.update(self._running)
                self._wakeup.notify()
            await self._outbox.close()

    # trio side -----------------------------------------------------------------
    def _handle(self, msg) -> None:
        if isinstance(msg, (Generate, Embed, Score, Tokenize, ReadFeatures, StartDashboards)):
            if len(self._queue) + len(self._running) >= self.max_queue:
                self._outbox.put(
                    Failed(
                        msg.rid,
                        GreenroomError(
                            "queue_full", f"the engine queue is full ({self.max_queue} requests); retry later"
                        ).to_wire(),
                    )
                )
                return
            with self._wakeup:
                self._queue.append(msg)
                self._enqueued[msg.rid] = time.monotonic()
                self._wakeup.notify()
        elif isinstance(msg, (Load, Unload)):  # lifecycle: never refused for a full queue
            with self._wakeup:
                self._queue.append(msg)
                self._wakeup.notify()
        elif isinstance(msg, SteerUpdate):  # not queued behind requests: it lands at the next step
            with self._wakeup:
                self._steers.append(msg)
                self._wakeup.notify()
        elif isinstance(msg, Cancel):
            self._cancelled.add(msg.rid)
        elif isinstance(msg, StatusQuery):
            self._outbox.put(Status(msg.rid, self.status()))

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "rss_bytes": _rss_bytes(),  # what /api/actors shows for an actor on another host
            "memory": _device_memory(self.device),
            "models": list(self.engines),
            "queue_depth": len(self._queue),
            "active": len(self._running),
            "max_queue_depth": self.max_queue,
            "inference": self.inference(),
            # each steerable model's applied steering version and attached SAEs (the front end's "live")
            "steering": {
                m: self._applied.get(m, {"version": 0, "saes": []})
                for m, e in list(self.engines.items())
                if e.capabilities.steering
            },
            # each model's prefix-reuse store (transformers: engines/transformers/prefix_cache.py; llama.cpp:
            # engines/llama_cpp/prompt_store.py), for /metrics
            "prefix_cache": {
                m: e.prefix_cache.stats()
                for m, e in list(self.engines.items())
                if getattr(e, "prefix_cache", None) is not None
            },
            **attrs.asdict(self.counters),
        }

    def inference(self) -> dict:
        """The active backend, as GET /api/health/inference shows it: continuous batching
        once it is on and a loaded model's engine batches (`models`)."""
        native = {m: e for m, e in self.engines.items() if getattr(e, "batches_any_sampling", False)}
        if native:  # llama.cpp decodes its sequences together whatever the flag, each sampling alone
            return {
                "backend": "llama.cpp_parallel",
                "models": sorted(native),
                "parallel": max(e.parallel for e in native.values()),
                "batched": len(self._choices),
                # one llama_decode for all, or in turns, with flash attention or not: what
                # measured faster at load (LlamaCppEngine._decode_plan)
                "decode": "together" if all(e.decode_together for e in native.values()) else "in_turns",
                "flash_attn": all(e.flash_attn for e in native.values()),
            }
        models = sorted(m for m, e in self.engines.items() if getattr(e, "batchable", False))
        if not self.continuous_batching or not models:
            return {"backend": "serial"}
        return {
            "backend": "continuous_batching",
            "models": models,
            "batched": len(self._choices),
            "fixed_sampling": {
                "temperature": FIXED_SAMPLING.temperature,
                "top_p": FIXED_SAMPLING.top_p,
                "top_k": FIXED_SAMPLING.top_k,
                "repetition_penalty": FIXED_SAMPLING.repetition_penalty,
            },
        }

    async def _run_worker(self) -> None:
        await trio.to_thread.run_sync(self._work, abandon_on_cancel=True)

    # worker thread ---------------------------------------------------------------
    def _work(self) -> None:
        rejoin = False  # the last turn skipped its step for requests that came during its prefills
        while True:
            with self._wakeup:
                while (
                    not self._queue and not self._running and not self._steers and not self._closing
                ) and not self._dashboards:
                    self._outbox.flush()  # nothing waits in the outbox while the worker does
                    self._wakeup.wait()
                if self._closing:
                    return
                steers = list(self._steers)
                self._steers.clear()
                starting = self._take()
            if steers or starting:  # nothing waits in the outbox behind a prefill or a serial request
                self._outbox.flush()
            if self._dashboards and (steers or starting):
                # before anything else enters the engine: a dashboards job's open generation holds
                # per-thread state (torch's inference mode) that must close before another opens
                self._dashboards.pause()
            for update in steers:  # between steps: a forward never sees half a change
                self._guard(update.rid, self._steer, update)
            one_by_one = self._join([start.request for start in starting if start.lane is Lane.BATCH])
            for start in starting:
                if start.lane is not Lane.BATCH:  # at most one, after the batchable ones (queue order)
                    self._start(start.request)
            if not rejoin and one_by_one and self._queue:
                # prefilled one by one: what came meanwhile joins before the next step (once a
                # step, so a stream of arrivals never holds the running sequences back longer)
                rejoin = True
                continue
            rejoin = False
            for model, batch in list(self._batches.items()):
                self._step_batch(model, batch)
            if self._serial is not None:
                req, steps = self._serial
                if self._guard(req.rid, next, steps, None) is None:  # finished, cancelled or failed
                    self._serial = None
                    self._finish(req.rid)
            self._outbox.flush_due(len(self._running))
            if self._dashboards:
                self._spare_time()

    def _spare_time(self) -> None:
        """A dashboards job's step while nothing else runs or waits (it was paused when they started)."""
        with self._wakeup:
            idle = not self._queue and not self._running and not self._steers and not self._closing
        if idle:
            self._outbox.flush()
            self._dashboards.step()

    def _take(self) -> list[Start]:
        """The requests that start now, as the policy says (scheduling.py), off the queue."""
        held = {model: len(batch) for model, batch in self._batches.items()}
        if self._serial is not None:  # the serial request holds one of its engine's sequences too
            held[self._serial[0].model] = held.get(self._serial[0].model, 0) + 1
        starting = self.policy.schedule(self._queue, self._models, serial=self._serial is not None, batched=held)
        for start in starting:
            self._queue.popleft()
            self._running.add(start.request.rid)
        return starting

    def _start(self, req) -> None:
        if self._dropped(req):
            return
        steps = self._guard(req.rid, self._run, req)
        if steps is None:  # done at once (or failed)
            self._finish(req.rid)
        else:
            self._serial = (req, steps)

    def _dropped(self, req) -> bool:
        """A request cancelled before it started ends here."""
        if req.rid not in self._cancelled:
            return False
        self.counters.cancelled += 1
        self._finish(req.rid)
        return True

    def _finish(self, rid: str) -> None:
        self._running.discard(rid)
        self._cancelled.discard(rid)
        self._enqueued.pop(rid, None)
        self._choices.pop(rid, None)

    def _guard(self, rid: str, fn, *args):
        """fn(*args), with any failure answered as `rid`'s typed error (None then)."""
        try:
            return fn(*args)
        except Exception as exc:
            self._fail([rid], exc)
            return None

    def _fail(self, rids: list[str], exc: Exception) -> None:
        error = self._typed(exc).to_wire()
        for rid in rids:
            self.counters.failed += 1
            self._outbox.put_from_thread(Failed(rid, error))
            self._finish(rid)

    def _typed(self, exc: Exception) -> GreenroomError:
        if isinstance(exc, GreenroomError):
            return exc
        if isinstance(exc, EngineError):
            return GreenroomError(exc.code, exc.message, exc.param)
        if self.device.startswith("cuda"):
            import torch

            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()  # what the failed step held goes back to the card now
                return GreenroomError(
                    "insufficient_memory",
                    f"{self.device} ran out of memory during generation "
                    "(the prompt and its KV cache do not fit beside the model): "
                    f"{str(exc).splitlines()[0]}",
                )
        return GreenroomError("generation_failed", f"generation failed: {type(exc).__name__}: {exc}")

    def _run(self, req):
        """Embed, Score, Tokenize, Load and Unload run to the end here; a Generate returns its
        step iterator (the serial path)."""
        if isinstance(req, (Load, Unload)):
            return self._lifecycle(req)
        engine = self._engine(req)
        if isinstance(req, Embed):
            return self._embed(engine, req)
        if isinstance(req, Score):
            return self._score(engine, req)
        if isinstance(req, Tokenize):
            return self._tokenize(engine, req)
        if isinstance(req, ReadFeatures):
            return self._read_features(engine, req)
        if isinstance(req, StartDashboards):
            self._dashboards.start(engine, req)
            return self._outbox.put_from_thread(Done(req.rid))
        return self._generate(engine, req)

    def _engine(self, req):
        engine = self.engines.get(req.model)
        if engine is None:
            raise GreenroomError("model_not_found", f"model {req.model!r} is not served by this engine", "model")
        return engine

    def _lifecycle(self, req: Load | Unload) -> None:
        """FIFO with requests: an Unload runs once everything queued before it is done."""
        if isinstance(req, Load):
            if req.spec["id"] not in self.engines:
                try:
                    self.engines[req.spec["id"]] = load_measured(
                        req.spec, lambda stage: self._outbox.put_from_thread(Loading(req.rid, stage))
                    )
                except Exception as exc:  # a missing source, a file the engine cannot read: the load's error
                    raise GreenroomError(
                        "model_load_failed",
                        f"model {req.spec['id']!r} could not be loaded: {type(exc).__name__}: {exc}",
                        "model",
                    ) from None
                self._models[req.spec["id"]] = ModelBatching.of(self.engines[req.spec["id"]])
            self._outbox.put_from_thread(Done(req.rid, self.engines[req.spec["id"]].info))
            return
        self._dashboards.drop(req.model)
        engine = self.engines.pop(req.model, None)
        self._models.pop(req.model, None)
        self._applied.pop(req.model, None)  # a reload starts unsteered, at version 0
        if engine is not None:
            engine.unload()
            del engine
            gc.collect()  # the weights go now, not at the next collection
        self._outbox.put_from_thread(Done(req.rid))

    def _steer(self, update: SteerUpdate) -> None:
        """Make the model's attached SAEs and steering what `update` says, unless the
        version held is as new (a stale push). Answered with the version now held."""
        steering = getattr(self.engines.get(update.model), "steering", None)
        if steering is None:
            raise GreenroomError(
                "steering_unsupported", f"model {update.model!r} is not loaded here with an engine that steers", "model"
            )
        if update.version > steering.state.version:
            from greenroom.engines.sae import load_sae
            from greenroom.engines.steering import SteeringState

            for info in steering.attached():
                if info.sae_id not in update.saes:
                    steering.detach(info.sae_id)
            held = {info.sae_id for info in steering.attached()}
            for sae_id, path in update.saes.items():
                if sae_id not in held:
                    steering.attach(sae_id, load_sae(path))
            steering.apply(SteeringState(update.version, update.enabled, update.strengths))
        self._applied[update.model] = {
            "version": steering.state.version,
            "saes": [i.sae_id for i in steering.attached()],
        }
        norms = {i.sae_id: i.residual_norm for i in steering.attached()}
        self._outbox.put_from_thread(Steered(update.rid, steering.state.version, norms))

    def _score(self, engine, req: Score) -> None:
        rows, names = score_rows(engine, req)
        # return_sae_activations (one row): read on the scoring pass itself, whose hooks are suppressed
        readout = self._readout(engine, req, rows[0], 1) if req.sae_activations is not None else None
        self.counters.admitted += 1
        out = []
        for ids, name in zip(rows, names):
            try:
                out.append(
                    _scored_row(engine, req, ids, req.prompts[len(out)] if req.prompts is not None else None, readout)
                )
            except EngineError as exc:
                raise EngineError(exc.code, f"{name}: {exc.message}", exc.param) from None
        self.counters.completed += 1
        activations = None if readout is None else attrs.evolve(readout.result(rows[0]), read_point="unsteered")
        self._outbox.put_from_thread(Scores(req.rid, out, activations))

    def _admitted(self, req: Generate, admitted: Admitted, hold: bool = False) -> float:
        """Count and announce the request (`hold`: with the caller's next flush); returns when
        it started computing."""
        self.counters.admitted += 1
        self._outbox.put_from_thread(admitted, hold)
        return time.monotonic()

    def _generate(self, engine, req: Generate):
        """The serial path, one decode step per iteration; every choice in turn."""
        from greenroom.engines.generation import generate

        rows, params, admitted = admit(engine, req, self.default_max_tokens, engine.capabilities.seed)
        grammar = engine.compile_constraint(req.constraint) if req.constraint is not None else None
        readout = self._readout(engine, req, rows[0], params[0].max_tokens) if req.sae_activations is not None else None
        # a profile steers this request's forwards only (engines/steering.py: the live state is
        # never changed, so there is nothing to restore, and a newer state applied meanwhile wins)
        scope = (
            contextlib.nullcontext()
            if req.request_strengths is None
            else engine.steering.steered(engine.steering.for_request(req.request_strengths))
        )
        started = self._admitted(req, admitted)
        queue_wait = started - self._enqueued.get(req.rid, started)
        for row, (ids, row_params) in enumerate(zip(rows, params)):
            for j in range(req.n):
                choice_params = (
                    row_params
                    if j == 0 or row_params.seed is None
                    else attrs.evolve(row_params, seed=_choice_seed(row_params.seed, j))
                )
                choice = _Choice(req.rid, row * req.n + j, started, queue_wait, engine.capabilities.token_logprobs)
                deltas = generate(engine, ids, choice_params, grammar, readout, self._monitor(engine, req))
                while True:
                    with scope:  # around each step, never across a yield: a batch's steps run in between
                        delta = next(deltas, None)
                    if delta is None:
                        break
                    self.counters.tokens_generated += 1
                    if req.rid in self._cancelled:
                        self.counters.cancelled += 1
                        return  # leaving the loop closes the sequence and frees its cache
                    self._deliver(choice, delta)
                    yield True
        self.counters.completed += 1

    def _monitor(self, engine, req: Generate):
        """A monitor for one choice of a monitored request; None without one, or when its SAE
        is not attached here (any more): monitoring never fails the request it watches."""
        if req.monitor is None or not engine.capabilities.steering:
            return None
        return engine.steering.monitor(req.monitor.sae_id, req.monitor.top_k)

    def _readout(self, engine, req: Generate | Score, ids: list[int], max_tokens: int):
        """The readout of the request's one sequence (validated against the SAEs attached now,
        and its worst case against the cap: a refusal comes before Admitted)."""
        steering = getattr(engine, "steering", None)
        if steering is None:
            raise GreenroomError(
                "field_not_honoured", f"model {req.model!r} has no SAE hooks on this engine", "return_sae_activations"
            )
        spec = req.sae_activations
        return steering.readout(
            len(ids),
            sae_id=spec.sae_id,
            top_k=spec.top_k,
            positions=spec.positions,
            features=spec.features,
            read_point=spec.read_point,
            max_tokens=max_tokens,
        )

    def _join(self, reqs: list[Generate]) -> bool:
        """Batchable requests join their model's batch, prefilled now (together, or one at a
        time where the batch prefills them one after another, each one's first token
        delivered as its prefill ends) and decoded with the others from the next step.
        True if some were prefilled one at a time."""
        one_by_one = False
        joining: dict[str, list] = {}
        for req in reqs:
            if not self._dropped(req):
                row = self._guard(req.rid, self._admit_row, req)
                if row is not None:
                    joining.setdefault(req.model, []).append(row)
        if joining:
            self._outbox.flush()  # their Admitted, together, before the prefill
        for model, rows in joining.items():
            batch = self._batches.get(model)
            if batch is None:
                batch = self._batches[model] = self.engines[model].new_batch(FIXED_SAMPLING)
            one_by_one = one_by_one or not batch.prefills_together
            for group in [rows] if batch.prefills_together else [[row] for row in rows]:
                try:
                    deltas = batch.join(group)
                except Exception as exc:  # the prefill failed: these requests, not the running ones
                    self._fail([rid for rid, _, _ in group], exc)
                    continue
                for (rid, _, _), delta in zip(group, deltas):
                    self.counters.tokens_generated += 1
                    self._deliver(self._choices[rid], delta)
                    if delta.finish_reason:
                        self.counters.completed += 1
                        self._finish(rid)
                self._outbox.flush_due(len(self._running))  # their first texts, together
        return one_by_one

    def _admit_row(self, req: Generate) -> tuple[str, list[int], object]:
        engine = self._engine(req)  # a batch whose sequences share one generator reproduces no seed
        seeded = engine.capabilities.seed and getattr(engine, "batches_any_sampling", False)
        (ids,), (params,), admitted = admit(engine, req, self.default_max_tokens, seeded)
        started = self._admitted(req, admitted, hold=True)  # sent with the others joining (_join)
        self._choices[req.rid] = _Choice(
            req.rid,
            0,
            started,
            started - self._enqueued.get(req.rid, started),
            engine.capabilities.token_logprobs,
        )
        return req.rid, ids, params

    def _step_batch(self, model: str, batch) -> None:
        gone = [rid for rid in batch.keys if rid in self._cancelled]
        if gone:  # cancelled: their rows leave the cache before the step
            batch.leave(gone)
            self.counters.cancelled += len(gone)
            for rid in gone:
                self._finish(rid)
        if len(batch):
            try:
                out = batch.step()
            except Exception as exc:  # a failed step fails every sequence in it
                self._fail(batch.keys, exc)
                batch.leave(set(batch.keys))
                out = []
            self.counters.tokens_generated += len(out)
            for rid, delta in out:
                self._deliver(self._choices[rid], delta)
                if delta.finish_reason:
                    self.counters.completed += 1
                    self._finish(rid)
            self._outbox.flush_due(len(self._running))
        if not len(batch):
            del self._batches[model]

    def _deliver(self, choice: _Choice, delta) -> None:
        """A choice's step as a Text event (none while the text is held back), with the
        engine's own figures, the activations read and the monitor's record on the finishing one.
        A running text goes as the outbox's row (`put_text`): no Text made per token."""
        if choice.first_token is None:
            choice.first_token = time.monotonic()
        choice.logprob_sum += delta.logprob
        if delta.token is not None:
            token_id, text, logprob, top = delta.token
            choice.tokens.append([token_id, text, logprob, [list(alt) for alt in top]])
        if delta.finish_reason is None:
            if delta.text:
                self._outbox.put_text(
                    choice.rid,
                    choice.index,
                    delta.text,
                    delta.completion_tokens,
                    choice.tokens or None,
                    not choice.shown,
                )
                choice.tokens, choice.shown = [], True
            return
        now = time.monotonic()
        stats = GenerationStats(
            logprob_sum=choice.logprob_sum if choice.logprobs else None,
            prefill_s=choice.first_token - choice.start,
            decode_s=now - choice.first_token,
            queue_wait_s=choice.queue_wait,
            compute_s=now - choice.started,
            peak_rss_mb=_peak_rss_mb(),
        )
        self._outbox.put_from_thread(
            Text(
                choice.rid,
                choice.index,
                delta.text,
                delta.completion_tokens,
                delta.finish_reason,
                stats,
                delta.sae_activations,
                delta.monitor,
                delta.stop,
                choice.tokens or None,
            )
        )
        choice.tokens = []

    def _tokenize(self, engine, req: Tokenize) -> None:
        ids = tokenized(engine, req)
        self._outbox.put_from_thread(
            Tokenized(
                req.rid,
                ids,
                engine.info.context_length,
                engine.decode(ids) if req.token_ids is not None else None,
                [engine.token_text(i) for i in ids] if req.token_strs else None,
            )
        )

    def _read_features(self, engine, req: ReadFeatures) -> None:
        from greenroom.engines.dashboards import read_features

        rows = []
        for read in read_features(engine, req.sae_id, req.texts):
            values, index = read.acts.topk(min(req.top_k, read.acts.shape[1]), dim=1)
            top = [[[i, v] for i, v in zip(idx, vals) if v > 0] for idx, vals in zip(index.tolist(), values.tolist())]
            rows.append(
                TextFeatures(
                    read.tokens,
                    [engine.token_text(i) for i in read.tokens],
                    read.mean.numpy().astype("<f4").tobytes(),
                    top,
                )
            )
        self._outbox.put_from_thread(FeaturesRead(req.rid, rows))

    def _embed(self, engine, req: Embed) -> None:
        rows = embed_rows(engine, req)  # each input's tokens counted and checked against the window
        self.counters.admitted += 1
        # an engine whose pipeline takes text (OpenVINO's) gets the texts, not their ids
        by_text = getattr(engine, "embed_texts", None) if req.texts is not None else None
        vectors = [array.array("f", v).tobytes() for v in (by_text(req.texts) if by_text else engine.embed(rows))]
        self.counters.completed += 1
        self._outbox.put_from_thread(Embedded(req.rid, vectors, sum(len(ids) for ids in rows)))


def _token(engine, token_id: int) -> list:
    text = engine.decode([token_id])
    return [token_id, text, list(text.encode("utf-8"))]


def _scored_row(engine, req: Score, ids: list[int], prompt: str | None, readout) -> ScoredRow:
    """One row of a Score: the token after the prompt (engine.score); with echo, the prompt's
    text too, and with echo_logprobs every prompt token's log-probability from one pass over
    the prompt (engine.prompt_logprobs), the token after it read from the same pass."""
    prompt_text = prompt if prompt is not None else engine.decode(ids)
    scored, echoed = None, None
    if req.echo_logprobs is not None or (readout is not None and not req.next_token):  # a readout reads a pass
        result = engine.prompt_logprobs(
            ids,
            req.temperature,
            req.echo_logprobs or 0,
            req.allowed_token_ids,
            req.report if req.next_token else None,
            readout,
        )
        scored, echoed = result.next, result.tokens if req.echo_logprobs is not None else None
    elif req.next_token:
        scored = engine.score(ids, req.temperature, req.allowed_token_ids, req.report, readout)
    texts: dict[int, str] = {}

    def text(token_id: int) -> str:
        if token_id not in texts:
            texts[token_id] = engine.decode([token_id])
        return texts[token_id]

    tokens = (
        None
        if echoed is None
        else [[ids[0], text(ids[0]), None, None]]
        + [[t, text(t), p.logprob, [[i, text(i), lp] for i, lp in p.top]] for t, p in zip(ids[1:], echoed)]
    )
    if scored is None:
        return ScoredRow(None, None, [], len(ids), len(prompt_text), prompt_text if req.echo else None, tokens)
    return ScoredRow(
        _token(engine, scored.token_id),
        scored.logprob,
        [_token(engine, i) + [lp] for i, lp in scored.top],
        len(ids),
        len(prompt_text),
        prompt_text if req.echo else None,
        tokens,
    )


def _device_memory(device: str) -> dict:
    """Free and total bytes of the actor's card (host memory for the CPU)."""
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
    else:
        import psutil

        vm = psutil.virtual_memory()
        free, total = vm.available, vm.total
    return {"device": device, "free_bytes": int(free), "total_bytes": int(total)}


def _device_bytes(device: str) -> int:
    """What this process holds on `device`: torch's reserved memory on a card, else its RSS."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.memory_reserved(torch.device(device))
    return _rss_bytes()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _choice_seed(seed: int, j: int) -> int:
    """Choice j > 0 of a seeded request: its own 32-bit seed (torch's CPU generator keeps
    32 bits), derived so that choice 0 stays the plain seeded request."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{j}".encode(), digest_size=4).digest(), "little")
