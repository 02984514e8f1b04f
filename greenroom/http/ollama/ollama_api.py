"""The Ollama /api surface's generation — /api/generate and /api/chat (NDJSON streams,
streamed by default) — and its read routes (tags, ps, show, version), so the `ollama` client
works unchanged. Its other parts have modules of their own: the answers' lines and objects
(ollama/format.py, from the neutral event stream: pipeline/events.py), the flat error
envelope (GreenroomError.ollama_body), the request's common parts (ollama_request.py), options
(ollama_params.py), `keep_alive` (keep_alive.py), `template` (ollama_templates.py),
embeddings (ollama_embed.py), metadata (model_facts.py), model management
(ollama_models.py).

Requests go the way /v1 requests do: the field ledger, values validated, one protocol
message to the engine actor, and the one generation path (pipeline/generation.py): the route
waits for Admitted before it answers anything. A stream that fails after it started ends with
the flat error envelope as its last line and no `done: true` line.
"""

from __future__ import annotations

import json
import logging
import time

import attrs
import trio
from quart import Quart

from greenroom import structured_fields as sf
from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, ledger, routes
from greenroom.http.core.contracts import NULL, when
from greenroom.http.core.framing import NDJSON
from greenroom.http.core.headers import (
    DEVICE_HEADER,
    NUM_CTX_HEADER,
    ROUTE_REASON_HEADER,
    TOKEN_COUNT_HEADER,
    TRUNCATED_HEADER,
)
from greenroom.http.core.request_ids import request_id
from greenroom.http.core.schema_subset import SCHEMA, check_schema
from greenroom.http.ollama import format as ollama_format
from greenroom.http.ollama import model_facts, ollama_params, ollama_templates
from greenroom.http.ollama.keep_alive import parse as parse_keep_alive
from greenroom.http.ollama.ollama_request import Prepared, prepare
from greenroom.http.openai import openai_params
from greenroom.http.pipeline import generation, structured
from greenroom.protocol import Admitted, Fit, Generate
from greenroom.supervisor.lifecycle import Serving
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom.http.ollama")

TOP_LOGPROBS_MAX = 20  # Ollama's bound
THINK_LEVELS = ("high", "medium", "low")  # `think` as a string (Ollama's api.ThinkValue)


_NOT_YET = "not yet implemented"
# --- request shapes (contracts.py) --------------------------------------------------------

MODEL = contracts.Text(
    min_length=1, examples=(openai_params.DEMO_MODEL,), description="Ollama's name: <id>:latest is <id>"
)

# what GET /api/version answers: the NPU document's value (greenroom's own version is on GET /)
OLLAMA_VERSION = "0.2.0-npu-proxy"


# `model` absent, null or empty: Ollama then reads `name`
_NO_MODEL = {"not": {"required": ["model"], "properties": {"model": {"not": {"enum": [None, ""]}}}}}


def named(field: contracts.Field) -> contracts.Shape:
    """`model`, or when it is absent or empty Ollama's deprecated `name` (read only then: the
    `ollama` CLI sends `{"model": "", "name": "X"}`)."""
    return contracts.Shape(
        fields={
            "model": contracts.AnyOf(
                options=(field, contracts.Choice(values=("",))), description="Empty: `name` names the model"
            ),
            "name": contracts.Anything(description="Deprecated: the model, when model is absent or empty"),
        },
        rules=(when(_NO_MODEL, contracts.Shape(fields={"name": field}, required=("name",)), "model, or name"),),
    )


_FALSY = contracts.Choice(values=(None, False, 0, "", [], {}))  # what `if m.get("images")` lets through
MESSAGE = contracts.Named(
    name="OllamaMessage",
    field=contracts.Shape(
        fields={
            "role": contracts.Choice(values=openai_params.ROLES),
            "content": contracts.AnyOf(options=(contracts.Text(), contracts.ListOf(items=openai_params.TEXT_PART))),
            "images": attrs.evolve(_FALSY, description="Refused unless empty: " + ledger.TEXT_ONLY),
            "tool_calls": contracts.ListOf(items=openai_params.TOOL_CALL, description="An assistant's earlier calls"),
        },
        required=("role",),
        ledger=True,
    ),
)
_FORMAT_FIELD = contracts.AnyOf(
    options=(contracts.Choice(values=("json", "")), SCHEMA),
    description=(
        '"json" or a JSON schema: the answer is decoded under it and validated; not with options.stop or tools'
    ),
    rule=contracts.needs("response_format", ""),
)
_NONE = {"anyOf": [NULL, {"type": "array", "maxItems": 0}]}  # a string stop is one stop
_STOPPED = {"options": {"anyOf": [NULL, {"properties": {"stop": _NONE}}]}}
_FORMATTED = {"properties": {"format": {"not": {"enum": [None, ""]}}}, "required": ["format"]}
_COMMON_FIELDS = {
    "model": MODEL,
    "stream": contracts.Boolean(default=True),
    "format": _FORMAT_FIELD,
    "options": ollama_params.SHAPE,
    "keep_alive": ollama_params.KEEP_ALIVE,
    "think": contracts.Choice(
        values=(False,),
        description='true or "high", "medium", "low": 400 field_not_honoured, "<model>" does not support '
        "thinking (no model greenroom serves thinks)",
    ),
    # each generated token's log-probability and the most probable at its position (Ollama's)
    "logprobs": contracts.Boolean(
        default=False,
        description="true: each generated token's log-probability (temperature 1) in `logprobs`",
        rule=contracts.needs("token_logprobs", False),
    ),
    "top_logprobs": contracts.Number(
        lo=0,
        hi=TOP_LOGPROBS_MAX,
        integer=True,
        default=0,
        description="With logprobs: the most probable tokens at each position too (without it: not read, reported)",
        rule=contracts.needs("token_logprobs", 0),
    ),
}
_LOADS = "Absent or empty: the model is loaded (keep_alive 0: unloaded)"
GENERATE_REQUEST = contracts.Shape(
    fields={
        **_COMMON_FIELDS,
        "prompt": contracts.Text(description=_LOADS),
        "system": contracts.Text(),
        "raw": contracts.Boolean(default=False, description="true: the prompt as it is (system and template reported)"),
        "template": contracts.Text(
            description="A Go template rendered as Ollama renders it (docs/ollama.md#templates); "
            "a construct greenroom does not render is refused by name"
        ),
        "images": contracts.refused([], why=ledger.TEXT_ONLY),
        "suffix": contracts.refused("", why="fill-in-the-middle is " + _NOT_YET),
        "context": contracts.refused([], why="greenroom returns no context; send the conversation to /api/chat"),
        **dict.fromkeys(("width", "height", "steps"), contracts.refused(why="image generation is not served")),
    },
    required=("model",),
    rules=(when(_FORMATTED, {"properties": _STOPPED}, "format cannot be cut by a stop string"),),
    ledger=True,
)
CHAT_REQUEST = contracts.Shape(
    fields={
        **_COMMON_FIELDS,
        "messages": attrs.evolve(openai_params.conversation(MESSAGE, min_items=0), description=_LOADS),
        "tools": contracts.ListOf(items=structured.TOOL, rule=contracts.needs("tools", [])),
    },
    required=("model",),
    rules=(
        when(
            _FORMATTED,
            {"properties": {**_STOPPED, "tools": _NONE}},
            "format cannot be cut by a stop string or combined with tools",
        ),
    ),
    ledger=True,
)
SHOW_REQUEST = attrs.evolve(
    named(MODEL),
    fields={
        **named(MODEL).fields,
        "verbose": contracts.Boolean(default=False, description="true: long arrays of model_info in full"),
        # the `ollama` CLI sends all three on every show, empty unless `/set system` or `/set parameter`
        "system": contracts.reported(""),
        "template": contracts.reported(""),
        "options": contracts.reported({}),
    },
    ledger=True,
)


def _plan(body: dict, tools: list | None, stop: tuple[str, ...]) -> structured.Plan:
    """Ollama's `format` ("json" or a JSON schema) and tools as greenroom's structured-output
    plan. A constrained answer is validated once complete (streamed too: a document that
    does not validate ends the stream with an error line instead of `done`)."""
    if tools is not None and not isinstance(tools, list):
        raise GreenroomError("invalid_parameter", "'tools' must be an array", "tools")
    fmt = body.get("format")
    if fmt not in (None, "") and tools:
        raise GreenroomError(
            "invalid_parameter",
            "'format' cannot be combined with tools: a tool call is not a document of the format; send one of them",
            "format",
        )
    if fmt is None or fmt == "":
        response_format = None
    elif fmt == "json":
        response_format = {"type": "json_object"}
    elif isinstance(fmt, dict):
        check_schema(fmt, "format")
        response_format = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    else:
        raise GreenroomError("invalid_parameter", "'format' must be \"json\" or a JSON schema object", "format")
    try:
        return structured.plan(structured.Output(tools=tools or None, response_format=response_format, stop=bool(stop)))
    except GreenroomError as exc:
        if not (exc.param or "").startswith("response_format"):
            raise
        raise GreenroomError(exc.code, exc.message.replace("response_format", "format"), "format") from None


def conversation(messages: list) -> list[dict]:
    """Ollama messages → greenroom's (checked by openai_params.turns, tool calls too)."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            if m.get("images"):
                raise ledger.media_refused(f"messages[{i}].images")
            m = {k: m[k] for k in ("role", "content", "tool_calls") if k in m}
        out.append(m)
    return openai_params.turns(out)


# --- generation ------------------------------------------------------------------------------


@attrs.frozen
class Job:
    chat: bool
    req: Prepared
    gen: Generate
    plan: structured.Plan
    options: ollama_params.Resolved
    stream: bool
    keep_alive: float | None  # seconds; applied once the answer is complete


async def _generate(tree: Tree, job: Job):
    rid = request_id()
    job.req.headers()  # strict mode refuses unread fields before anything runs
    load_started = time.monotonic_ns()
    client, serving = await tree.client_for(job.req.model, wait_unload=True)
    load_ns = time.monotonic_ns() - load_started
    # Ollama answers a prompt longer than num_ctx by cutting it (engines/prompt_fit.py), never a 400
    options = job.options
    window = ollama_params.window(options, serving.info.context_length)
    gen = attrs.evolve(
        job.gen,
        fit=Fit(
            window,
            options.num_keep,
            options.params.max_tokens or ollama_params.OPTIONS["num_predict"].default,
            options.fill,
        ),
    )
    log.debug("request %s → %s (%s)", rid, gen.rid, "chat" if job.chat else "generate")
    logprobs = job.gen.params.logprobs is not None
    context = ollama_format.Context(job.req.sent_model, job.chat, rid, job.req.started_ns, load_ns, logprobs)

    def headers(first) -> dict[str, str]:
        # without a chat template the prompt went as it is ({{ .Prompt }}): `system` was not read
        out = job.req.headers(["system"] if first.as_is and job.req.body.get("system") else [])
        out[NUM_CTX_HEADER] = sf.bare(window)
        out.update(generation.drawn_seed(first))
        if first.truncated:
            out[TRUNCATED_HEADER] = sf.dictionary(attrs.asdict(first.truncated))
        return {**out, **routing_headers(serving, first.prompt_tokens)}

    def kept_alive() -> None:  # the keep_alive applies once the answer is complete
        if job.keep_alive is not None:
            tree.keep_alive(job.req.model, job.keep_alive)

    framing = NDJSON if job.stream else None
    # the plan: its tools parsed (chat), its format's document checked
    return await generation.run(
        tree, client, gen, _Lines(context), framing=framing, headers=headers, plan=job.plan, done=kept_alive
    )


@attrs.frozen
class _Lines:
    """Ollama's Formatter: NDJSON lines, or the done object (ollama/format.py)."""

    context: ollama_format.Context

    def stream(self, events, _: Admitted):
        return ollama_format.lines(events, self.context)

    async def whole(self, completion, _: Admitted) -> dict:
        return ollama_format.whole(completion, self.context)


def routing_headers(serving: Serving, prompt_tokens: int) -> dict[str, str]:
    """Where the request ran (the NPU proxy's headers): the device that computed, spelt as the
    NPU proxy spells it (OpenVINO's CPU, GPU, NPU; a CUDA card is a GPU) whatever the engine
    calls it, why the router chose it (supervisor/routing.py), and the prompt's token count it
    classifies by."""
    kind = serving.info.device.replace(".", ":").partition(":")[0].upper()
    return {
        DEVICE_HEADER: "GPU" if kind == "CUDA" else kind,
        ROUTE_REASON_HEADER: serving.route_reason,
        TOKEN_COUNT_HEADER: str(prompt_tokens),
    }


async def _load(tree: Tree, req: Prepared, chat: bool, keep_alive: float | None):
    """No prompt (or no messages): load the model, as Ollama does — or, with keep_alive 0,
    unload it (graceful: running requests finish first)."""
    if keep_alive == 0:
        await tree.unload(req.model)
        reason = "unload"
    else:
        await tree.client_for(req.model, wait_unload=True)
        if keep_alive is not None:
            tree.keep_alive(req.model, keep_alive)
        reason = "load"
    return ollama_format.loaded(req.sent_model, chat, reason), 200, req.headers()


async def _generation_request(tree: Tree, shape: contracts.Shape, where: str):
    """What /api/generate and /api/chat read alike: the ledger, the options, `stream`
    (Ollama streams by default) and `keep_alive`."""
    what = "chat" if shape is CHAT_REQUEST else "generate"
    req = await prepare(tree, shape, where, defaults=what)
    keep_alive = parse_keep_alive(req.body)
    # a model that generates nothing (an embedding model) is refused as Ollama refuses it — but
    # for an unload (`ollama stop`: no prompt, keep_alive 0), which Ollama's handlers answer first
    if not (keep_alive == 0 and not req.body.get("messages" if what == "chat" else "prompt")):
        ledger.serves(req.caps, req.sent_model, what)
    _no_thinking(req)
    options = ollama_params.resolve(req.body.get("options"), req.caps)
    req = attrs.evolve(req, unread=req.unread + options.unread)
    top = _top_logprobs(req.body)
    if openai_params.boolean(req.body, "logprobs", False):
        options = attrs.evolve(options, params=attrs.evolve(options.params, logprobs=top))
    elif req.body.get("top_logprobs"):  # Ollama reads it only with logprobs
        req = attrs.evolve(req, unread=req.unread + ["top_logprobs"])
    return req, options, openai_params.boolean(req.body, "stream", True), keep_alive


def _no_thinking(req: Prepared) -> None:
    """No model greenroom serves thinks: `think` true or a level is refused as Ollama refuses it
    for a model without thinking, in its words — the `ollama` CLI keeps an interactive session
    going after `/set think` only on an error that says "does not support thinking"."""
    think = req.body.get("think")
    if think is None or think is False:
        return
    if isinstance(think, str) and think not in THINK_LEVELS:
        raise GreenroomError(
            "invalid_parameter",
            f'invalid think value: {json.dumps(think)} (must be "high", "medium", "low", true, or false)',
            "think",
        )
    if not isinstance(think, (bool, str)):
        raise GreenroomError(
            "invalid_parameter", 'think must be a boolean or string ("high", "medium", "low", true, or false)', "think"
        )
    name = json.dumps(req.sent_model, ensure_ascii=False)
    raise GreenroomError("field_not_honoured", f"{name} does not support thinking", "think")


def _top_logprobs(body: dict) -> int:
    top = body.get("top_logprobs")
    if top is None:
        return 0
    if not _COMMON_FIELDS["top_logprobs"].holds(top):
        raise GreenroomError(
            "invalid_parameter", f"top_logprobs must be between 0 and {TOP_LOGPROBS_MAX}", "top_logprobs"
        )
    return top


# --- routes ----------------------------------------------------------------------------------


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/api/generate")
    async def ollama_generate():
        req, options, stream, keep_alive = await _generation_request(tree, GENERATE_REQUEST, "on /api/generate")
        body = req.body
        prompt, system, template = (openai_params.string(body, f) for f in ("prompt", "system", "template"))
        raw = openai_params.boolean(body, "raw", False)
        plan = _plan(body, None, options.params.stop)
        if not prompt:
            return await _load(tree, req, chat=False, keep_alive=keep_alive)
        rid = openai_params.new_rid("gen")
        if raw or template:
            if raw and (system or template):
                req = attrs.evolve(req, unread=req.unread + [f for f in ("system", "template") if body.get(f)])
            asked = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            text = prompt if raw else ollama_templates.render(template, asked, think=body.get("think"))
            gen = Generate(rid, req.model, options.params, prompts=[text], constraint=plan.constraint)
        else:
            conversation = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            # a model without a chat template gets the prompt as it is, Ollama's `{{ .Prompt }}`
            gen = Generate(
                rid,
                req.model,
                options.params,
                conversations=[conversation],
                constraint=plan.constraint,
                as_is_without_template=True,
            )
        return await _generate(tree, Job(False, req, gen, plan, options, stream, keep_alive))

    @routes.view(app, "POST", "/api/chat")
    async def ollama_chat():
        req, options, stream, keep_alive = await _generation_request(tree, CHAT_REQUEST, "on /api/chat")
        body = req.body
        messages = body.get("messages")
        if messages is not None and not isinstance(messages, list):
            raise GreenroomError("invalid_parameter", "'messages' must be an array", "messages")
        plan = _plan(body, body.get("tools"), options.params.stop)
        if not messages:
            return await _load(tree, req, chat=True, keep_alive=keep_alive)
        rows = {"conversations": [conversation(messages)], "tools": plan.tools}  # validated either way
        template = (tree.placement(req.model)[1].defaults or {}).get("template")
        if template:  # a created model's TEMPLATE renders the chat, as Ollama renders it
            rows = {"prompts": [ollama_templates.render(template, messages, body.get("tools"), body.get("think"))]}
        gen = Generate(openai_params.new_rid("chat"), req.model, options.params, constraint=plan.constraint, **rows)
        return await _generate(tree, Job(True, req, gen, plan, options, stream, keep_alive))

    @routes.view(app, "GET", "/api/tags")
    async def ollama_tags():
        placed = [model_facts.Placed.of(tree, m["id"], trio.current_time()) for m in tree.models()]
        return model_facts.TAGS.build(models=await trio.to_thread.run_sync(model_facts.tags, placed))

    @routes.view(app, "GET", "/api/ps")
    async def ollama_ps():
        placed = [
            model_facts.Placed.of(tree, m["id"], trio.current_time()) for m in tree.models() if m["state"] == "loaded"
        ]
        return model_facts.PS.build(models=await trio.to_thread.run_sync(model_facts.ps, placed))

    @routes.view(app, "POST", "/api/show")
    async def ollama_show():
        req = await prepare(tree, SHOW_REQUEST, "on /api/show")
        placed = model_facts.Placed.of(tree, req.model, trio.current_time())
        verbose = openai_params.boolean(req.body, "verbose", False)
        shown = await trio.to_thread.run_sync(model_facts.show, placed, req.caps, verbose)
        return shown, 200, req.headers()

    @routes.view(app, "GET", "/api/version")
    async def ollama_version():
        return {"version": OLLAMA_VERSION}
