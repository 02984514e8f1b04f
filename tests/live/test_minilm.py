"""all-MiniLM-L6-v2 (`all-minilm:transformers`) on the transformers engine, through one real
server: its vectors equal an in-process reference (conftest.minilm_reference), rank the right
passage first through the ollama and openai SDKs and LangChain, `dimensions` on both surfaces,
the seed's input table, chat and generation refused as Ollama refuses an embedding model, and
/api/show, /api/tags and /v1/models describing it."""

from __future__ import annotations

import math

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import MINILM_SOURCE, Server, cosine, minilm_reference

MINILM = "all-minilm:transformers"

SENTENCES = [
    "The cat sat quietly on the warm windowsill.",
    "Stock markets fell sharply after the interest rate announcement.",
    "She baked a chocolate cake for her grandmother's birthday.",
    "The spacecraft entered orbit around Mars after a seven-month journey.",
    "Heavy rain flooded the streets of the old town overnight.",
    "A good night's sleep improves memory and concentration.",
    "The orchestra played Beethoven's ninth symphony to a full hall.",
    "Python is a popular language for data analysis.",
    "He repaired the bicycle's flat tyre with a patch kit.",
    "Volcanoes release ash and gas when they erupt.",
    "The museum opened a new exhibition of ancient Egyptian art.",
    "Electric cars are becoming cheaper to buy and run.",
    "The children built a sandcastle at the beach.",
    "Regular exercise lowers the risk of heart disease.",
    "The detective found a hidden letter in the library.",
    "Bees pollinate many of the crops we eat.",
    "The recipe calls for two cups of flour and one egg.",
    "A solar eclipse happens when the moon blocks the sun.",
    "The team won the championship in the final minute.",
    "Learning a second language takes patience and practice.",
]

# (query, its passage): each query's passage is among the ten, the others are distractors
RETRIEVAL = [
    ("How do I fix a punctured bike wheel?", "Patch the inner tube of the bicycle tyre after finding the hole."),
    ("What causes the seasons on Earth?", "The tilt of the Earth's axis makes summer and winter."),
    ("Which animal is known as the king of the jungle?", "The lion is often called the king of the jungle."),
    ("How can I sleep better at night?", "Keep a regular bedtime and avoid screens before going to sleep."),
    ("What is the capital city of France?", "Paris is the capital and largest city of France."),
    ("How do plants make their food?", "Photosynthesis turns sunlight, water and carbon dioxide into sugar."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare wrote the tragedy Romeo and Juliet."),
    ("How do I make bread rise?", "Yeast ferments the dough and makes the bread rise."),
    ("Why is the sky blue?", "Air scatters blue sunlight more than red light, so the sky looks blue."),
    ("What is the boiling point of water?", "At sea level water boils at one hundred degrees Celsius."),
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache, minilm_dir):
    """One server for the module: all-minilm on transformers, beside the demo causal LM."""
    config = f"""
[[models]]
id = "{MINILM}"
source = "{MINILM_SOURCE}"
engine = "transformers"

[[models]]
id = "greenroom-demo"
source = "demo:tiny"
engine = "transformers"
preload = false
"""
    server = Server(tmp_path_factory.mktemp("minilm"), model_cache, config)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reference():
    return minilm_reference(SENTENCES)


def _embed(srv, **body) -> httpx.Response:
    return httpx.post(srv.url + "/api/embed", json={"model": MINILM, **body}, timeout=120)


def _unit(v) -> bool:
    return math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, abs_tol=1e-5)


def test_api_embed_equals_the_reference(srv, reference):
    r = _embed(srv, input=SENTENCES)
    assert r.status_code == 200, r.text
    got = r.json()["embeddings"]
    assert len(got) == 20 and all(len(v) == 384 and _unit(v) for v in got)
    assert min(cosine(a, b) for a, b in zip(got, reference)) >= 0.9999
    assert r.json()["prompt_eval_count"] > 20


def test_v1_embeddings_equal_the_reference_float_and_base64(srv, reference):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    floats = client.embeddings.create(model=MINILM, input=SENTENCES, encoding_format="float")
    decoded = client.embeddings.create(model=MINILM, input=SENTENCES)  # the SDK asks for base64
    for data in (floats.data, decoded.data):
        assert min(cosine(d.embedding, ref) for d, ref in zip(data, reference)) >= 0.9999
    assert all(_unit(d.embedding) for d in floats.data)  # the checkpoint's Normalize module, on /v1 too


def test_legacy_api_embeddings_is_the_model_own_vector(srv, reference):
    r = httpx.post(srv.url + "/api/embeddings", json={"model": MINILM, "prompt": SENTENCES[0]}, timeout=120)
    assert r.status_code == 200, r.text
    assert cosine(r.json()["embedding"], reference[0]) >= 0.9999 and _unit(r.json()["embedding"])


def test_a_batch_of_128_equals_each_input_alone(srv):
    """128 inputs of different lengths run as padded batches: each vector is its input's alone."""
    texts = [" ".join(SENTENCES[: 1 + i % 7]) + f" ({i})" for i in range(128)]
    whole = _embed(srv, input=texts).json()["embeddings"]
    for i in (0, 5, 63, 127):
        assert cosine(whole[i], _embed(srv, input=texts[i]).json()["embeddings"][0]) >= 0.99999


def _ranks_right(query_vectors, passage_vectors) -> list[int]:
    """For each query, the index of the passage closest to it."""
    return [max(range(len(passage_vectors)), key=lambda j: cosine(q, passage_vectors[j])) for q in query_vectors]


QUERIES = [q for q, _ in RETRIEVAL]
PASSAGES = [p for _, p in RETRIEVAL]


def test_retrieval_through_the_ollama_sdk(srv):
    oc = ollama.Client(host=srv.url)
    passages = oc.embed(model=MINILM, input=PASSAGES).embeddings
    queries = [oc.embed(model=MINILM, input=q).embeddings[0] for q in QUERIES]
    assert _ranks_right(queries, passages) == list(range(10))


def test_retrieval_through_the_openai_sdk(srv):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    passages = [d.embedding for d in client.embeddings.create(model=MINILM, input=PASSAGES).data]
    queries = [d.embedding for d in client.embeddings.create(model=MINILM, input=QUERIES).data]
    assert _ranks_right(queries, passages) == list(range(10))


def test_retrieval_through_langchain(srv):
    from langchain_ollama import OllamaEmbeddings
    from langchain_openai import OpenAIEmbeddings

    # without check_embedding_ctx_length=False, OpenAIEmbeddings sends tiktoken's token ids
    # (OpenAI's vocabulary, not this model's): it then sends the texts
    for embeddings in (
        OllamaEmbeddings(model=MINILM, base_url=srv.url),
        OpenAIEmbeddings(
            model=MINILM, base_url=srv.url + "/v1", api_key="x", check_embedding_ctx_length=False, max_retries=0
        ),
    ):
        passages = embeddings.embed_documents(PASSAGES)
        queries = [embeddings.embed_query(q) for q in QUERIES]
        assert _ranks_right(queries, passages) == list(range(10)), type(embeddings).__name__


def test_dimensions_cut_and_renormalise_on_both_surfaces(srv, reference):
    head = reference[0][:64]
    norm = math.sqrt(sum(x * x for x in head))
    want = [x / norm for x in head]
    r = _embed(srv, input=SENTENCES[0], dimensions=64)
    assert r.headers["X-Greenroom-Dimensions"] == "64"
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    v1 = client.embeddings.create(model=MINILM, input=SENTENCES[0], dimensions=64).data[0].embedding
    for got in (r.json()["embeddings"][0], v1):
        assert len(got) == 64 and _unit(got) and cosine(got, want) >= 0.9999
    # Ollama keeps the whole vector for a length it cannot cut to, and says so
    r = _embed(srv, input=SENTENCES[0], dimensions=1000)
    assert len(r.json()["embeddings"][0]) == 384 and r.headers["X-Greenroom-Dimensions"] == "384"
    assert len(client.embeddings.create(model=MINILM, input="x", dimensions=384).data[0].embedding) == 384


@pytest.mark.parametrize("dimensions", [385, 0, -1, 1.5, "64"])
def test_v1_dimensions_it_cannot_give_are_refused(srv, dimensions):
    body = {"model": MINILM, "input": "hello", "dimensions": dimensions}
    r = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", r.text
    assert r.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"input": []}, 400, "empty_input"),
        ({"input": ["fine", "  "]}, 400, "empty_input"),
        ({"input": ["x"] * 129}, 413, "embedding_batch_too_large"),
        ({"input": "x" * 8193}, 413, "embedding_input_too_large"),
        ({"input": ["word " * 1600] * 9}, 413, "embedding_request_too_large"),
        # within the seed's limits, past the model's 256-token window: refused, never truncated
        ({"input": "word " * 300}, 400, "context_length_exceeded"),
        ({"input": "word " * 300, "truncate": False}, 400, "context_length_exceeded"),
    ],
)
def test_bad_input_keeps_the_seed_table(srv, body, status, code):
    r = _embed(srv, **body)
    assert r.status_code == status and r.json()["code"] == code, r.text
    assert _embed(srv, input="still fine").status_code == 200  # nothing left behind


def test_chat_and_generation_are_refused_as_ollama_refuses_them(srv):
    oc = ollama.Client(host=srv.url)
    for call, what in (
        (lambda: oc.chat(model=MINILM, messages=[{"role": "user", "content": "hi"}]), "chat"),
        (lambda: oc.generate(model=MINILM, prompt="hi"), "generate"),
        (lambda: oc.generate(model=MINILM), "generate"),  # an empty generate (a load) too
    ):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        # Ollama's words; greenroom's envelope adds the request id, as the spec's errors do
        assert err.value.status_code == 400 and err.value.error.startswith(f'"{MINILM}" does not support {what} (')
    # `ollama stop` (no prompt, keep_alive 0) unloads it, as Ollama answers an unload before it asks
    assert oc.generate(model=MINILM, keep_alive=0).done_reason == "unload"
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    for call in (
        lambda: client.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}]),
        lambda: client.completions.create(model=MINILM, prompt="hi"),
        lambda: client.responses.create(model=MINILM, input="hi"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["code"] == "unsupported_capability"
    # nor is it steered: an SAE is refused before anything is read
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MINILM, "sae": "random:384:3"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "steering_unsupported", r.text
    assert "embedding model" in r.json()["error"]["message"]
    messages = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="does not support chat"):
        messages.messages.create(model=MINILM, max_tokens=5, messages=[{"role": "user", "content": "hi"}])


def test_show_tags_and_models_describe_it(srv):
    oc = ollama.Client(host=srv.url)
    shown = oc.show(MINILM)
    assert shown.capabilities == ["embedding"]  # how Open WebUI tells an embedding model
    assert shown.details.family == "bert" and shown.template == ""
    info = shown.modelinfo
    assert info["general.architecture"] == "bert" and info["bert.embedding_length"] == 384
    assert info["bert.context_length"] == 256  # sentence_bert_config.json's max_seq_length
    assert info["general.parameter_count"] == 22_713_216
    assert "completion" in oc.show("greenroom-demo").capabilities  # a causal LM still generates
    tags = {m.model: m for m in oc.list().models}
    assert tags[MINILM].details.family == "bert" and tags[MINILM].size > 80_000_000
    ids = [m.id for m in openai.OpenAI(base_url=srv.url + "/v1", api_key="x").models.list()]
    assert MINILM in ids
