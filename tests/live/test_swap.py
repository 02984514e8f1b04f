"""Models swap on a small memory_budget (issue 31): three GGUF models of which the budget holds
one at a time, asked for in turn by the ollama and openai SDKs on pooled clients while a
stream runs. Every request is answered; the device never holds two; evictions are counted."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import ollama
import openai
from conftest import Server

MODELS = ("greenroom-demo-gguf:F16", "greenroom-demo-gguf:Q8_0", "greenroom-demo-gguf:Q4_0")
CONFIG = "".join(
    f'[[models]]\nid = "{m}"\nsource = "demo-gguf:{m.rpartition(":")[2]}"\nengine = "llama.cpp"\nn_ctx = 2048\n'
    for m in MODELS
)


def loaded(srv: Server) -> dict[str, int]:
    """/api/ps: each loaded model's size (what it takes on its device)."""
    return {m["name"]: m["size"] for m in httpx.get(srv.url + "/api/ps", timeout=30).json()["models"]}


def metric(srv: Server, name: str, label: str = "") -> float:
    """The sum of `name`'s samples whose labels include `label`."""
    lines = httpx.get(srv.url + "/metrics", timeout=30).text.splitlines()
    return sum(float(line.rpartition(" ")[2]) for line in lines if line.startswith(name + "{") and label in line)


def test_three_models_that_fit_one_at_a_time_each_answer_in_turn(own_server):
    probe = own_server(CONFIG)  # no budget: what each takes once loaded
    for model in MODELS:
        assert httpx.post(probe.url + "/api/generate", json={"model": model}, timeout=120).status_code == 200
    sizes = loaded(probe)
    probe.stop()
    assert set(sizes) == set(MODELS)
    budget = int(max(sizes.values()) * 1.25)
    assert all(a + b > budget for a in sizes.values() for b in sizes.values())  # no two fit together

    srv = own_server(f'memory_budget = "{budget}"\n' + CONFIG)
    chat = ollama.Client(host=srv.url)  # each SDK keeps its connections open between requests
    v1 = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    first, second, third = MODELS
    stream = v1.chat.completions.create(
        model=first, messages=[{"role": "user", "content": "tell a story"}], max_tokens=64, stream=True
    )
    pieces = [next(iter(stream))]  # the stream has started: `first` is loaded and busy
    with cf.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            chat.chat, model=second, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}
        )
        pieces += list(stream)  # runs to its end, not cut by the swap that waits for it
        assert waiting.result(timeout=120).message.role == "assistant"
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")
    assert list(loaded(srv)) == [second]

    for model in (third, first, second, third):  # each request swaps the one before it out
        if model in (first, third):
            reply = v1.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            assert reply.choices[0].message.role == "assistant"
        else:
            assert chat.generate(model=model, prompt="hi", options={"num_predict": 4}).done
        now = loaded(srv)
        assert list(now) == [model] and sum(now.values()) <= budget

    assert metric(srv, "greenroom_model_events_total", 'event="evicted"') >= 5
    assert metric(srv, "greenroom_swap_waits_total") >= 1
    server = httpx.get(srv.url + "/api/actors", timeout=30).json()["server"]
    assert server["limits"]["memory_budget_bytes"] == budget
    assert [d["models"] for d in server["devices"]] == [[third]]
