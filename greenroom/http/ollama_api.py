"""The Ollama /api surface: generate and chat (NDJSON streams, streamed by default),
embed and embeddings, tags, ps, show, version — so the `ollama` client works unchanged.

Requests go the way /v1 requests do (openai_api.py): parse, find the model, the field
ledger (refusals before any engine is asked anything; unread fields reported in
X-miLLM-Ignored-Fields), values validated (ollama_params.py for `options`), one protocol
message to the engine actor, the route waits for Admitted before it answers anything.

Errors are Ollama's flat envelope, `{"error": "<message> (request id: <id>)", "code"}`,
with greenroom's codes and statuses (errors.py); every response carries X-Request-ID
(the client's, echoed, or one made here). A stream that fails after it started ends
with that envelope as its last line and no `done: true` line.
"""

from __future__ import annotations

import array
import contextlib
import datetime
import json
import logging
import math
import re
import time
import uuid

import attrs
import trio
from quart import Quart, Response, g, request

from greenroom import __version__
from greenroom.engines.capabilities import Capabilities
from greenroom.engines.tool_calls import ToolCallStream
from greenroom.errors import GreenroomError
from greenroom.http import (
    ledger, manage_api, model_facts, monitoring_api, ollama_defaults, ollama_params, openai_params, steering_api,
    structured,
)
from greenroom.http.keep_alive import parse as parse_keep_alive
from greenroom.http.openai_api import StreamBody
from greenroom.http.schema_subset import check_schema
from greenroom.protocol import Embed, Embedded, Failed, Fit, Generate, Text
from greenroom.supervisor.engine_client import admit
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom.http.ollama")

NDJSON = "application/x-ndjson"
REQUEST_ID_HEADER = "X-Request-ID"
# what Ollama's rule cut from a prompt longer than its window: an RFC 8941 dictionary,
# `messages=<oldest messages dropped>, tokens=<tokens dropped from the prompt's middle>`
TRUNCATED_HEADER = "X-Greenroom-Truncated"
_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

# /api/embed and /api/embeddings: checked before any engine is asked anything
MAX_EMBED_ITEMS = 128
MAX_EMBED_TEXT_CHARS = 8192
MAX_EMBED_REQUEST_CHARS = 65536

_NOT_YET = "not yet implemented"
_TEXT_ONLY = "greenroom serves text-only models"
_FORMAT = ledger.needs("response_format", "")
_COMMON = {"model": ledger.USE, "stream": ledger.USE, "format": _FORMAT, "options": ledger.USE,
           "keep_alive": ledger.USE,  # the model is unloaded after this long idle (0: now)
           "think": ledger.refused(False, why="this model does not think"),
           "logprobs": ledger.refused(False, why=_NOT_YET), "top_logprobs": ledger.refused(0, why=_NOT_YET)}
GENERATE = {
    **_COMMON, "prompt": ledger.USE, "system": ledger.USE, "template": ledger.USE, "raw": ledger.USE,
    "images": ledger.refused([], why=_TEXT_ONLY),
    "suffix": ledger.refused("", why="fill-in-the-middle is " + _NOT_YET),
    "context": ledger.refused([], why="greenroom returns no context; send the conversation to /api/chat"),
    **{f: ledger.refused(why="image generation is not served") for f in ("width", "height", "steps")},
}
CHAT = {**_COMMON, "messages": ledger.USE, "tools": ledger.needs("tools", [])}
EMBED = {"model": ledger.USE, "input": ledger.USE, "truncate": ledger.USE, "dimensions": ledger.USE,
         "options": ledger.REPORTED, "keep_alive": ledger.USE}
EMBEDDINGS = {"model": ledger.USE, "prompt": ledger.USE, "options": ledger.REPORTED, "keep_alive": ledger.USE}


# --- request ids and the flat envelope ---------------------------------------------------

def owns(path: str) -> bool:
    """Whether `path` is the Ollama surface's (its errors use the flat envelope)."""
    return (path.startswith("/api/") and path != "/api/actors" and path not in manage_api.PATHS
            and not steering_api.owns(path) and not monitoring_api.owns(path))


def request_id() -> str:
    """This request's id: the client's X-Request-ID when it is a sane token, else a new one."""
    rid = g.get("greenroom_request_id")
    if rid is None:
        sent = request.headers.get(REQUEST_ID_HEADER)
        rid = sent if sent is not None and _REQUEST_ID_OK.fullmatch(sent) else f"req-{uuid.uuid4().hex[:24]}"
        g.greenroom_request_id = rid
    return rid


def error_body(err: GreenroomError, rid: str | None = None) -> dict:
    return {"error": f"{err.message} (request id: {rid or request_id()})", "code": err.code}


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _now() -> str:
    """RFC 3339, UTC."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


# --- the request's common parts --------------------------------------------------------------

@attrs.frozen
class Prepared:
    body: dict
    model: str  # as greenroom names it
    sent_model: str  # as the client did (echoed)
    caps: Capabilities
    unread: list[str]
    strict: bool
    started_ns: int

    def headers(self, also: list[str] = ()) -> dict[str, str]:
        return ledger.report_headers(self.unread + list(also), self.strict)


def _served(tree: Tree, name) -> str:
    """greenroom's id for an Ollama model name (`<id>:latest` is `<id>`), or 404."""
    if name is None or name == "":
        raise GreenroomError("missing_parameter", "model is required", "model")
    if not isinstance(name, str):
        raise GreenroomError("invalid_parameter", "'model' must be a string", "model")
    for candidate in (name, name.removesuffix(":latest")):
        try:
            return tree.resolve(candidate)
        except GreenroomError as exc:
            if exc.code != "model_not_found":
                raise
    raise GreenroomError("model_not_found", f"model '{name}' not found", "model")  # Ollama's words


async def _prepare(tree: Tree, table: dict, where: str) -> Prepared:
    started = time.monotonic_ns()
    strict = ledger.strict_mode(request.headers.get("X-miLLM-Strict"))
    body = openai_params.parse_json(await request.get_data())
    sent_model = body.get("model")
    if sent_model is None and "name" in table:  # Ollama's deprecated `name`
        sent_model = body.get("name")
    model = _served(tree, sent_model)
    _, placement = tree.placement(model)
    if table is GENERATE or table is CHAT:  # a model made by /api/create brings its defaults
        body = ollama_defaults.apply(body, placement, chat=table is CHAT)
    engine, caps = tree.capabilities(model)
    unread = ledger.check(table, body, caps, f"{where} with the {engine} engine")
    unread = [u for u in unread if not re.fullmatch(r"messages\[\d+\]\.images", u)]  # refused when not empty
    return Prepared(body, model, sent_model, caps, unread, strict, started)


def _string(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a string", name)
    return value


def _plan(body: dict, tools: list | None, stop: tuple[str, ...]) -> structured.Plan:
    """Ollama's `format` ("json" or a JSON schema) and tools as greenroom's structured-output
    plan. A constrained answer is validated once complete (streamed too: a document that
    does not validate ends the stream with an error line instead of `done`)."""
    fmt = body.get("format")
    if fmt not in (None, "") and tools:
        raise GreenroomError("invalid_parameter", "'format' cannot be combined with tools: a tool call is not a "
                             "document of the format; send one of them", "format")
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
        return structured.plan({"response_format": response_format, "tools": tools or None,
                                "stop": list(stop) or None}, stream=False)
    except GreenroomError as exc:
        if not (exc.param or "").startswith("response_format"):
            raise
        raise GreenroomError(exc.code, exc.message.replace("response_format", "format"), "format") from None


_TEMPLATE_VAR = re.compile(r"\{\{(-?)\s*\.(System|Prompt|Response)\s*(-?)\}\}")


def _apply_template(template: str, system: str | None, prompt: str) -> str:
    """Ollama's `template` override, in the subset greenroom renders: `{{ .System }}`,
    `{{ .Prompt }}` and `{{ .Response }}` (where the answer begins; the rest is dropped),
    with Go's `{{-` / `-}}` whitespace trimming. Anything else is refused."""
    head = template
    m = re.search(r"\{\{-?\s*\.Response\s*-?\}\}", template)
    if m:
        head = template[:m.end()]
    pieces, pos = [], 0
    for m in _TEMPLATE_VAR.finditer(head):
        before = head[pos:m.start()]
        pieces.append(before.rstrip() if m.group(1) else before)
        value = {"System": system or "", "Prompt": prompt, "Response": ""}[m.group(2)]
        pieces.append(value)
        pos = m.end()
        if m.group(3):
            rest = head[pos:]
            pos += len(rest) - len(rest.lstrip())
    pieces.append(head[pos:])
    text = "".join(pieces)
    if "{{" in _TEMPLATE_VAR.sub("", head):
        raise GreenroomError("field_not_honoured", "'template' cannot be honoured: greenroom renders only "
                             "{{ .System }}, {{ .Prompt }} and {{ .Response }} in a template override; send "
                             "raw: true with a prompt you rendered yourself", "template")
    return text


def _conversation(messages: list) -> list[dict]:
    """Ollama messages → greenroom's (validated by openai_params.messages)."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            if m.get("images"):
                raise GreenroomError("field_not_honoured", f"'messages[{i}].images' cannot be honoured: {_TEXT_ONLY}",
                                     f"messages[{i}].images")
            calls = m.get("tool_calls")
            if calls is not None:
                _check_tool_calls(calls, f"messages[{i}].tool_calls")
            m = {k: m[k] for k in ("role", "content", "tool_calls") if k in m}
        out.append(m)
    return openai_params.messages({"messages": out})


def _check_tool_calls(calls, where: str) -> None:
    if not isinstance(calls, list):
        raise GreenroomError("invalid_parameter", f"'{where}' must be an array", where)
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                and isinstance(fn.get("arguments", {}), (dict, str))):
            raise GreenroomError("invalid_parameter", f"'{where}[{j}]' must be {{\"function\": {{\"name\": ..., "
                                 "\"arguments\": {...}}}", f"{where}[{j}]")


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
    client, info = await tree.client_for(job.req.model, wait_unload=True)
    load_ns = time.monotonic_ns() - load_started
    # Ollama answers a prompt longer than num_ctx by cutting it (engines/prompt_fit.py), never a 400
    options = job.options
    gen = attrs.evolve(job.gen, fit=Fit(ollama_params.window(options, info["context_length"]), options.num_keep,
                                        options.params.max_tokens or ollama_params.OPTIONS["num_predict"].default,
                                        options.fill))
    log.debug("request %s → %s (%s)", rid, gen.rid, "chat" if job.chat else "generate")
    gen = monitoring_api.monitored(tree, gen)
    stack = contextlib.AsyncExitStack()
    try:
        events, first = await admit(stack, client, gen)
        events = monitoring_api.recorded(tree, gen, request.path, events)
        # without a chat template the prompt went as it is ({{ .Prompt }}): `system` was not read
        headers = job.req.headers(["system"] if first.as_is and job.req.body.get("system") else [])
        if first.truncated:
            headers[TRUNCATED_HEADER] = ", ".join(f"{k}={v}" for k, v in first.truncated.items())
        timing = _Timing(job.req.started_ns, load_ns, first.prompt_tokens)
        headers.update(routing_headers(info, first.prompt_tokens))
        if job.stream:
            body = StreamBody(_then_keep_alive(tree, job, _frames(job, events, timing, rid)), stack)
            response = Response(body, content_type=NDJSON, headers=headers)
            response.timeout = None
            return response
        async with stack:
            result = await _collect(job, events, timing)
        if job.keep_alive is not None:
            tree.keep_alive(job.req.model, job.keep_alive)
        return result, 200, headers
    except BaseException:
        await stack.aclose()
        raise


def routing_headers(info: dict, prompt_tokens: int) -> dict[str, str]:
    """Where the request ran (the NPU proxy's headers): the serving placement's device, why
    the router chose it (tree.route), and the prompt's token count it classifies by."""
    return {"X-NPU-Proxy-Device": info["device"], "X-NPU-Proxy-Route-Reason": info["route_reason"],
            "X-NPU-Proxy-Token-Count": str(prompt_tokens)}


async def _then_keep_alive(tree: Tree, job: Job, frames):
    """The stream's lines, then its keep_alive applied (once the answer is complete)."""
    async for line in frames:
        yield line
    if job.keep_alive is not None:
        tree.keep_alive(job.req.model, job.keep_alive)


@attrs.frozen
class _Timing:
    started_ns: int
    load_ns: int
    prompt_tokens: int

    def metrics(self, finished: Text) -> dict:
        stats = finished.stats or {}
        return {
            "total_duration": time.monotonic_ns() - self.started_ns,
            "load_duration": self.load_ns,
            "prompt_eval_count": self.prompt_tokens,
            "prompt_eval_duration": int(stats.get("prefill_s", 0.0) * 1e9),
            "eval_count": finished.completion_tokens,
            "eval_duration": int(stats.get("decode_s", 0.0) * 1e9),
        }


def _head(job: Job) -> dict:
    return {"model": job.req.sent_model, "created_at": _now()}


def _final(job: Job, text: str, finished: Text, timing: _Timing) -> dict:
    """The `done: true` object of a non-streamed answer (a complete constrained document
    that does not validate is a 500, never a 200)."""
    message, reason = structured.message(job.plan, text, finished.finish_reason)
    reason = "stop" if reason == "tool_calls" else reason
    out = _head(job)
    if job.chat:
        msg = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            msg["tool_calls"] = [{"function": {"name": c["function"]["name"],
                                               "arguments": json.loads(c["function"]["arguments"])}}
                                 for c in message["tool_calls"]]
        out["message"] = msg
    else:
        out["response"] = text
    return {**out, "done": True, "done_reason": reason, **timing.metrics(finished)}


async def _collect(job: Job, events, timing: _Timing) -> dict:
    texts: list[str] = []
    finished = None
    async for event in events:
        if isinstance(event, Failed):
            raise GreenroomError.from_wire(event.error)
        texts.append(event.text)
        if event.finish_reason:
            finished = event
    return _final(job, "".join(texts), finished, timing)


async def _frames(job: Job, events, timing: _Timing, rid: str):
    """NDJSON lines: one per batch of deltas, then `done: true` with the metrics — or, on a
    failure, the flat error envelope as the last line."""
    calls = ToolCallStream(job.plan.tools) if job.chat and job.plan.parses_tools else None
    texts: list[str] = []

    def delta(text: str, tool_calls: list | None = None) -> bytes:
        if job.chat:
            msg = {"role": "assistant", "content": text}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            return _line({**_head(job), "message": msg, "done": False})
        return _line({**_head(job), "response": text, "done": False})

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
                    yield _line(error_body(GreenroomError.from_wire(event.error), rid))
                    return
                pending.append(event.text)
                texts.append(event.text)
                if event.finish_reason:
                    finished = event
            for line in shaped("".join(pending), final=finished is not None):
                yield line
        if job.plan.constraint is not None:
            structured.message(job.plan, "".join(texts), finished.finish_reason)  # validates a complete document
        reason = finished.finish_reason
        done = {**_head(job), **({"message": {"role": "assistant", "content": ""}} if job.chat else {"response": ""}),
                "done": True, "done_reason": reason, **timing.metrics(finished)}
        yield _line(done)
    except GreenroomError as exc:
        yield _line(error_body(exc, rid))
    except Exception as exc:  # never a half-written stream without a last line
        log.exception("Ollama stream %s failed", rid)
        yield _line(error_body(GreenroomError("internal_error", f"internal error: {type(exc).__name__}"), rid))


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


# --- embeddings ------------------------------------------------------------------------------

def _embed_texts(value, param: str) -> list[str]:
    """The validation table, in order, before any engine is asked anything."""
    if value is None:
        raise GreenroomError("missing_parameter", f"'{param}' is a required property", param)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
        raise GreenroomError("invalid_parameter", f"'{param}' must be a string or an array of strings", param)
    if not items:
        raise GreenroomError("empty_input", "Embedding input must contain at least one item", param)
    if len(items) > MAX_EMBED_ITEMS:
        raise GreenroomError("embedding_batch_too_large", "Embedding input batch is too large", param)
    for text in items:
        if not text.strip():
            raise GreenroomError("empty_input", "Embedding input text must not be empty", param)
    for text in items:
        if len(text) > MAX_EMBED_TEXT_CHARS:
            raise GreenroomError("embedding_input_too_large", "Embedding input text is too large", param)
    if sum(len(t) for t in items) > MAX_EMBED_REQUEST_CHARS:
        raise GreenroomError("embedding_request_too_large", "Embedding request is too large", param)
    return items


async def _embed(tree: Tree, req: Prepared, texts: list[str]) -> tuple[Embedded, int]:
    if not req.caps.embeddings:
        raise GreenroomError("field_not_honoured", "this model's engine serves no embeddings", "model")
    load_started = time.monotonic_ns()
    client, _ = await tree.client_for(req.model, wait_unload=True)
    load_ns = time.monotonic_ns() - load_started
    async with client.submit(Embed(openai_params.new_rid("embd"), req.model, texts=texts)) as events:
        async for event in events:
            if isinstance(event, Failed):
                raise GreenroomError.from_wire(event.error)
    assert isinstance(event, Embedded)
    return event, load_ns


def _floats(raw: bytes) -> list[float]:
    return array.array("f", raw).tolist()


def _normalised(v: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v] if norm > 0 else v


async def _generation_request(tree: Tree, table: dict, where: str):
    """What /api/generate and /api/chat read alike: the ledger, the options, `stream`
    (Ollama streams by default) and `keep_alive`."""
    req = await _prepare(tree, table, where)
    options = ollama_params.resolve(req.body.get("options"), req.caps)
    req = attrs.evolve(req, unread=req.unread + options.unread)
    return req, options, openai_params.boolean(req.body, "stream", True), parse_keep_alive(req.body)


# --- routes ----------------------------------------------------------------------------------

def register(app: Quart, tree: Tree) -> None:
    @app.post("/api/generate")
    async def ollama_generate():
        req, options, stream, keep_alive = await _generation_request(tree, GENERATE, "on /api/generate")
        body = req.body
        prompt, system, template = _string(body, "prompt"), _string(body, "system"), _string(body, "template")
        raw = openai_params.boolean(body, "raw", False)
        plan = _plan(body, None, options.params.stop)
        if not prompt:
            return await _load(tree, req, chat=False, keep_alive=keep_alive)
        rid = openai_params.new_rid("gen")
        if raw or template:
            if raw and (system or template):
                req = attrs.evolve(req, unread=req.unread + [f for f in ("system", "template") if body.get(f)])
            text = prompt if raw else _apply_template(template, system, prompt)
            gen = Generate(rid, req.model, options.params, prompts=[text], constraint=plan.constraint)
        else:
            conversation = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}]
            # a model without a chat template gets the prompt as it is, Ollama's `{{ .Prompt }}`
            gen = Generate(rid, req.model, options.params, conversations=[conversation], constraint=plan.constraint,
                           as_is_without_template=True)
        return await _generate(tree, Job(False, req, gen, plan, options, stream, keep_alive))

    @app.post("/api/chat")
    async def ollama_chat():
        req, options, stream, keep_alive = await _generation_request(tree, CHAT, "on /api/chat")
        body = req.body
        messages = body.get("messages")
        if messages is not None and not isinstance(messages, list):
            raise GreenroomError("invalid_parameter", "'messages' must be an array", "messages")
        plan = _plan(body, body.get("tools"), options.params.stop)
        if not messages:
            return await _load(tree, req, chat=True, keep_alive=keep_alive)
        gen = Generate(openai_params.new_rid("chat"), req.model, options.params,
                       conversations=[_conversation(messages)], tools=plan.tools, constraint=plan.constraint)
        return await _generate(tree, Job(True, req, gen, plan, options, stream, keep_alive))

    @app.post("/api/embed")
    async def ollama_embed():
        req = await _prepare(tree, EMBED, "on /api/embed")
        body = req.body
        texts = _embed_texts(body.get("input"), "input")
        openai_params.boolean(body, "truncate", True)  # validated; never honoured as Ollama's truncation (see below)
        dimensions = body.get("dimensions")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or dimensions < 1):
            raise GreenroomError("invalid_parameter", "'dimensions' must be a positive integer", "dimensions")
        keep_alive = parse_keep_alive(body)
        also = ["truncate"] if body.get("truncate") is True else []  # never truncated: a long input is refused
        headers = req.headers(also)
        embedded, load_ns = await _embed(tree, req, texts)
        if keep_alive is not None:
            tree.keep_alive(req.model, keep_alive)
        vectors = [_floats(v) for v in embedded.vectors]
        if dimensions is not None:
            if dimensions > len(vectors[0]):
                raise GreenroomError("invalid_parameter", f"'dimensions' is {dimensions}, but this model's "
                                     f"embeddings have {len(vectors[0])}", "dimensions")
            vectors = [v[:dimensions] for v in vectors]
        return {"model": req.sent_model, "embeddings": [_normalised(v) for v in vectors],
                "total_duration": time.monotonic_ns() - req.started_ns, "load_duration": load_ns,
                "prompt_eval_count": embedded.prompt_tokens}, 200, headers

    @app.post("/api/embeddings")
    async def ollama_embeddings():
        req = await _prepare(tree, EMBEDDINGS, "on /api/embeddings")
        if req.body.get("prompt") is not None:
            _string(req.body, "prompt")
        texts = _embed_texts(req.body.get("prompt"), "prompt")
        keep_alive = parse_keep_alive(req.body)
        headers = req.headers()
        embedded, _ = await _embed(tree, req, texts)
        if keep_alive is not None:
            tree.keep_alive(req.model, keep_alive)
        return {"embedding": _floats(embedded.vectors[0])}, 200, headers

    @app.get("/api/tags")
    async def ollama_tags():
        placed = [model_facts.Placed.of(tree, m["id"], trio.current_time()) for m in tree.models()]
        return {"models": await trio.to_thread.run_sync(model_facts.tags, placed)}

    @app.get("/api/ps")
    async def ollama_ps():
        placed = [model_facts.Placed.of(tree, m["id"], trio.current_time())
                  for m in tree.models() if m["state"] == "loaded"]
        return {"models": await trio.to_thread.run_sync(model_facts.ps, placed)}

    @app.post("/api/show")
    async def ollama_show():
        req = await _prepare(tree, {"model": ledger.USE, "name": ledger.USE, "verbose": ledger.USE,
                                    "system": ledger.REPORTED, "template": ledger.REPORTED,
                                    "options": ledger.REPORTED}, "on /api/show")
        placed = model_facts.Placed.of(tree, req.model, trio.current_time())
        verbose = openai_params.boolean(req.body, "verbose", False)
        shown = await trio.to_thread.run_sync(model_facts.show, placed, req.caps.tools, verbose)
        return shown, 200, req.headers()

    @app.get("/api/version")
    async def ollama_version():
        return {"version": __version__}
