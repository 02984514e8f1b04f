"""Bad input gets a typed 4xx in OpenAI's envelope, never a 500."""

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import MODEL

CHAT = "/v1/chat/completions"


def post(server, path, body, **kw):
    return httpx.post(
        server.url + path,
        content=body if isinstance(body, (bytes, str)) else None,
        json=None if isinstance(body, (bytes, str)) else body,
        timeout=30,
        **kw,
    )


def envelope(r, status, code, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and isinstance(err["message"], str) and err["message"]
    assert err["type"] in ("invalid_request_error", "server_error", "not_found_error")
    if param is not None:
        assert err["param"] == param
    return err


def test_an_image_is_refused_alike_on_every_surface(server):
    """One code and one reason for an image on a text-only model — chat's image_url part, the
    Responses API's input_image, Anthropic's image block, Ollama's images — each error naming the
    request as its surface does (OpenAI's x-request-id header, Anthropic's request-id header and
    request_id, Ollama's message)."""
    reason = "cannot be honoured: greenroom serves text-only models"
    png = "iVBORw0KGgo="
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
    question = {"type": "text", "text": "What is in it?"}
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": [question, {"type": "image_url", "image_url": {"url": f"data:,{png}"}}]}
            ],
        )
    with pytest.raises(openai.BadRequestError) as responses:
        oai.responses.create(
            model=MODEL, input=[{"role": "user", "content": [{"type": "input_image", "image_url": f"data:,{png}"}]}]
        )
    for exc, param in ((chat.value, "messages[0].content[1]"), (responses.value, "input[0].content[0]")):
        assert (exc.code, exc.param, exc.body["message"]) == ("field_not_honoured", param, f"'{param}' {reason}")
        assert exc.request_id and exc.request_id == exc.response.headers["X-Request-ID"]
    with pytest.raises(anthropic.BadRequestError) as messages:
        anthropic.Anthropic(base_url=server.url, api_key="-", max_retries=0).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
                    ],
                }
            ],
        )
    body = messages.value.body
    assert (body["error"]["code"], body["error"]["param"]) == ("field_not_honoured", "messages[0].content[0]")
    assert body["error"]["message"] == f"'messages[0].content[0]' {reason}"
    assert messages.value.request_id == body["request_id"] == messages.value.response.headers["X-Request-ID"]
    with pytest.raises(ollama.ResponseError) as chatted:
        ollama.Client(host=server.url).chat(
            model=MODEL, messages=[{"role": "user", "content": "What is in it?", "images": [png]}]
        )
    assert chatted.value.status_code == 400
    assert chatted.value.error.startswith(f"'messages[0].images' {reason} (request id: req-")


def test_bad_json(server):
    envelope(post(server, CHAT, b"{not json", headers={"content-type": "application/json"}), 400, "invalid_json")
    envelope(post(server, CHAT, b"[1, 2]"), 400, "invalid_json")


def test_unknown_model_is_404_through_the_sdk(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_missing_messages(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=None)
    assert exc.value.code == "missing_parameter" and exc.value.param == "messages"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": MODEL}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 2.5}, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": -0.1}, "top_p"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, "max_tokens"),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 4,
                "max_completion_tokens": 5,
            },
            "max_completion_tokens",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": True}, "seed"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
def test_invalid_parameters_are_typed_400(server, body, param):
    r = post(server, CHAT, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_context_length_exceeded_before_stream_starts(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6, "stream": True}
    err = envelope(post(server, CHAT, body), 400, "context_length_exceeded", "max_tokens")
    assert "32768" in err["message"]


def test_completion_prompt_required(server):
    envelope(post(server, "/v1/completions", {"model": MODEL}), 400, "missing_parameter", "prompt")


def test_unknown_route_and_method(server):
    """As OpenAI answers them: a method and path no route answers, a wrong method too, is 404
    unknown_url in its words, not the web framework's."""
    err = envelope(httpx.get(server.url + "/v1/nothing"), 404, "unknown_url")
    assert err["type"] == "invalid_request_error" and err["message"].startswith("Unknown request URL: GET /v1/nothing.")
    message = envelope(httpx.get(server.url + CHAT), 404, "unknown_url")["message"]
    assert message.startswith(f"Unknown request URL: GET {CHAT}.") and f"({CHAT} answers POST)" in message
    r = httpx.get(server.url + "/v1/messages/batches")  # Anthropic's paths: its envelope
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "top_p": 0}),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 1e-300},
        ),
    ],
)
def test_extreme_but_valid_sampling_values_are_served(server, path, body):
    assert post(server, path, body).status_code == 200


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/embeddings", {"model": MODEL, "input": [10**30]}),
        ("/v1/completions", {"model": MODEL, "prompt": [10**30], "max_tokens": 2}),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 2,
                "chat_template_kwargs": {"a": 10**30},
            },
        ),
    ],
)
def test_huge_integers_are_a_typed_400(server, path, body):
    r = post(server, path, body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert httpx.get(server.url + "/health").json()["queue_depth"] == 0  # refused in the send: nothing left in flight


@pytest.mark.parametrize("path", [CHAT, "/api/chat"])
def test_a_body_past_the_servers_limit_is_a_typed_413(server, path):
    r = httpx.post(
        server.url + path,
        content=b'{"model": "' + b"x" * (17 << 20) + b'"}',
        timeout=120,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413, r.text[:300]
    body = r.json()
    assert (body["code"] if path.startswith("/api/") else body["error"]["code"]) == "request_too_large"
