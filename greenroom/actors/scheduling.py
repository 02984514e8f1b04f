"""The engine actor's scheduling policy: which queued requests start this turn, and in
which lane. Pure (no threads, no trio, no engine compute): the worker loop (engine_actor.py)
gives it the queue, what runs and how each model batches, and runs what it answers — the
schedule step of vLLM V1's schedule → execute → update.

FIFO: requests start in queue order, so what starts is always a prefix of the queue. Every
batchable request at the head joins its model's batch while the batch has room; at most one
other request starts, after them — a Generate, Embed or Score only while the serial path is
free (a Generate also needs a free sequence of an engine that has a fixed number), a Tokenize
whatever runs (a tokenizer call between two steps, no forward), a Load/Unload only once
nothing runs. A request that cannot start stops the queue: those
behind it wait, even ones that could start.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from greenroom.engines.base import SamplingParams
from greenroom.protocol import Embed, Generate, Load, ReadFeatures, Score, StartDashboards, Tokenize, Unload

# The server's fixed sampling parameters under continuous batching (the request defaults:
# temperature 1, top_p 1, no top_k, no penalty): only requests asking for exactly these join
# the batch, which samples every row alike from one generator.
FIXED_SAMPLING = SamplingParams()

Request = Generate | Embed | Score | Tokenize | ReadFeatures | StartDashboards | Load | Unload


@attrs.frozen
class ModelBatching:
    """What the policy knows of a served model: whether its engine batches it now, whether
    each of its sequences samples alone (llama.cpp's own batching: any sampling joins, flag or
    not), and how many sequences its batch holds (None: no fixed number)."""

    batches: bool = False
    any_sampling: bool = False
    capacity: int | None = None

    @classmethod
    def of(cls, engine) -> ModelBatching:
        """An engine's description, from the attributes a batching engine declares (base.py)."""
        return cls(
            getattr(engine, "batchable", False),
            getattr(engine, "batches_any_sampling", False),
            getattr(engine, "parallel", None),
        )


class Lane(enum.Enum):
    BATCH = "batch"  # joins its model's batch: prefilled this turn, decoded with the others from the next
    SERIAL = "serial"  # the serial path: a Generate's step iterator, or an Embed/Score run to the end
    BESIDE = "beside"  # a Tokenize, run to the end between two steps of whatever runs
    LIFECYCLE = "lifecycle"  # a Load/Unload, run to the end while nothing else runs


@attrs.frozen
class Start:
    request: Request
    lane: Lane


@attrs.frozen
class SchedulingPolicy:
    continuous_batching: bool = False

    def batchable(self, req: Request, model: ModelBatching | None) -> bool:
        """One choice of one prompt or conversation, no constraint, on a model whose engine
        batches; and — the spec's rule for the continuous-batching backend — with it on, the
        fixed sampling parameters (no seed, no penalty). An engine whose sequences each sample
        alone takes any sampling, always."""
        if (
            not isinstance(req, Generate)
            or model is None
            or not model.batches
            or req.n != 1
            or req.rows != 1
            or req.constraint is not None
            or req.sae_activations is not None
            or req.monitor is not None  # they read one sequence per forward
            or req.request_strengths is not None
        ):  # the spec: a profile request is served serially
            return False
        if model.any_sampling:
            return True
        p = req.params
        return (
            self.continuous_batching
            and p.seed is None
            and p.logprobs is None  # the batch samples every row alike and reports no alternatives
            and (p.temperature, p.top_p, p.top_k, p.repetition_penalty)
            == (
                FIXED_SAMPLING.temperature,
                FIXED_SAMPLING.top_p,
                FIXED_SAMPLING.top_k,
                FIXED_SAMPLING.repetition_penalty,
            )
        )

    def schedule(
        self,
        queued: Iterable[Request],
        models: Mapping[str, ModelBatching],
        *,
        serial: bool,
        batched: Mapping[str, int],
    ) -> list[Start]:
        """What starts this turn, in queue order (a prefix of `queued`). `serial`: the serial
        path is taken; `batched`: model → sequences its engine holds now (its batch's, and the
        serial request's)."""
        starts: list[Start] = []
        joining: dict[str, int] = {}  # model → sequences starting in its batch this turn
        for req in queued:
            model = models.get(req.model) if isinstance(req, Generate) else None
            full = (
                model is not None
                and model.capacity is not None
                and batched.get(req.model, 0) + joining.get(req.model, 0) >= model.capacity
            )
            if self.batchable(req, model):
                if full:
                    break  # the batch is full: FIFO, so nothing behind it starts either
                joining[req.model] = joining.get(req.model, 0) + 1
                starts.append(Start(req, Lane.BATCH))
                continue
            if isinstance(req, (Load, Unload)):
                if not serial and not any(batched.values()) and not starts:
                    starts.append(Start(req, Lane.LIFECYCLE))
            elif isinstance(req, (Tokenize, StartDashboards)):  # a dashboards job is only queued here
                starts.append(Start(req, Lane.BESIDE))
            elif not serial and not full:  # a Generate needs one of its engine's sequences too
                starts.append(Start(req, Lane.SERIAL))
            break  # at most one request off the batches, and nothing behind it
        return starts
