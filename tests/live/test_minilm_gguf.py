"""all-MiniLM-L6-v2 as an F16 GGUF on the llama.cpp engine (`all-minilm:f16`): the file
greenroom writes from the packaged checkpoint (engines/llama_cpp/bert_gguf.py) runs as llama.cpp's
`bert`, and /api/embed and /v1/embeddings answer what the checkpoint itself computes; the
embedding limits are kept; `greenroom convert --to-gguf` writes the same file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import httpx
import llama_cpp
import numpy as np
import ollama
import pytest
from conftest import Server, minilm_reference
from openai import OpenAI

from greenroom.engines.llama_cpp import gguf_meta
from greenroom.engines.llama_cpp.bert_gguf import NORMALIZE_KEY
from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine
from greenroom.engines.loader import resolve_source, source_path

MODEL = "all-minilm:f16"
CHECKPOINT = "unpacked:package:all_minilm_l6_v2/model.zip"
SOURCE = "gguf-from:" + CHECKPOINT

SENTENCES = [
    "The cat sits outside on the warm stone wall.",
    "A man is playing a guitar in the subway station.",
    "I love pasta with fresh basil and tomatoes.",
    "The new movie is awesome!",
    "Stock markets fell sharply after the announcement.",
    "How do I reset my router's password?",
    "Photosynthesis turns light, water and CO2 into sugar.",
    "She ran 42.195 km in 3 hours, 12 minutes.",
    "Café au lait, naïve façade, résumé.",
    "東京は日本の首都です。",
    "Python's list comprehensions are concise: [x * x for x in range(10)]",
    "The quarterly report is due next Friday at 5 p.m.",
    "Quantum computers use qubits instead of bits.",
    "My grandmother's recipe calls for two cups of flour.",
    "The Eiffel Tower is in Paris.",
    "Rain is expected over the weekend in Scotland.",
    "Unbelievably, the underdogs won the championship!!!",
    "e-mail me at someone@example.com — thanks",
    "A",
    "Transformers encode sentences into dense vectors for semantic search.",
]


@pytest.fixture(scope="module")
def checkpoint(model_cache):
    return resolve_source(CHECKPOINT, str(model_cache))


@pytest.fixture(scope="module")
def reference(checkpoint):
    """conftest's minilm_reference (the checkpoint in this process) as an array, with the
    tokens the checkpoint's own tokenizer counts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)

    def embed(texts: list[str]) -> tuple[np.ndarray, int]:
        vectors = np.asarray(minilm_reference(texts, checkpoint), dtype=np.float64)
        return vectors, sum(len(tokenizer(t)["input_ids"]) for t in texts)

    return embed


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    config = f'engine_actors = ["cpu"]\nnpu_actors = []\n[[models]]\nid = "{MODEL}"\nsource = "{SOURCE}"\nengine = "llama.cpp"\npreload = false\n'
    server = Server(tmp_path_factory.mktemp("minilm-gguf"), model_cache, config)
    yield server
    server.stop()


def _cosines(got, want: np.ndarray) -> np.ndarray:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def test_api_embed_equals_the_checkpoint(srv, reference):
    want, tokens = reference(SENTENCES)
    r = ollama.Client(host=srv.url, timeout=300).embed(model=MODEL, input=SENTENCES)
    assert _cosines(r.embeddings, want).min() >= 0.999
    assert np.allclose(np.linalg.norm(r.embeddings, axis=1), 1.0)
    assert r.prompt_eval_count == tokens  # llama.cpp's WPM tokenises as the checkpoint's tokenizer


def test_v1_embeddings_equal_the_checkpoint(srv, reference):
    want, tokens = reference(SENTENCES)
    client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    r = client.embeddings.create(model=MODEL, input=SENTENCES)
    got = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
    assert len(got[0]) == 384
    assert _cosines(got, want).min() >= 0.999
    # unit length as the model's Normalize module makes it, on /v1 too (not the causal LMs' raw mean)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert r.usage.prompt_tokens == tokens
    one = client.embeddings.create(model=MODEL, input=SENTENCES[3]).data[0].embedding
    assert _cosines([one], np.asarray([got[3]])).min() >= 0.99999  # alone or among 20: the same vector


def test_the_written_gguf_is_llama_cpps_bert(srv, model_cache, checkpoint):
    httpx.post(srv.url + "/api/embed", json={"model": MODEL, "input": "load"}, timeout=300).raise_for_status()
    path = source_path(SOURCE, str(model_cache))
    meta = gguf_meta.read(path)
    assert meta.get("general.architecture") == "bert" and meta.get("general.file_type") == 1  # F16
    assert meta.get("bert.pooling_type") == 1 and meta.get(NORMALIZE_KEY) is True  # mean, then Normalize
    assert meta.get("bert.context_length") == 512 and meta.get("bert.embedding_length") == 384
    assert meta.get("bert.block_count") == 6 and meta.get("bert.attention.causal") is False
    assert meta.fields["tokenizer.ggml.tokens"].count == 30522 and meta.get("tokenizer.ggml.model") == "bert"
    facts = httpx.get(srv.url + "/api/models", timeout=30).json()["models"]
    row = next(m for m in facts if m["id"] == MODEL)
    assert row["state"] == "loaded" and row["engine"] == "llama.cpp"


def test_embedding_decodes_use_every_core_unless_threads_is_set(srv, model_cache, reference):
    """Batch compute the front end only waits for: on every core this process may use by default
    (llama-server's default; generation keeps all cores but one), on `threads` when it is set —
    and the same vectors either way."""
    httpx.post(srv.url + "/api/embed", json={"model": MODEL, "input": "load"}, timeout=300).raise_for_status()
    path = source_path(SOURCE, str(model_cache))
    want, _ = reference(SENTENCES)
    vectors = {}
    for threads, expected in ((None, len(os.sched_getaffinity(0))), (1, 1)):
        engine = LlamaCppEngine(MODEL, path, threads=threads)
        vectors[threads] = np.asarray(engine.embed([engine.tokenize(t) for t in SENTENCES]))
        assert llama_cpp.llama_n_threads_batch(engine._embedding_context().ctx) == expected
        assert _cosines(vectors[threads], want).min() >= 0.999
        engine.unload()
    assert _cosines(vectors[None], vectors[1]).min() >= 0.99999


def test_pooled_clients_at_once_each_get_their_own_vectors(srv, reference):
    """Three pooled SDK clients at once — ollama's and openai's, each a kept-alive connection
    making requests one after another, and one sending bad input between them — on the server's
    every-core embedding decodes: each answer is its own inputs' vectors, every bad one its error."""
    want, _ = reference(SENTENCES)
    ollama_client = ollama.Client(host=srv.url, timeout=300)
    openai_client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    failures: list = []

    def by_ollama(k: int) -> None:
        part = SENTENCES[k::3]
        got = ollama_client.embed(model=MODEL, input=part).embeddings
        assert _cosines(got, want[k::3]).min() >= 0.999

    def by_openai(k: int) -> None:
        part = SENTENCES[k::2]
        got = [
            d.embedding
            for d in sorted(openai_client.embeddings.create(model=MODEL, input=part).data, key=lambda d: d.index)
        ]
        assert _cosines(got, want[k::2]).min() >= 0.999

    def bad(_: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=300) as client:  # pooled: one connection
            r = client.post("/api/embed", json={"model": MODEL, "input": ["x"] * 129})
            assert r.status_code == 413 and r.json()["code"] == "embedding_batch_too_large", r.text

    def run(ask) -> None:
        try:
            for k in range(3):
                ask(k % 2 if ask is by_openai else k)
        except BaseException as exc:  # noqa: BLE001 (raised below, in the test's thread)
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(ask,)) for ask in (by_ollama, by_openai, bad)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"input": ""}, 400, "empty_input"),
        ({"input": ["ok", "  "]}, 400, "empty_input"),
        ({"input": ["x"] * 129}, 413, "embedding_batch_too_large"),
        ({"input": "x" * 8193}, 413, "embedding_input_too_large"),
        ({"input": "word " * 600, "truncate": False}, 400, "context_length_exceeded"),  # 602 tokens, window 512
    ],
)
def test_bad_input_is_typed_and_leaves_the_model_serving(srv, reference, body, status, code):
    r = httpx.post(srv.url + "/api/embed", json={"model": MODEL, **body}, timeout=300)
    assert r.status_code == status and r.json()["code"] == code, r.text
    want, _ = reference(SENTENCES[:2])
    again = httpx.post(srv.url + "/api/embed", json={"model": MODEL, "input": SENTENCES[:2]}, timeout=300).json()
    assert _cosines(again["embeddings"], want).min() >= 0.999


def test_v1_input_past_the_window_is_refused(srv):
    r = httpx.post(srv.url + "/v1/embeddings", json={"model": MODEL, "input": "word " * 600}, timeout=300)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "512" in err["message"]


def test_generation_on_it_is_refused_and_show_says_embedding(srv):
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 4}, timeout=300)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_capability", r.text
    # Ollama's words, whether or not the GGUF is written yet (the checkpoint it is written from says)
    with pytest.raises(ollama.ResponseError, match=f'"{MODEL}" does not support chat'):
        ollama.Client(host=srv.url).chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert ollama.Client(host=srv.url).show(MODEL).capabilities == ["embedding"]


def convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "greenroom", "convert", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_convert_writes_the_gguf_the_source_serves(srv, model_cache, checkpoint, tmp_path):
    httpx.post(srv.url + "/api/embed", json={"model": MODEL, "input": "load"}, timeout=300).raise_for_status()
    out = tmp_path / "minilm-F16.gguf"
    done = convert("--to-gguf", checkpoint, out)
    assert done.returncode == 0 and done.stdout.strip() == str(out), done.stderr
    assert out.read_bytes() == source_path(SOURCE, str(model_cache)).read_bytes()  # one writer, deterministic
    again = convert("--to-gguf", checkpoint, out)  # never overwritten
    assert again.returncode == 2 and "exists" in again.stderr


def test_convert_refuses_what_is_not_a_bert_checkpoint(model_cache, tmp_path):
    smollm = resolve_source("demo:tiny", str(model_cache))  # a LlamaForCausalLM checkpoint
    done = convert("--to-gguf", smollm, tmp_path / "x.gguf")
    assert done.returncode == 2 and "only BertModel" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
