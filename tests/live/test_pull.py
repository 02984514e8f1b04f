"""POST /api/pull against a fake Hugging Face Hub on loopback (tests/fake_hub.py), with the
real `ollama` client where it can say it: progress frames, public and private repositories,
the two token places (and never the server's own credentials), the API-key rule, GGUF
repositories as repo:QUANT models, pulled models served on both surfaces and kept across a
restart. Spec: "Pull and known-model discovery", "Pull authentication"."""

from __future__ import annotations

import json
import signal

import httpx
import ollama
import openai
import pytest
from conftest import Server
from fake_hub import BARE, BROKEN, CONFIG, GGUF, PRIVATE, PRIVATE_TOKEN, PUBLIC

# the server's ambient Hugging Face credential: the private repository's own token, which
# a pull must never use on a caller's behalf
AMBIENT = {"HF_TOKEN": PRIVATE_TOKEN}
API_KEY = "server-key-for-pull-tests"


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache, hub):
    tmp = tmp_path_factory.mktemp("pull-server")
    (tmp / "hf-home").mkdir()
    (tmp / "hf-home" / "token").write_text(PRIVATE_TOKEN)  # a stored login: ambient too
    srv = Server(
        tmp,
        cache,
        CONFIG,
        extra_env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home"), "GREENROOM_LOG_LEVEL": "debug", **AMBIENT},
    )
    yield srv
    srv.stop()


@pytest.fixture
def oc(server):
    return ollama.Client(host=server.url, timeout=60)


def pull(server, body, **kw) -> httpx.Response:
    return httpx.post(server.url + "/api/pull", json=body, timeout=60, **kw)


def flat(r, status, code):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "code"} and body["code"] == code, body
    assert body["error"].endswith(f"(request id: {r.headers['X-Request-ID']})")
    return body["error"]


def hub_calls(hub, repo, since):
    """(method, Authorization) of the Hub requests for `repo` made after index `since`."""
    return [(m, auth) for m, path, auth in hub.requests[since:] if f"/{repo}/" in path + "/"]


# --- public repositories -----------------------------------------------------------------------------


def test_public_pull_streams_progress_frames_then_success(oc, server, hub):
    since = len(hub.requests)
    frames = list(oc.pull(PUBLIC, stream=True))
    assert frames[0].status == "pulling manifest" and frames[-1].status == "success"
    files = [f for f in frames if f.digest]
    assert files and all(f.status == f"pulling {f.digest.partition(':')[2][:12]}" for f in files)
    weights = hub.repos[PUBLIC].sibling("model.safetensors")
    last = {f.digest: f for f in files}
    assert last[f"sha256:{weights['lfs']['sha256']}"].total == weights["size"]
    assert all(f.completed == f.total for f in last.values())  # every file finished
    for f in files:
        assert 0 <= f.completed <= f.total
    assert [m for m, _ in hub_calls(hub, PUBLIC, since)].count("GET") == len(hub.repos[PUBLIC].files) + 1
    # the ambient HF_TOKEN and stored login were not sent to the Hub for a public pull
    assert {auth for _, auth in hub_calls(hub, PUBLIC, since)} == {None}
    assert PUBLIC in [m.model for m in oc.list().models]


def test_pull_not_streamed_answers_once(server):
    r = pull(server, {"model": PUBLIC, "stream": False})
    assert r.status_code == 200 and r.json() == {"status": "success"}


def test_pulled_model_answers_chat_on_both_surfaces(oc, server):
    pull(server, {"model": PUBLIC, "stream": False}).raise_for_status()
    answer = oc.chat(model=PUBLIC, messages=[{"role": "user", "content": "Hello!"}], options={"num_predict": 5})
    assert answer.done and answer.eval_count <= 5
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert PUBLIC in [m.id for m in client.models.list().data]
    r = client.chat.completions.create(model=PUBLIC, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 5


def test_unservable_and_unknown_names(server):
    flat(pull(server, {"model": BARE}), 400, "unsupported_repository")
    flat(pull(server, {"model": "nosuch"}), 404, "model_not_found")  # neither an alias nor owner/name
    flat(pull(server, {"model": "acme/nothing-here"}), 401, "hub_auth_required")  # the Hub says: not public
    flat(pull(server, {}), 400, "missing_parameter")
    flat(pull(server, {"model": PUBLIC, "insecure": True}), 400, "field_not_honoured")
    flat(pull(server, {"model": PUBLIC, "huggingface_token": "has space"}), 400, "invalid_parameter")
    flat(pull(server, {"model": PUBLIC, "stream": "yes"}), 400, "invalid_parameter")


def test_a_download_that_fails_ends_the_stream_with_an_error_line(oc, server):
    with httpx.stream("POST", server.url + "/api/pull", json={"model": BROKEN}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        frames = [json.loads(line) for line in r.iter_lines() if line]
    assert frames[0] == {"status": "pulling manifest"}
    assert set(frames[-1]) == {"error", "code"} and frames[-1]["code"] == "hub_unavailable"
    assert not any(f.get("status") == "success" for f in frames)
    with pytest.raises(ollama.ResponseError):
        list(oc.pull(BROKEN, stream=True))
    flat(pull(server, {"model": BROKEN, "stream": False}), 502, "hub_unavailable")
    assert BROKEN not in [m.model for m in oc.list().models]


# --- private repositories and tokens -------------------------------------------------------------------


def test_private_pull_refused_without_a_token(oc, server, hub):
    since = len(hub.requests)
    with pytest.raises(ollama.ResponseError) as err:
        oc.pull(PRIVATE)
    assert err.value.status_code == 401 and "send a Hugging Face token" in err.value.error
    # the server's HF_TOKEN and stored login (this repository's token) were not used
    assert hub_calls(hub, PRIVATE, since) == [("GET", None)]


def test_private_pull_with_the_body_field(server):
    r = pull(server, {"model": PRIVATE, "huggingface_token": PRIVATE_TOKEN, "stream": False})
    assert r.status_code == 200 and r.json() == {"status": "success"}


def test_private_pull_with_a_bearer_header_and_progress(server, hub):
    since = len(hub.requests)
    client = ollama.Client(host=server.url, timeout=60, headers={"Authorization": f"Bearer {PRIVATE_TOKEN}"})
    frames = list(client.pull(PRIVATE, stream=True))
    assert frames[-1].status == "success" and any(f.digest for f in frames)
    assert {auth for _, auth in hub_calls(hub, PRIVATE, since)} == {f"Bearer {PRIVATE_TOKEN}"}
    assert PRIVATE in [m.model for m in client.list().models]


def test_a_token_in_both_places_is_refused(server):
    r = pull(
        server,
        {"model": PRIVATE, "huggingface_token": PRIVATE_TOKEN},
        headers={"Authorization": f"Bearer {PRIVATE_TOKEN}"},
    )
    flat(r, 400, "hub_token_conflict")


def test_a_wrong_token_is_refused(server):
    flat(pull(server, {"model": PRIVATE, "huggingface_token": "hf_wrong"}), 403, "hub_access_denied")
    flat(pull(server, {"model": PRIVATE}, headers={"Authorization": "Basic abc"}), 400, "invalid_parameter")


def test_anonymous_caller_is_not_answered_from_a_private_cache(server, hub):
    pull(server, {"model": PRIVATE, "huggingface_token": PRIVATE_TOKEN, "stream": False}).raise_for_status()
    since = len(hub.requests)
    flat(pull(server, {"model": PRIVATE, "stream": False}), 401, "hub_auth_required")
    flat(pull(server, {"model": PRIVATE}), 401, "hub_auth_required")  # streamed: refused before the stream
    assert hub_calls(hub, PRIVATE, since) == [("GET", None)] * 2  # the Hub was asked, the files were not read


def test_tokens_never_reach_the_server_log(server):
    # the private pulls above ran with their token in the body and in a header; the server
    # logs at debug level (requests, the Hub client's own logs included)
    pull(server, {"model": PRIVATE, "huggingface_token": PRIVATE_TOKEN, "stream": False}).raise_for_status()
    pull(server, {"model": PRIVATE, "huggingface_token": "hf_wrong_and_secret", "stream": False})
    text = server.log_path.read_text(errors="replace")
    assert "pulled acme/secret" in text
    assert PRIVATE_TOKEN not in text and "hf_wrong_and_secret" not in text


# --- GGUF repositories ------------------------------------------------------------------------------------


def test_gguf_repository_becomes_repo_quant_models(oc, server):
    frames = list(oc.pull(f"{GGUF}:Q8_0", stream=True))  # the tag picks one quantization's file
    assert frames[-1].status == "success" and len({f.digest for f in frames if f.digest}) == 1
    names = [m.model for m in oc.list().models]
    assert f"{GGUF}:Q8_0" in names and f"{GGUF}:Q4_0" not in names
    assert oc.pull(GGUF).status == "success"  # every quantization
    assert {f"{GGUF}:Q8_0", f"{GGUF}:Q4_0"} <= {m.model for m in oc.list().models}
    flat(pull(server, {"model": f"{GGUF}:Q2_K"}), 404, "model_not_found")
    flat(pull(server, {"model": f"{PUBLIC}:Q8_0"}), 400, "invalid_parameter")  # a checkpoint has no quantizations


def test_gguf_pulled_model_answers(oc, server):
    pytest.importorskip("llama_cpp")
    pull(server, {"model": f"{GGUF}:Q8_0", "stream": False}).raise_for_status()
    r = oc.generate(model=f"{GGUF}:Q8_0", prompt="Once upon a time", options={"num_predict": 4})
    assert r.done and r.eval_count <= 4


# --- restart, and the server's API key -----------------------------------------------------------------


def test_pulled_models_survive_a_restart_and_the_api_key_rule(server, cache, hub, tmp_path):
    pull(server, {"model": PUBLIC, "stream": False}).raise_for_status()
    pull(server, {"model": PRIVATE, "huggingface_token": PRIVATE_TOKEN, "stream": False}).raise_for_status()
    server.stop(signal.SIGTERM)
    keyed = Server(tmp_path, cache, CONFIG, extra_env={"HF_ENDPOINT": hub.url, "GREENROOM_API_KEY": API_KEY})
    try:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        oc = ollama.Client(host=keyed.url, timeout=60, headers=auth)
        names = {m.model for m in oc.list().models}
        assert {PUBLIC, PRIVATE} <= names
        assert oc.chat(model=PRIVATE, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 3}).done
        # with an API key, Authorization carries the server's key, never a Hub token: the
        # Hub token comes from the body, and the key is not sent to the Hub
        since = len(hub.requests)
        flat(pull(keyed, {"model": PRIVATE}, headers=auth), 401, "hub_auth_required")
        assert hub_calls(hub, PRIVATE, since) == [("GET", None)]
        r = pull(keyed, {"model": PRIVATE, "huggingface_token": PRIVATE_TOKEN, "stream": False}, headers=auth)
        assert r.status_code == 200 and r.json() == {"status": "success"}
        assert oc.pull(PUBLIC).status == "success"
        flat(pull(keyed, {"model": PUBLIC}), 401, "invalid_api_key")  # the key itself is still required
        assert json.dumps(hub.requests).count(API_KEY) == 0
    finally:
        keyed.stop()
