"""The engine actor's dashboards jobs (engines/dashboards.py): queued in the order they came,
the first one run a step at a time whenever the actor has nothing else to do — no request
queued or running (engine_actor.EngineLoop._work) — so serving never waits for more than one
step. The job's status, progress and results go to the store (store/dashboards.py) from a thread
of their own — a commit can wait on the disk for tens of milliseconds, which the worker thread
would make a request wait too; a cancel comes back through the store (the status the front end
wrote), read with each progress write and seen at the step after it.
"""

from __future__ import annotations

import collections
import time
from concurrent.futures import Future, ThreadPoolExecutor

import attrs

from greenroom.engines.dashboards import Corpus, DashboardJob
from greenroom.protocol import StartDashboards
from greenroom.store.dashboards import DashboardStore

PROGRESS_EVERY_S = 0.5


@attrs.define(eq=False)
class _Run:
    req: StartDashboards
    job: DashboardJob
    store: DashboardStore
    reported: float = 0.0  # when progress was last written (0: never: the job has not started)
    status: Future | None = None  # the last progress write's: the status the job has in the store
    logits_stored: bool = False


class DashboardRunner:
    def __init__(self):
        self._runs: collections.deque[_Run] = collections.deque()
        self._writer = ThreadPoolExecutor(1, "dashboards-store")  # writes in order

    def __bool__(self) -> bool:
        return bool(self._runs)

    def start(self, engine, req: StartDashboards) -> None:
        """Queue the job; its errors (an SAE not attached, a corpus file that cannot be read)
        are raised now, before it is answered."""
        corpus = Corpus(tuple(req.files), tuple(req.seeds), req.generated_tokens)
        job = DashboardJob(
            engine,
            req.sae_id,
            req.features,
            corpus,
            top_k=req.top_k,
            context_tokens=req.context_tokens,
            max_tokens=req.max_tokens,
            logit_k=req.logit_k,
        )
        self._runs.append(_Run(req, job, DashboardStore(req.store)))

    def step(self) -> None:
        """One step of the first job; a finished, failed or cancelled job leaves the queue."""
        run = self._runs[0]
        req, job, store = run.req, run.job, run.store
        if run.status is not None and run.status.done():
            if run.status.exception() is not None or run.status.result() != "running":
                self._end(run)  # cancelled meanwhile (or its store cannot be written)
                return
        now = time.monotonic()
        if now - run.reported >= PROGRESS_EVERY_S:
            run.reported = now
            run.status = self._writer.submit(store.set_status, req.rid, "running", job.progress)
        try:
            more = job.step()
            if not run.logits_stored and len(job.logits) == len(req.features):
                rows = list(zip(req.features, job.logits))
                self._writer.submit(store.put_logits, req.model, req.sae_id, req.rid, rows)
                run.logits_stored = True
            if not more:
                rows = [(row["index"], row) for row in job.result()]
                self._writer.submit(store.put_stats, req.model, req.sae_id, req.rid, rows)
                self._writer.submit(store.set_status, req.rid, "done", job.progress)
        except Exception as exc:  # the job's failure, never the actor's
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self._writer.submit(store.set_status, req.rid, "failed", job.progress, message)
            self._end(run)
            return
        if not more:
            self._end(run)

    def pause(self) -> None:
        """Serving needs the engine: the running job lets go of what it holds there."""
        if self._runs:
            self._runs[0].job.pause()

    def drop(self, model: str | None = None) -> None:
        """The jobs of `model` (all: None) end, marked interrupted (its engine goes)."""
        for run in [r for r in self._runs if model is None or r.req.model == model]:
            self._writer.submit(run.store.interrupt_job, run.req.rid)
            self._end(run)

    def _end(self, run: _Run) -> None:
        run.job.pause()
        self._runs.remove(run)
