"""Scoring mode on GGUF models (llama.cpp): completion and chat scoring through a live server
(the default configuration's demo GGUF and the real SmolLM2 Q4_1) equal, to 1e-5, a softmax
computed here over llama.cpp's own logits — llama-cpp-python run in-process on the same file
(`logits_all`); every refusal typed; a scoring pass leaves the generations decoding beside it
untouched. The reductions themselves (engines/scoring.py) are checked engine-free in
tests/unit/test_scoring.py."""

from __future__ import annotations

import threading
import time

import httpx
import jinja2
import numpy as np
import pytest
from conftest import SMOLLM2_GGUF
from openai import OpenAI

DEMO, SMOL = "greenroom-demo-gguf:Q8_0", "smollm2-135m-instruct:Q4_1"
PROMPT = "[question] Is the sky green? Answer true or false.\n[decision]:"
TOLERANCE = 1e-5
DELTAS: list[float] = []  # every |served − in-process| compared here (the largest is printed at the end)


@pytest.fixture(scope="module")
def srv(server):
    """The session's default-config server (it serves both GGUF models); they are unloaded
    afterwards, so the tests after these find the server as they would have."""
    yield server
    for model in (DEMO, SMOL):
        httpx.post(server.url + "/api/models/unload", json={"model": model}, timeout=120)
    if DELTAS:
        print(f"\nGGUF scoring: max |served - in-process| = {max(DELTAS):.3g} over {len(DELTAS)} values")


@pytest.fixture(scope="module")
def files(model_cache):
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.loader import source_path

    return {
        DEMO: ensure_demo_gguf(default_cache_dir(model_cache), "Q8_0"),
        SMOL: source_path(SMOLLM2_GGUF, str(model_cache)),
    }


class Reference:
    """llama-cpp-python on the same file, in-process: llama.cpp's logits of every position."""

    def __init__(self, path):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=4096, n_batch=512, logits_all=True, n_threads=1, verbose=False)
        self.template = self.llm.metadata.get("tokenizer.chat_template")

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        add_bos = add_special_tokens and self.llm.metadata.get("tokenizer.ggml.add_bos_token", "true") != "false"
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=True)

    def logits(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], dtype=np.float64)

    def render(self, messages: list[dict]) -> str:
        """The file's chat template, as the engine renders it (bos/eos as the file names them)."""
        vocab = self.llm.metadata
        bos = self.llm.detokenize([int(vocab["tokenizer.ggml.bos_token_id"])], special=True).decode()
        eos = self.llm.detokenize([int(vocab["tokenizer.ggml.eos_token_id"])], special=True).decode()
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos
        )


@pytest.fixture(scope="module")
def refs(files):
    return {model: Reference(path) for model, path in files.items()}


def log_softmax(x: np.ndarray, temperature: float = 0) -> np.ndarray:
    x = x / temperature if temperature > 0 else x
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def close(served: float, expected: float) -> None:
    DELTAS.append(abs(served - expected))
    assert served == pytest.approx(expected, abs=TOLERANCE)


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=300)


def completion(srv, model: str, **body) -> dict:
    r = post(srv, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model", [DEMO, SMOL])
def test_completion_scoring_is_a_softmax_over_llama_cpp_logits(srv, refs, model):
    ref = refs[model]
    row = ref.logits(ref.tokenize(PROMPT))[-1]
    for temperature in (1.0, 0.7, 0):
        body = completion(srv, model, logprobs=20, temperature=temperature, return_tokens_as_token_ids=True)
        expected = log_softmax(row, temperature)
        order = np.argsort(-expected, kind="stable")[:20]
        (choice,) = body["choices"]
        lp = choice["logprobs"]
        assert lp["tokens"] == [f"token_id:{order[0]}"]
        close(lp["token_logprobs"][0], expected[order[0]])
        top = lp["top_logprobs"][0]
        assert set(top) == {f"token_id:{i}" for i in order}
        for i in order:
            close(top[f"token_id:{i}"], expected[i])
        assert lp["text_offset"] == [len(PROMPT)]
        assert choice["text"] == ref.llm.detokenize([int(order[0])]).decode("utf-8", errors="replace")
        assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 1
        assert body["system_fingerprint"].endswith(":llama.cpp")


@pytest.mark.parametrize("model", [DEMO, SMOL])
def test_allowed_token_ids_renormalise_over_the_set(srv, refs, model):
    ref = refs[model]
    allowed = [300, 400, 500, 600]
    body = completion(
        srv,
        model,
        logprobs=1,
        allowed_token_ids=allowed,
        add_special_tokens=False,
        return_tokens_as_token_ids=True,
        temperature=0.5,
    )
    expected = log_softmax(ref.logits(ref.tokenize(PROMPT, add_special_tokens=False))[-1][allowed], 0.5)
    top = body["choices"][0]["logprobs"]["top_logprobs"][0]
    assert set(top) == {f"token_id:{t}" for t in allowed}  # every listed token, whatever logprobs says
    for t, v in zip(allowed, expected):
        close(top[f"token_id:{t}"], v)
    assert sum(np.exp(list(top.values()))) == pytest.approx(1.0, abs=1e-9)
    assert body["choices"][0]["logprobs"]["tokens"] == [f"token_id:{allowed[int(np.argmax(expected))]}"]
    assert body["usage"]["prompt_tokens"] == len(ref.tokenize(PROMPT, add_special_tokens=False))
    constrained = completion(srv, model, allowed_token_ids=allowed)  # no logprobs: the token only
    assert constrained["choices"][0]["logprobs"] is None
    best = allowed[int(np.argmax(ref.logits(ref.tokenize(PROMPT))[-1][allowed]))]
    assert constrained["choices"][0]["text"] == ref.llm.detokenize([best]).decode("utf-8", errors="replace")


def test_token_arrays_several_prompts_and_text_keys(srv, refs):
    ref = refs[SMOL]
    prompts = [ref.tokenize("The capital of France is"), ref.tokenize("One, two, three,")]
    body = completion(srv, SMOL, prompt=prompts, logprobs=3)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for ids, choice in zip(prompts, body["choices"]):
        expected = log_softmax(ref.logits(ids)[-1])
        best = int(np.argmax(expected))
        assert choice["text"] == choice["logprobs"]["tokens"][0] == ref.llm.detokenize([best]).decode()
        close(choice["logprobs"]["top_logprobs"][0][choice["text"]], expected[best])
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_chat_scoring_equals_completion_scoring_of_the_rendered_prompt(srv, refs):
    ref = refs[SMOL]
    messages = [{"role": "user", "content": "Is the sky green? Answer yes or no."}]
    chat = post(
        srv,
        "/v1/chat/completions",
        {
            "model": SMOL,
            "messages": messages,
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": 5,
            "return_tokens_as_token_ids": True,
        },
    )
    assert chat.status_code == 200, chat.text
    content = chat.json()["choices"][0]["logprobs"]["content"][0]
    rendered = ref.render(messages)
    comp = completion(
        srv, SMOL, prompt=rendered, add_special_tokens=False, logprobs=5, return_tokens_as_token_ids=True
    )["choices"][0]["logprobs"]
    assert content["token"] == comp["tokens"][0] and content["logprob"] == comp["token_logprobs"][0]
    assert {t["token"]: t["logprob"] for t in content["top_logprobs"]} == comp["top_logprobs"][0]
    expected = log_softmax(ref.logits(ref.tokenize(rendered, add_special_tokens=False))[-1])
    for alt in content["top_logprobs"]:
        close(alt["logprob"], expected[int(alt["token"].removeprefix("token_id:"))])
    assert content["bytes"] == list(chat.json()["choices"][0]["message"]["content"].encode())


def test_chat_scoring_with_the_openai_sdk_and_extra_messages(srv):
    client = OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300)
    questions = ["Is fire hot?", "Is ice hot?", "Is the sea salty?"]
    raw = client.chat.completions.with_raw_response.create(
        model=SMOL,
        max_tokens=1,
        logprobs=True,
        top_logprobs=2,
        messages=[{"role": "user", "content": questions[0]}],
        extra_body={
            "extra_messages": [[{"role": "user", "content": q}] for q in questions[1:]],
            "allowed_token_ids": [9230, 2838],
        },
    )  # " Yes", " No" in SmolLM2's vocabulary
    assert raw.headers["X-miLLM-Steering"] == "none"
    r = raw.parse()
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        entry = c.logprobs.content[0]
        assert len(entry.top_logprobs) == 2
        assert sum(np.exp([t.logprob for t in entry.top_logprobs])) == pytest.approx(1.0, abs=1e-9)
        assert entry.token == c.message.content


REFUSALS = [
    ({"allowed_token_ids": [5], "max_tokens": 2}, "invalid_scoring_request", "max_tokens"),
    ({"stream": True}, "invalid_scoring_request", "stream"),
    ({"n": 2}, "field_not_honoured", "n"),
    ({"logprobs": 21}, "invalid_parameter", "logprobs"),
    ({"temperature": 0.0005}, "invalid_parameter", "temperature"),
    ({"allowed_token_ids": [5, 10**7]}, "invalid_scoring_request", "allowed_token_ids"),
    ({"allowed_token_ids": [-1]}, "invalid_scoring_request", "allowed_token_ids"),
    ({"prompt": [[1, 2, 10**6]]}, "invalid_scoring_request", "prompt"),
    ({"prompt": "", "add_special_tokens": False}, "invalid_scoring_request", "prompt"),
    ({"prompt": [[1] * 32768]}, "context_length_exceeded", "prompt"),  # the demo GGUF's window: 32,768
    ({"response_format": {"type": "json_object"}}, "field_not_honoured", "response_format"),
]


@pytest.mark.parametrize("extra,code,param", REFUSALS, ids=[f"{c}:{p}" for _, c, p in REFUSALS])
def test_every_bad_scoring_request_is_a_typed_400(srv, extra, code, param):
    r = post(srv, "/v1/completions", {"model": DEMO, "prompt": PROMPT, "max_tokens": 1, "logprobs": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err


def test_a_seed_is_accepted_and_echoed_where_it_changes_nothing(srv):
    plain = completion(srv, SMOL, logprobs=3)
    r = post(srv, "/v1/completions", {"model": SMOL, "prompt": PROMPT, "max_tokens": 1, "logprobs": 3, "seed": 7})
    assert r.status_code == 200 and r.headers["X-miLLM-Seed"] == '7;scope="request"'
    assert r.json()["choices"] == plain["choices"]


def test_chat_scoring_refusals_on_gguf(srv):
    from greenroom.engines.capabilities import capabilities_of

    base = {"model": DEMO, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logprobs": True}
    several = "invalid_scoring_request" if capabilities_of("llama.cpp").n else "field_not_honoured"
    for extra, code, param in (
        ({"allowed_token_ids": [5], "max_tokens": 2}, "invalid_scoring_request", "max_tokens"),
        ({"n": 2}, several, "n"),
        ({"top_logprobs": 21}, "invalid_parameter", "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "invalid_parameter", "top_logprobs"),
        ({"allowed_token_ids": [10**7]}, "invalid_scoring_request", "allowed_token_ids"),
    ):
        r = post(srv, "/v1/chat/completions", {**base, **extra})
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param), r.text


def _generations(path, interleave: bool) -> list:
    """A fresh engine's serial greedy generation and a batch of two beside it, stepped together;
    with `interleave`, scoring and echo passes (prompts sharing their prefixes) run between the
    steps, as the engine actor runs a Score between decode steps."""
    from greenroom.engines.base import SamplingParams
    from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine

    engine = LlamaCppEngine("m", path, n_ctx=1024, parallel=3)
    greedy = SamplingParams(max_tokens=40, temperature=0)
    try:
        prompts = [
            engine.tokenize(p)
            for p in ("Once upon a time, in a small village,", "The sea is", "Paris is the capital of")
        ]
        serial = engine.generate_ids(prompts[0], greedy)
        batch = engine.new_batch(greedy)
        out = [("join", d.text, d.logprob) for d in batch.join([(1, prompts[1], greedy), (2, prompts[2], greedy)])]
        seen = list(prompts[0])
        for step in range(40):
            token, logprob, _ = next(serial)
            seen.append(token)
            out.append(("serial", token, logprob))
            if len(batch):
                out += [(key, d.text, d.logprob) for key, d in batch.step()]
            if interleave:
                engine.score(seen, 0.7, None, 3)  # the generation's own prefix, then another prompt
                engine.score(prompts[1] + [token], 0.0, [5, 6], 2)
                engine.prompt_logprobs(seen[: 5 + step], 0.0, 2, None, 2)
        serial.close()
        return out
    finally:
        engine.unload()


@pytest.mark.parametrize("model", [DEMO, SMOL])
def test_scoring_between_decode_steps_leaves_the_generations_as_they_were(files, model):
    """The scoring pass runs in a context of its own: the generations decoding beside it —
    the serial path's and a batch's — give the same tokens and the same log-probabilities,
    bit for bit, as on an engine that never scored."""
    assert _generations(files[model], interleave=True) == _generations(files[model], interleave=False)


def test_scoring_while_requests_decode_through_the_server(srv):
    """Scoring requests answered while two generations stream on the same model, which finish."""
    body = {"model": SMOL, "prompt": "Once upon a time, in a small village,", "max_tokens": 120, "temperature": 0}
    out: dict[int, dict] = {}

    def generate(i: int) -> None:
        out[i] = post(srv, "/v1/completions", body).json()

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    scored = 0
    while any(t.is_alive() for t in threads):
        prompt = f"Once upon a time, in a small village, there lived {scored}"  # shares the generations' prefix
        assert completion(srv, SMOL, prompt=prompt, logprobs=2)["choices"][0]["logprobs"]
        scored += 1
    for t in threads:
        t.join()
    assert scored >= 2
    assert [out[i]["usage"]["completion_tokens"] for i in range(2)] == [120, 120], out


def test_a_scoring_request_on_smollm2_is_quick(srv, refs):
    """One scoring request of a ~60-token judge prompt, timed through the server (printed)."""
    ref = refs[SMOL]
    prompt = (
        "[kind] review\n[text] The food was cold and the waiter ignored us for an hour. We will not "
        "be coming back.\n[question] Is this review positive?\n[options]\ntrue\nfalse\n[decision]:"
    )
    completion(srv, SMOL, prompt=prompt, logprobs=5)  # the model is loaded
    times = []
    for i in range(5):
        start = time.perf_counter()
        body = completion(srv, SMOL, prompt=prompt + " " * i, logprobs=5)
        times.append(time.perf_counter() - start)
    print(
        f"\nscoring on {SMOL}: {len(ref.tokenize(prompt))} prompt tokens, median "
        f"{sorted(times)[2] * 1e3:.0f} ms per request"
    )
    assert body["choices"][0]["logprobs"] and sorted(times)[2] < 10
