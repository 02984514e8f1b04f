"""The one error table: every typed error greenroom answers, by code.

Routes never choose a status or an OpenAI error type themselves; they raise
`GreenroomError(code, message, param)` and the surface's envelope is built from
this table. Engine actors send the same (code, message, param) triple as data,
because tractor's RemoteActorError carries only a type name and a traceback.
"""

from __future__ import annotations

import attrs

INVALID = "invalid_request_error"
SERVER = "server_error"
NOT_FOUND = "not_found_error"


@attrs.frozen
class ErrorKind:
    status: int
    type: str
    ollama_only: bool = False  # raised by the Ollama /api surface alone (its embedding limits)


TABLE: dict[str, ErrorKind] = {
    # request shape
    "invalid_json": ErrorKind(400, INVALID),
    "invalid_parameter": ErrorKind(400, INVALID),
    "missing_parameter": ErrorKind(400, INVALID),
    "context_length_exceeded": ErrorKind(400, INVALID),
    "body_timeout": ErrorKind(408, INVALID),  # the request body did not arrive within the server's limit
    # a request body past the server's limit: 16 MiB, an uploaded blob's max_blob_bytes
    "request_too_large": ErrorKind(413, INVALID),
    # embedding input limits (the Ollama surface's validation table)
    "empty_input": ErrorKind(400, INVALID, ollama_only=True),
    "embedding_batch_too_large": ErrorKind(413, INVALID, ollama_only=True),
    "embedding_input_too_large": ErrorKind(413, INVALID, ollama_only=True),
    "embedding_request_too_large": ErrorKind(413, INVALID, ollama_only=True),
    # API key (GREENROOM_API_KEY / NEEDLE_API_KEY)
    "invalid_api_key": ErrorKind(401, INVALID),
    # a browser page on an origin the server does not allow (http/core/cors.py), as Ollama refuses it
    "origin_not_allowed": ErrorKind(403, INVALID),
    # routing and models
    "model_not_found": ErrorKind(404, INVALID),
    "AMBIGUOUS_MODEL_NAME": ErrorKind(400, INVALID),  # a bare GGUF repository name with several quantizations
    # a method and path no route answers (a wrong method too, as OpenAI and Ollama answer it):
    # OpenAI's own code on its surface; not_found on Ollama's and Anthropic's (http/core/app.py)
    "unknown_url": ErrorKind(404, INVALID),
    "not_found": ErrorKind(404, NOT_FOUND),
    "model_not_loaded": ErrorKind(503, SERVER),
    "model_busy": ErrorKind(503, SERVER),
    "model_load_failed": ErrorKind(500, SERVER),
    "unsupported_quantization": ErrorKind(400, INVALID),
    # a route the model cannot serve: chat or generation on an embedding model, as Ollama answers it
    # ('"all-minilm" does not support chat')
    "unsupported_capability": ErrorKind(400, INVALID),
    "insufficient_memory": ErrorKind(503, INVALID),  # the spec's type for it: the client asked too much
    "queue_full": ErrorKind(503, SERVER),
    "engine_busy": ErrorKind(429, SERVER),  # queue_full on /v1/needle/*, as Needle answers it
    "request_timeout": ErrorKind(504, SERVER),
    # Ollama's model management (http/ollama/ollama_models.py): pulls from the Hugging Face Hub, names
    "hub_token_conflict": ErrorKind(400, INVALID, ollama_only=True),  # a Hub token in both places
    "hub_auth_required": ErrorKind(401, INVALID, ollama_only=True),  # private or gated: no token sent
    "hub_access_denied": ErrorKind(403, INVALID, ollama_only=True),  # the Hub refused the token sent
    "unsupported_repository": ErrorKind(400, INVALID, ollama_only=True),  # neither GGUF nor safetensors
    "hub_unavailable": ErrorKind(502, SERVER, ollama_only=True),  # the Hub unreachable or failing
    "model_exists": ErrorKind(409, INVALID, ollama_only=True),  # copy/create/pull onto a name in use
    "model_configured": ErrorKind(409, INVALID, ollama_only=True),  # delete of a model the config defines
    # Ollama's push and its ollama.com account check (POST /api/me): no registry to push to (app.py)
    "push_not_supported": ErrorKind(400, INVALID, ollama_only=True),
    "digest_mismatch": ErrorKind(400, INVALID, ollama_only=True),  # a blob's bytes are not its sha256
    "blob_not_found": ErrorKind(400, INVALID, ollama_only=True),  # /api/create's `files` names a blob not uploaded
    "invalid_blob": ErrorKind(400, INVALID, ollama_only=True),  # … one that is not a GGUF model file
    # fields the request path cannot honour or would ignore (http/core/ledger.py)
    "field_not_honoured": ErrorKind(400, INVALID),
    "unused_fields_refused": ErrorKind(400, INVALID),
    # scoring and structured output
    "invalid_scoring_request": ErrorKind(400, INVALID),
    "no_chat_template": ErrorKind(400, INVALID),
    "non_finite_logits": ErrorKind(500, SERVER),
    "response_format_unsupported": ErrorKind(400, INVALID),
    "constrained_output_invalid": ErrorKind(500, SERVER),
    # steering (management API, http/manage/steering_api.py)
    "invalid_feature_index": ErrorKind(400, INVALID),  # a feature past the SAE's width (the spec's code)
    "sae_not_attached": ErrorKind(400, INVALID),  # an sae_id no SAE attached to the model has
    "invalid_sae": ErrorKind(400, INVALID),  # not a loadable SAE, or not one this model can take
    "steering_unsupported": ErrorKind(400, INVALID),  # OpenVINO models have no SAE hooks
    "dashboard_job_not_found": ErrorKind(404, INVALID),  # an unknown dashboards job (/api/saes/{sae_id}/dashboards)
    "profile_not_found": ErrorKind(404, INVALID),  # an unknown steering profile (the spec's code)
    "profile_exists": ErrorKind(409, INVALID),  # creating or importing a profile under a name in use
    "circuit_not_found": ErrorKind(404, INVALID),  # an unknown circuit
    "circuit_exists": ErrorKind(409, INVALID),  # importing a circuit under a name in use
    # stored responses (/v1/responses): an id never stored, deleted, or stored with store: false
    "response_not_found": ErrorKind(404, INVALID),
    # a store file (store/database.py) locked past its wait, read-only, on a full disk or unreadable
    "storage_unavailable": ErrorKind(503, SERVER),
    # SIGTERM/SIGINT: a new request while the server drains, or one still running when the drain ends
    "server_shutting_down": ErrorKind(503, SERVER),
    # engine failures
    "engine_crashed": ErrorKind(503, SERVER),
    "generation_failed": ErrorKind(500, SERVER),
    "internal_error": ErrorKind(500, SERVER),
}


# answered with Retry-After: a retry can succeed once the engine has room again
RETRYABLE = frozenset({"queue_full", "engine_busy", "model_busy"})
RETRY_AFTER_S = 1

# Anthropic's error types (its Messages API) by status; backpressure (RETRYABLE) is its
# overloaded_error with status 529, which its clients retry
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
}
OVERLOADED = 529


def anthropic_status(code: str) -> int:
    """The status a code is answered with on the Anthropic surface."""
    return OVERLOADED if code in RETRYABLE else TABLE[code].status


def anthropic_type(code: str) -> str:
    """Anthropic's error type for a code."""
    status = anthropic_status(code)
    if status == OVERLOADED:
        return "overloaded_error"
    return ANTHROPIC_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


class GreenroomError(Exception):
    """A typed error; `code` must be a key of TABLE."""

    def __init__(self, code: str, message: str, param: str | None = None):
        if code not in TABLE:
            raise KeyError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    @classmethod
    def wrong(cls, value, message: str, param: str) -> GreenroomError:
        """A required field's refusal: missing_parameter when it was left out (or null), else
        invalid_parameter."""
        return cls("missing_parameter" if value is None else "invalid_parameter", message, param)

    @property
    def status(self) -> int:
        return TABLE[self.code].status

    def openai_body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": TABLE[self.code].type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict:
        """Anthropic's envelope; greenroom's code and param beside its type."""
        return {
            "type": "error",
            "error": {
                "type": anthropic_type(self.code),
                "message": self.message,
                "code": self.code,
                "param": self.param,
            },
        }

    def ollama_body(self, rid: str) -> dict:
        """Ollama's flat envelope, naming the request (its X-Request-ID); greenroom's code beside it."""
        return {"error": f"{self.message} (request id: {rid})", "code": self.code}

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message, "param": self.param}

    @classmethod
    def from_wire(cls, d: dict) -> GreenroomError:
        return cls(d["code"], d["message"], d.get("param"))
