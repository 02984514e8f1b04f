"""Ollama's model-management routes: /api/pull (from the Hugging Face Hub), /api/delete,
/api/copy, /api/create (from a model, or from a GGUF file uploaded to /api/blobs:
http/ollama/ollama_blobs.py), and the NPU proxy's extensions /api/search and /api/models/known.

Models these routes add are placed on the tree (`Tree.add_model`) and recorded in the
registry (greenroom/store/registry.py), which places them again when the server starts. The
registry is written first, off the event loop: a store that cannot be written (503
storage_unavailable) leaves the served models as they were.
Errors are the Ollama surface's flat envelope (their routes' surface in routes.py).

Hub tokens (spec: "Pull authentication"): a public repository needs none; a private one
needs the caller's token in exactly one place — the body's `huggingface_token`, or
`Authorization: Bearer <token>` — both at once is a 400. When the server has an API key
(GREENROOM_API_KEY), `Authorization` carries that key, so the Hub token can only come from
the body. The server's own Hugging Face credentials are never used for a pull.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
from pathlib import Path

import attrs
import trio
from quart import Quart, Response, request

from greenroom.engines.capabilities import Capabilities, capabilities_of
from greenroom.engines.llama_cpp import gguf_files, gguf_meta
from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, framing, ledger, routes
from greenroom.http.core.headers import IGNORED_FIELDS_HEADER, STRICT_HEADER
from greenroom.http.core.request_ids import request_id
from greenroom.http.ollama import model_facts, ollama_api, ollama_blobs, ollama_params, ollama_templates
from greenroom.http.ollama.ollama_request import model_named, served
from greenroom.http.openai import openai_params
from greenroom.store import blobs, catalogue, hub
from greenroom.store.registry import Entry, Registry, place
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom.http.ollama")

_HUB_TOKEN = contracts.Text(
    pattern=r"[\x21-\x7e]{1,1024}",
    description="A Hugging Face token for a private "
    "repository (printable characters, no spaces); or Authorization: Bearer, not both",
)
# letters, digits and . _ - : /, at most 200 characters, starting with a letter or digit, no ".."
_NAME = contracts.Text(pattern=r"[A-Za-z0-9](?:\.?[A-Za-z0-9_:/-])*\.?", max_length=200)
# a file's name in `files`, as Ollama takes one: a relative path (no "." or ".." part, no empty
# part), without backslashes or colons
_PART = r"(?:[^/\\:.][^/\\:]*|\.[^/\\:.][^/\\:]*|\.\.[^/\\:]+)"
_FILE_NAME = contracts.Text(pattern=rf"{_PART}(?:/{_PART})*", description="The file's name (a relative path)")
_ONE_FILE = (
    "greenroom creates a model from one GGUF file (a model split in parts: merge them first, llama-gguf-split --merge)"
)

MAX_SEARCH_LIMIT = 100
_OFFLINE = ("downloads", "likes")  # sorts the offline catalogue cannot honour

# --- request shapes (contracts.py) --------------------------------------------------------

_FROM_HUB = "a catalogue alias (GET /api/models/known) or a Hugging Face repository id owner/name, with :TAG"
PULL_REQUEST = contracts.merge(
    ollama_api.named(
        contracts.Text(
            min_length=1,
            pattern=(rf"(?:[\s\S]*/)?(?:[^/:]*|[^/]*:{hub._TAG.pattern})"),
            description=_FROM_HUB + " (latest or a GGUF quantization)",
        )
    ),
    contracts.Shape(
        fields={
            "stream": contracts.Boolean(default=True),
            "huggingface_token": _HUB_TOKEN,
            "insecure": contracts.refused(False, why="the Hub is reached as HF_ENDPOINT says"),
        }
    ),
    ledger=True,
)
DELETE_REQUEST = attrs.evolve(ollama_api.named(ollama_api.MODEL), ledger=True)
COPY_REQUEST = contracts.Shape(
    fields={
        "source": ollama_api.MODEL,
        "destination": attrs.evolve(_NAME, description="The new name (:latest is the bare name)"),
    },
    required=("source", "destination"),
    ledger=True,
)
CREATE_REQUEST = contracts.merge(
    ollama_api.named(attrs.evolve(_NAME, description="The new model's name")),
    contracts.Shape(
        fields={
            "from": attrs.evolve(
                ollama_api.MODEL,
                description="The model it is made from (or the file /api/show's FROM names for one)",
            ),
            "files": contracts.MapOf(
                keys=_FILE_NAME,
                values=ollama_blobs.DIGEST,
                description="The GGUF file it is made from, uploaded to POST /api/blobs: {its name: its digest}. "
                + _ONE_FILE,
            ),
            "template": ollama_api.GENERATE_REQUEST.fields["template"],
            "system": contracts.Text(),
            "parameters": attrs.evolve(ollama_params.SHAPE, closed=True, description="Its default options"),
            "messages": contracts.ListOf(
                items=ollama_api.MESSAGE, min_items=1, description="Messages before every chat"
            ),
            "license": contracts.AnyOf(
                options=(contracts.Text(), contracts.ListOf(items=contracts.Text())), description="Shown by /api/show"
            ),
            "stream": contracts.Boolean(default=True),
            "quantize": contracts.refused("", why="greenroom does not quantize models"),  # "": none, as Ollama reads it
            "adapters": contracts.refused(
                {}, why="LoRA adapters are not supported: create from a GGUF file with them merged"
            ),
        },
        rules=(
            {
                "oneOf": [contracts.sent("from"), contracts.sent("files")],
                "description": "from (a model) or files (an uploaded GGUF file): one of them",
            },
            {"properties": {"files": {"minProperties": 1, "maxProperties": 1}}, "description": _ONE_FILE},
        ),
    ),
    ledger=True,
)
SEARCH_QUERY = contracts.Shape(
    fields={
        "q": contracts.Text(description="In the alias, repository or family (case-insensitive)"),
        "sort": contracts.Choice(
            values=tuple(s for s in catalogue.SORTS if s not in _OFFLINE),
            default="popular",
            description=" and ".join(_OFFLINE) + ": 400 field_not_honoured (an offline catalogue)",
        ),
        "limit": contracts.Number(lo=1, hi=MAX_SEARCH_LIMIT, integer=True, default=20),
        "offset": contracts.Number(lo=0, hi=10**9 - 1, integer=True, default=0),
        "type": contracts.Choice(values=catalogue.TYPES, default="all"),
        "quantization": contracts.Text(description="Exactly (case-insensitive)"),
        "min_downloads": contracts.Number(
            lo=0,
            hi=0,
            integer=True,
            default=0,
            description="Above 0: 400 field_not_honoured (the catalogue records no download counts)",
        ),
    },
    description=f"Other parameters are reported in {IGNORED_FIELDS_HEADER}",
)
POLL_S = 0.25  # how often a pull's progress is read from its download thread


async def _body(shape: contracts.Shape, where: str) -> tuple[dict, dict[str, str]]:
    """The JSON body, checked against `shape` (refusals raised; unread fields reported)."""
    strict = ledger.strict_mode(request.headers.get(STRICT_HEADER))
    body = openai_params.parse_json(await request.get_data())
    unread = ledger.check(shape, body, Capabilities(), where)
    return body, ledger.report_headers(unread, strict)


def _new_name(value, param: str) -> str:
    """A name for a new model, as Ollama writes them (`namespace/model:tag`; `:latest` is
    the bare name)."""
    if value is None or value == "":
        raise GreenroomError("missing_parameter", f"'{param}' is required", param)
    if not _NAME.matches(value):
        raise GreenroomError(
            "invalid_parameter",
            f"'{param}' must be a model name: letters, digits and . _ - : / (at most 200 characters)",
            param,
        )
    return value.removesuffix(":latest")


def _required(body: dict, name: str) -> str:
    """A model named by `name` (its own param in the error, not `model`)."""
    value = body.get(name)
    if value is None or value == "":
        raise GreenroomError("missing_parameter", f"'{name}' is required", name)
    if not isinstance(value, str):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a string", name)
    return value


def _ndjson(frames, headers: dict) -> Response:
    """Status frames as an NDJSON stream; a failure after the stream started is its last
    line, in the flat envelope."""
    rid = request_id()

    async def lines():
        try:
            async for frame in frames:
                yield framing.ndjson(frame)
        except GreenroomError as exc:
            yield framing.ndjson(exc.ollama_body(rid))

    return framing.streamed(lines(), framing.NDJSON, headers)


async def _last(frames) -> dict:
    """`stream: false`: only the last frame (a failure is the response's error status)."""
    last = None
    async for last in frames:  # noqa: B007 (the loop keeps the last frame)
        pass
    return last


@attrs.frozen
class _Base:
    """What a model is created from."""

    name: str  # the model's name, or the uploaded file's: /api/show's details.parent_model
    spec: dict  # the new model's placement (Tree.add_model's arguments)
    defaults: dict  # the base's own, which the new model's replace one by one
    template: str  # the template /api/show prints for the base
    frames: list[dict]  # the first status lines
    repo: str | None  # the pulled repository whose files it uses


def _spec(tree: Tree, model: str) -> dict:
    """Tree.add_model's arguments that place another name on `model`'s source."""
    m = tree.state_of(model)
    p = m.placement
    if p.engine == "transformers":
        actor = "auto" if m.auto is not None else m.slot.name
    else:  # an actor of its own is spawned for it: on this host, or on the source's worker host
        actor = m.slot.host or "auto"
    return {
        "source": p.source,
        "engine": p.engine,
        "actor": actor,
        "dtype": p.dtype,
        "n_ctx": p.n_ctx,
        "threads": p.threads,
        "chat_template": p.chat_template,
    }


def register(app: Quart, tree: Tree, store: blobs.BlobStore) -> None:
    registry = Registry(tree.config.cache_dir)
    pruned = store.prune({e.spec["source"] for e in registry.entries()})  # before any request: nothing in flight
    if pruned:
        log.info("deleted %d blob file(s) no model is made from: %s", len(pruned), ", ".join(pruned))
    pulling: dict[str, trio.Lock] = collections.defaultdict(trio.Lock)  # one pull per repository at a time
    # a blob checked for a create is registered before a delete can find it unused and remove it
    users_change = trio.Lock()

    def hub_token(body: dict) -> str | None:
        sent = body.get("huggingface_token")
        if sent is not None and not _HUB_TOKEN.matches(sent):
            raise GreenroomError(
                "invalid_parameter",
                "'huggingface_token' must be a token: printable characters, no spaces",
                "huggingface_token",
            )
        header = None
        auth = request.headers.get("Authorization")
        if tree.config.api_key is None and auth is not None:  # with an API key, Authorization is the server's
            scheme, _, value = auth.strip().partition(" ")
            if scheme.lower() != "bearer" or not _HUB_TOKEN.matches(value.strip()):
                raise GreenroomError(
                    "invalid_parameter",
                    "the Authorization header must be 'Bearer <Hugging Face token>'",
                    "Authorization",
                )
            header = value.strip()
        if sent is not None and header is not None:
            raise GreenroomError(
                "hub_token_conflict",
                "a Hugging Face token was sent both in huggingface_token and "
                "in Authorization: Bearer; send it in exactly one of them",
                "huggingface_token",
            )
        return sent if sent is not None else header

    async def release(entry: Entry) -> None:
        """A forgotten model's files go with the last name that uses them: a pulled
        repository's, an uploaded blob."""
        if entry.repo is not None:
            files = await trio.to_thread.run_sync(registry.prune, entry.repo)
            if files is not None:
                await trio.to_thread.run_sync(registry.delete_files, files)
                log.info("deleted the files of %s (%s): no model uses them", entry.repo, files)
        source = entry.spec["source"]
        if store.holds(source):
            users = await trio.to_thread.run_sync(registry.entries)
            if not any(e.spec["source"] == source for e in users):
                await trio.to_thread.run_sync(store.remove, source)
                log.info("deleted the blob %s: no model uses it", source)

    def pulled_entries(t: hub.Target, lst: hub.Listing, dest) -> list[Entry]:
        """The names a pulled repository is served as: the pulled name (a checkpoint), or
        `<name>:<QUANT>` per GGUF model, QUANT read from the file."""
        if lst.engine == "transformers":
            return [
                Entry(
                    t.name, "pulled", {"source": str(dest), "engine": "transformers", "actor": "auto"}, None, lst.repo
                )
            ]
        wanted = {(dest / f.name).resolve() for f in lst.files}
        names = {}
        for label, path in gguf_files.discover([dest]):
            if path.resolve() in wanted:
                names.setdefault(f"{t.name}:{label.rpartition(':')[2]}", path)
        return [
            Entry(n, "pulled", {"source": str(p), "engine": "llama.cpp"}, None, lst.repo)
            for n, p in sorted(names.items())
        ]

    def check_free(entries: list[Entry], repo: str) -> None:
        """A pulled name may replace only the same repository's earlier pull."""
        for e in entries:
            if e.name in tree.model_states:
                known = registry.get(e.name)
                if known is None or known.kind != "pulled" or known.repo != repo:
                    raise GreenroomError(
                        "model_exists",
                        f"a model named '{e.name}' already exists; delete it first "
                        "(DELETE /api/delete) or pull under another name",
                        "model",
                    )

    async def pull_frames(t: hub.Target, lst: hub.Listing, token: str | None):
        yield {"status": "pulling manifest"}
        dest = registry.repo_dir(lst.repo)
        async with pulling[lst.repo]:
            progress = hub.Progress()
            failure: list[BaseException] = []

            def work():
                try:
                    hub.download(lst, dest, token, progress)
                except BaseException as exc:  # handed to the stream, which raises it
                    failure.append(exc)

            worker = threading.Thread(target=work, name=f"pull {lst.repo}", daemon=True)
            worker.start()
            sent: dict[str, int] = {}
            try:
                while True:
                    finished = not worker.is_alive()
                    for f in lst.files:
                        done = progress.done.get(f.name)
                        if done is not None and sent.get(f.name) != done:
                            sent[f.name] = done
                            yield {
                                "status": f"pulling {f.digest.partition(':')[2][:12]}",
                                "digest": f.digest,
                                "total": f.size,
                                "completed": done,
                            }
                    if finished:
                        break
                    await trio.sleep(POLL_S)
            finally:
                progress.cancelled.set()  # a client that went away stops the download at its next chunk
            if failure:
                if isinstance(failure[0], GreenroomError):
                    raise failure[0]
                log.error("pull of %s failed: %s", lst.repo, type(failure[0]).__name__)
                raise GreenroomError(
                    "hub_unavailable", f"downloading '{lst.repo}' failed ({type(failure[0]).__name__})", "model"
                )
            yield {"status": "writing manifest"}
            entries = await trio.to_thread.run_sync(pulled_entries, t, lst, dest)
            if not entries:
                raise GreenroomError("unsupported_repository", f"no GGUF file of '{lst.repo}' could be read", "model")
            check_free(entries, lst.repo)
            await trio.to_thread.run_sync(
                registry.record_pull, lst.repo, lst.revision, dest, token is not None, entries
            )
            for e in entries:
                if e.name not in tree.model_states:
                    place(tree, e)
            log.info("pulled %s (%s) as %s", lst.repo, lst.revision[:12], ", ".join(e.name for e in entries))
        yield {"status": "success"}

    @routes.view(app, "POST", "/api/pull")
    async def ollama_pull():
        body, headers = await _body(PULL_REQUEST, "on /api/pull")
        stream = openai_params.boolean(body, "stream", True)
        t = hub.target(model_named(body))
        token = hub_token(body)
        # every pull asks the Hub with the caller's token (or none): files already here are never
        # an answer to a caller the Hub refuses, whoever pulled them before
        lst = await trio.to_thread.run_sync(hub.listing, t, token)
        if lst.engine == "transformers":
            check_free([Entry(t.name, "pulled", {}, None, lst.repo)], lst.repo)
        frames = pull_frames(t, lst, token)
        return _ndjson(frames, headers) if stream else (await _last(frames), 200, headers)

    @routes.view(app, "DELETE", "/api/delete")
    async def ollama_delete():
        body, headers = await _body(DELETE_REQUEST, "on /api/delete")
        model = served(tree, model_named(body))
        entry = registry.get(model)
        if entry is None:
            raise GreenroomError(
                "model_configured",
                f"model '{model}' comes from the server's configuration, not "
                "from /api/pull, /api/copy or /api/create: remove it there",
                "model",
            )
        await trio.to_thread.run_sync(registry.remove, model)
        await tree.remove_model(model)
        async with users_change:
            await release(entry)
        log.info("deleted model %s", model)
        return {}, 200, headers

    @routes.view(app, "POST", "/api/copy")
    async def ollama_copy():
        body, headers = await _body(COPY_REQUEST, "on /api/copy")
        source = served(tree, _required(body, "source"))
        destination = _new_name(body.get("destination"), "destination")
        if destination in tree.model_states:
            raise GreenroomError("model_exists", f"a model named '{destination}' already exists", "destination")
        m = tree.state_of(source)
        of = registry.get(source)
        entry = Entry(destination, "copy", _spec(tree, source), m.placement.defaults, of.repo if of else None)
        await trio.to_thread.run_sync(registry.add, entry)
        place(tree, entry)
        return {}, 200, headers

    def base_model(value) -> str:
        """The model `from` names: a served model, or the file (or directory) of one — what the
        CLI sends for a Modelfile whose FROM is a path it cannot read (on another machine)."""
        try:
            return served(tree, value)
        except GreenroomError as exc:
            if exc.code != "model_not_found" or not os.path.isabs(value):
                raise
            for m in tree.models():
                if tree.state_of(m["id"]).placement.path() == Path(value):
                    return m["id"]
            raise

    async def made_from(body: dict) -> _Base:
        """What a model is created from: an uploaded GGUF file (`files`), or a model (`from`)."""
        if body.get("from") is not None and body.get("files") is not None:
            raise GreenroomError(
                "invalid_parameter", "send 'from' (a model) or 'files' (a GGUF file), not both", "files"
            )
        if body.get("files") is not None:  # served by llama.cpp, as any GGUF file
            digest, label = _one_file(body["files"])
            path = store.path(digest)
            meta = await trio.to_thread.run_sync(_gguf_blob, path, label, digest)
            return _Base(
                label,
                {"source": str(path), "engine": "llama.cpp", "actor": "auto"},
                {},
                meta.get("tokenizer.chat_template", ""),
                [{"status": "parsing GGUF"}, {"status": f"using existing layer sha256:{blobs.hex_of(digest)}"}],
                None,
            )
        if body.get("from") is None:
            raise GreenroomError(
                "missing_parameter", "send 'from' (a model) or 'files' (an uploaded GGUF file)", "from"
            )
        label = base_model(_required(body, "from"))
        placed = model_facts.Placed.of(tree, label, trio.current_time())
        own = await trio.to_thread.run_sync(model_facts.template_of, placed) if body.get("template") else ""
        of = registry.get(label)
        return _Base(
            label,
            _spec(tree, label),
            dict(placed.placement.defaults or {}),
            own,
            [{"status": f"using base model {label}"}],
            of.repo if of else None,
        )

    @routes.view(app, "POST", "/api/create")
    async def ollama_create():
        body, headers = await _body(CREATE_REQUEST, "on /api/create")
        stream = openai_params.boolean(body, "stream", True)
        name = _new_name(model_named(body), "model")
        async with users_change:
            base = await made_from(body)
            defaults = _create_defaults(body, capabilities_of(base.spec["engine"]), base.template)
            merged = {
                **base.defaults,
                **{k: v for k, v in defaults.items() if v},  # what is sent replaces the base's
                "parameters": {**base.defaults.get("parameters", {}), **defaults["parameters"]},
                "parent_model": base.name,
            }
            existing = registry.get(name) if name in tree.model_states else None
            if name in tree.model_states and (existing is None or existing.kind != "created"):
                raise GreenroomError(
                    "model_exists",
                    f"a model named '{name}' already exists (only a model made by "
                    "/api/create is replaced by creating it again)",
                    "model",
                )
            entry = Entry(name, "created", base.spec, {k: v for k, v in merged.items() if v}, base.repo)
            await trio.to_thread.run_sync(registry.add, entry)
            if existing is not None:
                await tree.remove_model(name)
            place(tree, entry)
            if existing is not None:  # the replaced model's files, unless the new one uses them
                await release(existing)

        async def frames():
            for frame in base.frames:
                yield frame
            for field in ("system", "template", "parameters", "messages", "license"):
                if defaults.get(field):
                    yield {"status": f"creating {field} layer"}
            yield {"status": "writing manifest"}
            yield {"status": "success"}

        return _ndjson(frames(), headers) if stream else (await _last(frames()), 200, headers)

    @routes.view(app, "GET", "/api/models/known")
    async def ollama_known():
        return {"models": [catalogue.row(k) for k in catalogue.CATALOGUE]}

    @routes.view(app, "GET", "/api/search")
    async def ollama_search():
        args = request.args
        strict = ledger.strict_mode(request.headers.get(STRICT_HEADER))
        headers = ledger.report_headers([k for k in args if k not in SEARCH_QUERY.names], strict)
        sort = _choice(args, "sort", catalogue.SORTS)
        if sort in _OFFLINE:
            raise GreenroomError(
                "field_not_honoured",
                f"'sort={sort}' cannot be honoured: the catalogue is answered "
                "offline and records no download or like counts; use popular or newest",
                "sort",
            )
        if _count(args, "min_downloads") > 0:
            raise GreenroomError(
                "field_not_honoured",
                "'min_downloads' cannot be honoured: the catalogue is answered offline and records no download counts",
                "min_downloads",
            )
        limit, offset = _count(args, "limit", MAX_SEARCH_LIMIT), _count(args, "offset")
        found = catalogue.search(
            args.get("q", ""), sort, _choice(args, "type", catalogue.TYPES), args.get("quantization", "")
        )
        return (
            {
                "models": [catalogue.row(k) for k in found[offset : offset + limit]],
                "total": len(found),
                "limit": limit,
                "offset": offset,
            },
            200,
            headers,
        )


def _choice(args, name: str, allowed: tuple[str, ...]) -> str:
    value = args.get(name, SEARCH_QUERY.fields[name].default)
    if value not in allowed:
        raise GreenroomError("invalid_parameter", f"'{name}' must be one of {', '.join(allowed)}", name)
    return value


def _count(args, name: str, hi: int | None = None) -> int:
    """A count of SEARCH_QUERY, in at most 9 decimal digits, at most `hi`."""
    field = SEARCH_QUERY.fields[name]
    value = args.get(name)
    if value is None:
        return field.default
    if not re.fullmatch(r"\d{1,9}", value) or int(value) < field.lo or (hi is not None and int(value) > hi):
        raise GreenroomError(
            "invalid_parameter",
            f"'{name}' must be an integer from {field.lo}" + (f" to {hi}" if hi is not None else ""),
            name,
        )
    return int(value)


def _one_file(files) -> tuple[str, str]:
    """The digest and name of the one GGUF file `files` names (Ollama's words where it has them)."""
    if not isinstance(files, dict):
        raise GreenroomError("invalid_parameter", "'files' must be an object: {file name: digest}", "files")
    if len(files) != 1:
        raise GreenroomError(
            "invalid_parameter",
            "no files provided to convert" if not files else f"{_ONE_FILE}; got {len(files)}",
            "files",
        )
    ((label, digest),) = files.items()
    if not _FILE_NAME.matches(label):
        raise GreenroomError("invalid_parameter", f"file path must be relative: {label}", "files")
    if not ollama_blobs.DIGEST.matches(digest):
        raise GreenroomError("invalid_parameter", f"invalid digest for {label}: invalid digest format", "files")
    return digest, label


def _gguf_blob(path: Path, label: str, digest: str) -> gguf_meta.GGUFMeta:
    """The header of an uploaded file a model is made from: stored, a GGUF file, not an adapter."""
    try:
        meta = gguf_meta.read(path)
    except FileNotFoundError:
        raise GreenroomError(
            "blob_not_found",
            f"blob not found for {label} (digest {digest}): upload it first (POST /api/blobs/{digest})",
            "files",
        ) from None
    except (OSError, gguf_meta.GGUFError) as exc:
        raise GreenroomError(
            "invalid_blob", f"supplied file was not in GGUF format: {label} ({exc})", "files"
        ) from None
    if meta.get("general.type") == "adapter":
        raise GreenroomError("invalid_blob", f"LoRA adapters are not supported: {label} is one", "files")
    return meta


def _create_defaults(body: dict, caps: Capabilities, own_template: str) -> dict:
    """A created model's system, template, parameters, messages and license, validated as a
    request carrying them would be. A template that is the base's own (`own_template`, the
    chat template /api/show prints for it, which a Modelfile written by `ollama show
    --modelfile` carries back) is no template of the new model's: it keeps the base's."""
    system, template = openai_params.string(body, "system"), openai_params.string(body, "template")
    template = ollama_templates.check(template or "", own_template)
    parameters = openai_params.mapping(body, "parameters")
    if parameters is not None:
        unknown = sorted(set(parameters) - set(ollama_params.OPTIONS))
        if unknown:
            raise GreenroomError(
                "invalid_parameter", f"unknown parameter(s): {', '.join(unknown)}", f"parameters.{unknown[0]}"
            )
        try:
            ollama_params.resolve(parameters, caps)
        except GreenroomError as exc:
            raise GreenroomError(
                exc.code,
                exc.message.replace("options.", "parameters."),
                (exc.param or "").replace("options", "parameters", 1),
            ) from None
    messages = body.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise GreenroomError("invalid_parameter", "'messages' must be an array", "messages")
        ollama_api.conversation(messages)
        messages = [{k: m[k] for k in ("role", "content", "tool_calls") if k in m} for m in messages]
    licenses = body.get("license")
    if isinstance(licenses, str):
        licenses = [licenses]
    if licenses is not None and not (isinstance(licenses, list) and all(isinstance(t, str) for t in licenses)):
        raise GreenroomError("invalid_parameter", "'license' must be a string or an array of strings", "license")
    return {
        "system": system,
        "template": template,
        "parameters": {k: v for k, v in (parameters or {}).items() if v is not None},  # null: not set
        "messages": messages,
        "license": [t for t in licenses or () if t],
    }
