"""`echo` on /v1/completions: the prompt's own log-probabilities, in OpenAI's legacy shape as
vLLM returns it (`tokens`, `token_logprobs` and `top_logprobs` with the first entry null,
`text_offset`), on both engines — what lm-evaluation-harness's `local-completions` model
sends for its loglikelihood tasks. Checked with the real OpenAI SDK, against in-process
references (transformers' forward pass; llama-cpp-python's logits on the same GGUF file),
with lm-eval's exact request and its parser, and every refusal typed.

lm-eval itself is not installed here: `pip install lm-eval` takes about a minute but brings
~600 MB that nothing else needs (pyarrow, scipy, pandas, scikit-learn, datasets); the request
below is `LocalCompletionsAPI._create_payload`'s (generate=False) and `parse_logprobs` is its
parser, line for line (lm_eval/models/openai_completions.py, 0.4.x)."""

from __future__ import annotations

import time
from operator import itemgetter

import httpx
import numpy as np
import pytest
import torch
from conftest import MODEL, SMOLLM2_GGUF
from openai import BadRequestError, OpenAI

DEMO_GGUF, SMOL = "greenroom-demo-gguf:Q8_0", "smollm2-135m-instruct:Q4_1"
ENGINES = [MODEL, DEMO_GGUF, SMOL]  # transformers, llama.cpp, llama.cpp (the real model)
PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def srv(server):
    """The session's default-config server; the GGUF models are unloaded afterwards."""
    yield server
    for model in (DEMO_GGUF, SMOL):
        httpx.post(server.url + "/api/models/unload", json={"model": model}, timeout=120)


@pytest.fixture(scope="module")
def client(srv):
    return OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300)


class HFReference:
    """The transformers demo model in-process: one forward over the whole prompt."""

    def __init__(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model

        path = ensure_demo_model(default_cache_dir())
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tolerance = 1e-4  # the server runs the prompt in chunks over a cache: float32 reassociation

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def logprobs(self, ids: list[int]) -> np.ndarray:
        """Row i: the log-distribution after prompt position i."""
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, -1).numpy()

    def text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=True)


class LlamaReference:
    """llama-cpp-python on the same GGUF file: llama.cpp's logits of every position."""

    def __init__(self, path):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=2048, logits_all=True, n_threads=1, verbose=False)
        self.add_bos = self.llm.metadata.get("tokenizer.ggml.add_bos_token", "true") != "false"
        self.tolerance = 1e-5

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=self.add_bos, special=True)

    def logprobs(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        x = np.array(self.llm.scores[: len(ids)], dtype=np.float64)
        top = x.max(-1, keepdims=True)
        return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))

    def text(self, token: int) -> str:
        return self.llm.detokenize([token]).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def refs(model_cache):
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.loader import source_path

    return {
        MODEL: HFReference(),
        DEMO_GGUF: LlamaReference(ensure_demo_gguf(default_cache_dir(model_cache), "Q8_0")),
        SMOL: LlamaReference(source_path(SMOLLM2_GGUF, str(model_cache))),
    }


@pytest.mark.parametrize("model", ENGINES)
def test_echo_returns_the_prompts_logprobs_in_the_legacy_shape(client, refs, model):
    ref = refs[model]
    ids = ref.tokenize(PROMPT)
    expected = ref.logprobs(ids)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, logprobs=2, echo=True, temperature=0)
    (choice,) = r.choices
    lp = choice.logprobs
    n = len(ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert lp.tokens[:n] == [ref.text(t) for t in ids]
    for i in range(1, n):
        assert lp.token_logprobs[i] == pytest.approx(expected[i - 1, ids[i]], abs=ref.tolerance)
        top = lp.top_logprobs[i]
        best = np.argsort(-expected[i - 1], kind="stable")[:2]
        # the two most probable, and the prompt's own token (OpenAI: up to logprobs + 1 entries)
        assert set(top) == {ref.text(int(t)) for t in best} | {lp.tokens[i]}
        assert top[lp.tokens[i]] == lp.token_logprobs[i]
        for t in best:
            assert top[ref.text(int(t))] == pytest.approx(expected[i - 1, t], abs=ref.tolerance)
    # the last entry is the token after the prompt, the most probable, as scoring returns it
    following = int(np.argmax(expected[-1]))
    assert lp.tokens[n] == ref.text(following) and choice.text == PROMPT + lp.tokens[n]
    assert lp.token_logprobs[n] == pytest.approx(expected[-1, following], abs=ref.tolerance)
    offsets = [0]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets  # cumulative over the tokens' texts, as vLLM counts them
    assert choice.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n, 1, n + 1)


@pytest.mark.parametrize("model", ENGINES)
def test_echo_with_max_tokens_0_is_the_prompt_alone(client, refs, model):
    ref = refs[model]
    ids = ref.tokenize(PROMPT)
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=0, logprobs=0, echo=True, extra_body={"return_tokens_as_token_ids": True}
    )
    (choice,) = r.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in ids]
    assert choice.logprobs.top_logprobs[0] is None
    # logprobs 0: each position lists its own token alone
    assert [list(top) for top in choice.logprobs.top_logprobs[1:]] == [[f"token_id:{t}"] for t in ids[1:]]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)
    bare = client.completions.create(model=model, prompt=[ids], max_tokens=0, echo=True)  # no logprobs
    assert bare.choices[0].text == ref_decoded(ref, ids) and bare.choices[0].logprobs is None


def ref_decoded(ref, ids: list[int]) -> str:
    if isinstance(ref, HFReference):
        return ref.tokenizer.decode(ids, skip_special_tokens=True)
    return ref.llm.detokenize(ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("model", ENGINES)
def test_echo_with_allowed_token_ids_and_a_temperature(client, refs, model):
    """Prompt positions over the whole vocabulary; the token after the prompt renormalised over
    the allowed set; the temperature divides every position's logits."""
    ref = refs[model]
    ids = ref.tokenize(PROMPT)
    allowed = [5, 17, 300]
    r = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=1,
        logprobs=1,
        echo=True,
        temperature=0.5,
        extra_body={"allowed_token_ids": allowed, "return_tokens_as_token_ids": True},
    )
    lp = r.choices[0].logprobs
    if isinstance(ref, HFReference):
        with torch.no_grad():
            logits = ref.model(torch.tensor([ids])).logits[0].double() / 0.5
        scaled = torch.log_softmax(logits, -1).numpy()
        last = torch.log_softmax(logits[-1, allowed], -1).numpy()
    else:
        ref.llm.reset()
        ref.llm.eval(ids)
        x = np.array(ref.llm.scores[: len(ids)], dtype=np.float64) / 0.5
        scaled = x - x.max(-1, keepdims=True)
        scaled -= np.log(np.exp(scaled).sum(-1, keepdims=True))
        tail = x[-1, allowed] - x[-1, allowed].max()
        last = tail - np.log(np.exp(tail).sum())
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(scaled[i - 1, ids[i]], abs=ref.tolerance)
    assert set(lp.top_logprobs[-1]) == {f"token_id:{t}" for t in allowed}
    for t, v in zip(allowed, last):
        assert lp.top_logprobs[-1][f"token_id:{t}"] == pytest.approx(v, abs=ref.tolerance)
    assert lp.tokens[-1] == f"token_id:{allowed[int(np.argmax(last))]}"


# --- lm-evaluation-harness -----------------------------------------------------------------


def lm_eval_payload(model: str, prompts: list[list[int]]) -> dict:
    """LocalCompletionsAPI._create_payload(messages, generate=False, seed=1234): lm-eval's
    loglikelihood request (prompts: context + continuation token ids, one list each)."""
    return {
        "model": model,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }


def lm_eval_parse_logprobs(outputs, tokens=None, ctxlens=None):
    """LocalCompletionsAPI.parse_logprobs, as lm-eval has it."""
    res = []
    if not isinstance(outputs, list):
        outputs = [outputs]
    for out in outputs:
        for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
            assert ctxlen > 0, "Context length must be greater than 0"
            logprobs = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
            tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
            top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
            is_greedy = True
            for tok, top in zip(tokens_logprobs, top_logprobs):
                if tok != max(top.values()):
                    is_greedy = False
                    break
            res.append((logprobs, is_greedy))
    return res


@pytest.mark.parametrize("model", ENGINES)
def test_lm_evals_loglikelihood_request_gets_the_right_answer(srv, refs, model):
    """Two requests of a batch of two, as lm-eval sends them: a continuation that is the model's
    own greedy path (is_greedy true) and one that is not; the loglikelihood lm-eval's parser reads
    off the response is the sum of the continuation's log-probabilities in-process."""
    ref = refs[model]
    context = ref.tokenize("Question: What is the capital of France?\nAnswer:")
    greedy = []
    for _ in range(3):  # the model's own greedy continuation, read off the reference
        greedy.append(int(np.argmax(ref.logprobs(context + greedy)[-1])))
    other = [int(np.argsort(-ref.logprobs(context)[-1])[5])] + greedy[1:]  # its 6th choice first: not greedy
    payload = lm_eval_payload(model, [context + greedy, context + other])
    r = httpx.post(srv.url + "/v1/completions", json=payload, timeout=300)
    assert r.status_code == 200, r.text
    parsed = lm_eval_parse_logprobs([r.json()], tokens=payload["prompt"], ctxlens=[len(context)] * 2)
    for (loglikelihood, is_greedy), continuation, want_greedy in zip(parsed, (greedy, other), (True, False)):
        rows = ref.logprobs(context + continuation)
        expected = sum(rows[len(context) + i - 1, t] for i, t in enumerate(continuation))
        assert loglikelihood == pytest.approx(expected, abs=len(continuation) * ref.tolerance)
        assert is_greedy is want_greedy


# --- a long prompt ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", [MODEL, SMOL])
def test_echo_of_a_prompt_of_several_chunks(srv, refs, model):
    """An echo longer than two of the engines' 256-position chunks (llama.cpp's score_batch,
    transformers' ECHO_CHUNK), read chunk by chunk, equals a whole in-process pass."""
    ref = refs[model]
    rng = np.random.default_rng(0)
    ids = ref.tokenize("Hello")[:1] + [int(t) for t in rng.integers(100, 1000, size=539)]
    httpx.post(
        srv.url + "/v1/completions",
        json={"model": model, "prompt": [ids[:8]], "max_tokens": 1, "logprobs": 1, "echo": True},
        timeout=300,
    )  # loaded
    start = time.perf_counter()
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=300,
        json={
            "model": model,
            "prompt": [ids],
            "max_tokens": 1,
            "logprobs": 5,
            "echo": True,
            "temperature": 0,
            "return_tokens_as_token_ids": True,
        },
    )
    took = time.perf_counter() - start
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    print(f"\necho of a {len(ids)}-token prompt on {model}: {took:.2f} s, {len(r.content) / 1e6:.1f} MB of JSON")
    assert len(lp["tokens"]) == len(ids) + 1 and lp["tokens"][: len(ids)] == [f"token_id:{t}" for t in ids]
    expected = ref.logprobs(ids)
    served = np.array(lp["token_logprobs"][1 : len(ids)])
    assert np.abs(served - expected[np.arange(len(ids) - 1), ids[1:]]).max() < ref.tolerance
    assert all(5 <= len(top) <= 6 for top in lp["top_logprobs"][1 : len(ids)])


# --- refusals --------------------------------------------------------------------------------


def test_echo_is_not_reported_as_ignored_and_not_applicable_fields_are(srv):
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": "x y", "max_tokens": 1, "logprobs": 1, "echo": True, "top_p": 0.5},
    )
    assert r.status_code == 200 and r.headers["X-miLLM-Ignored-Fields"] == '"top_p"'


ECHO = {"prompt": PROMPT, "max_tokens": 1, "logprobs": 1, "echo": True}
BAD = [
    ("/v1/completions", {**ECHO, "stream": True}, "invalid_scoring_request", "stream"),
    (
        "/v1/completions",
        {**ECHO, "max_tokens": 0, "logprobs": None, "stream": True},
        "invalid_scoring_request",
        "stream",
    ),
    ("/v1/completions", {**ECHO, "n": 2}, "field_not_honoured", "n"),
    ("/v1/completions", {**ECHO, "best_of": 2}, "field_not_honoured", "best_of"),
    ("/v1/completions", {**ECHO, "max_tokens": 2}, "invalid_scoring_request", "max_tokens"),
    ("/v1/completions", {**ECHO, "max_tokens": None}, "invalid_scoring_request", "max_tokens"),
    (
        "/v1/completions",
        {**ECHO, "max_tokens": 0, "allowed_token_ids": [5]},
        "invalid_scoring_request",
        "allowed_token_ids",
    ),
    # without logprobs an echo is the prompt alone: a generation does not echo its prompt
    ("/v1/completions", {**ECHO, "logprobs": None, "max_tokens": 16}, "field_not_honoured", "echo"),
    ("/v1/completions", {**ECHO, "logprobs": False, "max_tokens": None}, "field_not_honoured", "echo"),
    ("/v1/completions", {**ECHO, "echo": "yes"}, "invalid_parameter", "echo"),
    ("/v1/completions", {**ECHO, "echo": 1}, "invalid_parameter", "echo"),
    ("/v1/completions", {**ECHO, "logprobs": 21}, "invalid_parameter", "logprobs"),
    ("/v1/completions", {**ECHO, "temperature": 0.0001}, "invalid_parameter", "temperature"),
    ("/v1/completions", {**ECHO, "prompt": [[1, 2, 10**6]]}, "invalid_scoring_request", "prompt"),
    ("/v1/completions", {**ECHO, "prompt": [[1] * 32768]}, "context_length_exceeded", "prompt"),
    ("/v1/completions", {**ECHO, "max_tokens": 0, "prompt": [[1] * 32769]}, "context_length_exceeded", "prompt"),
    ("/v1/completions", {**ECHO, "profile": "calm"}, "field_not_honoured", "profile"),
    ("/v1/completions", {**ECHO, "response_format": {"type": "json_object"}}, "field_not_honoured", "response_format"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "echo": True},
        "field_not_honoured",
        "echo",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": True, "echo": True},
        "field_not_honoured",
        "echo",
    ),
]


@pytest.mark.parametrize("model", [MODEL, DEMO_GGUF])
@pytest.mark.parametrize(
    "path,body,code,param", BAD, ids=[f"{p.split('/')[-1]}:{c}:{q}:{i}" for i, (p, _, c, q) in enumerate(BAD)]
)
def test_every_bad_echo_is_a_typed_400(srv, model, path, body, code, param):
    r = httpx.post(srv.url + path, json={"model": model, **body}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err


def test_echo_on_an_engine_without_scoring_is_refused_before_it_loads(client):
    with pytest.raises(BadRequestError) as exc:  # OpenVINO GenAI: no per-token distribution
        client.completions.create(model="greenroom-demo-npu", prompt="x", max_tokens=0, echo=True)
    err = exc.value.response.json()["error"]
    assert (err["code"], err["param"]) == ("field_not_honoured", "echo") and "openvino" in err["message"]


@pytest.mark.parametrize("extra", [{"max_tokens": 1, "logprobs": 1}, {"max_tokens": 0}])
def test_echo_reads_sae_activations_on_its_unsteered_pass(srv, refs, extra):
    """return_sae_activations on an echo (transformers) reads the one pass over the prompt,
    chunked or not; with max_tokens 0 and no logprobs the pass still runs for the readout."""
    ids = refs[MODEL].tokenize(PROMPT)
    r = httpx.post(
        srv.url + "/v1/completions",
        timeout=120,
        json={
            "model": MODEL,
            "prompt": PROMPT,
            "echo": True,
            **extra,
            "return_sae_activations": {"positions": "prompt", "top_k": 2},
        },
    )
    assert r.status_code == 200, r.text
    read = r.json()["millm"]["sae_activations"]
    assert read["read_point"] == "unsteered"
    assert [p["position"] for p in read["positions"]] == list(range(len(ids)))
    assert [p["token_id"] for p in read["positions"]] == ids
    assert r.json()["choices"][0]["text"].startswith(PROMPT)
