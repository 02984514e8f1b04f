"""Seeds on GGUF models, reproducible: the same seed, body and model give byte-identical text
whatever ran on the server before or beside the request — greedy answers too — with
gguf_parallel = 4 (sequences decoded together), through the real openai and ollama SDKs.

Before (one KV cache the sequences shared, any cached prefix reused): SmolLM2's greedy answer
to one prompt matched a fresh engine's after 1 of 10 rounds of unrelated traffic, and a
conversation continuing the model's own answer never did, even with gguf_parallel = 1
(llama_cpp_engine.py's docstring has the measurements and the rules that fixed it)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import ollama
import pytest
from conftest import GEMMA3, SMOLLM2_GGUF, Server, first_steps, reference_llama
from openai import OpenAI

SMOL = "smollm2-135m-instruct:Q4_1"
Q8 = "greenroom-demo-gguf:Q8_0"
QUESTION = [{"role": "user", "content": "Explain photosynthesis in one sentence."}]
WORDS = ("a dog", "the sea", "Paris", "a robot", "winter", "a cat who sings", "the moon", "bread")


def real_ggufs(gemma3) -> str:
    """The config of SmolLM2 Q4_1, the demo Q8_0 and Gemma 3, 4 sequences each (test_gguf_footprint.py too)."""
    return (
        "gguf_parallel = 4\n"
        f'[[models]]\nid = "{SMOL}"\nsource = "{SMOLLM2_GGUF}"\nengine = "llama.cpp"\nn_ctx = 2048\n'
        f'[[models]]\nid = "{Q8}"\nsource = "demo-gguf:Q8_0"\nengine = "llama.cpp"\nn_ctx = 2048\n'
        f'[[models]]\nid = "{GEMMA3}"\nsource = "{gemma3}"\nengine = "llama.cpp"\nn_ctx = 1024\n'
    )


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache, gemma3):
    server = Server(tmp_path_factory.mktemp("gguf-seeds"), model_cache, real_ggufs(gemma3))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(srv):
    return OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300)


def probes(srv, model: str, oai) -> dict:
    """What must reproduce: a seeded sampled chat, a greedy chat, a seeded text completion, a
    conversation continuing the model's own answer (its cells were decoded, not prefilled) and
    Ollama's options.seed; each probe's text and finish reason."""
    greedy = oai.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=32)
    answer = greedy.choices[0].message.content
    follow_up = QUESTION + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in French?"}]

    def chat(**kw):
        choice = oai.chat.completions.create(model=model, max_tokens=32, **kw).choices[0]
        return choice.message.content, choice.finish_reason

    out = {
        "greedy": (answer, greedy.choices[0].finish_reason),
        "seeded": chat(messages=QUESTION, temperature=0.9, seed=7),
        "seeded top_p": chat(messages=QUESTION, temperature=1.2, top_p=0.9, seed=123456789),
        "follow-up greedy": chat(messages=follow_up, temperature=0),
        "follow-up seeded": chat(messages=follow_up, temperature=0.9, seed=7),
    }
    done = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=24, seed=4294967295)
    out["completion"] = (done.choices[0].text, done.choices[0].finish_reason)
    reply = ollama.Client(host=srv.url, timeout=300).chat(
        model=model, messages=QUESTION, options={"seed": 11, "num_predict": 24}
    )
    out["ollama seed"] = (reply.message.content, reply.done_reason)
    return out


def traffic(srv, model: str, rounds: int, stop: threading.Event | None = None) -> None:
    """Unrelated requests, several at once: other prompts (some sharing the probes' prefix),
    penalties, streams, a stream dropped halfway."""
    oai = OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300)

    def one(i: int) -> None:
        messages = [{"role": "user", "content": f"Tell me a story about {WORDS[i % len(WORDS)]}."}]
        if i % 4 == 0:
            messages = QUESTION + [{"role": "assistant", "content": "Plants"}, {"role": "user", "content": "More."}]
        if i % 5 == 3:  # a stream whose client goes away
            with httpx.stream(
                "POST",
                srv.url + "/v1/chat/completions",
                timeout=300,
                json={"model": model, "messages": messages, "max_tokens": 200, "stream": True},
            ) as r:
                next(line for line in r.iter_lines() if line.startswith("data: {"))
            return
        oai.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=8 + 7 * (i % 6),
            temperature=0.8 if i % 2 else 0,
            frequency_penalty=0.5 * (i % 3),
            stream=False,
        )

    with ThreadPoolExecutor(6) as pool:
        for r in range(rounds):
            if stop is not None and stop.is_set():
                return
            list(pool.map(one, range(6 * r, 6 * r + 6)))


@pytest.mark.parametrize("model", [SMOL, Q8])
def test_answers_are_byte_identical_whatever_ran_before_or_beside(srv, oai, model):
    first = probes(srv, model, oai)
    assert first["seeded"] != first["greedy"]  # sampling, not greedy
    traffic(srv, model, rounds=3)
    assert probes(srv, model, oai) == first, "after unrelated traffic"
    # and while unrelated requests decode beside them, in the same llama_decode steps
    stop = threading.Event()
    background = threading.Thread(target=traffic, args=(srv, model, 50, stop))
    background.start()
    try:
        beside = probes(srv, model, oai)
    finally:
        stop.set()
        background.join()
    assert beside == first, "beside unrelated traffic"
    # a fresh load (nothing cached) answers the same
    assert httpx.post(srv.url + "/api/models/unload", json={"model": model}, timeout=120).status_code == 200
    assert probes(srv, model, oai) == first, "after a reload"


def test_greedy_equals_llama_cpp_pythons_after_traffic(srv, oai, model_cache):
    """llama-cpp-python's own Llama (one sequence, the whole prompt prefilled at once) on the
    same file, with the server's attention kernel: the server's greedy answer equals it
    whatever ran before."""
    from greenroom.engines.loader import source_path

    llama = reference_llama(srv.url, SMOL, source_path(SMOLLM2_GGUF, str(model_cache)), n_ctx=1024)
    messages = [{"role": "user", "content": "Name three primary colors."}]
    direct = llama.create_chat_completion(messages=messages, temperature=0, max_tokens=40)["choices"][0]
    for _ in range(2):
        traffic(srv, SMOL, rounds=1)
        served = oai.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=40).choices[0]
        assert (served.message.content, served.finish_reason) == (direct["message"]["content"], direct["finish_reason"])


def test_the_seed_header_and_n_choices_seeded_apart(oai):
    kw = dict(model=SMOL, messages=QUESTION, temperature=1.0, max_tokens=16, seed=5)
    raw = oai.chat.completions.with_raw_response.create(n=3, **kw)
    assert raw.headers["X-miLLM-Seed"] == '5;scope="request"'
    texts = [c.message.content for c in raw.parse().choices]
    assert len(set(texts)) == 3  # each choice its own seed
    assert texts[0] == oai.chat.completions.create(**kw).choices[0].message.content  # choice 0 is the seeded request
    assert [c.message.content for c in oai.chat.completions.create(n=3, **kw).choices] == texts
    rows = oai.chat.completions.with_raw_response.create(
        extra_body={"extra_messages": [[{"role": "user", "content": "Name a colour."}]]}, **kw
    )
    assert rows.headers["X-miLLM-Seed"] == '5;scope="batch-shape"'  # what the front end promises of rows
    assert rows.parse().choices[0].message.content == texts[0]


def test_unseeded_sampling_draws_afresh(oai):
    kw = dict(model=Q8, messages=QUESTION, temperature=1.0, max_tokens=24)
    raw = oai.chat.completions.with_raw_response.create(**kw)
    assert "X-miLLM-Seed" not in raw.headers
    assert (
        len(
            {raw.parse().choices[0].message.content}
            | {oai.chat.completions.create(**kw).choices[0].message.content for _ in range(2)}
        )
        > 1
    )


# Gemma 3 has no chat template: its probes are text completions, a few tokens each
GEMMA_PROBES = [
    {"prompt": "Once upon a time", "temperature": 0.9, "seed": 7},
    {"prompt": "The capital of France is", "temperature": 0},
    {"prompt": "In 1492, Columbus", "temperature": 1.0, "top_p": 0.9, "seed": 11},
]


def test_gemma3_answers_are_byte_identical_whatever_ran_before_or_beside(srv, oai):
    """Gemma 3 270M Q4_K_M (sliding-window attention, K-quant kernels), seeded and greedy:
    the same text alone, beside two unrelated streams decoding in the same llama_decode
    steps, and after them. Before, the first probe parted from itself after 7 tokens beside
    the streams: ggml's kernels compute a row with others beside it otherwise than alone, and
    the engine's prefill cuts and repacked weights left that to the traffic
    (llama_cpp_engine.py's docstring)."""

    def answer(probe: dict) -> tuple[str, str]:
        choice = oai.completions.create(model=GEMMA3, max_tokens=12, **probe).choices[0]
        return choice.text, choice.finish_reason

    alone = [answer(probe) for probe in GEMMA_PROBES]
    assert alone[0] != answer({**GEMMA_PROBES[0], "temperature": 0})  # sampled, not greedy
    started, stop = threading.Barrier(3), threading.Event()

    def stream(prompt: str) -> None:
        body = {"model": GEMMA3, "prompt": prompt, "max_tokens": 200, "temperature": 0.7, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: {"))
            next(lines)
            started.wait()
            for _ in lines:
                if stop.is_set():
                    return

    streams = [threading.Thread(target=stream, args=(p,)) for p in ("My grandmother's garden", "Dear diary, today")]
    for t in streams:
        t.start()
    try:
        started.wait(timeout=120)  # both streams are decoding
        with ThreadPoolExecutor(len(GEMMA_PROBES)) as pool:
            beside = list(pool.map(answer, GEMMA_PROBES))
    finally:
        stop.set()
        for t in streams:
            t.join()
    assert beside == alone, "beside unrelated streams"
    assert [answer(probe) for probe in GEMMA_PROBES] == alone, "after them"


def test_gemma3_a_sequence_is_the_same_alone_beside_others_and_after_a_cached_prefix(model_cache, gemma3):
    """In process, on Gemma 3: four probes (one seeded, one sharing a cached prompt's first grid
    cell) give the same text and log-probabilities, bit for bit, decoded one at a time and then
    in one batch joining at steps 0, 2 and 4, on the engine whose slots now hold their prompts.
    Before, the logits moved with where a prefill was cut after a cached prefix and with how
    many sequences a decode step held (repacked weights compute 4 rows otherwise than fewer)."""
    from greenroom.engines.base import SamplingParams
    from greenroom.engines.generation import generate
    from greenroom.engines.llama_cpp.llama_cpp_engine import PREFILL_GRID, LlamaCppEngine

    engine = LlamaCppEngine("gemma", gemma3, n_ctx=512, threads=1, parallel=4)
    try:
        story = " ".join(f"Line {i}: the {w} is here." for i, w in enumerate(WORDS * 2))
        prompts = [
            engine.tokenize(t) for t in (story + " So", "Once upon a time", "In 1492, Columbus", story + " Then")
        ]
        assert PREFILL_GRID < len(prompts[0]) < 2 * PREFILL_GRID
        params = [SamplingParams(max_tokens=10, temperature=0) for _ in prompts]
        params[1] = SamplingParams(max_tokens=10, temperature=0.9, seed=7)
        alone = [[(d.text, d.logprob) for d in generate(engine, ids, p)] for ids, p in zip(prompts, params)]
        batch, together = engine.new_batch(params[0]), {i: [] for i in range(len(prompts))}

        def join(*rows):
            for i, d in zip(rows, batch.join([(i, prompts[i], params[i]) for i in rows])):
                together[i].append((d.text, d.logprob))

        join(0, 1)
        for step in range(1, 40):
            for i, d in batch.step():
                together[i].append((d.text, d.logprob))
            if step == 2:
                join(2)
            if step == 4:
                join(3)
            if not len(batch):
                break
        assert [together[i] for i in range(len(prompts))] == alone
    finally:
        engine.unload()


@pytest.mark.parametrize("flash", [False, True], ids=["plain", "flash-attention"])
def test_a_reused_prefix_computes_as_the_whole_prompt(tmp_path, monkeypatch, model_cache, flash):
    """In process, with either attention kernel (chosen here through the plan the engine keeps
    per file, whatever this CPU measures): a prompt that extends one computed before — by a
    few tokens, by many, or cut short — gives the same tokens and bit-identical
    log-probabilities as when nothing was computed before it: a prefill is cut on the grid
    whatever it reuses (before the grid, flash attention's kernel, which computes fewer than 64
    queries otherwise, moved SmolLM2's logits by up to 0.45 when a long prefix was reused and 5
    tokens prefilled). A prompt shorter than the grid's first cell is computed whole again."""
    import json

    from greenroom.engines.base import SamplingParams
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine
    from greenroom.engines.loader import source_path

    path = source_path(SMOLLM2_GGUF, str(model_cache))
    monkeypatch.setenv("GREENROOM_CACHE", str(tmp_path))

    def load() -> LlamaCppEngine:
        return LlamaCppEngine("reuse", path, n_ctx=1024, threads=1, parallel=2)

    load().unload()  # measures and stores the plan; then this test's kernel is put in its place
    store = default_cache_dir() / "llama-cpp-decode.json"
    store.write_text(json.dumps({key: [flash, True] for key in json.loads(store.read_text())}))
    engine = load()
    assert engine.flash_attn is flash
    params = SamplingParams(temperature=0.0, logprobs=3)
    text = " ".join(f"Line {i}: the {WORDS[i % len(WORDS)]} is here." for i in range(24))
    base = engine.tokenize(text)  # ~230 tokens
    prompts = [base + engine.tokenize(" And then", add_special_tokens=False), base[:150], base[:40], base]

    def run(engine, ids):
        return first_steps(engine, ids, params, 6)

    def fresh(ids):  # nothing computed before it
        engine = load()
        try:
            return run(engine, ids)
        finally:
            engine.unload()

    for ids in prompts:
        run(engine, base)  # the prefix is now cached in a slot
        run(engine, engine.tokenize("Something unrelated entirely."))  # and another in the other
        assert run(engine, ids) == fresh(ids)
    # under the grid's first cell nothing is reused: a short prompt is computed whole again
    short = engine.tokenize("Line 1: the cat is here.")
    for ids in (short, short + engine.tokenize(" And", add_special_tokens=False)):
        run(engine, short)
        run(engine, engine.tokenize("Something unrelated entirely."))
        assert run(engine, ids) == fresh(ids)
    engine.unload()
