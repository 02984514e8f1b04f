"""POST /v1/embeddings: mean-pooled last hidden layer, float and base64, usage, `dimensions`,
refusals; on the transformers and llama.cpp engines alike (an embedding model: test_minilm.py)."""

import base64
import math
import struct

import httpx
import numpy as np
import ollama
import pytest
from conftest import MODEL, Server
from openai import OpenAI


def test_float_and_base64_agree(client, server):
    floats = client.embeddings.create(model=MODEL, input="The quick brown fox", encoding_format="float")
    raw = httpx.post(
        server.url + "/v1/embeddings",
        timeout=60,
        json={"model": MODEL, "input": "The quick brown fox", "encoding_format": "base64"},
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    decoded = list(struct.unpack(f"<{len(packed) // 4}f", packed))
    assert decoded == pytest.approx(floats.data[0].embedding, abs=0)
    assert len(decoded) == 128  # the tiny demo model's hidden size
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0


def test_sdk_default_base64_round_trip(client):
    # the openai SDK asks for base64 by default and decodes it itself
    a = client.embeddings.create(model=MODEL, input="hello").data[0].embedding
    b = client.embeddings.create(model=MODEL, input="hello", encoding_format="float").data[0].embedding
    assert a == pytest.approx(b)


def test_list_input_one_vector_each_in_order(client):
    r = client.embeddings.create(model=MODEL, input=["alpha", "beta", "alpha"], encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2]
    assert r.data[0].embedding == r.data[2].embedding != r.data[1].embedding
    assert all(math.isfinite(x) for d in r.data for x in d.embedding)


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0"])
def test_each_engine_embeds_each_input_deterministically(client, model):
    out = client.embeddings.create(model=model, input=["the sea", "a dog"])
    a, b = (d.embedding for d in out.data)
    assert len(a) == 128 and a != b
    assert out.usage.prompt_tokens > 2
    again = client.embeddings.create(model=model, input=["the sea", "a dog"])
    assert [d.embedding for d in again.data] == [a, b]  # deterministic: the same request, the same bits
    # inputs are embedded together (one decode for many): alone, an input's vector is the same to
    # float32 rounding, not bit for bit (ggml's matrix kernels tile by a ubatch's row count)
    alone = client.embeddings.create(model=model, input="the sea").data[0].embedding
    assert alone == pytest.approx(a, rel=1e-4, abs=1e-5)


def test_a_second_architecture_gemma3_embeds_by_the_same_rules(tmp_path, model_cache, gemma3):
    """Gemma 3 270M (sliding-window attention, K-quant kernels) on llama.cpp: a causal LM's vector
    is the spec's mean-pooled last layer on /v1 (not unit length), unit length on Ollama's
    /api/embed, the same for the same request, and an input's vector the same alone or batched."""
    config = (
        f'engine_actors = ["cpu"]\nnpu_actors = []\n[[models]]\nid = "gemma"\nsource = "{gemma3}"\n'
        'engine = "llama.cpp"\nn_ctx = 4096\n'
    )
    srv = Server(tmp_path, model_cache, config)
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        out = client.embeddings.create(model="gemma", input=["the sea", "a dog"], encoding_format="float")
        a, b = (np.asarray(d.embedding) for d in out.data)
        assert len(a) == 640 and not np.array_equal(a, b)  # Gemma 3 270M's width
        assert not np.isclose(np.linalg.norm(a), 1.0, atol=1e-3)  # as pooled, not normalised
        again = client.embeddings.create(model="gemma", input=["the sea", "a dog"], encoding_format="float")
        assert [d.embedding for d in again.data] == [list(a), list(b)]
        alone = np.asarray(
            client.embeddings.create(model="gemma", input="the sea", encoding_format="float").data[0].embedding
        )
        assert alone @ a / np.linalg.norm(alone) / np.linalg.norm(a) >= 0.9999
        unit = np.asarray(
            ollama.Client(host=srv.url, timeout=300).embed(model="gemma", input=["the sea", "a dog"]).embeddings
        )
        assert np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)  # Ollama's /api/embed: unit vectors
        assert unit[0] @ a / np.linalg.norm(a) >= 0.9999  # the same direction
    finally:
        srv.stop()


def test_token_inputs(client):
    text = client.embeddings.create(model=MODEL, input=[[5, 6, 7], [8]], encoding_format="float")
    assert len(text.data) == 2 and text.usage.prompt_tokens == 4


def test_input_past_the_context_window_is_refused(server):
    r = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, "input": "word " * 33000}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "32768" in err["message"]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": ""}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": [1, "a"]}, "input"),
        ({"model": MODEL, "input": [[10**9]]}, "input"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x"}, "model"),
    ],
)
def test_bad_embedding_requests_are_typed_400(server, body, param):
    r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0"])
def test_dimensions_cut_a_causal_lm_vector_to_unit_length(client, model):
    """The spec's mean-pooled vector is not unit length; `dimensions` answers as OpenAI's: its
    first coordinates, at unit length (it was refused as not implemented before)."""
    whole = client.embeddings.create(model=model, input="the sea", encoding_format="float").data[0].embedding
    cut = client.embeddings.create(model=model, input="the sea", dimensions=8).data[0].embedding
    norm = math.sqrt(sum(x * x for x in whole[:8]))
    assert cut == pytest.approx([x / norm for x in whole[:8]], rel=1e-5)
    assert not math.isclose(math.sqrt(sum(x * x for x in whole)), 1.0, abs_tol=1e-3)  # the whole one is as pooled
