"""all-MiniLM-L6-v2 as `all-minilm` on the OpenVINO engine on the NPU actor (npu0: the NPU
pipeline's static-shape profile, on the CPU here): exported to IR once into the model cache,
served by TextEmbeddingPipeline. Through one real server: /api/embed, /api/embeddings and
/v1/embeddings equal an in-process reference, the routing headers say where it ran, the seed's
input table and the window are typed refusals, generation is refused, a second load does not
export again; in process, the static profile runs many texts BATCH at a time."""

from __future__ import annotations

import os

import conftest
import httpx
import numpy as np
import pytest
from conftest import Server

from greenroom.engines.base import EngineError, SamplingParams
from greenroom.engines.built_dirs import MARKER
from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.engines.loader import load_engine, resolve_source
from greenroom.engines.openvino import text_embedding
from greenroom.engines.openvino.encoder_export import openvino_dir

MINILM = "all-minilm"
SOURCE = "unpacked:package:all_minilm_l6_v2/model.zip"

SENTENCES = [
    "A man is playing a guitar on the street corner.",
    "The stock market closed higher after a volatile week.",
    "Photosynthesis converts light energy into chemical energy.",
    "She ordered a cappuccino and a croissant at the café.",
    "The bridge was closed for repairs until next spring.",
    "Neural networks learn representations from data.",
    "It rained all weekend, so the picnic was cancelled.",
    "The museum's new wing houses modern sculpture.",
    "Our flight to Lisbon was delayed by two hours.",
    "He trained for months to run his first marathon.",
    "The recipe needs three eggs, flour and a pinch of salt.",
    "Glaciers are retreating faster than scientists predicted.",
    "The committee approved the budget without amendments.",
    "A black cat slept in a patch of afternoon sunlight.",
    "Quantum computers exploit superposition and entanglement.",
    "The violinist tuned her instrument before the concert.",
    "Traffic on the motorway was slow because of an accident.",
    "Children built a snowman in the schoolyard.",
    "The novel follows three generations of one family.",
    "Regular backups protect you against losing your files.",
]


def minilm_reference(texts: list[str]) -> np.ndarray:
    """conftest's reference (the checkpoint in this process, apart from every engine), as an array."""
    return np.asarray(conftest.minilm_reference(texts, resolve_source(SOURCE, os.environ["GREENROOM_CACHE"])))


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    config = f'[[models]]\nid = "{MINILM}"\nsource = "{SOURCE}"\nengine = "openvino"\nactor = "npu0"\npreload = false\n'
    server = Server(tmp_path_factory.mktemp("minilm-openvino"), model_cache, config)
    yield server
    server.stop()


def embed(srv, body: dict, path: str = "/api/embed") -> httpx.Response:
    return httpx.post(srv.url + path, json={"model": MINILM, **body}, timeout=300)


def loaded(srv) -> list[str]:
    return [m["name"] for m in httpx.get(srv.url + "/api/ps", timeout=30).json()["models"]]


def test_bad_input_is_refused_before_a_load_and_leaves_it_working(srv):
    httpx.post(srv.url + "/api/models/unload", json={"model": MINILM}, timeout=120)
    for body, status, code in [
        ({"input": []}, 400, "empty_input"),
        ({"input": ["fine", "  "]}, 400, "empty_input"),
        ({"input": ["x"] * 129}, 413, "embedding_batch_too_large"),
        ({"input": "x" * 8193}, 413, "embedding_input_too_large"),
        ({"input": ["y" * 8000] * 9}, 413, "embedding_request_too_large"),
    ]:
        r = embed(srv, body)
        assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert MINILM not in loaded(srv)  # the table is checked before the engine is asked anything
    # past the window (256 tokens, fewer than 8192 characters): the engine's typed refusal, both surfaces
    long = "word " * 300
    r = embed(srv, {"input": ["short", long]})
    assert (r.status_code, r.json()["code"]) == (400, "context_length_exceeded"), r.text
    assert "256" in r.json()["error"]
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": MINILM, "input": long}, timeout=60)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "context_length_exceeded"), r.text
    r = embed(srv, {"input": ["still served"]})
    assert r.status_code == 200 and len(r.json()["embeddings"][0]) == 384


def test_vectors_equal_the_reference_on_both_surfaces(srv):
    from openai import OpenAI

    reference = minilm_reference(SENTENCES)
    r = embed(srv, {"input": SENTENCES})
    assert r.status_code == 200, r.text
    ollama_vectors = np.array(r.json()["embeddings"])
    assert ollama_vectors.shape == (20, 384)
    assert cosines(ollama_vectors, reference).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ollama_vectors, axis=1), 1.0, atol=1e-5)
    # the seed's routing headers: the device that computed (the CPU standing in for the NPU here)
    assert r.headers["X-NPU-Proxy-Device"] in ("CPU", "NPU")
    assert r.headers["X-NPU-Proxy-Route-Reason"] == "single_engine_runtime"
    assert int(r.headers["X-NPU-Proxy-Token-Count"]) == r.json()["prompt_eval_count"] > 20

    client = OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=120)
    data = client.embeddings.create(model=MINILM, input=SENTENCES).data
    openai_vectors = np.array([d.embedding for d in data])
    assert cosines(openai_vectors, reference).min() >= 0.9999
    # the model's own Normalize module: unit vectors on /v1 too
    np.testing.assert_allclose(np.linalg.norm(openai_vectors, axis=1), 1.0, atol=1e-5)

    legacy = embed(srv, {"prompt": SENTENCES[3]}, "/api/embeddings")
    assert legacy.status_code == 200 and legacy.headers["X-NPU-Proxy-Device"] in ("CPU", "NPU")
    assert cosines([legacy.json()["embedding"]], reference[3:4])[0] >= 0.9999


def test_generation_is_refused(srv):
    """Typed 400s, a prompt's in Ollama's words (`"all-minilm" does not support generate`); a
    conversation is refused before the engine too (it has no chat template)."""
    for path, body, prompt in [
        ("/api/generate", {"prompt": "Hello", "stream": False}, True),
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 4}, True),
        ("/api/chat", {"messages": [{"role": "user", "content": "Hello"}], "stream": False}, False),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}, False),
    ]:
        r = httpx.post(srv.url + path, json={"model": MINILM, **body}, timeout=120)
        error = r.json()["error"]  # Ollama's flat envelope, or OpenAI's object
        code, message = (r.json()["code"], error) if isinstance(error, str) else (error["code"], error["message"])
        assert r.status_code == 400 and code, (path, r.text)
        assert not prompt or message.startswith(f'"{MINILM}" does not support'), (path, r.text)


def test_a_second_load_does_not_export_again(srv, model_cache):
    checkpoint = resolve_source(SOURCE, str(model_cache))
    assert embed(srv, {"input": "first"}).status_code == 200
    marker = openvino_dir(default_cache_dir(str(model_cache)), checkpoint) / MARKER
    exported = marker.stat().st_mtime_ns
    r = httpx.post(srv.url + "/api/models/unload", json={"model": MINILM}, timeout=120)
    assert r.status_code == 200 and MINILM not in loaded(srv)
    assert embed(srv, {"input": "second"}).status_code == 200
    assert marker.stat().st_mtime_ns == exported


@pytest.fixture(scope="module")
def npu(model_cache):
    return load_engine({"id": MINILM, "source": SOURCE, "engine": "openvino", "device": "npu:0"})


def test_the_static_profile_runs_batches(npu, model_cache):
    info = npu.info
    assert (info.engine, info.context_length, info.embedding_only) == ("openvino", 256, True)
    vectors = npu.embed_texts(SENTENCES)
    # 20 texts ran as three calls in the BATCH-row shape (the last filled up), none alone
    assert set(npu.embedder._pipelines) == {text_embedding.BATCH}
    assert cosines(vectors, minilm_reference(SENTENCES)).min() >= 0.9999
    one = npu.embed_texts(SENTENCES[:1])  # a lone text: the one-row shape, the same vector
    assert set(npu.embedder._pipelines) == {1, text_embedding.BATCH}
    assert cosines(one, vectors[:1])[0] >= 0.99999
    # an embedding request's texts are counted in one tokenizer call: the same ids as one by one
    texts = SENTENCES + ["Ünïcödé café 東京 🙂", "a"]
    assert npu.tokenize_many(texts) == [npu.tokenize(t) for t in texts]
    # token ids that are a text's tokenisation embed as that text; others are refused
    assert cosines(npu.embed([npu.tokenize(SENTENCES[0])]), vectors[:1])[0] >= 0.99999
    with pytest.raises(EngineError) as refused:
        npu.embed([npu.tokenize("word", add_special_tokens=False)])
    assert (refused.value.code, refused.value.param) == ("invalid_parameter", "input")
    with pytest.raises(EngineError) as refused:
        next(iter(npu.generate_ids(npu.tokenize("Hello"), SamplingParams(max_tokens=2))))
    assert (
        refused.value.code == "field_not_honoured" and refused.value.message == '"all-minilm" does not support generate'
    )


def test_the_npu_row_length_is_the_placements_within_the_position_table(model_cache):
    for asked, window in [(128, 128), (4096, 512)]:  # MiniLM's position table: 512
        engine = load_engine(
            {"id": MINILM, "source": SOURCE, "engine": "openvino", "device": "npu:0", "max_prompt_len": asked}
        )
        assert engine.info.context_length == engine.embedder.static_length == window
