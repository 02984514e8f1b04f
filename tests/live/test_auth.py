"""With an API key configured, every route but /health and / needs it (Ollama's too), sent as
Authorization: Bearer or as x-api-key (Anthropic's clients); 401 in each surface's envelope."""

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import MODEL

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.http.core import routes
from greenroom.http.core.routes import Surface

KEY = "s3cret-key"
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    "/v1/completions": {"model": MODEL, "prompt": "x", "max_tokens": 1},
    "/v1/embeddings": {"model": MODEL, "input": "x"},
    "/v1/needle/extract": {
        "text": "x",
        "name": "n",
        "schema": {
            "type": "object",
            "properties": {"a": {"enum": [1]}},
            "required": ["a"],
            "additionalProperties": False,
        },
    },
    "/v1/needle/complete": {"query": "x", "max_tokens": 1},
    "/v1/responses": {"model": MODEL, "input": "x", "max_output_tokens": 1, "store": False},
    "/v1/messages": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
    "/tokenize": {"model": MODEL, "prompt": "x"},
    "/detokenize": {"model": MODEL, "tokens": [1]},
    "/api/generate": {"model": MODEL, "prompt": "x", "stream": False, "options": {"num_predict": 1}},
    "/api/chat": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "stream": False,
        "options": {"num_predict": 1},
    },
    "/api/embed": {"model": MODEL, "input": "x"},
    "/api/embeddings": {"model": MODEL, "prompt": "x"},
    "/api/show": {"model": MODEL},
    "/api/models/load": {"model": MODEL},
    "/api/models/unload": {"model": "other"},  # a preload=false model that is not loaded: a no-op
    "/api/copy": {"source": MODEL, "destination": "auth-copy"},
    "/api/create": {"model": "auth-made", "from": MODEL, "system": "Be brief.", "stream": False},
    "/api/delete": {"model": "auth-made"},
    # steering of "other" (nothing else uses it): attached, then detached, so nothing is left behind
    "/api/saes/attach": {"model": "other", "sae": "demo:tiny:2", "sae_id": "auth_sae"},
    "/api/saes/detach": {"model": "other", "sae_id": "auth_sae"},
    # auth_sae's dashboards: a job of one feature over one seed's token (cancelled), a label, a search, a contrast
    "/api/saes/auth_sae/dashboards": {
        "model": "other",
        "features": [1],
        "corpus": {"seeds": ["x"], "generated_tokens": 1},
        "max_tokens": 16,
    },
    "/api/saes/auth_sae/features/1/label": {"model": "other", "label": "auth"},
    "/api/saes/auth_sae/features/search": {"model": "other", "label": "auth"},
    "/api/saes/auth_sae/contrast": {"model": "other", "positive": ["a"], "negative": ["b"], "top_k": 1},
    "/api/steering": {"model": "other", "strengths": {}},
    # a profile of "other" made, read, updated, activated, exported and deleted; the import's is
    # deleted by the fixture
    "/api/profiles": {"name": "auth-profile", "model": "other"},
    "/api/profiles/auth-profile": {"description": "updated"},
    "/api/profiles/import": {
        "format": "greenroom.steering_profile.v1",
        "saes": [],
        "profile": {"name": "auth-imported", "model": "other"},
    },
    # a cluster (on auth_sae, still attached: its detach is walked last) and a circuit of "other",
    # imported, dialled, activated and deleted; the lock set and lifted
    "/api/clusters/import": {
        "format": "greenroom.cluster.v1",
        "name": "auth-profile",
        "model": "other",
        "sae_id": "auth_sae",
        "members": [{"feature": 1, "strength": 10}],
    },
    "/api/clusters/auth-profile/intensity": {"intensity": 0.5},
    "/api/circuits/import": {
        "format": "greenroom.circuit.v1",
        "name": "auth-profile",
        "model": "other",
        "rung": 1,
        "layers": [{"layer": 2, "members": [{"feature": 1, "strength": 10}]}],
    },
    "/api/circuits/auth-profile/intensity": {"intensity": 0.5},
    "/api/steering/lock": {"model": "other"},
    "/api/monitoring": {"model": "other", "enabled": False},
}
STREAMS = ("/api/monitoring/stream",)  # answered as it comes, never ending: its status is enough
# walked last: what earlier routes need is there until then (a stored response: GET before DELETE)
LAST = ("/api/saes/detach", "/api/delete", "DELETE /v1/responses/")
FIRST = "POST /api/saes/attach"  # walked first: the routes under /api/saes/{sae_id} read the SAE it attaches
# past the key, these need the Hugging Face Hub, which tests never reach: any answer but 401 will do
NEEDS_THE_HUB = {"/api/pull": {"model": "someone/some-repo", "stream": False}}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, model_cache):
    from conftest import Server

    config = (
        '[[models]]\nid = "greenroom-demo"\nsource = "demo:tiny"\n'
        '[[models]]\nid = "other"\nsource = "demo:tiny"\npreload = false\n'
    )
    srv = Server(tmp_path_factory.mktemp("auth"), model_cache, config, extra_env={"NEEDLE_API_KEY": KEY})
    yield srv
    for name in ("auth-copy", "auth-made"):  # the registry is the session's cache's: leave nothing to others
        httpx.request(
            "DELETE",
            srv.url + "/api/delete",
            json={"model": name},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )
    httpx.delete(srv.url + "/api/profiles/auth-imported", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    (default_cache_dir(model_cache) / "blobs" / EMPTY_BLOB.replace(":", "-")).unlink(missing_ok=True)
    srv.stop()


# what each path parameter is walked with: a blob's digest is an empty body's (POST stores it, 201)
EMPTY_BLOB = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
PARAMETERS = {
    "{id}": MODEL,
    "{name}": "auth-profile",
    "{digest}": EMPTY_BLOB,
    "{file}": "console.js",
    "{sae_id}": "auth_sae",
    "{index}": "1",
}


def walked(srv):
    """The route table, as the index lists it, each path parameter filled in (a response id:
    one stored for the walk)."""
    index = httpx.get(srv.url + "/").json()["endpoints"]
    assert [(e["method"], e["path"]) for e in index] == [(r.method, r.path) for r in routes.TABLE]
    stored = httpx.post(
        srv.url + "/v1/responses",
        json={"model": MODEL, "input": "x", "max_output_tokens": 1},
        headers={"x-api-key": KEY},
        timeout=60,
    ).json()["id"]
    out = []
    for e in index:
        path = e["path"]
        for parameter, value in {**PARAMETERS, "{response_id}": stored}.items():
            path = path.replace(parameter, value)
        out.append((e["method"], path, routes.BY_ENDPOINT[f"{e['method']} {e['path']}"].surface))
    return out


def call(srv, method, path, headers):
    body = BODIES.get(path) or NEEDS_THE_HUB.get(path)
    if path in STREAMS:
        with httpx.stream(method, srv.url + path, headers=headers, timeout=60) as r:
            if r.status_code != 200:
                r.read()
            return r
    return httpx.request(
        method, srv.url + path, json=body if method in ("POST", "PUT", "DELETE") else None, headers=headers, timeout=60
    )


def test_every_route_needs_the_key_but_health_index_and_the_consoles_files(keyed):
    # /api/create before /api/delete removes what it made; the SAE attached before the cluster is made
    job = None  # the dashboards job the walk starts: its GET and DELETE walked after it
    for method, path, surface in sorted(
        walked(keyed),
        key=lambda r: (
            0
            if f"{r[0]} {r[1]}" == FIRST
            else 2
            if r[1] in LAST or any(f"{r[0]} {r[1]}".startswith(x) for x in LAST)
            else 1
        ),
    ):
        path = path.replace("{job_id}", str(job))
        open_route = path in ("/", "/health") or path.startswith("/ui/")  # the console's page asks for the key
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = call(keyed, method, path, headers)
            if open_route:
                assert r.status_code == 200, (path, r.text)
                continue
            assert r.status_code == 401, (method, path, headers, r.text)
            if method == "HEAD":  # its answer has no body
                continue
            body = r.json()
            if surface is Surface.OLLAMA:
                assert body["code"] == "invalid_api_key" and "request id" in body["error"]
            else:
                assert body["error"]["code"] == "invalid_api_key"
            if surface is Surface.ANTHROPIC:
                assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
        r = call(
            keyed, method, path, {"Authorization": f"Bearer {KEY}"} if path != "/v1/messages" else {"x-api-key": KEY}
        )
        if path == "/api/saes/auth_sae/dashboards" and method == "POST":
            job = r.json()["id"]
        if path in NEEDS_THE_HUB:
            assert r.status_code != 401 and r.json()["code"] == "hub_unavailable", (method, path, r.text)
        else:  # a blob stored: 201 (its HEAD, walked after it, 200)
            assert r.status_code == (201 if method == "POST" and path.startswith("/api/blobs/") else 200), (
                method,
                path,
            )


def test_clients_with_the_key(keyed):
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    assert good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()
    assert (
        anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)
        .messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "x"}])
        .input_tokens
    )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keyed.url, api_key="nope", max_retries=0).messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )
    client = ollama.Client(host=keyed.url, headers={"Authorization": f"Bearer {KEY}"})
    assert MODEL in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as exc:
        ollama.Client(host=keyed.url).list()
    assert exc.value.status_code == 401


def test_ps_with_the_key(keyed):
    import subprocess
    import sys

    from conftest import ROOT

    env = {k: v for k, v in __import__("os").environ.items() if k not in ("GREENROOM_API_KEY", "NEEDLE_API_KEY")}
    denied = subprocess.run(
        [sys.executable, "-m", "greenroom", "ps", "--url", keyed.url], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert denied.returncode == 1
    ok = subprocess.run(
        [sys.executable, "-m", "greenroom", "ps", "--url", keyed.url],
        cwd=ROOT,
        env={**env, "GREENROOM_API_KEY": KEY},
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "cpu" in ok.stdout


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_auth_scheme_is_case_insensitive(keyed, scheme):
    """RFC 7235: the scheme is a case-insensitive token."""
    r = httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"Basic {KEY}"}, timeout=30)
    assert r.status_code == 401


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/api/steering", "/v1/no-such-route"])
def test_a_cors_preflight_never_needs_the_key(keyed, path):
    r = httpx.options(keyed.url + path, headers={"Origin": "http://localhost:5173", **PREFLIGHT}, timeout=30)
    assert r.status_code == 204, r.text
    assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert r.headers["Access-Control-Allow-Headers"] == "authorization,content-type"


def test_an_allowed_origin_gets_cors_headers_on_answers_and_errors(keyed):
    origin = {"Origin": "http://127.0.0.1:8080"}
    ok = httpx.post(
        keyed.url + "/v1/chat/completions",
        json=BODIES["/v1/chat/completions"],
        timeout=60,
        headers={**origin, "Authorization": f"Bearer {KEY}"},
    )
    assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8080"
    assert ok.headers["Access-Control-Expose-Headers"] == "*"  # X-Request-ID, X-miLLM-* readable by the page
    denied = httpx.get(keyed.url + "/v1/models", headers=origin, timeout=30)
    assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8080"


@pytest.mark.parametrize("path", ["/v1/models", "/api/tags"])
def test_another_sites_page_is_refused_before_any_work(keyed, path):
    """As Ollama: an origin that is not allowed gets 403, preflight or not, whatever the key."""
    for headers in (PREFLIGHT, {"Authorization": f"Bearer {KEY}"}):
        method = "OPTIONS" if headers is PREFLIGHT else "GET"
        r = httpx.request(method, keyed.url + path, headers={"Origin": "https://evil.example", **headers}, timeout=30)
        assert r.status_code == 403, r.text
        assert "Access-Control-Allow-Origin" not in r.headers
        body = r.json()
        assert (
            body["code"] if routes.surface(path) is Surface.OLLAMA else body["error"]["code"]
        ) == "origin_not_allowed"


def test_configured_origins_are_allowed(own_server):
    srv = own_server(
        'cors_origins = ["https://*.example.org"]\n[[models]]\nid = "greenroom-demo"\nsource = "demo:tiny"\n',
        extra_env={"OLLAMA_ORIGINS": "https://webui.lan:3000"},
    )
    for origin, status in (
        ("https://chat.example.org", 200),
        ("https://webui.lan:3000", 200),
        ("https://example.org.evil.com", 403),
    ):
        r = httpx.get(srv.url + "/api/tags", headers={"Origin": origin}, timeout=30)
        assert r.status_code == status, (origin, r.text)
