"""The llama.cpp engine through a live server: two quantizations of the demo GGUF (the
default configuration's), plus a one-quantization repository found in a model directory."""

from __future__ import annotations

import shutil

import httpx
import psutil
import pytest
from conftest import UNENDING, Server
from openai import BadRequestError, OpenAI

Q8, Q4 = "greenroom-demo-gguf:Q8_0", "greenroom-demo-gguf:Q4_0"
SOLO = "solo-repo:F16"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir

    dirs = tmp_path_factory.mktemp("ggufs")
    (dirs / "solo-repo").mkdir()
    shutil.copy(ensure_demo_gguf(default_cache_dir(model_cache), "F16"), dirs / "solo-repo" / "model-f16.gguf")
    config = (
        f'model_dirs = ["{dirs}"]\n'
        '[[models]]\nid = "greenroom-demo"\nsource = "demo:tiny"\n'
        f'[[models]]\nid = "{Q8}"\nsource = "demo-gguf:Q8_0"\nengine = "llama.cpp"\n'
        f'[[models]]\nid = "{Q4}"\nsource = "demo-gguf:Q4_0"\nengine = "llama.cpp"\nn_ctx = 256\n'
    )
    server = Server(tmp_path_factory.mktemp("gguf-server"), model_cache, config)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(srv):
    return OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=60)


def state(srv, model: str) -> str:
    return next(m for m in httpx.get(srv.url + "/api/models").json()["models"] if m["id"] == model)["state"]


def unload(srv, model: str) -> None:
    assert httpx.post(srv.url + "/api/models/unload", json={"model": model}, timeout=60).status_code == 200
    assert state(srv, model) == "unloaded"


def error_of(exc) -> dict:
    return exc.value.response.json()["error"]


# seed, n, response_format and every tool_choice are served: test_gguf_seeds.py, test_gguf_constrained.py
REFUSED_BEFORE_LOAD = [
    # scoring (logprobs, top_logprobs, allowed_token_ids) and echo are served: test_gguf_scoring.py, test_echo.py;
    # profile, steering_intensity and return_sae_activations: test_gguf_steering.py
    ("logit_bias", {"logit_bias": {"5": 1}}),
]


@pytest.mark.parametrize("field,extra", REFUSED_BEFORE_LOAD, ids=[f for f, _ in REFUSED_BEFORE_LOAD])
def test_fields_llama_cpp_cannot_honour_are_refused_before_the_model_loads(srv, field, extra):
    unload(srv, Q4)
    body = {"model": Q4, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "field_not_honoured" and err["param"] == field
    assert "llama.cpp" in err["message"] and ": " in err["message"]  # every refusal names its reason
    assert state(srv, Q4) == "unloaded"


def test_seeded_completions_are_served_and_echo_their_seed(srv):
    body = {"model": Q4, "prompt": "hi", "max_tokens": 8, "seed": 1}
    first, again = (httpx.post(srv.url + "/v1/completions", json=body, timeout=60) for _ in range(2))
    assert first.status_code == 200, first.text
    assert first.headers["X-miLLM-Seed"] == '1;scope="request"'
    assert first.json()["choices"][0]["text"] == again.json()["choices"][0]["text"]


def test_scoring_and_echo_are_served(oai):
    scored = oai.completions.create(model=Q4, prompt="Once upon a time", max_tokens=1, logprobs=2)
    assert scored.choices[0].logprobs.tokens == [scored.choices[0].text]
    echoed = oai.completions.create(model=Q4, prompt="Once upon a time", max_tokens=0, logprobs=1, echo=True)
    assert echoed.choices[0].text == "Once upon a time" and echoed.choices[0].logprobs.token_logprobs[0] is None


def test_chat_template_kwargs_are_reported_not_refused(oai):
    raw = oai.chat.completions.with_raw_response.create(
        model=Q8,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert raw.headers["X-miLLM-Ignored-Fields"] == '"chat_template_kwargs"'
    assert raw.parse().choices[0].message.content


def test_the_fingerprint_has_a_revision_only_where_one_is_recorded(oai):
    """The demo files': their generator's versions (their marker); a file of a model directory with
    nothing recording one: unrecorded — never its general.name, which names the model."""
    from greenroom.engines.demo.demo_gguf import CONVERTER_VERSION
    from greenroom.engines.demo.demo_model import GENERATOR_VERSION

    demo = oai.completions.create(model=Q8, prompt="Hi", max_tokens=1).system_fingerprint
    assert demo == f"millm:{Q8}@demo-tiny-v{GENERATOR_VERSION}-c{CONVERTER_VERSION}:Q8_0/Q8_0:llama.cpp"
    solo = oai.completions.create(model=SOLO, prompt="Hi", max_tokens=1).system_fingerprint
    assert solo == f"millm:{SOLO}@unrecorded:F16/F16:llama.cpp"


@pytest.mark.parametrize("model", [Q8, Q4])
def test_chat_and_completions_streamed_and_not(oai, model):
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    whole = oai.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
    assert whole.model == model and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens > 5
    assert whole.system_fingerprint.endswith(":llama.cpp")
    chunks = list(
        oai.chat.completions.create(
            model=model,
            messages=msgs,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # greedy: the same text either way
    assert chunks[-1].usage.completion_tokens == 24

    done = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
    streamed = "".join(
        c.choices[0].text
        for c in oai.completions.create(
            model=model, prompt="Once upon a time", max_tokens=16, temperature=0, stream=True
        )
    )
    assert streamed == done.choices[0].text and done.usage.completion_tokens == 16


def test_quantizations_are_served_side_by_side(oai):
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    a = oai.chat.completions.create(model=Q8, messages=msgs, max_tokens=32, temperature=0).choices[0].message.content
    b = oai.chat.completions.create(model=Q4, messages=msgs, max_tokens=32, temperature=0).choices[0].message.content
    assert a and b and a != b  # 4-bit weights answer differently from 8-bit ones
    ids = [m.id for m in oai.models.list().data]
    assert {Q8, Q4, SOLO} <= set(ids)


def test_a_bare_repository_name(oai):
    # one quantization: the bare name serves it
    assert (
        oai.chat.completions.create(model="solo-repo", messages=[{"role": "user", "content": "hi"}], max_tokens=2).model
        == SOLO
    )
    # several: 400 naming the tags, on every surface
    with pytest.raises(BadRequestError) as exc:
        oai.chat.completions.create(model="greenroom-demo-gguf", messages=[{"role": "user", "content": "hi"}])
    err = error_of(exc)
    assert err["code"] == "AMBIGUOUS_MODEL_NAME" and Q8 in err["message"] and Q4 in err["message"]


def test_a_bare_repository_name_on_ollama(srv):
    r = httpx.post(
        srv.url + "/api/chat",
        json={"model": "greenroom-demo-gguf", "stream": False, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and r.json()["code"] == "AMBIGUOUS_MODEL_NAME"


def test_an_oversized_prompt_is_a_400_with_counts_streamed_and_not(srv, oai):
    long = "the sea " * 200  # far past Q4's n_ctx of 256
    for stream in (False, True):
        with pytest.raises(BadRequestError) as exc:
            r = oai.chat.completions.create(model=Q4, messages=[{"role": "user", "content": long}], stream=stream)
            list(r) if stream else r
        err = error_of(exc)
        assert err["code"] == "context_length_exceeded"
        assert "maximum context length is 256 tokens" in err["message"]
    with pytest.raises(BadRequestError) as exc:
        oai.completions.create(model=Q4, prompt="the sea", max_tokens=300)
    msg = error_of(exc)["message"]
    assert "256 tokens" in msg and "300 in the completion" in msg
    # embeddings too
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": Q4, "input": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_the_gguf_actor_comes_and_goes_with_load_and_unload(srv):
    unload(srv, Q8)
    assert f"gguf:{Q8}" not in srv.actors()
    r = httpx.post(srv.url + "/api/models/load", json={"model": Q8}, timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "loaded"
    actor = srv.actors()[f"gguf:{Q8}"]
    assert actor["state"] == "ready" and actor["models"] == [Q8]
    pid = actor["pid"]
    assert psutil.pid_exists(pid)
    unload(srv, Q8)
    assert f"gguf:{Q8}" not in srv.actors()
    psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=10)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # and a request loads it again, in a new actor
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=60,
        json={"model": Q8, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200 and srv.actors()[f"gguf:{Q8}"]["pid"] != pid


def test_ollama_surface_on_gguf(srv):
    import ollama

    c = ollama.Client(host=srv.url)
    r = c.chat(model=Q8, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 5})
    assert r.done and r.eval_count == 5
    tags = {m.model for m in c.list().models}
    assert {Q8, Q4, SOLO} <= tags


def test_concurrent_requests_decode_together_each_with_its_own_sampling(srv, oai):
    """llama.cpp's own batching: more concurrent requests than sequence slots (4), greedy
    and penalised mixed; each answers exactly what it answers alone."""
    from concurrent.futures import ThreadPoolExecutor

    msgs = [{"role": "user", "content": "Tell me about the sea."}]

    def ask(penalty: float) -> str:
        return (
            oai.chat.completions.create(
                model=Q8, messages=msgs, max_tokens=40, temperature=0, frequency_penalty=penalty
            )
            .choices[0]
            .message.content
        )

    alone = {p: ask(p) for p in (0.0, 1.0)}
    assert alone[0.0] != alone[1.0]
    penalties = [0.0, 1.0] * 5
    with ThreadPoolExecutor(len(penalties)) as pool:
        together = list(pool.map(ask, penalties))
    assert together == [alone[p] for p in penalties]
    backends = {a["name"]: a for a in httpx.get(srv.url + "/api/health/inference").json()["actors"]}
    assert backends[f"gguf:{Q8}"]["backend"] == "llama.cpp_parallel"


def test_a_disconnected_stream_is_cancelled_and_frees_its_sequence(srv):
    name = f"gguf:{Q8}"
    httpx.post(srv.url + "/api/models/load", json={"model": Q8}, timeout=60)
    before = srv.actors()[name]["counters"]
    body = {"model": Q8, "prompt": "Once", "max_tokens": 1800, "stream": True, **UNENDING}
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: {"))
    counters = srv.after_cancel(name, before)
    assert counters["cancelled"] == before["cancelled"] + 1 and counters["active"] == 0
    assert counters["tokens_generated"] - before["tokens_generated"] < 1800
    # every sequence slot is free again: a full batch still runs
    from concurrent.futures import ThreadPoolExecutor

    def ask(_):
        return httpx.post(
            srv.url + "/v1/completions", timeout=60, json={"model": Q8, "prompt": "hi", "max_tokens": 8}
        ).json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ask, range(4))) == [8] * 4


def test_ollama_options_seed_is_honoured(srv):
    """options.seed on llama.cpp (refused before seeds were measured to reproduce there)."""

    def ask():
        r = httpx.post(
            srv.url + "/api/chat",
            timeout=60,
            json={
                "model": Q4,
                "stream": False,
                "messages": [{"role": "user", "content": "hi"}],
                "options": {"seed": 7, "num_predict": 12},
            },
        )
        assert r.status_code == 200, r.text
        return r.json()["message"]["content"]

    assert ask() == ask()
