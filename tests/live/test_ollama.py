"""The Ollama /api surface, driven by the real `ollama` Python client (and raw httpx where
the exact wire matters): generate and chat streamed and not, embeddings and their
validation table, tags/show/ps/version, options on the wire, the flat error envelope."""

import datetime
import json
import math
import os
import re
import signal
import struct
import time

import http_sf
import httpx
import ollama
import pytest
from conftest import MODEL, UNENDING

METRICS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


@pytest.fixture
def oc(server):
    return ollama.Client(host=server.url, timeout=60)


def post(server, path, body, **kw):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, timeout=60, **kw)


def flat(r, status, code, message=None):
    """Ollama's flat envelope, with the request id the response names."""
    assert r.status_code == status, r.text
    rid = r.headers["X-Request-ID"]
    body = r.json()
    assert set(body) == {"error", "code"} and body["code"] == code, body
    assert body["error"].endswith(f" (request id: {rid})"), body
    if message is not None:
        assert body["error"] == f"{message} (request id: {rid})"
    return body["error"]


def lines(r) -> list[dict]:
    return [json.loads(line) for line in r.iter_lines() if line]


def rfc3339(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- generate and chat -----------------------------------------------------------------------


def test_generate_streamed_and_not_agree(oc):
    options = {"num_predict": 12, "seed": 0}  # one seed: the two runs are the same sampling
    whole = oc.generate(model=MODEL, prompt="Once upon a time", options=options)
    parts = list(oc.generate(model=MODEL, prompt="Once upon a time", options=options, stream=True))
    assert whole.done and whole.done_reason in ("stop", "length") and whole.response
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.response for p in parts) == whole.response
    last = parts[-1]
    assert last.done_reason == whole.done_reason and last.eval_count == whole.eval_count <= 12
    assert whole.prompt_eval_count == last.prompt_eval_count > 0
    assert whole.total_duration >= whole.eval_duration > 0 and whole.prompt_eval_duration > 0
    assert abs(rfc3339(whole.created_at) - datetime.datetime.now(datetime.UTC)).total_seconds() < 60


def test_chat_streamed_and_not_agree(oc):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    whole = oc.chat(model=MODEL, messages=messages, options={"num_predict": 10, "seed": 3})
    parts = list(oc.chat(model=MODEL, messages=messages, options={"num_predict": 10, "seed": 3}, stream=True))
    assert whole.message.role == "assistant" and whole.message.content and whole.done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].done_reason == whole.done_reason and parts[-1].eval_count <= 10


def test_stream_is_the_default_and_ndjson_with_ollama_final_fields(server):
    with httpx.stream(
        "POST",
        server.url + "/api/generate",
        timeout=60,
        json={"model": MODEL, "prompt": "Hi", "options": {"num_predict": 4}},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        assert r.headers["X-Request-ID"]
        frames = lines(r)
    final = frames[-1]
    assert final["done"] is True and final["done_reason"] in ("stop", "length") and final["response"] == ""
    assert all(isinstance(final[k], int) for k in METRICS) and final["model"] == MODEL
    assert all(f["done"] is False and "response" in f for f in frames[:-1])


def test_load_requests_answer_done_without_text(oc, server):
    r = oc.generate(model=MODEL)
    assert r.done and r.done_reason == "load" and r.response == ""
    r = post(server, "/api/chat", {"model": MODEL, "messages": []})
    assert r.json()["done"] is True and r.json()["message"] == {"role": "assistant", "content": ""}


def test_raw_and_template_prompts(oc):
    turn = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    greedy = {"num_predict": 6, "temperature": 0, "repeat_penalty": 1.0}  # the top token is the one drawn
    raw = oc.generate(model=MODEL, prompt=turn.format("Hi"), raw=True, options=greedy)
    templated = oc.generate(
        model=MODEL, prompt="Hi", options=greedy, template=turn.format("{{ .Prompt }}") + "{{ .Response }}"
    )
    assert raw.response == templated.response and raw.prompt_eval_count == templated.prompt_eval_count


def test_format_json_schema_is_enforced_streamed_and_not(oc):
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["humor", "not_humor"]}},
        "required": ["label"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Classify: a joke"}]
    r = oc.chat(model=MODEL, messages=messages, format=schema, options={"num_predict": 200})
    assert r.done_reason == "stop" and json.loads(r.message.content)["label"] in ("humor", "not_humor")
    parts = list(oc.chat(model=MODEL, messages=messages, format=schema, options={"num_predict": 200}, stream=True))
    assert json.loads("".join(p.message.content for p in parts))["label"] in ("humor", "not_humor")


def test_tools_and_tool_results_are_rendered(oc):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    r = oc.chat(
        model=MODEL,
        tools=tools,
        options={"num_predict": 8},
        messages=[
            {"role": "user", "content": "Weather in Lagos?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Lagos"}}}],
            },
            {"role": "tool", "content": "31 C, sunny", "tool_name": "get_weather"},
        ],
    )
    assert r.done and r.message.role == "assistant"


# --- options on the wire ---------------------------------------------------------------------


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0"])
def test_logprobs_and_top_logprobs_streamed_and_not(oc, model):
    """Each generated token's log-probability and the most probable at its position, as Ollama
    writes them; streamed, every line carries the tokens it writes, and the two agree."""
    greedy = {"num_predict": 6, "temperature": 0, "repeat_penalty": 1.0}  # the top token is the one drawn
    whole = oc.generate(model=model, prompt="Once upon a time", logprobs=True, top_logprobs=3, options=greedy)
    assert len(whole.logprobs) == whole.eval_count == 6 and whole.done_reason == "length"
    for entry in whole.logprobs:
        alternatives = [(alt.token, alt.logprob) for alt in entry.top_logprobs]
        assert len(alternatives) == 3 and alternatives[0] == (entry.token, entry.logprob)  # greedy: the top one
        assert [lp for _, lp in alternatives] == sorted((lp for _, lp in alternatives), reverse=True)
        assert sum(math.exp(lp) for _, lp in alternatives) <= 1 + 1e-6 and entry.logprob <= 0
    streamed = [
        e
        for part in oc.generate(
            model=model, prompt="Once upon a time", logprobs=True, top_logprobs=3, options=greedy, stream=True
        )
        for e in part.logprobs or ()
    ]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in whole.logprobs
    ]
    chat = oc.chat(model=model, messages=[{"role": "user", "content": "Hi"}], logprobs=True, options=greedy)
    assert len(chat.logprobs) == 6 and all(not e.top_logprobs for e in chat.logprobs)
    assert oc.chat(model=model, messages=[{"role": "user", "content": "Hi"}], options=greedy).logprobs is None


def test_top_logprobs_alone_is_reported_and_its_bounds_are_typed(server):
    r = post(
        server,
        "/api/generate",
        {"model": MODEL, "prompt": "x", "stream": False, "top_logprobs": 2, "options": {"num_predict": 2}},
    )
    assert r.status_code == 200 and "logprobs" not in r.json(), r.text
    assert r.headers["X-miLLM-Ignored-Fields"] == '"top_logprobs"'
    for top in (21, -1, 1.5, "3"):
        body = {"model": MODEL, "prompt": "x", "logprobs": True, "top_logprobs": top}
        flat(post(server, "/api/generate", body), 400, "invalid_parameter")
    flat(post(server, "/api/chat", {"model": MODEL, "messages": [], "logprobs": "yes"}), 400, "invalid_parameter")


def test_seed_and_temperature(oc):
    def text(**options):
        return oc.generate(model=MODEL, prompt="Tell me a story", options={"num_predict": 16, **options}).response

    assert text(seed=7) == text(seed=7) != text(seed=8)
    assert text(temperature=0, seed=1) == text(temperature=0, seed=2)  # greedy: the seed draws nothing


DRAWN = "X-Greenroom-Drawn-Seed"


def drawn(r: httpx.Response) -> int:
    """The seed X-Greenroom-Drawn-Seed reports, in X-miLLM-Seed's RFC 8941 form."""
    seed, params = http_sf.parse(r.headers[DRAWN].encode(), tltype="item")
    assert params == {"scope": "request"} and 0 <= seed < 2**32, r.headers[DRAWN]
    return seed


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0"])
def test_an_unseeded_request_draws_its_own_seed_and_echoes_it(server, model):
    """Ollama's default seed is -1, random: Open WebUI's Regenerate (no seed) answers anew, and
    the seed drawn for it, sent back, reproduces the answer byte for byte (transformers' serial
    path, llama.cpp's batch of sequences that each sample alone)."""

    def generate(**options) -> httpx.Response:
        options = {"num_predict": 40, "temperature": 1.0, "top_k": 0, "top_p": 1.0, **options}
        r = post(
            server, "/api/generate", {"model": model, "prompt": "Tell me a story", "stream": False, "options": options}
        )
        assert r.status_code == 200, r.text
        return r

    answers = [generate(), generate(), generate(seed=-1)]  # -1, sent: random too
    texts = [r.json()["response"] for r in answers]
    assert len(set(texts)) == 3 and len({drawn(r) for r in answers}) == 3, texts
    for r in answers:
        again = generate(seed=drawn(r))
        assert DRAWN not in again.headers and again.json()["response"] == r.json()["response"]
        assert again.json()["eval_count"] == r.json()["eval_count"]
    with httpx.stream(
        "POST",
        server.url + "/api/chat",
        timeout=60,
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 20}},
    ) as streamed:
        seed = drawn(streamed)
        text = "".join(line["message"]["content"] for line in lines(streamed))
    replay = post(
        server,
        "/api/chat",
        {
            "model": model,
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": False,
            "options": {"num_predict": 20, "seed": seed},
        },
    )
    assert replay.json()["message"]["content"] == text


def test_num_predict_is_honoured(oc):
    r = oc.generate(model=MODEL, prompt="Count", options={"num_predict": 3})
    assert r.eval_count == 3 and r.done_reason == "length" or r.eval_count < 3 and r.done_reason == "stop"


def test_num_predict_minus_one_fills_the_requested_window(oc):
    r = oc.generate(model=MODEL, prompt="Go", options={"num_predict": -1, "num_ctx": 48})
    assert r.prompt_eval_count + r.eval_count == 48 or r.done_reason == "stop"


def test_num_ctx_is_clamped_as_ollama_clamps_it(server, oc):
    """0, a negative or a window past the model's (Open WebUI users set large ones) is not a 400:
    capped at the model's trained window (32768), raised to 4, the value used in X-Greenroom-Num-Ctx."""

    def run(**options) -> httpx.Response:
        body = {"model": MODEL, "prompt": "Once upon a time", "stream": False}
        r = post(server, "/api/generate", {**body, "options": {**options, "num_predict": 8, "temperature": 0}})
        assert r.status_code == 200, r.text
        return r

    capped = run(num_ctx=1_000_000)
    assert capped.headers["X-Greenroom-Num-Ctx"] == "32768" and "X-Greenroom-Truncated" not in capped.headers
    assert capped.json()["response"] == run(num_ctx=32768).json()["response"]
    assert run().headers["X-Greenroom-Num-Ctx"] == "2048"  # the default
    for small in (0, -1, 3):
        r = run(num_ctx=small)
        assert r.headers["X-Greenroom-Num-Ctx"] == "4" and r.json()["prompt_eval_count"] <= 4, small
    streamed = oc.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}], options={"num_ctx": 2**40})
    assert streamed.done
    flat(
        post(server, "/api/generate", {"model": MODEL, "prompt": "x", "options": {"num_ctx": 2**63}}),
        400,
        "invalid_parameter",
    )


def test_a_prompt_past_num_ctx_is_cut_by_ollamas_rule(server):
    """Ollama never refuses a long prompt: the oldest messages go (never a system one nor the
    last), then the prompt's middle; X-Greenroom-Truncated says what went."""
    messages = [{"role": "system", "content": "Be brief."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 20} for i in range(9)
    ]
    r = httpx.post(
        server.url + "/api/chat",
        timeout=60,
        json={"model": MODEL, "stream": False, "messages": messages, "options": {"num_ctx": 256, "num_predict": 8}},
    )
    assert r.status_code == 200, r.text
    dropped = http_sf.parse(r.headers["X-Greenroom-Truncated"].encode(), tltype="dictionary")
    assert dropped["messages"][0] > 0 and dropped["tokens"] == (0, {})
    body = r.json()
    assert body["prompt_eval_count"] <= 256 - 8 and body["eval_count"] <= 8
    # one message longer than the window: its middle goes, its first num_keep tokens stay
    r = httpx.post(
        server.url + "/api/generate",
        timeout=60,
        json={
            "model": MODEL,
            "stream": False,
            "prompt": "word " * 600,
            "raw": True,
            "options": {"num_ctx": 128, "num_predict": 4, "num_keep": 10},
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["X-Greenroom-Truncated"].startswith("messages=0, tokens=")
    assert r.json()["prompt_eval_count"] == 128 - 4
    # the answer never passes the window: num_predict above it stops at the window
    r = httpx.post(
        server.url + "/api/generate",
        timeout=60,
        json={"model": MODEL, "stream": False, "prompt": "x", "options": {"num_predict": 4000, "num_ctx": 64}},
    )
    assert r.status_code == 200 and r.json()["prompt_eval_count"] + r.json()["eval_count"] <= 64
    assert "X-Greenroom-Truncated" not in r.headers


def test_unapplied_and_unknown_options_are_reported(server):
    r = post(
        server,
        "/api/generate",
        {
            "model": MODEL,
            "prompt": "x",
            "stream": False,
            "options": {"num_predict": 2, "top_k": 5, "mirostat": 0, "min_p": 0.2, "bogus": 1},
            "keep_alive": -1,
        },
    )
    assert r.status_code == 200
    reported = r.headers["X-miLLM-Ignored-Fields"]
    assert all(f'"{f}"' in reported for f in ("options.min_p", "options.bogus"))
    assert "keep_alive" not in reported  # honoured (see test_model_lifecycle.py)
    assert "mirostat" not in reported and "top_k" not in reported  # a no-change value; honoured
    r = post(
        server,
        "/api/generate",
        {"model": MODEL, "prompt": "x", "options": {"min_p": 0.3}},
        headers={"X-miLLM-Strict": "true"},
    )
    flat(r, 400, "unused_fields_refused")


@pytest.mark.parametrize(
    "options,where",
    [
        ({"temperature": "hot"}, "options.temperature"),
        ({"num_predict": 1.5}, "options.num_predict"),
        ({"top_p": 2}, "options.top_p"),
        ({"stop": [1]}, "options.stop"),
        ({"num_predict": -3}, "options.num_predict"),
        ({"repeat_penalty": 0}, "options.repeat_penalty"),
        ({"seed": 2**40}, "options.seed"),
    ],
)
def test_bad_option_values_are_typed_400(server, options, where):
    assert where in flat(
        post(server, "/api/generate", {"model": MODEL, "prompt": "x", "options": options}), 400, "invalid_parameter"
    )


# --- embeddings ------------------------------------------------------------------------------


def test_embed_and_legacy_embeddings(oc):
    r = oc.embed(model=MODEL, input=["alpha", "beta", "alpha"])
    assert len(r.embeddings) == 3 and r.embeddings[0] == r.embeddings[2] != r.embeddings[1]
    assert all(abs(math.hypot(*v) - 1) < 1e-4 for v in r.embeddings)  # Ollama's /api/embed normalises
    assert r.prompt_eval_count > 0 and r.total_duration > 0
    legacy = oc.embeddings(model=MODEL, prompt="alpha").embedding
    norm = math.hypot(*legacy)
    assert len(legacy) == 128 and [x / norm for x in legacy] == pytest.approx(r.embeddings[0], abs=1e-5)
    assert len(oc.embed(model=MODEL, input="alpha", dimensions=16).embeddings[0]) == 16


def test_embed_prints_float32_as_ollama_does(server):
    """Ollama's /api/embed answers []float32: each number the shortest text that reads back its
    float32 (half the bytes of a float64's 17 digits); the legacy /api/embeddings a float64 of it."""

    def is_float32(x: float) -> bool:
        return struct.unpack("<f", struct.pack("<f", x))[0] == x

    r = post(server, "/api/embed", {"model": MODEL, "input": ["alpha", "beta"], "dimensions": 16})
    texts = re.findall(r"-?\d[\d.e+-]*", r.text[r.text.index('"embeddings"') :].split("]]")[0])
    # 9 significant digits tell every float32 apart; a float64 takes up to 17
    assert len(texts) == 32 and max(len(re.sub(r"e.*|[-.]", "", t).lstrip("0")) for t in texts) <= 9
    legacy = post(server, "/api/embeddings", {"model": MODEL, "prompt": "alpha"}).json()["embedding"]
    assert all(is_float32(x) for x in legacy)


@pytest.mark.parametrize("dimensions,length", [(16, 16), (0, 128), (-3, 128), (128, 128), (4096, 128)])
def test_embed_dimensions_are_read_as_ollama_reads_them(server, dimensions, length):
    """From 1 to below the width: the vector cut and normalised again; otherwise the whole vector."""
    whole = post(server, "/api/embed", {"model": MODEL, "input": "alpha"}).json()["embeddings"][0]
    r = post(server, "/api/embed", {"model": MODEL, "input": "alpha", "dimensions": dimensions})
    assert r.status_code == 200 and r.headers["X-Greenroom-Dimensions"] == str(length), r.text
    (vector,) = r.json()["embeddings"]
    norm = math.hypot(*whole[:length])
    assert len(vector) == length and vector == pytest.approx([x / norm for x in whole[:length]], abs=1e-6)


EMBED_ROWS = [  # the validation table: status, code, message, exact
    ("/api/embed", {"input": []}, 400, "empty_input", "Embedding input must contain at least one item"),
    ("/api/embed", {"input": ["x"] * 129}, 413, "embedding_batch_too_large", "Embedding input batch is too large"),
    ("/api/embed", {"input": ["ok", " \n\t"]}, 400, "empty_input", "Embedding input text must not be empty"),
    ("/api/embed", {"input": ""}, 400, "empty_input", "Embedding input text must not be empty"),
    ("/api/embed", {"input": "x" * 8193}, 413, "embedding_input_too_large", "Embedding input text is too large"),
    ("/api/embed", {"input": ["x" * 8000] * 9}, 413, "embedding_request_too_large", "Embedding request is too large"),
    ("/api/embeddings", {"prompt": "   "}, 400, "empty_input", "Embedding input text must not be empty"),
    ("/api/embeddings", {"prompt": "x" * 8193}, 413, "embedding_input_too_large", "Embedding input text is too large"),
]


@pytest.mark.parametrize("path,body,status,code,message", EMBED_ROWS)
def test_embedding_validation_table(server, path, body, status, code, message):
    before = server.actors()["cpu"]["counters"]["admitted"]
    r = post(server, path, {"model": MODEL, **body}, headers={"X-Request-ID": "client-id-42"})
    assert r.headers["X-Request-ID"] == "client-id-42"
    flat(r, status, code, message)
    assert server.actors()["cpu"]["counters"]["admitted"] == before  # refused before the engine was asked


def test_embedding_batch_limit_is_inclusive(oc):
    assert len(oc.embed(model=MODEL, input=["x"] * 128).embeddings) == 128


# --- models ----------------------------------------------------------------------------------


def test_list_show_ps_version(oc, server):
    listed = {m.model: m for m in oc.list().models}
    demo = listed[MODEL]
    assert demo.size > 0 and len(demo.digest) == 64 and demo.details.family == "llama"
    assert demo.details.format == "safetensors" and demo.details.quantization_level == "F32"
    shown = oc.show(MODEL)
    assert "<|im_start|>" in shown.template and shown.modelfile.startswith("# Modelfile")
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 32768
    assert shown.modelinfo["llama.embedding_length"] == 128 and shown.modelinfo["general.parameter_count"] > 0
    assert "temperature" in shown.parameters and "num_ctx" in shown.parameters
    assert shown.details.parameter_size == demo.details.parameter_size
    running = {m.model: m for m in oc.ps().models}[MODEL]
    assert running.context_length == 32768 and running.size_vram == 0
    # loaded, its size is what it takes (its actor's report): at least its float32 weights
    footprint = {m["id"]: m for m in httpx.get(server.url + "/api/models").json()["models"]}[MODEL]["footprint_bytes"]
    assert running.size == footprint >= shown.modelinfo["general.parameter_count"] * 4
    assert running.expires_at > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    assert httpx.get(server.url + "/api/version").json() == {"version": "0.2.0-npu-proxy"}  # the spec's value
    assert oc.show(MODEL + ":latest").modelinfo == shown.modelinfo  # Ollama's default tag


def _files(path) -> list:
    return [
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    ]


def test_each_format_is_listed_and_shown_from_its_files(oc, server, model_cache):
    """transformers (safetensors), GGUF and a not-yet-loaded OpenVINO directory: sizes, mtimes,
    formats, family lists and parameter sizes read from the files, none of them loaded for it."""
    from greenroom.engines.capabilities import ENGINES
    from greenroom.engines.demo.demo_gguf import demo_gguf_path
    from greenroom.engines.demo.demo_model import default_cache_dir, demo_model_dir
    from greenroom.engines.demo.demo_openvino import demo_openvino_dir

    cache = default_cache_dir(model_cache)
    checkpoint, gguf_file, ir = demo_model_dir(cache), demo_gguf_path(cache, "Q8_0"), demo_openvino_dir(cache)
    listed = {m.model: m for m in oc.list().models}
    hf, q8, npu = listed[MODEL], listed["greenroom-demo-gguf:Q8_0"], listed["greenroom-demo-npu"]
    for model, files in ((hf, _files(checkpoint)), (q8, [gguf_file]), (npu, _files(ir))):
        assert model.size == sum(f.stat().st_size for f in files), model.model
        newest = max(f.stat().st_mtime for f in files)
        assert model.modified_at.timestamp() == pytest.approx(newest, abs=1e-6), model.model
        assert model.details.families == ["llama"] and model.details.family == "llama"
        assert len(model.digest) == 64
    assert (hf.details.format, q8.details.format, npu.details.format) == ("safetensors", "gguf", "openvino")
    assert q8.details.parameter_size == hf.details.parameter_size  # the same weights, counted from each file
    assert (q8.details.quantization_level, npu.details.quantization_level) == ("Q8_0", "F32")
    assert npu.details.parameter_size == ""  # an IR's constants are no exact parameter count

    shown = oc.show("greenroom-demo-gguf:Q8_0")
    assert f"\nFROM {gguf_file}\n" in shown.modelfile
    assert shown.template == (checkpoint / "chat_template.jinja").read_text()
    trained = json.loads((checkpoint / "config.json").read_text())["max_position_embeddings"]
    assert shown.details == q8.details and shown.modelinfo["llama.context_length"] == trained
    assert shown.modelinfo["general.parameter_count"] == oc.show(MODEL).modelinfo["general.parameter_count"]
    assert shown.capabilities == ["completion"] + (["tools"] if ENGINES["llama.cpp"].tools else [])
    assert oc.show(MODEL).capabilities == ["completion", "tools"]
    ov = oc.show("greenroom-demo-npu")
    assert "\nFROM greenroom-demo-npu\n" in ov.modelfile and ov.details == npu.details  # a directory: by name
    assert ov.modelinfo["general.architecture"] == "llama" and ov.modelinfo["llama.embedding_length"] == 128
    assert "general.parameter_count" not in ov.modelinfo
    assert ov.capabilities == ["completion"] + (["tools"] if ENGINES["openvino"].tools else [])


# --- errors ----------------------------------------------------------------------------------


def test_unknown_model_is_404_through_the_client(oc, server):
    with pytest.raises(ollama.ResponseError) as exc:
        oc.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 404 and exc.value.error.startswith("model 'no-such-model' not found")
    flat(post(server, "/api/show", {"model": "nope"}), 404, "model_not_found")


@pytest.mark.parametrize(
    "path,body,status,code",
    [
        ("/api/generate", b"{not json", 400, "invalid_json"),
        ("/api/chat", b"[1]", 400, "invalid_json"),
        ("/api/generate", {"prompt": "x"}, 400, "missing_parameter"),
        ("/api/embed", {"model": MODEL}, 400, "missing_parameter"),
        ("/api/embeddings", {"model": MODEL}, 400, "missing_parameter"),
        ("/api/chat", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_parameter"),
        ("/api/chat", {"model": MODEL, "messages": "hi"}, 400, "invalid_parameter"),
        ("/api/generate", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "invalid_parameter"),
        ("/api/generate", {"model": MODEL, "prompt": "x", "format": "yaml"}, 400, "invalid_parameter"),
        (
            "/api/generate",
            {"model": MODEL, "prompt": "x", "format": {"type": "object", "oneOf": []}},
            400,
            "response_format_unsupported",
        ),
        ("/api/generate", {"model": MODEL, "prompt": "x", "images": ["aGk="]}, 400, "field_not_honoured"),
        (
            "/api/chat",
            {"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            400,
            "field_not_honoured",
        ),
        ("/api/generate", {"model": MODEL, "prompt": "x", "keep_alive": "soon"}, 400, "invalid_parameter"),
        ("/api/embeddings", {"model": MODEL, "prompt": ["x"]}, 400, "invalid_parameter"),
        (
            "/api/chat",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "format": "json",
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            400,
            "invalid_parameter",
        ),
        (
            "/api/generate",
            {"model": MODEL, "prompt": "x", "template": '{{ template "x" }}{{ .Prompt }}'},
            400,
            "field_not_honoured",
        ),
    ],
)
def test_bad_requests_are_typed_in_the_flat_envelope(server, path, body, status, code):
    flat(post(server, path, body), status, code)


def test_unknown_route_and_method_are_flat_and_v1_keeps_openai_envelope(server):
    flat(httpx.get(server.url + "/api/nothing"), 404, "not_found", "404 page not found")  # Ollama's (gin's) words
    # a wrong method too, as Ollama answers it
    flat(httpx.get(server.url + "/api/generate"), 404, "not_found", "404 page not found (/api/generate answers POST)")
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{bad", timeout=30)
    assert r.json()["error"]["code"] == "invalid_json" and r.headers["X-Request-ID"]


def test_kill_engine_mid_stream_ends_with_the_error_object(own_server):
    srv = own_server()
    body = {"model": MODEL, "prompt": "Go", "options": {"num_predict": 1800, **UNENDING}}
    with httpx.stream("POST", srv.url + "/api/generate", json=body, timeout=60) as r:
        frames = []
        for line in r.iter_lines():
            frames.append(json.loads(line))
            if len(frames) == 2:
                os.kill(srv.actors()["cpu"]["pid"], signal.SIGKILL)
    last = frames[-1]
    assert set(last) == {"error", "code"} and last["code"] == "engine_crashed", last
    assert last["error"].endswith(f"(request id: {r.headers['X-Request-ID']})")
    assert not any(f.get("done") for f in frames)
    # the real client raises it; the restarted engine serves the next request
    oc = ollama.Client(host=srv.url, timeout=60)
    with pytest.raises(ollama.ResponseError) as exc:
        for i, _part in enumerate(
            oc.generate(model=MODEL, prompt="Go", options={"num_predict": 1800, **UNENDING}, stream=True)
        ):
            if i == 1:
                os.kill(srv.actors()["cpu"]["pid"], signal.SIGKILL)
    assert "died" in exc.value.error
    deadline = time.monotonic() + 30
    while srv.actors()["cpu"]["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert oc.generate(model=MODEL, prompt="Hi", options={"num_predict": 2}).done
