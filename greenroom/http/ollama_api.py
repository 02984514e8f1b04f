"""The Ollama /api surface's generation — /api/generate and /api/chat (NDJSON streams,
streamed by default) — and its read routes (tags, ps, show, version), so the `ollama` client
works unchanged. Its other parts have modules of their own: the envelope
(ollama_envelope.py), the request's common parts (ollama_request.py), options
(ollama_params.py), `keep_alive` (keep_alive.py), `template` (ollama_templates.py),
embeddings (ollama_embed.py), metadata (model_facts.py), model management
(ollama_models.py).

Requests go the way /v1 requests do: the field ledger, values validated, one protocol
message to the engine actor, the route waits for Admitted before it answers anything
(answering.py). A stream that fails after it started ends with the flat error envelope as
its last line and no `done: true` line.
"""

from __future__ import annotations

import datetime
import json
import logging
import time

import attrs
import trio
from quart import Quart

from greenroom import structured_fields as sf
from greenroom.engines.tool_calls import ToolCallStream
from greenroom.errors import GreenroomError
from greenroom.http import (
    contracts,
    framing,
    ledger,
    model_facts,
    ollama_params,
    ollama_templates,
    openai_params,
    routes,
    structured,
)
from greenroom.http.answering import answer, drawn_seed
from greenroom.http.contracts import NULL, when
from greenroom.http.keep_alive import parse as parse_keep_alive
from greenroom.http.ollama_envelope import error_body, request_id
from greenroom.http.ollama_request import Prepared, prepare
from greenroom.http.schema_subset import SCHEMA, check_schema
from greenroom.protocol import Failed, Fit, Generate, Text
from greenroom.supervisor.lifecycle import Serving
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom.http.ollama")

TOP_LOGPROBS_MAX = 20  # Ollama's bound
THINK_LEVELS = ("high", "medium", "low")  # `think` as a string (Ollama's api.ThinkValue)

# what Ollama's rule cut from a prompt longer than its window: an RFC 8941 dictionary,
# `messages=<oldest messages dropped>, tokens=<tokens dropped from the prompt's middle>`
TRUNCATED_HEADER = "X-Greenroom-Truncated"
# the context window the request ran with: options.num_ctx as Ollama clamps it (ollama_params.window)
NUM_CTX_HEADER = "X-Greenroom-Num-Ctx"

_NOT_YET = "not yet implemented"
_FORMAT = ledger.needs("response_format", "")
_COMMON = {
    "model": ledger.USE,
    "stream": ledger.USE,
    "format": _FORMAT,
    "options": ledger.USE,
    "keep_alive": ledger.USE,  # the model is unloaded after this long idle (0: now)
    "think": ledger.USE,  # refused unless false, in Ollama's words (_no_thinking)
    # each generated token's log-probability and the most probable at its position (Ollama's)
    "logprobs": ledger.needs("token_logprobs", False),
    "top_logprobs": ledger.needs("token_logprobs", 0),
}
GENERATE = {
    **_COMMON,
    "prompt": ledger.USE,
    "system": ledger.USE,
    "template": ledger.USE,
    "raw": ledger.USE,
    "images": ledger.refused([], why=ledger.TEXT_ONLY),
    "suffix": ledger.refused("", why="fill-in-the-middle is " + _NOT_YET),
    "context": ledger.refused([], why="greenroom returns no context; send the conversation to /api/chat"),
    **{f: ledger.refused(why="image generation is not served") for f in ("width", "height", "steps")},
}
CHAT = {**_COMMON, "messages": ledger.USE, "tools": ledger.needs("tools", [])}
SHOW = {
    "model": ledger.USE,
    "name": ledger.USE,
    "verbose": ledger.USE,
    # the `ollama` CLI sends all three on every show, empty unless `/set system` or `/set parameter`
    "system": ledger.reported(""),
    "template": ledger.reported(""),
    "options": ledger.reported({}),
}

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
    ),
)
_FORMAT_FIELD = contracts.AnyOf(
    options=(contracts.Choice(values=("json", "")), SCHEMA),
    description=(
        '"json" or a JSON schema: the answer is decoded under it and validated; not with options.stop or tools'
    ),
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
    "logprobs": contracts.Boolean(
        default=False, description="true: each generated token's log-probability (temperature 1) in `logprobs`"
    ),
    "top_logprobs": contracts.Number(
        lo=0,
        hi=TOP_LOGPROBS_MAX,
        integer=True,
        default=0,
        description="With logprobs: the most probable tokens at each position too (without it: not read, reported)",
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
    },
    required=("model",),
    rules=(when(_FORMATTED, {"properties": _STOPPED}, "format cannot be cut by a stop string"),),
)
CHAT_REQUEST = contracts.Shape(
    fields={
        **_COMMON_FIELDS,
        "messages": attrs.evolve(openai_params.conversation(MESSAGE, min_items=0), description=_LOADS),
        "tools": contracts.ListOf(items=structured.TOOL),
    },
    required=("model",),
    rules=(
        when(
            _FORMATTED,
            {"properties": {**_STOPPED, "tools": _NONE}},
            "format cannot be cut by a stop string or combined with tools",
        ),
    ),
)
SHOW_REQUEST = attrs.evolve(
    named(MODEL),
    fields={
        **named(MODEL).fields,
        "verbose": contracts.Boolean(default=False, description="true: long arrays of model_info in full"),
    },
)


def _now() -> str:
    """RFC 3339, UTC."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


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
        return structured.plan({"response_format": response_format, "tools": tools or None, "stop": list(stop) or None})
    except GreenroomError as exc:
        if not (exc.param or "").startswith("response_format"):
            raise
        raise GreenroomError(exc.code, exc.message.replace("response_format", "format"), "format") from None


def conversation(messages: list) -> list[dict]:
    """Ollama messages → greenroom's (validated by openai_params.messages, tool calls too)."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            if m.get("images"):
                raise ledger.media_refused(f"messages[{i}].images")
            m = {k: m[k] for k in ("role", "content", "tool_calls") if k in m}
        out.append(m)
    return openai_params.messages({"messages": out})


def _ollama_calls(calls) -> list[dict]:
    """greenroom's parsed calls (arguments as JSON text) → Ollama's (arguments an object)."""
    return [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls]


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

    def headers(first) -> dict[str, str]:
        # without a chat template the prompt went as it is ({{ .Prompt }}): `system` was not read
        out = job.req.headers(["system"] if first.as_is and job.req.body.get("system") else [])
        out[NUM_CTX_HEADER] = sf.bare(window)
        out.update(drawn_seed(first))
        if first.truncated:
            out[TRUNCATED_HEADER] = sf.dictionary(attrs.asdict(first.truncated))
        return {**out, **routing_headers(serving, first.prompt_tokens)}

    def timing(first) -> _Timing:
        return _Timing(job.req.started_ns, load_ns, first.prompt_tokens)

    def kept_alive() -> None:  # the keep_alive applies once the answer is complete
        if job.keep_alive is not None:
            tree.keep_alive(job.req.model, job.keep_alive)

    return await answer(
        tree,
        client,
        gen,
        framing=framing.NDJSON if job.stream else None,
        headers=headers,
        frames=lambda events, first: _frames(job, events, timing(first), rid),
        collect=lambda events, first: _collect(job, events, timing(first)),
        done=kept_alive,
    )


def routing_headers(serving: Serving, prompt_tokens: int) -> dict[str, str]:
    """Where the request ran (the NPU proxy's headers): the device that computed, spelt as the
    NPU proxy spells it (OpenVINO's CPU, GPU, NPU; a CUDA card is a GPU) whatever the engine
    calls it, why the router chose it (supervisor/routing.py), and the prompt's token count it
    classifies by."""
    kind = serving.info.device.replace(".", ":").partition(":")[0].upper()
    return {
        "X-NPU-Proxy-Device": "GPU" if kind == "CUDA" else kind,
        "X-NPU-Proxy-Route-Reason": serving.route_reason,
        "X-NPU-Proxy-Token-Count": str(prompt_tokens),
    }


@attrs.frozen
class _Timing:
    started_ns: int
    load_ns: int
    prompt_tokens: int

    def metrics(self, finished: Text) -> dict:
        stats = finished.stats
        return {
            "total_duration": time.monotonic_ns() - self.started_ns,
            "load_duration": self.load_ns,
            "prompt_eval_count": self.prompt_tokens,
            "prompt_eval_duration": int(stats.prefill_s * 1e9) if stats else 0,
            "eval_count": finished.completion_tokens,
            "eval_duration": int(stats.decode_s * 1e9) if stats else 0,
        }


def _head(job: Job) -> dict:
    return {"model": job.req.sent_model, "created_at": _now()}


def _final(job: Job, text: str, finished: Text, timing: _Timing, tokens: list) -> dict:
    """The `done: true` object of a non-streamed answer (a complete constrained document
    that does not validate is a 500, never a 200), with every reported token's `logprobs`."""
    message, reason = structured.message(job.plan, text, finished.finish_reason)
    reason = "stop" if reason == "tool_calls" else reason
    out = _head(job)
    if job.chat:
        msg = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            msg["tool_calls"] = [
                {"function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
        out["message"] = msg
    else:
        out["response"] = text
    if job.gen.params.logprobs is not None:
        out["logprobs"] = _logprobs(tokens)
    return {**out, "done": True, "done_reason": reason, **timing.metrics(finished)}


async def _collect(job: Job, events, timing: _Timing) -> dict:
    texts: list[str] = []
    tokens: list = []
    finished = None
    async for event in events:
        if isinstance(event, Failed):
            raise GreenroomError.from_wire(event.error)
        texts.append(event.text)
        tokens += event.logprobs or ()
        if event.finish_reason:
            finished = event
    return _final(job, "".join(texts), finished, timing, tokens)


async def _frames(job: Job, events, timing: _Timing, rid: str):
    """NDJSON lines: one per batch of deltas, then `done: true` with the metrics — or, on a
    failure, the flat error envelope as the last line."""
    calls = ToolCallStream(job.plan.tools) if job.chat and job.plan.parses_tools else None
    texts: list[str] = []
    tokens: list = []  # reported tokens not yet written: they ride on the next line

    def reported() -> dict:
        if not tokens:
            return {}
        out = {"logprobs": _logprobs(tokens)}
        tokens.clear()
        return out

    def delta(text: str, tool_calls: list | None = None) -> bytes:
        if job.chat:
            msg = {"role": "assistant", "content": text}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            return framing.ndjson({**_head(job), "message": msg, "done": False, **reported()})
        return framing.ndjson({**_head(job), "response": text, "done": False, **reported()})

    def shaped(text: str, final: bool = False) -> list[bytes]:
        if calls is None:
            return [delta(text)] if text else []
        out, content = [], []
        for kind, *rest in calls.feed(text) + (calls.finish() if final else []):
            if kind == "content":
                content.append(rest[0])
            elif kind == "arguments":  # the call is complete: name and arguments in one line
                if content:
                    out.append(delta("".join(content)))
                    content = []
                out.append(delta("", _ollama_calls([calls.calls[rest[0]]])))
        if content and (text := "".join(content)):
            out.append(delta(text))
        return out

    try:
        finished = None
        async for first in events:
            pending = []
            for event in [first, *events.ready()]:  # what queued while we wrote goes out as one line
                if isinstance(event, Failed):
                    for line in shaped("".join(pending)):
                        yield line
                    yield framing.ndjson(error_body(GreenroomError.from_wire(event.error), rid))
                    return
                pending.append(event.text)
                texts.append(event.text)
                tokens.extend(event.logprobs or ())
                if event.finish_reason:
                    finished = event
            for line in shaped("".join(pending), final=finished is not None):
                yield line
        structured.check(job.plan, "".join(texts), finished.finish_reason)
        reason = finished.finish_reason
        done = {
            **_head(job),
            **({"message": {"role": "assistant", "content": ""}} if job.chat else {"response": ""}),
            "done": True,
            "done_reason": reason,
            **timing.metrics(finished),
            **reported(),
        }
        yield framing.ndjson(done)
    except GreenroomError as exc:
        yield framing.ndjson(error_body(exc, rid))
    except Exception as exc:  # never a half-written stream without a last line
        log.exception("Ollama stream %s failed", rid)
        yield framing.ndjson(error_body(GreenroomError("internal_error", f"internal error: {type(exc).__name__}"), rid))


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
    out = {"model": req.sent_model, "created_at": _now()}
    out.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return {**out, "done": True, "done_reason": reason}, 200, req.headers()


async def _generation_request(tree: Tree, table: dict, where: str):
    """What /api/generate and /api/chat read alike: the ledger, the options, `stream`
    (Ollama streams by default) and `keep_alive`."""
    req = await prepare(tree, table, where, defaults="chat" if table is CHAT else "generate")
    _no_thinking(req)
    options = ollama_params.resolve(req.body.get("options"), req.caps)
    req = attrs.evolve(req, unread=req.unread + options.unread)
    top = _top_logprobs(req.body)
    if openai_params.boolean(req.body, "logprobs", False):
        options = attrs.evolve(options, params=attrs.evolve(options.params, logprobs=top))
    elif req.body.get("top_logprobs"):  # Ollama reads it only with logprobs
        req = attrs.evolve(req, unread=req.unread + ["top_logprobs"])
    return req, options, openai_params.boolean(req.body, "stream", True), parse_keep_alive(req.body)


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


def _logprobs(tokens: list) -> list[dict]:
    """Text events' reported tokens as Ollama writes them: token, logprob, bytes and, when
    asked for, top_logprobs."""
    return [
        {
            "token": text,
            "logprob": logprob,
            "bytes": list(text.encode("utf-8")),
            **(
                {"top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for _, t, lp in top]}
                if top
                else {}
            ),
        }
        for _, text, logprob, top in tokens
    ]


# --- routes ----------------------------------------------------------------------------------


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/api/generate")
    async def ollama_generate():
        req, options, stream, keep_alive = await _generation_request(tree, GENERATE, "on /api/generate")
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
        req, options, stream, keep_alive = await _generation_request(tree, CHAT, "on /api/chat")
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
        return {"models": await trio.to_thread.run_sync(model_facts.tags, placed)}

    @routes.view(app, "GET", "/api/ps")
    async def ollama_ps():
        placed = [
            model_facts.Placed.of(tree, m["id"], trio.current_time()) for m in tree.models() if m["state"] == "loaded"
        ]
        return {"models": await trio.to_thread.run_sync(model_facts.ps, placed)}

    @routes.view(app, "POST", "/api/show")
    async def ollama_show():
        req = await prepare(tree, SHOW, "on /api/show")
        placed = model_facts.Placed.of(tree, req.model, trio.current_time())
        verbose = openai_params.boolean(req.body, "verbose", False)
        shown = await trio.to_thread.run_sync(model_facts.show, placed, req.caps.tools, verbose)
        return shown, 200, req.headers()

    @routes.view(app, "GET", "/api/version")
    async def ollama_version():
        return {"version": OLLAMA_VERSION}
