"""The engine actor: hosts engines in its own process and serves the front end's one
multiplexed stream.

All blocking compute runs in one worker thread, fed by a queue; the actor's trio
loop only routes messages, so it always answers status and cancel. The worker
checks for cancellation between decode steps and closes the sequence's iterator
(freeing its cache) at the first step boundary after a cancel.

With continuous batching on, the worker interleaves, step by step, one decode step of
each model's batch (every batchable request that has started: the server's fixed
sampling parameters, one choice) and one step of the serial request, if any;
requests start in queue order, a Load/Unload once nothing runs.
"""

from __future__ import annotations

import array
import collections
import contextlib
import gc
import hashlib
import math
import os
import resource
import sys
import threading
import time

import attrs
import trio

from greenroom.actors.runtime import die_with_parent, tractor
from greenroom.errors import GreenroomError
from greenroom.engines.base import EngineError, SamplingParams
from greenroom.protocol import (
    Admitted, Cancel, Done, Embed, Embedded, Events, Failed, Generate, Load, Score, ScoredRow, Scores, Status,
    StatusQuery, Steered, SteerUpdate, Text, Unload, from_wire, to_wire,
)


SEND_INTERVAL_S = 0.002  # ≤ 500 messages/s per actor; below that rate nothing waits
# The server's fixed sampling parameters under continuous batching (the request defaults:
# temperature 1, top_p 1, no top_k, no penalty): only requests asking for exactly these join
# the batch, which samples every row alike from one generator.
FIXED_SAMPLING = SamplingParams()


@tractor.context
async def engine_session(ctx, parent_pid: int, models: list[dict], max_queue: int, default_max_tokens: int,
                         device: str, continuous_batching: bool = False):
    """`models`: [{"id", "engine", "path", "device", "dtype"}]. Loads them, reports
    {"ok": True, "models": [ModelInfo…]} or {"ok": False, "error": …} as the first
    value, then serves the stream until the front end closes it."""
    die_with_parent(parent_pid)
    # The worker thread holds the GIL between torch ops; a short switch interval lets the
    # loop thread forward each step's message promptly instead of after up to 5 ms.
    sys.setswitchinterval(0.0005)
    try:
        engines = await trio.to_thread.run_sync(_load_engines, models)
    except Exception as exc:  # a load failure is a value, never a crashed tree
        await ctx.started({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    await ctx.started({"ok": True, "models": [attrs.asdict(e.info) for e in engines.values()]})
    loop = EngineLoop(engines, max_queue, default_max_tokens, device, continuous_batching)
    async with ctx.open_stream() as stream:
        await loop.serve(stream)


def _load_engines(models: list[dict]) -> dict:
    from greenroom.engines.loader import load_engine  # torch is imported here, in the child

    return {m["id"]: load_engine(m) for m in models}


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
    logprob_sum: float = 0.0


@attrs.define
class Counters:
    admitted: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    tokens_generated: int = 0


class EngineLoop:
    def __init__(self, engines: dict, max_queue: int, default_max_tokens: int, device: str,
                 continuous_batching: bool = False):
        self.engines = engines
        self.device = device
        self.max_queue = max_queue
        self.default_max_tokens = default_max_tokens
        self.continuous_batching = continuous_batching
        self.counters = Counters()
        self._queue: collections.deque[Generate | Embed | Score | Load | Unload] = collections.deque()
        self._wakeup = threading.Condition()
        self._cancelled: set[str] = set()
        self._running: set[str] = set()  # rids taken from the queue and not finished
        self._serial = None  # (request, its step iterator): the one request on the serial path
        self._batches: dict = {}  # model id → DecodeBatch, while it has sequences
        self._choices: dict[str, _Choice] = {}  # rid → a batched request's figures
        self._closing = False
        self._outbox: collections.deque = collections.deque()  # events for the sender, from both threads
        self._enqueued: dict[str, float] = {}  # rid → arrival, for queue-wait figures
        self._steers: collections.deque[SteerUpdate] = collections.deque()  # applied between steps, in order
        self._applied: dict[str, dict] = {}  # model → what _steer left applied, read by status()
        self._wake_pending = False

    async def serve(self, stream) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sender, stream)
                nursery.start_soon(self._run_worker)
                async for raw in stream:
                    self._handle(from_wire(raw))
                nursery.cancel_scope.cancel()
        finally:
            with self._wakeup:
                self._closing = True
                self._cancelled.update(g.rid for g in self._queue)
                self._cancelled.update(self._running)
                self._wakeup.notify()

    # trio side -----------------------------------------------------------------
    def _handle(self, msg) -> None:
        if isinstance(msg, (Generate, Embed, Score)):
            if len(self._queue) + len(self._running) >= self.max_queue:
                self._emit(Failed(msg.rid, GreenroomError(
                    "queue_full", f"the engine queue is full ({self.max_queue} requests); retry later"
                ).to_wire()))
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
            self._emit(Status(msg.rid, self.status()))

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "memory": _device_memory(self.device),
            "models": list(self.engines),
            "queue_depth": len(self._queue),
            "active": len(self._running),
            "max_queue_depth": self.max_queue,
            "inference": self.inference(),
            # each steerable model's applied steering version and attached SAEs (the front end's "live")
            "steering": {m: self._applied.get(m, {"version": 0, "saes": []})
                         for m, e in list(self.engines.items()) if hasattr(e, "steering")},
            **attrs.asdict(self.counters),
        }

    def inference(self) -> dict:
        """The active backend, as GET /api/health/inference shows it: continuous batching
        once it is on and a loaded model's engine batches (`models`)."""
        native = {m: e for m, e in self.engines.items() if getattr(e, "batches_any_sampling", False)}
        if native:  # llama.cpp decodes its sequences together whatever the flag, each sampling alone
            return {"backend": "llama.cpp_parallel", "models": sorted(native),
                    "parallel": max(e.parallel for e in native.values()), "batched": len(self._choices),
                    # one llama_decode for all, or in turns where that measured faster at load
                    "decode": "together" if all(e.decode_together for e in native.values()) else "in_turns"}
        models = sorted(m for m, e in self.engines.items() if getattr(e, "batchable", False))
        if not self.continuous_batching or not models:
            return {"backend": "serial"}
        return {"backend": "continuous_batching", "models": models, "batched": len(self._choices),
                "fixed_sampling": {"temperature": FIXED_SAMPLING.temperature, "top_p": FIXED_SAMPLING.top_p,
                                   "top_k": FIXED_SAMPLING.top_k,
                                   "repetition_penalty": FIXED_SAMPLING.repetition_penalty}}

    async def _sender(self, stream) -> None:
        """One message per wake-up carrying everything produced since the last one, and
        at most one per SEND_INTERVAL_S: a fast engine's steps are coalesced instead of
        each paying the trip, while the first event after a lull goes at once."""
        last = -math.inf
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            wait = last + SEND_INTERVAL_S - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
            self._wake_pending = False
            batch = []
            while self._outbox:
                batch.append(self._outbox.popleft())
            if batch:
                await stream.send(to_wire(Events(batch)))
                last = trio.current_time()

    async def _run_worker(self) -> None:
        await trio.to_thread.run_sync(self._work, abandon_on_cancel=True)

    def _emit(self, event) -> None:  # from the loop thread
        self._outbox.append(event)
        self._wake.set()

    # worker thread ---------------------------------------------------------------
    def _emit_from_thread(self, event) -> None:
        """Queue an event for the sender, waking the loop thread only when no wake-up
        is pending: every hand-off of the GIL to the loop thread delays the decode."""
        self._outbox.append(event)
        if not self._wake_pending:
            self._wake_pending = True
            self._token.run_sync_soon(self._wake_sender)

    def _wake_sender(self) -> None:  # runs in the loop thread
        self._wake.set()

    def _work(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._running and not self._steers and not self._closing:
                    self._wakeup.wait()
                if self._closing:
                    return
                steers = list(self._steers)
                self._steers.clear()
                starting = self._take()
            for update in steers:  # between steps: a forward never sees half a change
                self._guard(update.rid, self._steer, update)
            self._join([req for req in starting if self._batchable(req)])
            for req in starting:
                if not self._batchable(req):  # at most one, after the batchable ones (queue order)
                    self._start(req)
            for model, batch in list(self._batches.items()):
                self._step_batch(model, batch)
            if self._serial is not None:
                req, steps = self._serial
                if self._guard(req.rid, next, steps, None) is None:  # finished, cancelled or failed
                    self._serial = None
                    self._finish(req.rid)

    def _take(self) -> list:
        """The requests that start now, in queue order: every batchable one at the head,
        and at most one other — a Load/Unload only once nothing runs, anything else
        only while the serial path is free."""
        starting = []
        while self._queue:
            head = self._queue[0]
            if not self._batchable(head):
                lifecycle = isinstance(head, (Load, Unload))
                if self._serial is not None or (lifecycle and (self._running or starting)):
                    break
            elif not self._room(head.model, starting):
                break  # the batch is full: FIFO, so nothing behind it starts either
            starting.append(self._queue.popleft())
            self._running.add(head.rid)
            if not self._batchable(head):
                break
        return starting

    def _batchable(self, req) -> bool:
        """One choice of one prompt or conversation, no constraint, on an engine that
        batches; and — the spec's rule for the continuous-batching backend — with it on, the
        fixed sampling parameters (no seed, no penalty). An engine whose sequences each
        sample alone (llama.cpp's own batching) takes any sampling, always."""
        engine = self.engines.get(req.model) if isinstance(req, Generate) else None
        if (not getattr(engine, "batchable", False) or req.n != 1 or req.rows != 1 or req.constraint is not None
                or req.sae_activations is not None or req.monitor is not None  # they read one sequence per forward
                or req.request_strengths is not None):  # the spec: a profile request is served serially
            return False
        if getattr(engine, "batches_any_sampling", False):
            return True
        p = req.params
        return self.continuous_batching and p.seed is None and (
            p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (
            FIXED_SAMPLING.temperature, FIXED_SAMPLING.top_p, FIXED_SAMPLING.top_k, FIXED_SAMPLING.repetition_penalty)

    def _room(self, model: str, starting: list) -> bool:
        """Whether another sequence fits the model's batch (an engine may hold a fixed number)."""
        limit = getattr(self.engines.get(model), "parallel", None)
        if limit is None:
            return True
        batch = self._batches.get(model)
        return (len(batch) if batch else 0) + sum(r.model == model for r in starting) < limit

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
            self._emit_from_thread(Failed(rid, error))
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
                return GreenroomError("insufficient_memory", f"{self.device} ran out of memory during generation "
                                      "(the prompt and its KV cache do not fit beside the model): "
                                      f"{str(exc).splitlines()[0]}")
        return GreenroomError("generation_failed", f"generation failed: {type(exc).__name__}: {exc}")

    def _run(self, req):
        """Embed, Score, Load and Unload run to the end here; a Generate returns its step
        iterator (the serial path)."""
        if isinstance(req, (Load, Unload)):
            return self._lifecycle(req)
        engine = self._engine(req)
        if isinstance(req, Embed):
            return self._embed(engine, req)
        if isinstance(req, Score):
            return self._score(engine, req)
        return self._generate(engine, req)

    def _engine(self, req):
        engine = self.engines.get(req.model)
        if engine is None:
            raise GreenroomError("model_not_found", f"model {req.model!r} is not served by this engine", "model")
        return engine

    def _lifecycle(self, req: Load | Unload) -> None:
        """FIFO with requests: an Unload runs once everything queued before it is done."""
        if isinstance(req, Load):
            from greenroom.engines.loader import load_engine

            if req.spec["id"] not in self.engines:
                try:
                    self.engines[req.spec["id"]] = load_engine(req.spec)
                except Exception as exc:  # a missing source, a file the engine cannot read: the load's error
                    raise GreenroomError("model_load_failed", f"model {req.spec['id']!r} could not be loaded: "
                                         f"{type(exc).__name__}: {exc}", "model") from None
            self._emit_from_thread(Done(req.rid, attrs.asdict(self.engines[req.spec["id"]].info)))
            return
        engine = self.engines.pop(req.model, None)
        self._applied.pop(req.model, None)  # a reload starts unsteered, at version 0
        if engine is not None:
            engine.unload()
            del engine
            gc.collect()  # the weights go now, not at the next collection
        self._emit_from_thread(Done(req.rid))

    def _steer(self, update: SteerUpdate) -> None:
        """Make the model's attached SAEs and steering what `update` says, unless the
        version held is as new (a stale push). Answered with the version now held."""
        steering = getattr(self.engines.get(update.model), "steering", None)
        if steering is None:
            raise GreenroomError("steering_unsupported", f"model {update.model!r} is not loaded here with an engine "
                                 "that steers", "model")
        if update.version > steering.state.version:
            from greenroom.engines.sae import load_sae
            from greenroom.engines.steering import SteeringState

            wanted = {s["sae_id"]: s["path"] for s in update.saes}
            for info in steering.attached():
                if info.sae_id not in wanted:
                    steering.detach(info.sae_id)
            held = {info.sae_id for info in steering.attached()}
            for sae_id, path in wanted.items():
                if sae_id not in held:
                    steering.attach(sae_id, load_sae(path))
            steering.apply(SteeringState(update.version, update.enabled, {
                sae_id: {int(f): s for f, s in features.items()} for sae_id, features in update.strengths.items()}))
        attached = steering.attached()
        self._applied[update.model] = {"version": steering.state.version, "saes": [i.sae_id for i in attached]}
        self._emit_from_thread(Steered(update.rid, steering.state.version, [attrs.asdict(i) for i in attached]))

    def _score(self, engine, req: Score) -> None:
        if req.conversations is not None and not engine.has_chat_template:
            raise GreenroomError("no_chat_template", f"model {req.model!r} has no chat template: chat scoring "
                                 "would score a prompt the model was never trained on; use /v1/completions")
        rows, names = _rows(engine, req)
        for ids, name in zip(rows, names):
            if not ids:
                raise GreenroomError("invalid_scoring_request", f"{name} tokenises to nothing: there is no "
                                     "position to score", name.split("[")[0])
            if len(ids) >= engine.info.context_length:
                raise GreenroomError("context_length_exceeded", (
                    f"This model's maximum context length is {engine.info.context_length} tokens. However, you "
                    f"requested {len(ids) + 1} tokens ({len(ids)} in the {name}, 1 in the completion)."), name)
        # return_sae_activations (one row): read on the scoring pass itself, whose hooks are suppressed
        readout, read = self._readout(engine, req, rows[0], 1) if req.sae_activations is not None else (None, None)
        self.counters.admitted += 1
        out = []
        for ids, name in zip(rows, names):
            try:
                scored = engine.score(ids, req.temperature, req.allowed_token_ids, req.report, readout)
            except EngineError as exc:
                raise EngineError(exc.code, f"{name}: {exc.message}", exc.param) from None
            prompt_text = req.prompts[len(out)] if req.prompts is not None else engine.decode(ids)
            out.append(ScoredRow(_token(engine, scored.token_id), scored.logprob,
                                 [_token(engine, i) + [lp] for i, lp in scored.top], len(ids), len(prompt_text)))
        self.counters.completed += 1
        activations = {**read, "read_point": "unsteered", "positions": readout.result(rows[0])} if read else None
        self._emit_from_thread(Scores(req.rid, out, activations))

    def _admit(self, engine, req: Generate) -> tuple[list[list[int]], list, Admitted]:
        """Validate and tokenise every row (each row's params, max_tokens resolved) — a row
        with a Fit cut to its window by Ollama's rule — and the Admitted that announces it."""
        rows, names = _rows(engine, req)
        if req.conversations is None:
            for ids, name in zip(rows, names):
                _check_ids(engine, ids, name, "prompt")
        fitted = None
        if req.fit is not None:
            fitted, params = self._fitted(engine, req, rows[0])
            rows = [fitted.ids]
        else:  # a constrained document is ended by its grammar, not cut by the server's default
            params = [self._resolve_max_tokens(engine, ids, req.params, name, whole_room=req.constraint is not None)
                      for ids, name in zip(rows, names)]
        as_is = req.conversations is not None and not engine.has_chat_template
        return rows, params, Admitted(req.rid, sum(len(ids) for ids in rows), fitted and fitted.truncated, as_is)

    def _fitted(self, engine, req: Generate, ids: list[int]):
        """The row fitted by Ollama's rule (engines/prompt_fit.py) and its params: the answer
        gets num_predict tokens, or the rest of the window, and never passes the window."""
        from greenroom.engines.prompt_fit import answer_room, fit_conversation, fit_ids

        fit = req.fit
        window = min(fit.window, engine.info.context_length)
        target = window - answer_room(window, fit.answer)
        # an engine may take shorter prompts than its window (the NPU pipeline's static shapes)
        target = min(target, getattr(engine, "max_prompt_len", None) or target)
        if req.conversations is not None and len(ids) > target:
            fitted = fit_conversation(_renderer(engine, req, "messages"), req.conversations[0], target, fit.keep)
        else:
            fitted = fit_ids(ids, target, fit.keep)
        room = window - len(fitted.ids)
        return fitted, [attrs.evolve(req.params, max_tokens=room if fit.fill else min(fit.answer, room))]

    def _admitted(self, req: Generate, admitted: Admitted) -> float:
        """Count and announce the request; returns when it started computing."""
        self.counters.admitted += 1
        self._emit_from_thread(admitted)
        return time.monotonic()

    def _generate(self, engine, req: Generate):
        """The serial path, one decode step per iteration; every choice in turn."""
        from greenroom.engines.generation import generate

        rows, params, admitted = self._admit(engine, req)
        grammar = engine.compile_constraint(req.constraint) if req.constraint is not None else None
        readout, read = self._readout(engine, req, rows[0], params[0].max_tokens) \
            if req.sae_activations is not None else (None, None)
        # a profile steers this request's forwards only (engines/steering.py: the live state is
        # never changed, so there is nothing to restore, and a newer state applied meanwhile wins)
        scope = contextlib.nullcontext() if req.request_strengths is None else engine.steering.steered(
            engine.steering.for_request({sae_id: {int(f): s for f, s in features.items()}
                                         for sae_id, features in req.request_strengths.items()}))
        started = self._admitted(req, admitted)
        queue_wait = started - self._enqueued.get(req.rid, started)
        for row, (ids, row_params) in enumerate(zip(rows, params)):
            for j in range(req.n):
                choice_params = row_params if j == 0 or row_params.seed is None else attrs.evolve(
                    row_params, seed=_choice_seed(row_params.seed, j))
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
                    self._deliver(choice, delta, read)
                    yield True
        self.counters.completed += 1

    def _monitor(self, engine, req: Generate):
        """A monitor for one choice of a monitored request; None without one, or when its SAE
        is not attached here (any more): monitoring never fails the request it watches."""
        steering = getattr(engine, "steering", None)
        if req.monitor is None or steering is None:
            return None
        return steering.monitor(req.monitor["sae_id"], req.monitor["top_k"])

    def _readout(self, engine, req: Generate | Score, ids: list[int], max_tokens: int) -> tuple:
        """The readout of the request's one sequence (validated against the SAEs attached now,
        and its worst case against the cap: a refusal comes before Admitted), and what the
        finishing event says of it."""
        steering = getattr(engine, "steering", None)
        if steering is None:
            raise GreenroomError("field_not_honoured", f"model {req.model!r} has no SAE hooks on this engine",
                                 "return_sae_activations")
        spec = req.sae_activations
        readout = steering.readout(len(ids), sae_id=spec["sae_id"], top_k=spec["top_k"], positions=spec["positions"],
                                   features=spec["features"], read_point=spec["read_point"], max_tokens=max_tokens)
        layer = next(info.layer for info in steering.attached() if info.sae_id == readout.sae_id)
        return readout, {"sae_id": readout.sae_id, "layer": layer, "read_point": readout.read_point}

    def _join(self, reqs: list[Generate]) -> None:
        """Batchable requests join their model's batch, prefilled together now and decoded
        with the others from the next step."""
        joining: dict[str, list] = {}
        for req in reqs:
            if not self._dropped(req):
                row = self._guard(req.rid, self._admit_row, req)
                if row is not None:
                    joining.setdefault(req.model, []).append(row)
        for model, rows in joining.items():
            batch = self._batches.get(model)
            if batch is None:
                batch = self._batches[model] = self.engines[model].new_batch(FIXED_SAMPLING)
            try:
                deltas = batch.join(rows)
            except Exception as exc:  # the prefill failed: these requests, not the running ones
                self._fail([rid for rid, _, _ in rows], exc)
                continue
            for (rid, _, _), delta in zip(rows, deltas):
                self.counters.tokens_generated += 1
                self._deliver(self._choices[rid], delta)
                if delta.finish_reason:
                    self.counters.completed += 1
                    self._finish(rid)

    def _admit_row(self, req: Generate) -> tuple[str, list[int], object]:
        (ids,), (params,), admitted = self._admit(self._engine(req), req)
        started = self._admitted(req, admitted)
        self._choices[req.rid] = _Choice(req.rid, 0, started, started - self._enqueued.get(req.rid, started),
                                         self._engine(req).capabilities.token_logprobs)
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
            for rid, delta in out:
                self.counters.tokens_generated += 1
                self._deliver(self._choices[rid], delta)
                if delta.finish_reason:
                    self.counters.completed += 1
                    self._finish(rid)
        if not len(batch):
            del self._batches[model]

    def _deliver(self, choice: "_Choice", delta, read: dict | None = None) -> None:
        """A choice's step as a Text event (none while the text is held back), with the
        engine's own figures on the finishing one, the activations read (`read`: which) and
        the monitor's record."""
        now = time.monotonic()
        choice.first_token = choice.first_token or now
        choice.logprob_sum += delta.logprob
        stats = None
        if delta.finish_reason:
            stats = {"logprob_sum": choice.logprob_sum if choice.logprobs else None,
                     "prefill_s": choice.first_token - choice.start,
                     "decode_s": now - choice.first_token, "queue_wait_s": choice.queue_wait,
                     "compute_s": now - choice.started, "peak_rss_mb": _peak_rss_mb()}
        if delta.text or delta.finish_reason:
            activations = {**read, "positions": delta.sae_activations} if read and delta.finish_reason else None
            self._emit_from_thread(Text(choice.rid, choice.index, delta.text, delta.completion_tokens,
                                        delta.finish_reason, stats, activations, delta.monitor))

    def _embed(self, engine, req: Embed) -> None:
        rows = req.token_ids if req.token_ids is not None else [engine.tokenize(t) for t in req.texts]
        limit = engine.info.context_length
        for i, ids in enumerate(rows):
            where = "input" if len(rows) == 1 else f"input[{i}]"
            if len(ids) > limit:
                raise GreenroomError("context_length_exceeded", (
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{len(ids)} tokens in {where}. Please reduce the length of the input."), "input")
            _check_ids(engine, ids, where, "input")
        self.counters.admitted += 1
        vectors = [array.array("f", v).tobytes() for v in engine.embed(rows)]
        self.counters.completed += 1
        self._emit_from_thread(Embedded(req.rid, vectors, sum(len(ids) for ids in rows)))

    def _resolve_max_tokens(self, engine, prompt_ids: list[int], params, where: str, whole_room: bool = False):
        limit = engine.info.context_length
        room = limit - len(prompt_ids)
        if params.max_tokens is None:
            if room <= 0:
                raise GreenroomError("context_length_exceeded", (
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"{where} resulted in {len(prompt_ids)} tokens."), where.split("[")[0])
            return attrs.evolve(params, max_tokens=room if whole_room else min(self.default_max_tokens, room))
        if len(prompt_ids) + params.max_tokens > limit:
            raise GreenroomError("context_length_exceeded", (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt_ids) + params.max_tokens} tokens ({len(prompt_ids)} in the {where}, "
                f"{params.max_tokens} in the completion). Please reduce the length of the {where} "
                f"or completion."), "max_tokens")
        return params


def _rows(engine, req: Generate | Score) -> tuple[list[list[int]], list[str]]:
    """Each row's prompt ids and its name in the request: conversations rendered with the
    chat template (a failing one is named by its index), prompts tokenised."""
    if req.conversations is not None:
        names = ["messages"] + [f"extra_messages[{i}]" for i in range(len(req.conversations) - 1)]
        return [_renderer(engine, req, name)(c) for c, name in zip(req.conversations, names)], names
    rows = req.prompt_token_ids or [engine.tokenize(p, add_special_tokens=req.add_special_tokens)
                                    for p in req.prompts]
    return rows, ["prompt"] if len(rows) == 1 else [f"prompt[{i}]" for i in range(len(rows))]


def _renderer(engine, req: Generate | Score, name: str):
    """messages → prompt ids, by the model's chat template; a model without one refuses
    (no_chat_template), or renders the last message as it is where the request says so
    (Ollama's `{{ .Prompt }}` on /api/generate)."""
    if not engine.has_chat_template:
        if getattr(req, "as_is_without_template", False):
            return lambda messages: engine.tokenize(messages[-1].get("content") or "")
        raise GreenroomError("no_chat_template", f"model {req.model!r} has no chat template, so a conversation "
                             "cannot be rendered for it: give its [[models]] entry a chat_template, or send a plain "
                             "prompt (/v1/completions; /api/generate renders a prompt as it is)", name)

    def render(messages: list[dict]) -> list[int]:
        try:
            return engine.render_chat(messages, req.template_kwargs, req.tools)
        except Exception as exc:  # a template error names the conversation it came from
            raise GreenroomError("invalid_parameter", f"{name} cannot be rendered with the model's chat "
                                 f"template: {exc}", name) from None

    return render


def _token(engine, token_id: int) -> list:
    text = engine.decode([token_id])
    return [token_id, text, list(text.encode("utf-8"))]


def _check_ids(engine, ids: list[int], where: str, param: str) -> None:
    if not ids:
        raise GreenroomError("invalid_parameter", f"{where} is empty", param)
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        raise GreenroomError("invalid_parameter", f"{where} has token ids outside the vocabulary "
                             f"(0–{engine.vocab_size - 1}): {bad[:5]}", param)


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


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _choice_seed(seed: int, j: int) -> int:
    """Choice j > 0 of a seeded request: its own 32-bit seed (torch's CPU generator keeps
    32 bits), derived so that choice 0 stays the plain seeded request."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{j}".encode(), digest_size=4).digest(), "little")
