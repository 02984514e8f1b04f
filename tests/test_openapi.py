"""The live server against its own OpenAPI document (greenroom/http/openapi.py), fuzzed
with schemathesis: no 5xx, and every status, content type, header and body as documented."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conftest import MODEL
from greenroom.http.openapi import document

PATHS = {
    "/": {"get"},
    "/health": {"get"},
    "/api/actors": {"get"},
    "/openapi.json": {"get"},
    "/v1/models": {"get"},
    "/v1/models/{model_id}": {"get"},
    "/v1/chat/completions": {"post"},
    "/v1/completions": {"post"},
    "/v1/embeddings": {"post"},
}

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]

# The schema lets max_tokens go to 2**31 and n grow without bound, and the server honours
# what it is given: one generated request could decode for minutes. Generation length is
# not what this test is about, so a body is clamped after generation (a value that is
# still in the documented range; out-of-range or non-integer values are left alone, they
# exercise the refusals).
MAX_TOKENS_CAP = 64
N_CAP = 2


def _clamp(body: dict, name: str, cap: int, lo: int) -> None:
    value = body.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and lo <= value and value > cap:
        body[name] = cap


def _bounded(context, body):
    if isinstance(body, dict):
        _clamp(body, "max_tokens", MAX_TOKENS_CAP, 0)
        _clamp(body, "max_completion_tokens", MAX_TOKENS_CAP, 0)
        _clamp(body, "n", N_CAP, 1)
    return body


# Fields this engine refuses unless they carry their "no change" value: a generated value
# almost never is one, so a body that carries any of them is a 400 before generation.
REFUSED_FIELDS = {
    "response_format", "profile", "steering_intensity", "steering", "dimensions", "tools",
    "tool_choice", "logit_bias", "extra_messages", "return_sae_activations", "logprobs",
    "top_logprobs", "allowed_token_ids", "return_tokens_as_token_ids", "echo", "best_of", "suffix",
}


def _served_model_often(context, strategy):
    """A random model name is always a 404 and a refused field always a 400: in about half
    the bodies, name the served model and leave the refused fields out, so that generation
    itself (and its 200 responses, streamed or not) is exercised."""
    def aim(pair):
        body, served = pair
        if served and isinstance(body, dict) and "model" in body:
            return {**{k: v for k, v in body.items() if k not in REFUSED_FIELDS}, "model": MODEL}
        return body
    return st.tuples(strategy, st.booleans()).map(aim)


def _served_model_id_often(context, strategy):
    return st.one_of(st.just({"model_id": MODEL}), strategy)


def _served_document(server) -> dict | None:
    response = httpx.get(server.url + "/openapi.json", timeout=10)
    return response.json() if response.status_code == 200 else None


# Loaded from the module, not from GET /openapi.json: schemathesis parametrizes at
# collection time, before the `server` fixture exists, and its lazy loader
# (`schemathesis.pytest.from_fixture`) fails on pytest 9 (it writes `Function._nodeid`).
# test_openapi_json_lists_every_route checks that the served document is this one.
schema = schemathesis.openapi.from_dict(document())
schema.config.update(request_timeout=60)
schema.config.output.sanitization.update(enabled=False)  # it masks every field named *token*
schema.hook("map_body")(_bounded)
schema.hook("before_generate_body")(_served_model_often)
schema.hook("before_generate_path_parameters")(_served_model_id_often)


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_server_conforms_to_its_openapi_document(case, server):
    import json as _j
    with open("/tmp/oa/calls.log", "a") as f:
        f.write(_j.dumps([case.operation.label, case.body if not isinstance(case.body, bytes) else repr(case.body), dict(case.headers or {}), case.path_parameters], default=str) + "\n")
    case.call_and_validate(base_url=server.url, checks=CHECKS)


def test_openapi_json_lists_every_route(server):
    served = _served_document(server)
    if served is None:
        pytest.skip("GET /openapi.json is not served yet (answers 404)")
    assert served["openapi"].startswith("3.1")
    assert {path: set(ops) & {"get", "post"} for path, ops in served["paths"].items()} == PATHS
    assert served == document()


def test_document_lists_every_route():
    assert {path: set(ops) for path, ops in document()["paths"].items()} == PATHS
