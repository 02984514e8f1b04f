"""The one table of routes greenroom serves.

Each `Route` says its method and path (OpenAPI's form, `{name}` for a path parameter), its
surface (whose error envelope its errors use), what it is for, and the components of its
request and its answer. The views are registered through it (`view`: a route not in the
table cannot be registered, and `create_app` refuses to start with a route left without a
view); `GET /` lists it; openapi.py documents it; tests/live/test_auth.py walks it.

Surfaces: greenroom's own routes (/v1, the management and steering API) answer errors in
OpenAI's envelope `{"error": {message, type, param, code}}`; Ollama's routes in Ollama's
flat `{"error", "code"}`; Anthropic's Messages routes (/v1/messages…) in Anthropic's
`{"type": "error", "error": {type, message}}` with its statuses (errors.anthropic_status). A
method and path no route matches (404, a known path with another method too: app.py) keeps the
rule from before the table: the surface of the route with that path template, else OpenAI's under the
roots of greenroom's parametrised /api routes (/api/profiles/…, /api/clusters/…,
/api/circuits/…), else Ollama's anywhere else under /api/, else Anthropic's under
/v1/messages/, else OpenAI's.

No quart here: app.py's error handler and the modules that register views read the table.
"""

from __future__ import annotations

import enum
import re

import attrs


class Surface(enum.Enum):
    OPENAI = "openai"  # OpenAI's error envelope
    OLLAMA = "ollama"  # Ollama's flat error envelope
    ANTHROPIC = "anthropic"  # Anthropic's error envelope and statuses


class Framing(enum.Enum):
    JSON = "json"  # one JSON body
    SSE = "sse"  # with "stream": true, server-sent events (each `stream` item a JSON chunk)
    ONLY_SSE = "only_sse"  # always server-sent events
    NDJSON = "ndjson"  # newline-delimited JSON unless "stream": false (Ollama streams by default)
    TEXT = "text"  # text/plain
    FILE = "file"  # a static file of the console (http/console): HTML, JavaScript or CSS


OPENAI, OLLAMA, ANTHROPIC = Surface.OPENAI, Surface.OLLAMA, Surface.ANTHROPIC

# the X-miLLM-* headers a generation's answer carries (openapi.py's header components)
IGNORED = ("IgnoredFields",)
SEEDED = ("IgnoredFields", "Seed", "DrawnSeed", "Steering", "CircuitRung")
CONSTRAINED = SEEDED + ("Constrained", "SteeringIntensity")
ROUTED = ("Device", "RouteReason", "TokenCount")  # where an Ollama request ran (the NPU proxy's headers)
OLLAMA_GENERATED = ("IgnoredFields", "DrawnSeed", "NumCtx", "Truncated", *ROUTED)
OLLAMA_EMBEDDED = ("IgnoredFields", "Dimensions", *ROUTED)


@attrs.frozen
class Route:
    method: str
    path: str
    surface: Surface
    description: str  # the index's line and the operation's summary
    operation: str  # the OpenAPI operationId
    response: str | None = None  # the component of the 200's JSON body (or of one NDJSON line)
    answer: str = "The answer"  # the 200's description
    request: str | None = None  # the component of its JSON body
    query: str | None = None  # the component whose fields are its query parameters
    framing: Framing = Framing.JSON
    stream: str | None = None  # the component of one streamed item (SSE event, NDJSON line)
    headers: tuple[str, ...] = ()  # response header components
    strict: bool = False  # reads X-miLLM-Strict: the ledger reports (or refuses) fields it does not read
    details: str = ""  # the operation's longer description
    # the body is a file's bytes, streamed to the view as they come (connection.py paces it), not JSON;
    # its answers carry no body: `answer` is the 200's (already there), `created` the 201's
    upload: bool = False
    created: str = ""

    @property
    def rule(self) -> str:
        """The path as quart routes it: a model id may hold slashes (`owner/name:tag`)."""
        return re.sub(r"\{(\w+)\}", lambda m: f"<path:{m[1]}>" if m[1] == "id" else f"<{m[1]}>", self.path)

    @property
    def params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)

    @property
    def endpoint(self) -> str:
        return f"{self.method} {self.path}"


def _steering(method: str, path: str, description: str, operation: str, request: str | None = None) -> Route:
    """A write answered with the model's resulting steering state."""
    return Route(
        method,
        path,
        OPENAI,
        description,
        operation,
        "ModelSteering",
        "The model's resulting steering state, its version, and whether it is live",
        request,
    )


def _named(kind: str, dial: str, activate: str) -> list[Route]:
    """/api/{kind}s/{name}…: one route set per document kind (http/manage/clusters_api.py)."""
    title, root = kind.capitalize(), f"/api/{kind}s/{{name}}"
    return [
        Route("GET", root, OPENAI, f"one {kind}", f"get{title}", title, f"The {kind}"),
        Route(
            "GET",
            root + "/export",
            OPENAI,
            f"a {kind} as the document import takes",
            f"export{title}",
            f"{title}Document",
            f"The document POST /api/{kind}s/import takes",
        ),
        Route(
            "PUT",
            root + "/intensity",
            OPENAI,
            f'a {kind}\'s persistent dial: {{"intensity": {dial}}}',
            f"dial{title}",
            f"{title}Dialled",
            f"The {kind}, and the re-applied steering when it is active",
            "IntensityRequest",
        ),
        _steering("POST", root + "/activate", activate, f"activate{title}"),
        Route("DELETE", root, OPENAI, f"delete a {kind}", f"delete{title}", "ProfileDeleted", "Deleted"),
    ]


def _ollama(
    method: str, path: str, description: str, operation: str, response: str, request: str | None = None, **kw
) -> Route:
    return Route(
        method,
        path,
        OLLAMA,
        description,
        operation,
        response,
        request=request,
        strict=kw.pop("strict", request is not None),
        **kw,
    )


TABLE: tuple[Route, ...] = (
    Route("GET", "/", OPENAI, "this index", "index", "Index", "The routes this server answers"),
    Route(
        "GET",
        "/health",
        OPENAI,
        "readiness: ok once the tree is up, loading before",
        "health",
        "Health",
        "ok once the tree is up, loading before",
    ),
    Route(
        "GET",
        "/api/actors",
        OPENAI,
        "the live actor tree: name, pid, state, models, queue depth, RSS; the server's URLs and uptime",
        "actors",
        "Actors",
        "One row per actor",
    ),
    Route(
        "GET",
        "/api/health/inference",
        OPENAI,
        "the inference backend of each engine actor: serial or continuous_batching",
        "inference",
        "Inference",
        "serial or continuous_batching, per engine actor",
    ),
    Route(
        "GET",
        "/metrics",
        OPENAI,
        "Prometheus metrics",
        "metrics",
        answer="The Prometheus text exposition",
        framing=Framing.TEXT,
    ),
    Route(
        "GET",
        "/api/models",
        OPENAI,
        "every model with its state (loaded, unloaded, loading, converting, unloading)",
        "listModelStates",
        "ModelStates",
        "Every available model",
    ),
    Route(
        "POST",
        "/api/models/load",
        OPENAI,
        'load a model: {"model": id}',
        "loadModel",
        "ModelState",
        "The model, loaded",
        "ModelRequest",
    ),
    Route(
        "POST",
        "/api/models/unload",
        OPENAI,
        'unload a model gracefully: {"model": id}',
        "unloadModel",
        "ModelState",
        "The model, unloaded (running requests finished first)",
        "ModelRequest",
    ),
    Route(
        "GET",
        "/api/saes",
        OPENAI,
        "the SAEs attached to each steerable model (width, layer, hook point) and the demo SAEs",
        "listSAEs",
        "SAEList",
        "Per model: its steering state with each SAE's width, layer and hook point; the demo SAEs",
    ),
    Route(
        "GET",
        "/api/saes/{sae_id}",
        OPENAI,
        "one attached SAE (?model=: of that model): what a strength means there — its residual norm, "
        "each feature's decoder norm, the coefficient a strength of 1 is — and its hook point",
        "getSAE",
        "SAE",
        "The SAE's record, its units and every feature's decoder norm",
        query="ModelQuery",
    ),
    _steering(
        "POST",
        "/api/saes/attach",
        'attach an SAE: {"model", "sae": a directory, demo:<size>[:<layer>] or random:<d_in>:<layer>}',
        "attachSAE",
        "SAEAttachRequest",
    ),
    _steering("POST", "/api/saes/detach", 'detach an SAE: {"model", "sae_id"}', "detachSAE", "SAEDetachRequest"),
    Route(
        "POST",
        "/api/saes/{sae_id}/dashboards",
        OPENAI,
        "start computing feature dashboards (logit effects, top contexts, histogram, density) in the engine's "
        "spare time",
        "startDashboards",
        "DashboardJob",
        "The job, queued (its progress: GET …/dashboards/{job_id})",
        "DashboardsRequest",
    ),
    Route(
        "GET",
        "/api/saes/{sae_id}/dashboards",
        OPENAI,
        "an SAE's dashboards jobs: ?model=",
        "listDashboards",
        "DashboardJobs",
        "Every job of the SAE, oldest first",
        query="ModelQuery",
    ),
    Route(
        "GET",
        "/api/saes/{sae_id}/dashboards/{job_id}",
        OPENAI,
        "one dashboards job: status and progress",
        "getDashboards",
        "DashboardJob",
        "The job",
    ),
    Route(
        "DELETE",
        "/api/saes/{sae_id}/dashboards/{job_id}",
        OPENAI,
        "cancel a dashboards job",
        "cancelDashboards",
        "DashboardJob",
        "The job, cancelled (a finished job stays as it is)",
    ),
    Route(
        "GET",
        "/api/saes/{sae_id}/features/{index}",
        OPENAI,
        "one feature's dashboard and label: ?model=",
        "getFeature",
        "FeatureDashboard",
        "What the dashboards jobs computed for the feature (null where nothing was), and its label",
        query="ModelQuery",
    ),
    Route(
        "PUT",
        "/api/saes/{sae_id}/features/{index}/label",
        OPENAI,
        'label a feature: {"model"?, "label"} ("" removes it)',
        "labelFeature",
        "FeatureDashboard",
        "The feature, labelled",
        "FeatureLabelRequest",
    ),
    Route(
        "POST",
        "/api/saes/{sae_id}/features/search",
        OPENAI,
        'find features: {"text"} (those that fire most on it), {"label"} or {"token"} (whose logit effects promote it)',
        "searchFeatures",
        "FeatureSearch",
        "The features found",
        "FeatureSearchRequest",
    ),
    Route(
        "POST",
        "/api/saes/{sae_id}/contrast",
        OPENAI,
        "rank features by the difference of their mean activations over two prompt sets; suggest a "
        "strength on a held-out prompt and save them as a profile",
        "contrastFeatures",
        "Contrast",
        "The features, the measure and the profile saved",
        "ContrastRequest",
    ),
    Route(
        "GET",
        "/api/steering",
        OPENAI,
        "each steerable model's steering: strengths, enabled, version, live",
        "getSteering",
        "SteeringList",
        "Strengths, enabled, version and whether it is live",
    ),
    _steering(
        "PUT",
        "/api/steering",
        'set steering: {"model", "enabled"?, "strengths"?: {sae_id: {feature: ±200}}}',
        "setSteering",
        "SteeringRequest",
    ),
    Route(
        "GET",
        "/api/profiles",
        OPENAI,
        "steering profiles: named strengths for one model's SAEs",
        "listProfiles",
        "ProfileList",
        "Every profile",
    ),
    Route(
        "POST",
        "/api/profiles",
        OPENAI,
        'create a profile: {"name", "model", "description"?, "strengths"?}',
        "createProfile",
        "Profile",
        "The profile (409 profile_exists when the name is taken)",
        "ProfileCreateRequest",
    ),
    Route("GET", "/api/profiles/{name}", OPENAI, "one steering profile", "getProfile", "Profile", "The profile"),
    Route(
        "PUT",
        "/api/profiles/{name}",
        OPENAI,
        'update a profile: {"description"?, "strengths"?}',
        "updateProfile",
        "Profile",
        "The updated profile",
        "ProfileUpdateRequest",
    ),
    _steering(
        "POST", "/api/profiles/{name}/activate", "a profile's strengths as its model's live steering", "activateProfile"
    ),
    Route(
        "GET",
        "/api/profiles/{name}/export",
        OPENAI,
        "a profile as a self-contained document (with its SAEs' identities)",
        "exportProfile",
        "ProfileDocument",
        "The document POST /api/profiles/import takes",
    ),
    Route(
        "POST",
        "/api/profiles/import",
        OPENAI,
        "import an exported profile (its SAEs must be attached to the model)",
        "importProfile",
        "Profile",
        "The imported profile",
        "ProfileDocument",
    ),
    Route(
        "DELETE",
        "/api/profiles/{name}",
        OPENAI,
        "delete a steering profile",
        "deleteProfile",
        "ProfileDeleted",
        "Deleted",
    ),
    Route(
        "GET",
        "/api/clusters",
        OPENAI,
        "clusters: a profile's members with an intensity_range and a persistent dial",
        "listClusters",
        "ClusterList",
        "Every cluster",
    ),
    Route(
        "POST",
        "/api/clusters/import",
        OPENAI,
        "import a cluster document (greenroom.cluster.v1)",
        "importCluster",
        "Cluster",
        "The cluster (409 profile_exists when the name is taken)",
        "ClusterDocument",
    ),
    *_named("cluster", "0 to its cap", "a cluster's dialled strengths as its model's live steering"),
    Route(
        "GET",
        "/api/circuits",
        OPENAI,
        "circuits: members per layer, evidence rung, range, dial, backing cluster",
        "listCircuits",
        "CircuitList",
        "Every circuit",
    ),
    Route(
        "POST",
        "/api/circuits/import",
        OPENAI,
        "import a circuit document (greenroom.circuit.v1)",
        "importCircuit",
        "Circuit",
        "The circuit (409 circuit_exists when the name is taken)",
        "CircuitDocument",
    ),
    Route(
        "GET",
        "/api/circuits/active",
        OPENAI,
        "per steerable model (?model=: one), its active circuit, serving mode and whether it genuinely steers",
        "activeCircuit",
        "CircuitsActive",
        "Per model: the circuit, its serving mode and its `steering`",
        query="ModelQuery",
    ),
    *_named("circuit", "0–2", "a circuit's dialled members as its model's live steering"),
    Route(
        "GET",
        "/api/steering/lock",
        OPENAI,
        "the model locked for steering (/v1/models then lists it alone)",
        "getSteeringLock",
        "SteeringLock",
        "The lock",
    ),
    Route(
        "PUT",
        "/api/steering/lock",
        OPENAI,
        'lock steering to a model: {"model"}',
        "lockSteering",
        "SteeringLock",
        "The lock",
        "SteeringLockRequest",
    ),
    Route(
        "DELETE",
        "/api/steering/lock",
        OPENAI,
        "lift the steering lock",
        "unlockSteering",
        "SteeringLock",
        "The lock (null)",
    ),
    Route(
        "GET",
        "/api/monitoring",
        OPENAI,
        "each steerable model's SAE monitoring: enabled, sae_id, top_k",
        "getMonitoring",
        "MonitoringList",
        "enabled, sae_id and top_k per transformers model",
    ),
    Route(
        "PUT",
        "/api/monitoring",
        OPENAI,
        'set monitoring: {"model", "enabled", "sae_id"?, "top_k"?: 1–64}',
        "setMonitoring",
        "MonitoringConfig",
        "The configuration now held (persisted)",
        "MonitoringRequest",
    ),
    Route(
        "GET",
        "/api/monitoring/records",
        OPENAI,
        "monitoring records, oldest first: ?model=&since=<id>&limit=",
        "getMonitoringRecords",
        "MonitoringRecords",
        "The records newer than `since`, and the next `since`",
        query="MonitoringRecordsQuery",
    ),
    Route(
        "GET",
        "/api/monitoring/stream",
        OPENAI,
        "monitoring records as they come (SSE): ?model=",
        "streamMonitoring",
        answer="One `data:` event per record; an event `dropped` when this reader fell "
        "behind and lost some (GET /api/monitoring/records still has them); comment lines while idle",
        query="ModelQuery",
        framing=Framing.ONLY_SSE,
        stream="MonitoringEvent",
    ),
    Route(
        "GET",
        "/ui/",
        OPENAI,
        "the steering console, a web page (open without the API key: the page asks for it)",
        "console",
        answer="The console's page",
        framing=Framing.FILE,
    ),
    Route(
        "GET",
        "/ui/{file}",
        OPENAI,
        "the console's script and style",
        "consoleFile",
        answer="The file",
        framing=Framing.FILE,
    ),
    Route("GET", "/v1/models", OPENAI, "models served", "listModels", "ModelList", "The models served"),
    Route("GET", "/v1/models/{id}", OPENAI, "one model card", "getModel", "Model", "The model's card"),
    Route(
        "POST",
        "/v1/chat/completions",
        OPENAI,
        "chat completion, streaming (SSE) or not",
        "createChatCompletion",
        "ChatCompletion",
        "The ChatCompletion object, or with stream: true its SSE stream",
        "ChatCompletionRequest",
        framing=Framing.SSE,
        stream="ChatCompletionEvent",
        headers=CONSTRAINED,
        strict=True,
        details="Generation (structured output, tool calls and with logprobs: true each token's log-probability "
        "included), or scoring mode: logprobs with max_tokens 1, or allowed_token_ids (one choice per conversation)",
    ),
    Route(
        "POST",
        "/v1/completions",
        OPENAI,
        "text completion, streaming (SSE) or not",
        "createCompletion",
        "TextCompletion",
        "The TextCompletion object, or with stream: true its SSE stream",
        "CompletionRequest",
        framing=Framing.SSE,
        stream="TextCompletionEvent",
        headers=SEEDED,
        strict=True,
        details="Generation (with logprobs, each token's log-probability), or scoring mode: logprobs with "
        "max_tokens 1, allowed_token_ids or echo (one choice per prompt); no chat template",
    ),
    Route(
        "POST",
        "/v1/embeddings",
        OPENAI,
        "embeddings, pooled as the model says (a causal LM: mean-pooled), float or base64, `dimensions`",
        "createEmbedding",
        "EmbeddingList",
        "One embedding per input",
        "EmbeddingRequest",
        headers=IGNORED,
        strict=True,
        details="The last hidden layer mean-pooled, never steered",
    ),
    Route(
        "POST",
        "/v1/needle/extract",
        OPENAI,
        "text + JSON schema → an extracted object (constrained decoding)",
        "needleExtract",
        "NeedleExtraction",
        "The extracted value, or matched: false when the model produced none",
        "NeedleExtractRequest",
    ),
    Route(
        "POST",
        "/v1/needle/complete",
        OPENAI,
        "a query or messages, with tools, → the engine's own result",
        "needleComplete",
        "NeedleCompletion",
        "The answer: content and tool calls with parsed arguments",
        "NeedleCompleteRequest",
        details="Needle's flat tools, answered as a chat completion",
    ),
    Route(
        "POST",
        "/v1/responses",
        OPENAI,
        "OpenAI's Responses API: a response, streamed (typed SSE events) or not, stored unless store: false",
        "createResponse",
        "Response",
        "The Response object, or with stream: true its typed SSE events",
        "ResponseRequest",
        framing=Framing.SSE,
        stream="ResponseStreamEvent",
        headers=CONSTRAINED + ("NotStored",),
        strict=True,
        details="Translated onto chat completions' path (the same ledger, structured output, tools, seeds and "
        "steering); previous_response_id continues a stored response's conversation",
    ),
    Route(
        "GET",
        "/v1/responses/{response_id}",
        OPENAI,
        "a stored response",
        "getResponse",
        "Response",
        "The Response object as it was answered",
    ),
    Route(
        "GET",
        "/v1/responses/{response_id}/input_items",
        OPENAI,
        "a stored response's input items, OpenAI's paginated list: ?after=&limit=&order=&include=",
        "listInputItems",
        "ResponseItemList",
        "The items of the response's own input, `limit` of them in `order` after the item `after`",
        query="InputItemsQuery",
        headers=IGNORED,
        strict=True,
    ),
    Route(
        "DELETE",
        "/v1/responses/{response_id}",
        OPENAI,
        "delete a stored response",
        "deleteResponse",
        "ResponseDeleted",
        "Deleted",
    ),
    Route(
        "POST",
        "/v1/messages",
        ANTHROPIC,
        "Anthropic's Messages API: a message, streamed (Anthropic's SSE events) or not",
        "createMessage",
        "Message",
        "The Message object, or with stream: true Anthropic's SSE events",
        "MessageRequest",
        framing=Framing.SSE,
        stream="MessageStreamEvent",
        headers=CONSTRAINED,
        strict=True,
        details="Translated onto chat completions' path (the same ledger, structured output, tools, seeds and "
        "steering); errors in Anthropic's envelope, backpressure as its 529 overloaded_error",
    ),
    Route(
        "POST",
        "/v1/messages/count_tokens",
        ANTHROPIC,
        "Anthropic's token count: the prompt tokens a Messages request would use",
        "countMessageTokens",
        "MessageTokensCount",
        "The prompt's tokens, as the model's chat template renders it",
        "MessageCountTokensRequest",
        headers=IGNORED,
        strict=True,
    ),
    Route(
        "POST",
        "/tokenize",
        OPENAI,
        "vLLM's tokenize: a prompt, or messages as chat completions render them, to token ids",
        "tokenize",
        "Tokenized",
        "The ids, their count and the model's context window",
        "TokenizeRequest",
        headers=IGNORED,
        strict=True,
    ),
    Route(
        "POST",
        "/detokenize",
        OPENAI,
        "vLLM's detokenize: token ids to text",
        "detokenize",
        "Detokenized",
        "The text",
        "DetokenizeRequest",
        headers=IGNORED,
        strict=True,
    ),
    Route(
        "GET",
        "/openapi.json",
        OPENAI,
        "this OpenAPI document: every route in this table",
        "openapi",
        "OpenAPIDocument",
        "The OpenAPI 3.1 document",
    ),
    _ollama(
        "POST",
        "/api/generate",
        "Ollama: generate, NDJSON streaming or not",
        "ollamaGenerate",
        "OllamaGenerated",
        "OllamaGenerateRequest",
        framing=Framing.NDJSON,
        stream="OllamaGeneratedLine",
        headers=OLLAMA_GENERATED,
        answer="The done: true object, or unless stream: false an NDJSON stream of deltas ending with it (or "
        "with the error envelope, when the stream fails after it started); with no prompt, the model loaded "
        "(or with keep_alive 0 unloaded)",
    ),
    _ollama(
        "POST",
        "/api/chat",
        "Ollama: chat, NDJSON streaming or not",
        "ollamaChat",
        "OllamaChatted",
        "OllamaChatRequest",
        framing=Framing.NDJSON,
        stream="OllamaChattedLine",
        headers=OLLAMA_GENERATED,
        answer="The done: true object, or unless stream: false an NDJSON stream of message deltas ending with "
        "it (or with the error envelope); with no messages, the model loaded (or with keep_alive 0 unloaded)",
    ),
    _ollama(
        "POST",
        "/api/embed",
        "Ollama: embeddings (current format)",
        "ollamaEmbed",
        "OllamaEmbedded",
        "OllamaEmbedRequest",
        headers=OLLAMA_EMBEDDED,
        answer="Normalised embeddings, one per input",
    ),
    _ollama(
        "POST",
        "/api/embeddings",
        "Ollama: embeddings (legacy format)",
        "ollamaEmbeddings",
        "OllamaEmbedding",
        "OllamaEmbeddingsRequest",
        headers=IGNORED + ROUTED,
        answer="The model's own embedding of the prompt",
    ),
    _ollama("GET", "/api/tags", "Ollama: models available", "ollamaTags", "OllamaTags", answer="Every model"),
    _ollama("GET", "/api/ps", "Ollama: models loaded", "ollamaPs", "OllamaPs", answer="The loaded models"),
    _ollama(
        "POST",
        "/api/show",
        "Ollama: a model's metadata",
        "ollamaShow",
        "OllamaShown",
        "OllamaShowRequest",
        headers=IGNORED,
        answer="What the model's files say, without loading it",
    ),
    _ollama(
        "GET",
        "/api/version",
        "Ollama: server version",
        "ollamaVersion",
        "OllamaVersion",
        answer="The NPU proxy's version, 0.2.0-npu-proxy",
    ),
    _ollama(
        "POST",
        "/api/pull",
        "Ollama: pull a Hugging Face repository (NDJSON progress)",
        "ollamaPull",
        "OllamaStatus",
        "OllamaPullRequest",
        framing=Framing.NDJSON,
        stream="OllamaStatusLine",
        headers=IGNORED,
        answer='Progress lines ending with {"status": "success"} (or the error envelope), or with '
        "stream: false only the last one",
    ),
    _ollama(
        "DELETE",
        "/api/delete",
        "Ollama: delete a pulled, copied or created model",
        "ollamaDelete",
        "OllamaEmpty",
        "OllamaDeleteRequest",
        headers=IGNORED,
        answer="Deleted",
    ),
    _ollama(
        "POST",
        "/api/blobs/{digest}",
        "Ollama: store a file under the sha256 of its bytes, as `ollama create` uploads one",
        "ollamaCreateBlob",
        None,
        upload=True,
        answer="The blob was already stored: the body was not read",
        created="Stored: the body's sha256 is the digest",
    ),
    _ollama(
        "HEAD",
        "/api/blobs/{digest}",
        "Ollama: whether a blob is stored (200, else 404)",
        "ollamaHasBlob",
        None,
        answer="The blob is stored",
    ),
    _ollama(
        "POST",
        "/api/copy",
        "Ollama: another name for a model",
        "ollamaCopy",
        "OllamaEmpty",
        "OllamaCopyRequest",
        headers=IGNORED,
        answer="Copied",
    ),
    _ollama(
        "POST",
        "/api/create",
        "Ollama: a model from another or from an uploaded GGUF file, with its own system prompt, template, "
        "parameters, messages, license",
        "ollamaCreate",
        "OllamaStatus",
        "OllamaCreateRequest",
        framing=Framing.NDJSON,
        stream="OllamaStatusLine",
        headers=IGNORED,
        answer='Status lines ending with {"status": "success"}, or with stream: false only the last one',
    ),
    _ollama(
        "GET",
        "/api/models/known",
        "the aliases /api/pull understands (NPU proxy extension)",
        "knownModels",
        "KnownModels",
        answer="The catalogue",
    ),
    _ollama(
        "GET",
        "/api/search",
        "search the known-model catalogue (NPU proxy extension)",
        "searchModels",
        "SearchResults",
        query="SearchQuery",
        headers=IGNORED,
        strict=True,
        answer="The matching entries, `limit` from `offset`, and how many matched",
    ),
)

# Ollama routes greenroom does not serve, refused with why (400 push_not_supported, app.py) instead of
# the generic 404: `ollama push` asks POST /api/me (its ollama.com account) first, then POST /api/push
_NO_REGISTRY = (
    "greenroom has no registry to push to: its models come from its configuration, /api/pull (the "
    "Hugging Face Hub), /api/copy and /api/create"
)
NOT_SERVED = {
    "POST /api/push": f"push is not supported: {_NO_REGISTRY}",
    "POST /api/me": f"push and sign-in are not supported: greenroom has no ollama.com account ({_NO_REGISTRY})",
}

BY_ENDPOINT = {r.endpoint: r for r in TABLE}
assert len(BY_ENDPOINT) == len(TABLE), "a route is in the table twice"
_SURFACES = {r.path: r.surface for r in TABLE}
assert all(_SURFACES[r.path] is r.surface for r in TABLE), "one path, one surface"


def _pattern(path: str) -> re.Pattern:
    """A path template as a regular expression over the paths it matches."""
    return re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$")


_TEMPLATES = [(_pattern(r.path), r.surface) for r in TABLE]
_UPLOADS = [(r.method, _pattern(r.path)) for r in TABLE if r.upload]
# the roots under which greenroom's parametrised /api routes live: an unknown path there is theirs
_ROOTS = sorted(
    {r.path.split("/{")[0] for r in TABLE if r.surface is OPENAI and r.params and r.path.startswith("/api/")}
)


def streamed(method: str, path: str) -> bool:
    """Whether the request's body is an upload (`Route.upload`), streamed to its view."""
    return any(m == method and template.match(path) for m, template in _UPLOADS)


def view(app, method: str, path: str):
    """Register the decorated function as the view of the table's route (KeyError: a route
    the table does not have)."""
    route = BY_ENDPOINT[f"{method} {path}"]

    def register(fn):
        app.add_url_rule(route.rule, route.endpoint, fn, methods=[method])
        return fn

    return register


def unregistered(app) -> list[Route]:
    """Table routes no view was registered for."""
    return [r for r in TABLE if r.endpoint not in app.view_functions]


def surface(path: str) -> Surface:
    """The surface whose envelope a request to `path` is answered with (see the module's doc
    for a path no route matches)."""
    exact = _SURFACES.get(path)
    if exact is not None:
        return exact
    for template, owner in _TEMPLATES:
        if template.match(path):
            return owner
    if any(path == root or path.startswith(root + "/") for root in _ROOTS):
        return OPENAI
    if path.startswith("/api/"):
        return OLLAMA
    return ANTHROPIC if path.startswith("/v1/messages/") else OPENAI
