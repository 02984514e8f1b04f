"""The OpenVINO GenAI engine in-process: the demo model's IR on the CPU device and through
the NPU pipeline, which runs on the CPU here (NPUW_DEVICES=CPU) — generating, streaming,
cancelling, seeds, embeddings and the NPU pipeline's prompt limit; then the same model placed
on the `cpu` engine actor of a live server (engine "openvino")."""

import threading
import time

import httpx
import numpy as np
import pytest
from conftest import UNENDING

from greenroom.engines.base import EngineError, SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.demo.demo_openvino import EMBEDDING_SUBDIR, ensure_demo_openvino, export_llama
from greenroom.engines.generation import generate
from greenroom.engines.loader import load_engine
from greenroom.engines.openvino.openvino_engine import openvino_device

PROMPT = "Once upon a time"
MAX_PROMPT_LEN, MIN_RESPONSE_LEN = 64, 64


def load(device: str, **spec):
    return load_engine(
        {"id": "greenroom-demo", "source": "demo-openvino:tiny", "engine": "openvino", "device": device} | spec
    )


@pytest.fixture(scope="module")
def cpu(model_cache):
    # float32: the IR then computes what the checkpoint does (the CPU's default here is bf16)
    return load("cpu", dtype="float32")


@pytest.fixture(scope="module")
def npu(model_cache):
    return load("npu:0", max_prompt_len=MAX_PROMPT_LEN, min_response_len=MIN_RESPONSE_LEN)


@pytest.fixture(scope="module", params=["cpu", "npu"])
def engine(request):
    return request.getfixturevalue(request.param)


def run(engine, params, prompt=PROMPT):
    deltas = list(generate(engine, engine.tokenize(prompt), params))
    return "".join(d.text for d in deltas), deltas


def test_device_strings():
    assert openvino_device("cpu") == ("CPU", False)
    assert openvino_device("npu:0") == ("NPU", True) == openvino_device("npu")  # no NPU here: the stand-in
    for bad in ("gpu", "cuda:0", "npu:x", "cpu:1"):
        with pytest.raises(ValueError):
            openvino_device(bad)


def test_demo_export_is_deterministic_and_cached(model_cache, tmp_path):
    cache = default_cache_dir()
    built = ensure_demo_openvino(cache)
    again = export_llama(ensure_demo_model(cache), tmp_path / "again")
    for name in ("openvino_model.bin", "openvino_model.xml", f"{EMBEDDING_SUBDIR}/openvino_model.bin"):
        assert (built / name).read_bytes() == (again / name).read_bytes(), name
    stamp = (built / "openvino_model.bin").stat().st_mtime_ns
    assert ensure_demo_openvino(cache) == built and (built / "openvino_model.bin").stat().st_mtime_ns == stamp


def test_info(cpu, npu):
    assert (cpu.info.engine, cpu.info.device, cpu.info.dtype, cpu.info.context_length) == (
        "openvino",
        "CPU",
        "float32",
        32768,
    )
    assert cpu.info.revision.startswith("demo-tiny-") and cpu.info.quantization == "F32"
    # the NPU pipeline's KV cache is its window: the NPU stand-in computes on the CPU
    assert (npu.info.device, npu.info.context_length) == ("CPU", MAX_PROMPT_LEN + MIN_RESPONSE_LEN)
    assert (
        cpu.eos_token_ids
        == npu.eos_token_ids
        == frozenset(cpu.tokenize("<|im_end|><|end_of_text|>", add_special_tokens=False))
    )


def test_same_ids_as_the_transformers_engine(cpu):
    """The exported graph is the checkpoint's forward pass: tokeniser, chat template (with the
    continue rule) and greedy decoding agree with transformers token for token."""
    from greenroom.engines.transformers.transformers_engine import TransformersEngine

    hf = TransformersEngine("greenroom-demo", ensure_demo_model(default_cache_dir()))
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me a story"},
        {"role": "assistant", "content": "The lighthouse keeper"},
    ]
    for text in (PROMPT, 'café <tool_call>{"a": 1}</tool_call>\n\tdef f():'):
        assert cpu.tokenize(text) == hf.tokenize(text)
        assert cpu.tokenize(text, add_special_tokens=False) == hf.tokenize(text, add_special_tokens=False)
    ids = cpu.render_chat(chat)
    assert ids == hf.render_chat(chat)
    greedy = SamplingParams(max_tokens=40, temperature=0)
    assert [t for (t, *_), _ in zip(cpu.generate_ids(ids, greedy), range(40))] == [
        t for (t, *_), _ in zip(hf.generate_ids(ids, greedy), range(40))
    ]
    mine, theirs = cpu.embed([cpu.tokenize(PROMPT)])[0], hf.embed([hf.tokenize(PROMPT)])[0]
    np.testing.assert_allclose(mine, theirs, atol=1e-5)


def test_greedy_is_deterministic_and_honours_max_tokens(engine):
    a, deltas = run(engine, SamplingParams(max_tokens=12, temperature=0))
    b, _ = run(engine, SamplingParams(max_tokens=12, temperature=0))
    assert a == b and a
    assert deltas[-1].completion_tokens == 12 and deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_stop_string_finishes_with_stop(engine):
    text, _ = run(engine, SamplingParams(max_tokens=20, temperature=0))
    stop = text[6:10]
    cut, deltas = run(engine, SamplingParams(max_tokens=20, temperature=0, stop=(stop,)))
    assert deltas[-1].finish_reason == "stop" and cut == text[: text.index(stop)]


def test_streamed_ids_are_the_text(engine):
    ids = engine.tokenize(PROMPT)
    params = SamplingParams(max_tokens=16, temperature=0)
    streamed = [t for t, *_ in engine.generate_ids(ids, params)]
    assert len(streamed) == 16  # the pipeline itself stops at max_new_tokens
    text, _ = run(engine, params)
    assert engine.decode(streamed) == text


def test_cancel_stops_at_once_and_frees_the_pipeline(engine):
    ids = engine.tokenize(PROMPT)
    room = engine.info.context_length - len(ids)
    steps = engine.generate_ids(ids, SamplingParams(max_tokens=room, temperature=0))
    first = [next(steps)[0] for _ in range(3)]
    started = time.monotonic()
    steps.close()
    assert time.monotonic() - started < 1.0  # one token's work, not the other ~room of them
    assert not [t for t in threading.enumerate() if t.name == "openvino-generate"]
    # usable at once (a pipeline still running would refuse a second caller)
    again = [t for t, *_ in engine.generate_ids(ids, SamplingParams(max_tokens=3, temperature=0))]
    assert again == first


def test_seeds_reproduce(engine):
    p = dict(max_tokens=24, temperature=1.0)
    a, _ = run(engine, SamplingParams(**p, seed=7))
    b, _ = run(engine, SamplingParams(**p, seed=7))
    c, _ = run(engine, SamplingParams(**p, seed=8))
    assert a == b and a != c
    unseeded = {run(engine, SamplingParams(**p))[0] for _ in range(3)}
    assert len(unseeded) > 1


def test_repetition_penalty_changes_greedy_text(engine):
    # the prompt is the model's own greedy continuation: a penalised token is soon one of it
    text, _ = run(engine, SamplingParams(max_tokens=30, temperature=0))
    plain, _ = run(engine, SamplingParams(max_tokens=30, temperature=0), prompt=PROMPT + text)
    penalised, _ = run(
        engine, SamplingParams(max_tokens=30, temperature=0, repetition_penalty=3.0), prompt=PROMPT + text
    )
    assert plain != penalised


def test_embeddings(cpu, npu):
    rows = [cpu.tokenize(PROMPT), cpu.tokenize("The capital of France is Paris.")]
    assert cpu.tokenize_many([PROMPT, "The capital of France is Paris."]) == rows  # one call
    on_cpu = np.array(cpu.embed(rows))
    assert on_cpu.shape == (2, 128) and not np.allclose(on_cpu[0], on_cpu[1])
    # the NPU pipeline's static, padded rows pool to the same means (up to its precision)
    np.testing.assert_allclose(np.array(npu.embed(rows)), on_cpu, atol=0.05)
    # a token array that is no text's tokenisation: the text pipeline cannot embed it
    pieces = cpu.tokenize("Onc", add_special_tokens=False) + cpu.tokenize("e", add_special_tokens=False)
    with pytest.raises(EngineError) as refused:
        cpu.embed([pieces])
    assert (refused.value.code, refused.value.param) == ("invalid_parameter", "input")


def test_npu_prompt_limit_is_a_typed_refusal(npu):
    too_long = npu.tokenize(" ".join(["time"] * (MAX_PROMPT_LEN + 5)))[: MAX_PROMPT_LEN + 1]
    with pytest.raises(EngineError) as refused:
        next(npu.generate_ids(too_long, SamplingParams(max_tokens=4, temperature=0)))
    assert refused.value.code == "context_length_exceeded" and "MAX_PROMPT_LEN" in refused.value.message
    # a prompt of exactly the limit, answered up to the window's last token
    full = too_long[:MAX_PROMPT_LEN]
    _, deltas = run_ids(npu, full, SamplingParams(max_tokens=MIN_RESPONSE_LEN, temperature=0))
    assert (deltas[-1].completion_tokens, deltas[-1].finish_reason) == (MIN_RESPONSE_LEN, "length")


def run_ids(engine, ids, params):
    deltas = list(generate(engine, ids, params))
    return "".join(d.text for d in deltas), deltas


def test_npu_compiled_blobs_are_cached(model_cache, tmp_path):
    load(
        "npu",
        source=str(ensure_demo_openvino(default_cache_dir())),
        cache_dir=str(tmp_path),
        max_prompt_len=MAX_PROMPT_LEN,
        min_response_len=MIN_RESPONSE_LEN,
    )
    assert list((tmp_path / "openvino-cache").glob("*.blob"))


def test_no_embedding_graph_is_a_typed_refusal(model_cache, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(ensure_demo_openvino(default_cache_dir()), bare, ignore=shutil.ignore_patterns(EMBEDDING_SUBDIR))
    engine = load_engine({"id": "bare", "source": str(bare), "engine": "openvino", "device": "cpu"})
    with pytest.raises(EngineError) as refused:
        engine.embed([engine.tokenize(PROMPT)])
    assert (refused.value.code, refused.value.param) == ("field_not_honoured", "model")


# --- through a live server: the demo IR placed on the `cpu` engine actor with engine "openvino"

OV_MODEL = "greenroom-demo-openvino"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    from conftest import Server

    config = f'[[models]]\nid = "{OV_MODEL}"\nsource = "demo-openvino:tiny"\nengine = "openvino"\n'
    server = Server(tmp_path_factory.mktemp("openvino-server"), model_cache, config)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(srv):
    from openai import OpenAI

    return OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=60)


def test_served_chat_streamed_and_not(oai):
    chat = dict(model=OV_MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=12, seed=3)
    whole = oai.chat.completions.create(**chat)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    assert whole.system_fingerprint.endswith(":openvino")
    again = oai.chat.completions.create(**chat)
    assert again.choices[0].message.content == whole.choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in oai.chat.completions.create(**chat, stream=True) if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content


def test_needle_confidence_is_null_where_there_are_no_probabilities(oai):
    """OpenVINO's pipeline reports no token probabilities: x_needle says so, never 1.0."""
    r = oai.chat.completions.create(model=OV_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    x = r.model_extra["x_needle"]
    assert x["confidence"] is None
    assert any("confidence is null" in w for w in x["warnings"])


def test_tools_are_described_and_required_is_refused(oai):
    """Tools are honoured ("auto": rendered by the template, or described in the system
    message); a required call needs constrained decoding, which OpenVINO has not."""
    from openai import BadRequestError

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    r = oai.chat.completions.create(
        model=OV_MODEL, messages=[{"role": "user", "content": "Weather?"}], max_tokens=4, tools=tools
    )
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    with pytest.raises(BadRequestError) as refused:
        oai.chat.completions.create(
            model=OV_MODEL,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=4,
            tools=tools,
            tool_choice="required",
        )
    assert (
        refused.value.body["code"] == "field_not_honoured" and "constrained decoding" in refused.value.body["message"]
    )


def test_served_embeddings_and_refusals(srv, oai):
    from openai import BadRequestError

    vectors = oai.embeddings.create(model=OV_MODEL, input=[PROMPT, "hi"]).data
    assert [len(v.embedding) for v in vectors] == [128, 128]
    with pytest.raises(BadRequestError) as refused:
        oai.completions.create(model=OV_MODEL, prompt=PROMPT, max_tokens=1, logprobs=2)
    assert refused.value.body["code"] == "field_not_honoured"
    r = httpx.post(srv.url + "/api/generate", json={"model": OV_MODEL, "prompt": "x", "logprobs": True}, timeout=30)
    assert r.status_code == 400 and r.json()["code"] == "field_not_honoured", r.text  # no token probabilities


def test_served_disconnect_stops_generation(srv):
    import httpx

    before = srv.actors()["cpu"]["counters"]
    body = {
        "model": OV_MODEL,
        "messages": [{"role": "user", "content": "Talk"}],
        "max_tokens": 1800,
        "stream": True,
        **UNENDING,
    }
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 6:
                break  # leaving the block closes the connection
    counters = srv.after_cancel("cpu", before)
    assert counters["cancelled"] == before["cancelled"] + 1 and counters["active"] == 0
    assert counters["tokens_generated"] - before["tokens_generated"] < 200
