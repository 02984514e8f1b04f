"""The live server against its own OpenAPI document (greenroom/http/openapi.py).

schemathesis generates requests from the document (its examples, a deterministic coverage
pass over every keyword's boundaries, valid and invalid, then 30 random cases per
operation) and checks every answer: no 5xx, and the status, content type, headers and body
(each SSE event too) as documented. The document's examples reach scoring, structured
output, tool calls (streamed too) and both Needle routes; response objects are closed, so
a field the server sends and the document does not name fails too. Derandomized with no
example database, so a run is repeatable; about 30 s on 2 cores, plus the server's start."""

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

from conftest import MODEL, Server
from greenroom.engines.capabilities import capabilities_of
from greenroom.errors import TABLE
from greenroom.http import ledger
from greenroom.http.openapi import document

PATHS = {
    "/": {"get"},
    "/health": {"get"},
    "/api/actors": {"get"},
    "/api/health/inference": {"get"},
    "/api/saes": {"get"},
    "/api/saes/attach": {"post"},
    "/api/saes/detach": {"post"},
    "/api/steering": {"get", "put"},
    "/api/profiles": {"get", "post"},
    "/api/profiles/{name}": {"get", "put", "delete"},
    "/api/profiles/{name}/activate": {"post"},
    "/api/profiles/{name}/export": {"get"},
    "/api/profiles/import": {"post"},
    "/api/clusters": {"get"},
    "/api/clusters/import": {"post"},
    "/api/clusters/{name}": {"get", "delete"},
    "/api/clusters/{name}/intensity": {"put"},
    "/api/clusters/{name}/activate": {"post"},
    "/api/clusters/{name}/export": {"get"},
    "/api/circuits": {"get"},
    "/api/circuits/import": {"post"},
    "/api/circuits/active": {"get"},
    "/api/circuits/{name}": {"get", "delete"},
    "/api/circuits/{name}/intensity": {"put"},
    "/api/circuits/{name}/activate": {"post"},
    "/api/circuits/{name}/export": {"get"},
    "/api/steering/lock": {"get", "put", "delete"},
    "/api/monitoring": {"get", "put"},
    "/api/monitoring/records": {"get"},
    "/api/monitoring/stream": {"get"},
    "/openapi.json": {"get"},
    "/v1/models": {"get"},
    "/v1/models/{model_id}": {"get"},
    "/v1/chat/completions": {"post"},
    "/v1/completions": {"post"},
    "/v1/embeddings": {"post"},
    "/v1/needle/extract": {"post"},
    "/v1/needle/complete": {"post"},
}

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]

# Bodies are bounded: the document lets max_tokens reach 2**31 - 1, n 16, and a request
# carry 16 prompts or conversations (the server's limits), and the server decodes what it
# is asked for, so one request could run for minutes. How long a generation is is not what
# this test is about: a value the server would accept is lowered to the cap; values past
# its limits (and non-integers) are left as they are, to exercise the refusals. Applied in
# the test itself: the example and coverage phases apply no generation hooks.
BOUNDS = {  # field: (cap, the largest value the server accepts)
    "max_tokens": (64, 2**31 - 1),
    "max_completion_tokens": (64, 2**31 - 1),
    "n": (2, 16),
}
# A generation with no max_tokens runs to the server default (512 tokens; a constrained
# answer to the end of the context window): lowered to the cap too, by sending it.
GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/needle/extract", "/v1/needle/complete"}
LIST_BOUNDS = {  # field: (cap, the longest list the server accepts) for a list of prompts or conversations
    "prompt": (2, 16),
    "extra_messages": (1, 15),
}

# Fields the served model's engine refuses unless they carry their "no change" value,
# read from today's ledger: a generated value almost never is one, so a body that carries
# any of them is a 400 before generation. (Scoring fields, response_format and tools are
# honoured on chat: they stay, and reach scoring, constrained decoding and tool calls.)
ENGINE = capabilities_of("transformers")  # the engine of the served model (configs/default.toml)


def _refused(table: dict) -> frozenset[str]:
    return frozenset(f for f, rule in table.items()
                     if rule.refuse and not (rule.needs and getattr(ENGINE, rule.needs)))


REFUSED_FIELDS = {
    "/v1/chat/completions": _refused(ledger.CHAT),
    "/v1/completions": _refused(ledger.COMPLETIONS),
    "/v1/embeddings": _refused(ledger.EMBEDDINGS),
}


def _bounded(path, body):
    if isinstance(body, dict):
        if path in GENERATING and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = BOUNDS["max_tokens"][0]
        for name, (cap, limit) in BOUNDS.items():
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and cap < value <= limit:
                body[name] = cap
        for name, (cap, limit) in LIST_BOUNDS.items():
            value = body.get(name)
            if (isinstance(value, list) and cap < len(value) <= limit
                    and all(isinstance(v, (str, list)) for v in value)):  # not a token array
                body[name] = value[:cap]
    return body


def _served_model_often(context, strategy):
    """A random model name is always a 404 and a refused field always a 400: in about half
    the bodies, name the served model and leave the refused fields out, so that generation
    itself (and its 200 answers, streamed or not) is exercised."""
    refused = REFUSED_FIELDS.get(context.operation.path, frozenset())

    def aim(pair):
        body, served = pair
        if served and isinstance(body, dict) and "model" in body:
            return {**{k: v for k, v in body.items() if k not in refused}, "model": MODEL}
        return body
    return st.tuples(strategy, st.booleans()).map(aim)


def _served_model_id_often(context, strategy):
    if context.operation.path != "/v1/models/{model_id}":  # a profile's name is not a model's id
        return strategy
    return st.one_of(st.just({"model_id": MODEL}), strategy)


# The document comes from the module, not from GET /openapi.json: schemathesis parametrizes
# at collection time, before the `server` fixture exists, and its lazy loader
# (schemathesis.pytest.from_fixture, 4.32) fails on pytest 9 (it sets Function._nodeid).
# test_openapi_json_serves_the_document checks that the served document is this one.
# the monitoring stream lasts until the client goes: no whole body to check (test_monitoring.py reads it)
schema = schemathesis.openapi.from_dict(document()).exclude(path="/api/monitoring/stream")
schema.config.update(request_timeout=60)
schema.config.output.sanitization.update(enabled=False)  # it masks every field named *token*
schema.hook("before_generate_body")(_served_model_often)
schema.hook("before_generate_path_parameters")(_served_model_id_often)


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache):
    """The fuzzer's own server on a cache of its own: generated requests attach SAEs, write
    steering state and profiles, copy models — state the session's servers must not inherit."""
    srv = Server(tmp_path_factory.mktemp("openapi"), cache)
    yield srv
    srv.stop()


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_server_conforms_to_its_openapi_document(case, server):
    _bounded(case.path, case.body)
    case.call_and_validate(base_url=server.url, checks=CHECKS)


def test_openapi_json_serves_the_document(server):
    response = httpx.get(server.url + "/openapi.json", timeout=10)
    if response.status_code == 404:
        pytest.skip("GET /openapi.json is not served yet (answers 404)")
    assert response.status_code == 200
    served = response.json()
    assert served["openapi"].startswith("3.1")
    assert {path: set(ops) for path, ops in served["paths"].items()} == PATHS
    assert served == document()


def test_document_is_valid_openapi_3_1_and_lists_every_route():
    schemathesis.openapi.from_dict(document()).validate()  # against the OpenAPI 3.1 meta-schema
    assert {path: set(ops) for path, ops in document()["paths"].items()} == PATHS


def _resolve(doc: dict, node: dict) -> dict:
    while "$ref" in node:
        _, _, kind, name = node["$ref"].split("/")
        node = doc["components"][kind][name]
    return node


def test_every_error_code_is_allowed_on_every_route():
    """Each code of the error table, under its status, in every operation's error response."""
    doc = document()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for code, kind in TABLE.items():
                if kind.ollama_only:
                    continue
                response = _resolve(doc, operation["responses"][str(kind.status)])
                envelope = _resolve(doc, response["content"]["application/json"]["schema"])
                assert code in envelope["properties"]["error"]["properties"]["code"]["enum"], (method, path, code)


@pytest.mark.parametrize("path,table", [("/v1/chat/completions", ledger.CHAT),
                                        ("/v1/completions", ledger.COMPLETIONS),
                                        ("/v1/embeddings", ledger.EMBEDDINGS)])
def test_every_field_the_ledger_knows_is_documented(path, table):
    doc = document()
    body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(table) <= set(_resolve(doc, body)["properties"])
