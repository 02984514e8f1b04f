"""The one generation path every surface runs, from its request to its answer.

`prepare` (parse, the model's engine, the field ledger: refusals before any engine is asked
anything) → the typed ChatRequest the surface's translator made of the body (request.py),
planned (`planned`: the structured-output plan, `Generate`, SAE activations, the request's
steering — chat completions, Responses, Messages, Needle) →
`run`: submit, wait for `Admitted` (the engine's refusals are then plain typed errors, never a
broken stream), the engine's events turned once into the typed stream (events.py; a `Failure`
named in the request's own fields: paths.py), which the surface's `Formatter` writes as its
frames or, folded, as its body. Closing the response body (the client went away) or leaving
early cancels the request in the engine. Ollama prepares its own way (ollama_request.py: its
model names and a created model's defaults) and runs the same `run`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import attrs
from quart import current_app, request

from greenroom import structured_fields as sf
from greenroom.engines.capabilities import Capabilities
from greenroom.http.core import contracts, ledger
from greenroom.http.core.contracts import Shape
from greenroom.http.core.framing import SSE, Framing, streamed
from greenroom.http.core.headers import CONSTRAINED_HEADER, DRAWN_SEED_HEADER, SEED_HEADER, STRICT_HEADER
from greenroom.http.core.pacing import Pacer
from greenroom.http.manage import steering_api
from greenroom.http.openai import openai_params, scoring
from greenroom.http.pipeline import events as typed
from greenroom.http.pipeline import sae_activations, structured
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.http.pipeline.request import ChatRequest, Streaming
from greenroom.protocol import Admitted, Generate
from greenroom.supervisor.engine_client import EngineClient, admit
from greenroom.supervisor.lifecycle import Serving
from greenroom.supervisor.tree import Tree

_AS_SENT = FieldPaths()  # a surface's own request: its errors name its fields as they are


@attrs.frozen
class Prepared:
    body: dict  # as the surface's client sent it: what the ledger read
    model: str
    ignored: list[str]
    strict: bool
    caps: Capabilities = Capabilities()
    where: str = ""  # "on <endpoint> with the <engine> engine": where a refusal says it could not honour
    paths: FieldPaths = FieldPaths()  # a translated surface's names for its ChatRequest's locations
    request: ChatRequest | None = None  # a chat request's, as its surface's translator made it

    def unread(self, also_ignored: tuple[str, ...] = ()) -> list[str]:
        """Every location not read: the ledger's, and fields this request's path skips (sent to a
        surface that declares them; to one that does not, the ledger has them)."""
        skipped = [f for f in also_ignored if self.body.get(f) is not None and f not in self.ignored]
        return self.ignored + skipped

    def unread_by(self, gen: Generate) -> list[str]:
        """Every location a generation `gen` does not read: return_tokens_as_token_ids too while
        it asks for no logprobs (scoring.SCORING_ONLY: read only where they are written)."""
        return self.unread(scoring.SCORING_ONLY if gen.params.logprobs is None else ())

    def headers(self, also_ignored: tuple[str, ...] = ()) -> dict[str, str]:
        """Refuse under strict mode, else the report of every field not read."""
        return ledger.report_headers(self.unread(also_ignored), self.strict)

    def asking(self, request: ChatRequest, unread: Sequence[str] = (), paths: FieldPaths = _AS_SENT) -> Prepared:
        """The chat request a surface's translator made of its body, with the nested keys it did
        not read and where each of the request's locations came from (`paths`: the surface names
        its refusals by it, before the answer and in its stream); a forced tool_choice checked
        (the ledger checks chat completions' own: this, for a translated surface's)."""
        ledger.constrained_choice(attrs.asdict(request.output, recurse=False), self.caps, self.where)
        return attrs.evolve(self, ignored=self.ignored + list(unread), paths=paths, request=request)


async def prepare(
    tree: Tree, shape: Shape, where: str, translated: bool = False, generates: str | None = None
) -> Prepared:
    """Parse, find the model's engine, and run the ledger: refusals happen here, before
    any engine is asked for anything. `translated`: see ledger.check. `generates`: what the
    route does ("chat", "generate"), which a model that generates nothing refuses."""
    strict = ledger.strict_mode(request.headers.get(STRICT_HEADER))
    body = openai_params.parse_json(await request.get_data())
    model = tree.resolve(openai_params.model_name(body))
    engine, caps = tree.capabilities(model)
    if generates is not None:
        ledger.serves(caps, openai_params.model_name(body), generates)
    where = f"{where} with the {engine} engine"
    ignored = ledger.check(shape, body, caps, where, translated)
    return Prepared(body, model, ignored, strict, caps, where)


# miLLM's per-request fields on the surfaces translated into a ChatRequest, declared as chat
# declares them: top-level fields, what the SDKs send with extra_body
MILLM = contracts.merge(
    Shape(fields={"seed": openai_params.SEED, "return_sae_activations": openai_params.SAE_ACTIVATIONS}),
    steering_api.CHAT,
)


class Formatter(Protocol):
    """How a generation answers on a surface, given the request's Admitted: `stream` turns the
    one typed event stream (events.py) into the surface's frames, `whole` the folded Completion
    into its body — each through the surface's pure formatter."""

    def stream(self, events: AsyncIterator[typed.Event], admitted: Admitted) -> AsyncIterator[bytes]: ...

    async def whole(self, completion: typed.Completion, admitted: Admitted): ...


@attrs.frozen
class Planned:
    """A /v1 request as the engine runs it: its Generate, its plan (a chat request's constraint
    and tools; None: a text completion's), whether it streams, and its steering's response
    headers (steering_api)."""

    gen: Generate
    plan: structured.Plan | None
    stream: Streaming
    steering: dict[str, str]


async def planned(tree: Tree, req: Prepared) -> Planned:
    """A chat request (req.request) planned: the structured-output plan, the engine request, SAE
    activations, the request's steering."""
    request = req.request
    plan = structured.plan(request.output, batching=tree.config.continuous_batching)
    gen = openai_params.chat_request(request, req.model, plan.tools, plan.constraint)
    several = len(request.conversations) > 1
    if request.sae_activations is not None:  # a readout asked for: checked against the SAEs attached
        gen = await sae_activations.attach(tree, request.sae_activations, gen, several)
    gen, steering = await steering_api.request_steering(tree, request.profile, request.steering_intensity, gen)
    return Planned(gen, plan, request.stream, steering)


async def chat(tree: Tree, req: Prepared, surface: Callable[[Planned, Serving], Formatter]):
    """A chat request (req.request: chat completions', or a surface's translated) planned and answered."""
    return await answer(tree, req, await planned(tree, req), surface)


async def answer(tree: Tree, req: Prepared, job: Planned, surface: Callable[[Planned, Serving], Formatter]):
    """A /v1 request's `job` answered in the Formatter `surface` makes of it and the placement
    that serves it, with the /v1 headers; a failure named in the request's field paths."""
    headers = v1_headers(req, job.gen, job.plan, job.steering)
    client, serving = await tree.client_for(job.gen.model)
    return await run(
        tree,
        client,
        job.gen,
        surface(job, serving),
        framing=SSE if job.stream.on else None,
        headers=headers,
        plan=job.plan,
        paths=req.paths,
    )


def v1_headers(
    req: Prepared, gen: Generate, plan: structured.Plan | None, steering: dict[str, str]
) -> Callable[[Admitted], dict[str, str]]:
    """The /v1 family's response headers, once admitted: the ledger's report (refused here under
    strict mode, before anything runs), the seed's, the steering's, the constraint's."""
    scope = "batch-shape" if gen.conversations and len(gen.conversations) > 1 else "request"
    report = ledger.report_headers(req.unread_by(gen), req.strict)
    headers = {**report, **seed_header(gen.params.seed, scope), **steering}
    if plan is not None and plan.header:
        headers[CONSTRAINED_HEADER] = plan.header
    return lambda first: {**headers, **drawn_seed(first, scope)}


def seed_header(seed: int | None, scope: str = "request") -> dict[str, str]:
    """X-miLLM-Seed echoes a sent seed with the scope of its promise; absent without one."""
    return {SEED_HEADER: sf.item(seed, {"scope": scope})} if seed is not None else {}


def drawn_seed(admitted: Admitted, scope: str = "request") -> dict[str, str]:
    """X-Greenroom-Drawn-Seed, in X-miLLM-Seed's form and with the scope of the promise that
    seed, sent, would carry; absent where no seed was drawn (one was sent, or the request's lane
    reproduces none: Admitted.drawn_seed)."""
    if admitted.drawn_seed is None:
        return {}
    return {DRAWN_SEED_HEADER: sf.item(admitted.drawn_seed, {"scope": scope})}


async def run(
    tree: Tree,
    client: EngineClient,
    gen: Generate,
    surface: Formatter,
    *,
    framing: Framing | None,
    headers: Callable[[Admitted], dict[str, str]],
    plan: structured.Plan | None = None,
    paths: FieldPaths = _AS_SENT,
    done: Callable[[], None] | None = None,
):
    """Run `gen` (monitored where its model's monitoring is on) and answer it through `surface`:
    streamed in `framing` (None: one collected answer), with `headers(admitted)`. `plan`: a chat
    request's (its tools parsed, its constrained document checked); None: a text completion's,
    read as it is. `paths`: the names a failure in the answer takes (a translated surface's own).
    `done` runs once the answer is complete — after the last frame, or once collected."""
    gen = tree.monitoring.monitored(gen)

    def native(events, admitted: Admitted):
        if not paths.names:  # a surface's own request: no layer per event to rename nothing
            return typed.native(events, gen.choices, admitted.prompt_tokens, plan)
        return named(events, gen.choices, admitted.prompt_tokens, plan, paths)

    stack = contextlib.AsyncExitStack()
    try:
        events, first = await admit(stack, client, gen)
        if framing is not None:
            pacer().pace(events, stack)
        events = tree.monitoring.recorded(gen, request.path, events)
        if gen.sae_activations is not None:  # its module entered only by a request that asks for a readout
            events = sae_activations.labelled(tree, gen, events)
        answered = headers(first)
        if framing is not None:
            chunks = surface.stream(native(events, first), first)
            return streamed(chunks, framing, answered, stack, done)
        async with stack:
            result = await surface.whole(await typed.collect(native(events, first), gen.choices), first)
        if done is not None:
            done()
        return result, 200, answered
    except BaseException:
        await stack.aclose()
        raise


async def named(
    events, choices: int, prompt_tokens: int, plan: structured.Plan | None, paths: FieldPaths
) -> AsyncIterator[typed.Event]:
    """The engine's events as the one typed stream (events.native), a failure in the answer
    naming the field the client sent (a translated surface's own: `paths`)."""
    async for event in typed.native(events, choices, prompt_tokens, plan):
        yield typed.Failure(paths.renamed(event.error)) if isinstance(event, typed.Failure) else event


def pacer() -> Pacer:
    """The app's one pacer (create_app makes it)."""
    return current_app.extensions["greenroom.pacer"]
