"""Continuous batching (opt-in): requests with the server's fixed sampling parameters decode
together; the others fall back to the serial path; response_format is refused while it is
enabled; GET /api/health/inference shows the backend."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import MODEL, UNENDING, Server, staggered_batch

from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.transformers.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def batching(tmp_path_factory, model_cache):
    srv = Server(tmp_path_factory.mktemp("batching"), model_cache, extra_env={"GREENROOM_CONTINUOUS_BATCHING": "1"})
    yield srv
    srv.stop()


def chat(url: str, max_tokens: int, stream: bool = False, **extra) -> httpx.Response | dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me about {max_tokens}"}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    if not stream:
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    text, last = "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = httpx.Response(200, content=line[6:]).json()
                if last["choices"]:
                    text += last["choices"][0]["delta"].get("content") or ""
    return {"text": text, "finish_reason": last["choices"][0]["finish_reason"], "usage": last["usage"]}


def inference(url: str) -> dict:
    return httpx.get(url + "/api/health/inference", timeout=10).json()


def cpu(url: str) -> dict:
    return next(a for a in inference(url)["actors"] if a["name"] == "cpu")


def test_health_inference_shows_the_backend(batching, server):
    assert inference(batching.url)["backend"] == "continuous_batching"
    row = cpu(batching.url)
    assert row["backend"] == "continuous_batching" and row["models"] == [MODEL] and row["batched"] == 0
    assert row["fixed_sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}
    assert inference(server.url)["backend"] == "serial"  # off by default
    assert cpu(server.url)["backend"] == "serial"


def test_concurrent_streamed_and_plain_requests_all_finish(batching):
    peak, done = [0], threading.Event()

    def watch():  # how many decode in one batch at once, seen from outside
        while not done.is_set():
            peak[0] = max(peak[0], cpu(batching.url)["batched"])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    lengths = [20 + 7 * i for i in range(24)]
    try:
        with ThreadPoolExecutor(24) as pool:
            results = list(pool.map(lambda i: chat(batching.url, lengths[i], stream=i % 2 == 0), range(24)))
    finally:
        done.set()
        watcher.join()
    assert peak[0] > 1, "no two requests were ever batched together"
    texts = []
    for max_tokens, result in zip(lengths, results):
        if isinstance(result, httpx.Response):
            assert result.status_code == 200, result.text
            body = result.json()
            choice, usage = body["choices"][0], body["usage"]
            text, reason = choice["message"]["content"], choice["finish_reason"]
            assert body["x_needle"]["compute_seconds"] > 0  # per-choice stats reach the answer
        else:
            text, reason, usage = result["text"], result["finish_reason"], result["usage"]
        texts.append(text)
        assert reason in ("length", "stop")
        if reason == "length":
            assert usage["completion_tokens"] == max_tokens
        else:  # an end-of-text token came first
            assert usage["completion_tokens"] <= max_tokens
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert sum(map(bool, texts)) > 20  # text reached both framings (an end-of-text token at once leaves none)
    row = cpu(batching.url)
    assert row["batched"] == 0


def test_greedy_batched_equals_greedy_serial(model_cache):
    """Left padding, the mask and the position ids leave every row computing what it would
    alone: sequences of different lengths, joining at different steps, one with a stop."""
    engine = TransformersEngine(MODEL, ensure_demo_model(default_cache_dir(), "tiny"))
    texts, reasons, serial = staggered_batch(engine, engine)
    assert texts == dict(enumerate(serial))
    assert reasons[2] == "stop" and reasons[0] == "length"


def test_seeded_penalised_and_greedy_requests_fall_back_to_serial(batching):
    seeded = {"seed": 11, "temperature": 0.9}
    alone = chat(batching.url, 30, **seeded)
    assert alone.headers["X-miLLM-Seed"] == '11;scope="request"'
    with ThreadPoolExecutor(8) as pool:
        neighbours = [pool.submit(chat, batching.url, 60, stream=True) for _ in range(6)]
        beside = pool.submit(chat, batching.url, 30, **seeded)
        penalised = pool.submit(chat, batching.url, 30, frequency_penalty=1.0)
        greedy = [pool.submit(chat, batching.url, 20, temperature=0) for _ in range(2)]
        two = pool.submit(chat, batching.url, 10, n=2)
        assert all(f.result()["usage"]["completion_tokens"] > 0 for f in neighbours)
        # a seeded request's text does not depend on what else runs (never batched)
        assert beside.result().json()["choices"] == alone.json()["choices"]
        assert penalised.result().status_code == 200
        a, b = (f.result().json()["choices"][0]["message"]["content"] for f in greedy)
        assert a == b
        assert [c["index"] for c in two.result().json()["choices"]] == [0, 1]


def test_response_format_is_refused(batching):
    r = chat(batching.url, 20, response_format={"type": "json_object"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "response_format_unsupported"
    assert r.json()["error"]["param"] == "response_format"
    assert chat(batching.url, 5, response_format={"type": "text"}).status_code == 200  # "no change"


def test_cancelled_batched_stream_leaves_the_batch(batching):
    before = httpx.get(batching.url + "/api/actors", timeout=10).json()["actors"]
    before = next(a for a in before if a["name"] == "cpu")["counters"]
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(chat, batching.url, 400, **UNENDING)  # stays in the batch meanwhile
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Talk"}],
            "max_tokens": 1800,
            "stream": True,
            **UNENDING,
        }
        with httpx.stream("POST", batching.url + "/v1/chat/completions", json=body, timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen == 6:
                    break  # leaving the block closes the connection
        response = other.result()
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 400
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        counters = next(
            a for a in httpx.get(batching.url + "/api/actors", timeout=10).json()["actors"] if a["name"] == "cpu"
        )["counters"]
        if counters["active"] == 0:
            break
        time.sleep(0.05)
    assert counters["cancelled"] == before["cancelled"] + 1
    assert counters["active"] == 0 and counters["queue_depth"] == 0 and cpu(batching.url)["batched"] == 0
    generated = counters["tokens_generated"] - before["tokens_generated"]
    assert generated < 400 + 400, f"{generated} tokens generated: the cancelled stream kept decoding"


def test_cuda_out_of_memory_during_generation_is_insufficient_memory_naming_the_card():
    """The mapping every failed step or prefill goes through (torch's real exception; no card
    is needed to raise it). A stream then ends with this error event, as any Failed does."""
    import torch

    from greenroom.actors.engine_actor import EngineLoop

    error = EngineLoop({}, 1, 1, "cuda:0")._typed(
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    )
    assert (error.code, error.status) == ("insufficient_memory", 503)
    assert error.message.startswith("cuda:0 ran out of memory") and "Tried to allocate 2.00 GiB" in error.message
    assert "more detail" not in error.message
    other = EngineLoop({}, 1, 1, "cpu")._typed(RuntimeError("boom"))
    assert other.code == "generation_failed"
